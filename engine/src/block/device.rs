//! One end of a raw block copy: a block device, or an image file standing for one, opened
//! only as what it is and measured (`BLKGETSIZE64`, not a claim's requested capacity).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::sys::{self, Opened};

/// What is behind a [`Device`]'s descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A block device node (`S_ISBLK`); its number is [`Device::rdev`].
    Block,
    /// A regular file holding a device's bytes (a disk image): what the tests and the
    /// benchmark's peers use, and where a device can be backed up to.
    Image,
}

/// An open end of a block copy.
#[derive(Debug)]
pub struct Device {
    fd: OwnedFd,
    kind: DeviceKind,
    size: u64,
    rdev: u64,
    /// What errors name: the path opened, or `<descriptor>` for one handed over.
    name: PathBuf,
}

impl Device {
    /// Open `path` (a path the caller trusts: symlinks such as `/dev/disk/by-id/...` are
    /// followed, as `dd` follows them) for reading (`write: false`) or reading and writing.
    /// It is opened `O_PATH` first and looked at, so that nothing but a block device or a
    /// regular file is ever opened for I/O (a character device's open can act, a FIFO's
    /// waits). With `create`, a missing path becomes an empty image file (mode 0600, never
    /// through a symlink), grown by the copy.
    pub fn open(path: &Path, write: bool, create: bool) -> Result<Device, Error> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::Usage(format!("{}: a path with a NUL byte", path.display())))?;
        let flags = libc::O_CLOEXEC | if write { libc::O_RDWR } else { libc::O_RDONLY };
        let look = sys::open(&c, libc::O_PATH | libc::O_CLOEXEC).and_then(|p| {
            let st = sys::fstat(p.as_fd())?;
            if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
                sys::reopen(p.as_fd(), flags).map(|fd| Opened::Open(fd, st))
            } else {
                sys::opened_if(p, flags, false)
            }
        });
        let opened = match look {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                sys::create_or_open_regular(&c, flags, 0o600)
            }
            other => other,
        };
        match opened {
            Ok(Opened::Open(fd, _)) => Device::checked(fd, path.to_owned()),
            Ok(Opened::Other(st)) => Err(not_a_device(path, st.st_mode)),
            Err(e) => Err(Error::io("open", path, e)),
        }
    }

    /// A descriptor another process opened and handed over (the holder pod's device): what
    /// it refers to is looked at again here, never taken on trust.
    pub fn from_fd(fd: OwnedFd) -> Result<Device, Error> {
        Device::checked(fd, PathBuf::from("<descriptor>"))
    }

    fn checked(fd: OwnedFd, name: PathBuf) -> Result<Device, Error> {
        let st = sys::fstat(fd.as_fd()).map_err(|e| Error::io("fstat", &name, e))?;
        let (kind, size) = match st.st_mode & libc::S_IFMT {
            libc::S_IFBLK => {
                let size = sys::device_size(fd.as_fd())
                    .map_err(|e| Error::io("BLKGETSIZE64", &name, e))?;
                (DeviceKind::Block, size)
            }
            libc::S_IFREG => (DeviceKind::Image, st.st_size as u64),
            mode => return Err(not_a_device(&name, mode)),
        };
        Ok(Device {
            fd,
            kind,
            size,
            rdev: st.st_rdev,
            name,
        })
    }

    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// Its size in bytes: a block device's own, an image's length.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The device number of a block device (`st_rdev`), to compare with the node the
    /// kubelet made for a claim; `None` for an image.
    pub fn rdev(&self) -> Option<u64> {
        (self.kind == DeviceKind::Block).then_some(self.rdev)
    }

    /// For a loop device, its backing file's `(st_dev, st_ino)`: what stays the same across
    /// a detach and a new loop device over the same file. `None` for any other device.
    pub fn loop_backing(&self) -> io::Result<Option<(u64, u64)>> {
        match self.kind {
            DeviceKind::Block => sys::loop_backing(self.fd.as_fd()),
            DeviceKind::Image => Ok(None),
        }
    }

    pub fn name(&self) -> &Path {
        &self.name
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Grow an image to `size` (never shrink it; a block device's size is what it is).
    pub(super) fn grow_image(&mut self, size: u64) -> Result<(), Error> {
        if self.kind == DeviceKind::Image && self.size < size {
            sys::ftruncate(self.fd.as_fd(), size)
                .map_err(|e| Error::io("ftruncate", &self.name, e))?;
            self.size = size;
        }
        Ok(())
    }
}

fn not_a_device(path: &Path, mode: u32) -> Error {
    let what = match mode & libc::S_IFMT {
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symlink (an image is not created through one)",
        _ => "not a block device",
    };
    Error::Usage(format!(
        "{} is {what}: a block copy reads and writes only a block device or an image file",
        path.display()
    ))
}
