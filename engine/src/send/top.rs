//! What a source half serves: a directory (paths resolved beneath it) or one regular file,
//! opened from a trusted host path or from a tenant's path inside a root, never as a FIFO,
//! socket or device.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::ends::SrcAt;
use crate::sys::{self, Stat};
use crate::{beneath, Error};

/// What the source half is serving.
#[derive(Debug)]
pub enum SourceTop {
    /// A directory: paths are resolved beneath it.
    Dir(OwnedFd),
    /// One regular file (a shard that copies a file): only the path "" exists.
    File(OwnedFd),
    /// A raw block device (a shard between block claims): read by range
    /// ([`ferry_transfer::Frame::ReadRange`]), counted as one file of its size; it has no
    /// paths, records or listings.
    Device(crate::block::Device),
}

impl SourceTop {
    /// Open `path` (a host path the caller resolved and trusts) as a top.
    pub fn open(path: &Path) -> io::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
        // O_NOATIME where we may: serving a tree does not disturb its access times. Only
        // a directory or a regular file is opened (a device at the path never is).
        let flags = libc::O_RDONLY | libc::O_NOATIME;
        match sys::open_regular_path(&c, flags, true)? {
            sys::Opened::Open(fd, st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                Ok(Self::Dir(fd))
            }
            sys::Opened::Open(fd, _) => Ok(Self::File(fd)),
            sys::Opened::Other(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the source is neither a directory nor a regular file",
            )),
        }
    }

    /// Open `path` inside `root` (a tenant's path inside an admin's root) as a top,
    /// resolved as [`crate::copy_beneath`] resolves its source: relative, no `..`, no
    /// symlink at any depth (the last component included), access times left alone where
    /// the agent may. A FIFO, socket or device is refused without being opened.
    pub fn beneath(root: BorrowedFd<'_>, path: &Path) -> Result<Self, Error> {
        let parts = beneath::check_relative(path)?;
        let (parent, name) = match beneath::open_source_in(root, &parts, path)? {
            SrcAt::Dir { fd, .. } => return Ok(Self::Dir(fd)),
            SrcAt::Entry { parent, name } => (parent, name),
            SrcAt::Remote { .. } => {
                return Err(Error::Usage(format!(
                    "{}: internal: a local source resolved as a remote one",
                    path.display()
                )))
            }
        };
        // Opened only as the regular file it is (see `sys::open_regular`): a FIFO, device
        // or symlink at the name, there all along or put there since the source was
        // resolved, is refused unopened. O_NOATIME where the agent may.
        let flags = libc::O_RDONLY | libc::O_NOCTTY | libc::O_NOATIME;
        match sys::open_regular(parent.as_fd(), &name, flags)
            .map_err(|e| beneath::classify(e, path))?
        {
            sys::Opened::Open(fd, _) => Ok(Self::File(fd)),
            sys::Opened::Other(st) => Err(not_a_top(path, &st)),
        }
    }
}

/// Why `path` (of stat `st`) cannot be a [`SourceTop`].
fn not_a_top(path: &Path, st: &Stat) -> Error {
    let what = match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR | libc::S_IFBLK => "a device",
        libc::S_IFDIR => "a directory now (it changed while it was opened)",
        _ => "not a regular file",
    };
    Error::Usage(format!(
        "{} is {what}; the source of a copy between nodes must be a directory or a regular file",
        path.display()
    ))
}
