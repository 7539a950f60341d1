//! What callers outside the engine may ask of a volume they hold open: which filesystem it
//! is, how much room it has, a flush, and a file of Ferry's own in it opened safely. Safe
//! wrappers, so `sys` stays private.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys;

/// The device number of the filesystem `fd` is on: volumes with the same one share a flush.
pub fn device(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(sys::fstat(fd)?.st_dev)
}

/// Whether `fd` is a directory.
pub fn is_dir(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(sys::fstat(fd)?.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// Bytes available to an unprivileged writer on the filesystem of `fd`.
pub fn free_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    sys::free_bytes(fd)
}

/// ramfs's `f_type` (linux/magic.h; the libc crate does not name it).
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Whether the filesystem of `fd` keeps its files in memory (tmpfs, ramfs): the pages
/// written there are charged to the writer's memory cgroup and cannot be reclaimed, so a
/// copy into it counts against the agent's memory limit.
pub fn in_memory(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let t = sys::fs_type(fd)?;
    #[allow(clippy::unnecessary_cast)] // TMPFS_MAGIC is i64 on x86_64, not on every target
    Ok(t == libc::TMPFS_MAGIC as i64 || t == RAMFS_MAGIC)
}

/// Flush the whole filesystem of `fd` to stable storage (`syncfs`). A failure is final:
/// the kernel may have dropped the dirty pages it could not write.
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    sys::syncfs(fd)
}

/// Open the file at `path` in a tenant's volume (e.g. in `.ferry/`, reached through a
/// directory descriptor's `/proc/self/fd` path) to read it, only if it is a regular file:
/// a symlink at the name is not followed, and a device, FIFO or socket is never opened
/// (it is checked through an `O_PATH` descriptor first, then opened through that very
/// descriptor: nothing swapped in meanwhile is opened either). `Ok(None)`: something
/// other than a regular file has the name. The file comes with its length.
pub fn open_regular_to_read(path: &Path) -> io::Result<Option<(File, u64)>> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    Ok(match sys::open_regular_path(&c, libc::O_RDONLY, false)? {
        sys::Opened::Open(fd, st) => Some((File::from(fd), st.st_size as u64)),
        sys::Opened::Other(_) => None,
    })
}

/// Create a device node `name` in the directory `dir` (block or character, device number
/// `rdev`, mode 0600), as the copy of one does. Only `ferry-agent confinement` calls it, to
/// show that the agent may create a node it may not open.
pub fn make_device_node(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    block: bool,
    rdev: u64,
) -> io::Result<()> {
    let kind = if block { libc::S_IFBLK } else { libc::S_IFCHR };
    sys::mknodat(dir, name, kind | 0o600, rdev)
}

/// The calls a copy makes that a container runtime's seccomp profile could refuse, each
/// made once on two scratch files in `dir` (removed after): the answer of each, `Ok` or
/// the kernel's error. Only `ferry-agent confinement` calls it. A profile refuses with
/// EPERM; another error means the call reached the filesystem, which declined it (FICLONE
/// on tmpfs: EOPNOTSUPP).
pub fn probe_calls(dir: BorrowedFd<'_>) -> Vec<(&'static str, io::Result<()>)> {
    let pid = sys::getpid();
    let (a, b, c) = (
        name(&format!(".ferry-probe-{pid}-a")),
        name(&format!(".ferry-probe-{pid}-b")),
        name(&format!(".ferry-probe-{pid}-c")),
    );
    let mut out = Vec::new();
    out.push((
        "openat2",
        sys::openat2_beneath(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY).map(drop),
    ));
    let create = |n: &std::ffi::CStr| {
        sys::openat(
            dir,
            n,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )
    };
    match (create(&a), create(&b)) {
        (Ok(fa), Ok(fb)) => {
            use std::os::fd::AsFd;
            let (fa, fb) = (fa.as_fd(), fb.as_fd());
            let data = [0x5au8; 4096];
            out.push(("pwrite64", sys::pwrite(fa, &data, 0).map(drop)));
            out.push((
                "copy_file_range",
                sys::copy_file_range(fa, 0, fb, 0, data.len()).map(drop),
            ));
            out.push(("ioctl(FICLONE)", sys::ficlone(fb, fa)));
            out.push(("fadvise64", sys::fadvise_dontneed(fa)));
            out.push(("fsetxattr", sys::fsetxattr(fa, c"user.ferry-probe", b"1")));
            out.push(("fdatasync", sys::fdatasync(fa)));
            out.push(("syncfs", sys::syncfs(dir)));
            out.push((
                "open(O_TMPFILE)",
                sys::open_tmpfile(dir, libc::O_RDWR, 0o600).map(drop),
            ));
            out.push(("renameat2", sys::renameat(dir, &b, dir, &c, true)));
        }
        (Err(e), _) | (_, Err(e)) => out.push(("openat(O_CREAT)", Err(e))),
    }
    for n in [&a, &b, &c] {
        let _ = sys::unlinkat(dir, n, false);
    }
    out
}

/// A name we made (no NUL in it).
fn name(s: &str) -> CString {
    CString::new(s).expect("a name without NUL")
}
