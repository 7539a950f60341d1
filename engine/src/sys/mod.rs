//! Every libc call the engine makes, and the only module with `unsafe`.
//!
//! One small safe function per system call: `-1` becomes an `io::Error`, and calls whose
//! "not supported here" answers the caller falls back on return that as a value (the xcp
//! `libfs/src/linux.rs` shape). Nothing here decides policy.

#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

pub use libc::stat as Stat;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        // A non-negative ssize_t always fits in usize.
        Ok(ret as usize)
    }
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: `fd` was just returned by the kernel as a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)`.
pub fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string and `dir` a live descriptor.
    owned(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })
}

/// An unnamed regular file in `dir` (`O_TMPFILE`): it has no name until [`link_fd`] gives
/// it one, so a crash mid-copy leaves nothing behind and no reader can see it partial.
/// Filesystems without support answer EOPNOTSUPP (or EISDIR on old kernels).
pub fn open_tmpfile(dir: BorrowedFd<'_>, access: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    openat(dir, c".", libc::O_TMPFILE | access, mode)
}

/// Give the unnamed file `fd` the name `dir/name` (fails with EEXIST if it is taken).
/// `AT_EMPTY_PATH` needs CAP_DAC_READ_SEARCH; without it the `/proc/self/fd` link does the
/// same for the owner of the descriptor.
pub fn link_fd(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid descriptors; an empty NUL-terminated path with AT_EMPTY_PATH names `fd`.
    let ret = unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    match cvt(ret) {
        Err(e)
            if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::EPERM) =>
        {
            let proc_path =
                CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|_| e)?;
            // SAFETY: valid descriptor and NUL-terminated paths.
            cvt(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr(),
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })
            .map(drop)
        }
        other => other.map(drop),
    }
}

/// Open one entry of `dir` without following a symlink at any step: `openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` where the kernel has it
/// (5.6+), `openat` with `O_NOFOLLOW` otherwise. For the single-component names a directory
/// listing yields the two are equivalent; `openat2` also refuses a name that would climb
/// out (`..`, or one with a `/`), whatever the caller passes.
pub fn open_beneath(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match openat2_beneath(dir, name, flags) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed)
            }
            other => return other,
        }
    }
    openat(dir, name, flags | libc::O_NOFOLLOW, 0)
}

/// `open(path)` for the top-level paths the user named (relative to the working directory).
pub fn open(path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated string.
    owned(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })
}

/// Create the regular file `path` with `mode` (`O_CREAT | O_EXCL | O_NOFOLLOW`): EEXIST
/// whatever has the name, a symlink or a device included, which is never opened.
pub fn create(path: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `path` is a valid NUL-terminated string; the mode is passed as open(2)'s
    // variadic argument, as an unsigned int.
    owned(unsafe { libc::open(path.as_ptr(), flags, mode as libc::c_uint) })
}

/// Open again, with `flags`, the file that `fd` (an `O_PATH` descriptor) refers to, through
/// its `/proc/self/fd` link: the kernel follows that link to the very inode `fd` holds, so
/// the open cannot land on whatever has taken the name since. `O_NOFOLLOW` is dropped (the
/// link is what is followed). Without `/proc` it fails with a message that says so.
pub fn reopen(fd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<OwnedFd> {
    // "/proc/self/fd/" and the number, written without allocating (one open per file).
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut buf = [0u8; PREFIX.len() + 11];
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut n = fd.as_raw_fd().unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let end = PREFIX.len() + digits.len() - at;
    buf[PREFIX.len()..end].copy_from_slice(&digits[at..]);
    let flags = flags & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL);
    // The number alone, in the process's own /proc/self/fd held open: one lookup instead
    // of the walk through /proc and its `self` link (a fifth of the reopen, measured).
    let (path, name) = (&buf[..=end], &buf[PREFIX.len()..=end]);
    let opened = match proc_self_fd() {
        Some(dir) => CStr::from_bytes_with_nul(name)
            .map_err(io::Error::other)
            .and_then(|name| openat(dir, name, flags, 0)),
        None => CStr::from_bytes_with_nul(path)
            .map_err(io::Error::other)
            .and_then(|path| open(path, flags)),
    };
    opened.map_err(|e| match e.raw_os_error() {
        // The descriptor is live, so its link exists: /proc is what is missing.
        Some(libc::ENOENT) => io::Error::other(
            "/proc is not mounted: Ferry opens a tenant's files through /proc/self/fd, so that it only ever opens regular files and directories",
        ),
        _ => e,
    })
}

/// This process's `/proc/self/fd`, opened once; `None` without /proc, or in a child forked
/// since (where the descriptor still shows its parent's descriptors). A fork handler marks
/// the child, instead of a `getpid` on every reopen: that was one system call a file.
fn proc_self_fd() -> Option<BorrowedFd<'static>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DIR: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    static FORKED: AtomicBool = AtomicBool::new(false);
    extern "C" fn forked() {
        FORKED.store(true, Ordering::Relaxed);
    }
    let dir = DIR
        .get_or_init(|| {
            // SAFETY: the child handler only stores to an atomic (async-signal-safe). Its
            // failure (ENOMEM) leaves no handler: then a forked child that reopens through
            // this descriptor would see its parent's table, so give up the shortcut.
            if unsafe { libc::pthread_atfork(None, None, Some(forked)) } != 0 {
                return None;
            }
            open(c"/proc/self/fd", libc::O_RDONLY | libc::O_DIRECTORY).ok()
        })
        .as_ref()?;
    (!FORKED.load(Ordering::Relaxed)).then(|| dir.as_fd())
}

pub fn getpid() -> u32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// What [`open_regular`] found at a name.
#[derive(Debug)]
pub enum Opened {
    /// A regular file (or, for [`open_regular_or_dir`], a directory), opened with the
    /// flags asked for; and its stat.
    Open(OwnedFd, Stat),
    /// Anything else (a device, FIFO, socket or symlink), never opened: its own stat.
    Other(Stat),
}

/// Open entry `name` of `dir` for reading or writing only if it is a regular file, with no
/// window for a swap: the name is opened `O_PATH | O_NOFOLLOW` beneath `dir` (which opens
/// nothing: no driver's open runs, no FIFO waits, and a symlink is the link itself),
/// `fstat` says what that is, and only a regular file is opened for real, by [`reopen`]
/// through the `O_PATH` descriptor. A device node, whose mere open can act (a watchdog
/// reboots the node when closed without its magic byte), is never opened; nor is
/// anything swapped in at the name meanwhile. `O_NOATIME` in `flags` is dropped when the
/// kernel refuses it (EPERM: another owner's file without CAP_FOWNER).
pub fn open_regular(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<Opened> {
    opened_if(open_beneath(dir, name, libc::O_PATH)?, flags, false)
}

/// [`open_regular`], for a regular file or a directory.
pub fn open_regular_or_dir(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
) -> io::Result<Opened> {
    opened_if(open_beneath(dir, name, libc::O_PATH)?, flags, true)
}

/// [`open_regular`] for a path a user or the agent names (resolved as `open(2)` resolves
/// it, except that a symlink as its last component is not followed); `dirs`: a directory
/// is opened too.
pub fn open_regular_path(path: &CStr, flags: libc::c_int, dirs: bool) -> io::Result<Opened> {
    opened_if(open(path, libc::O_PATH | libc::O_NOFOLLOW)?, flags, dirs)
}

/// Open the regular file at `path` ([`open_regular_path`]), or create it with `mode` when
/// nothing has the name: never a device or FIFO planted there, never through a symlink.
pub fn create_or_open_regular(path: &CStr, flags: libc::c_int, mode: u32) -> io::Result<Opened> {
    // A name that appears between the look and the create is looked at again (a few
    // times: someone creating and removing it in a loop gets the last error).
    let mut tries = 0;
    loop {
        match open_regular_path(path, flags, false) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            other => return other,
        }
        match create(path, flags, mode) {
            Ok(fd) => {
                let st = fstat(fd.as_fd())?;
                return Ok(Opened::Open(fd, st));
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && tries < 3 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The second half of the `open_regular` family: what `path` (an `O_PATH` descriptor) is,
/// and for a regular file (or a directory, with `dirs`) its reopening with `flags`.
pub fn opened_if(path: OwnedFd, flags: libc::c_int, dirs: bool) -> io::Result<Opened> {
    let st = fstat(path.as_fd())?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFDIR if dirs => {}
        _ => return Ok(Opened::Other(st)),
    }
    let fd = match reopen(path.as_fd(), flags) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && flags & libc::O_NOATIME != 0 => {
            reopen(path.as_fd(), flags & !libc::O_NOATIME)
        }
        other => other,
    }?;
    Ok(Opened::Open(fd, st))
}

/// `openat2(dir, path, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`:
/// a multi-component relative path that can neither leave `dir` nor pass a symlink.
/// ENOSYS (kernel < 5.6) is returned as is; callers refuse rather than weaken.
pub fn openat2_beneath(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    openat2(
        dir,
        path,
        flags | libc::O_NOFOLLOW,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    )
}

/// `openat2(dir, path, {flags, resolve})` (Linux 5.6+; ENOSYS before). `O_CLOEXEC` is added.
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
    resolve: u64,
) -> io::Result<OwnedFd> {
    // `struct open_how` (linux/openat2.h); libc's is non-exhaustive, so mirror it here.
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: `how` is a fully initialised open_how whose size we pass; `path` is NUL-terminated.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    owned(ret as libc::c_int)
}

/// A stat with every field zero, to fill in from a record (an entry on another node).
pub fn zeroed_stat() -> Stat {
    // SAFETY: `struct stat` is plain integers (and padding): all zeros is a valid value.
    unsafe { std::mem::zeroed() }
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut st = MaybeUninit::<Stat>::uninit();
    // SAFETY: `st` points to writable memory of the right size; the kernel fills it on success.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so `st` is initialised.
    Ok(unsafe { st.assume_init() })
}

/// Whether `fd` is the root of a mount (`statx`'s `STATX_ATTR_MOUNT_ROOT`): a directory
/// something is mounted on, not the directory under it. `None` where the kernel does not
/// say (before Linux 5.8).
pub fn is_mount_root(fd: BorrowedFd<'_>) -> io::Result<Option<bool>> {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: an empty path with AT_EMPTY_PATH names `fd` itself; `stx` is writable memory
    // of the right size, which the kernel fills on success.
    cvt(unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            0,
            stx.as_mut_ptr(),
        )
    })?;
    // SAFETY: statx succeeded (and the buffer was zeroed before).
    let stx = unsafe { stx.assume_init() };
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Ok((stx.stx_attributes_mask & bit != 0).then_some(stx.stx_attributes & bit != 0))
}

/// Bytes available to an unprivileged writer on the filesystem of `fd` (`fstatvfs`'s
/// `f_bavail`), for "how much more space is needed" messages.
pub fn free_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `st` points to writable memory of the right size; the kernel fills it on success.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded, so `st` is initialised.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: never follows a final symlink.
pub fn lstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    let mut st = MaybeUninit::<Stat>::uninit();
    // SAFETY: valid string and output buffer; see fstat.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded.
    Ok(unsafe { st.assume_init() })
}

/// `stat` or `lstat` of a user-named path.
pub fn stat_path(path: &CStr, follow: bool) -> io::Result<Stat> {
    let mut st = MaybeUninit::<Stat>::uninit();
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: valid string and output buffer; see fstat.
    cvt(unsafe { libc::fstatat(libc::AT_FDCWD, path.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded.
    Ok(unsafe { st.assume_init() })
}

/// One `getdents64` call into `buf`; 0 means the end of the directory.
pub fn getdents64(dir: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    cvt_size(ret as libc::ssize_t)
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid descriptor and NUL-terminated name.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, dev: u64) -> io::Result<()> {
    // SAFETY: valid descriptor and NUL-terminated name.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, dev) })
        .map(drop)
}

pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated; `dir` is live.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `readlinkat`, growing the buffer until the whole target fits.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<CString> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let n = cvt_size(unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })?;
        if n < buf.len() {
            buf.truncate(n);
            // A link target never contains NUL.
            return CString::new(buf).map_err(|_| io::Error::from(io::ErrorKind::InvalidData));
        }
        buf.resize(buf.len() * 2, 0);
    }
}

pub fn linkat(
    old_dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
) -> io::Result<()> {
    // SAFETY: valid descriptors and NUL-terminated names; flags 0 never follows `old`.
    cvt(unsafe {
        libc::linkat(
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            0,
        )
    })
    .map(drop)
}

/// `renameat2`; `no_replace` selects `RENAME_NOREPLACE` (fails with EEXIST instead of replacing).
pub fn renameat(
    dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
    no_replace: bool,
) -> io::Result<()> {
    let flags = if no_replace {
        libc::RENAME_NOREPLACE
    } else {
        0
    };
    // SAFETY: valid descriptors and NUL-terminated names.
    cvt(unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid descriptor and NUL-terminated name.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `ioctl(dst, FICLONE, src)`: share all of `src`'s extents with `dst`.
pub fn ficlone(dst: BorrowedFd<'_>, src: BorrowedFd<'_>) -> io::Result<()> {
    // FICLONE = _IOW(0x94, 9, int); not exported by the libc crate on every target.
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: FICLONE takes the source descriptor by value; both descriptors are live.
    cvt(unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE, src.as_raw_fd()) }).map(drop)
}

/// `copy_file_range` with explicit offsets (so parallel chunks never share a file position).
pub fn copy_file_range(
    src: BorrowedFd<'_>,
    off_in: u64,
    dst: BorrowedFd<'_>,
    off_out: u64,
    len: usize,
) -> io::Result<usize> {
    let mut off_in = off_in as libc::loff_t;
    let mut off_out = off_out as libc::loff_t;
    // SAFETY: the offsets are valid pointers to locals; no buffer memory is involved.
    cvt_size(unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut off_in,
            dst.as_raw_fd(),
            &mut off_out,
            len,
            0,
        )
    })
}

/// `lseek(SEEK_DATA)` / `lseek(SEEK_HOLE)`; `Ok(None)` when there is no data at or after `off`.
pub fn seek_data_or_hole(fd: BorrowedFd<'_>, off: u64, data: bool) -> io::Result<Option<u64>> {
    let whence = if data {
        libc::SEEK_DATA
    } else {
        libc::SEEK_HOLE
    };
    // SAFETY: plain integer arguments.
    let ret = unsafe { libc::lseek(fd.as_raw_fd(), off as libc::off_t, whence) };
    if ret == -1 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(err)
        };
    }
    Ok(Some(ret as u64))
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    cvt_size(unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            off as libc::off_t,
        )
    })
}

pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], off: u64) -> io::Result<usize> {
    // SAFETY: the kernel reads at most `buf.len()` bytes from `buf`.
    cvt_size(unsafe {
        libc::pwrite(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            off as libc::off_t,
        )
    })
}

pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }).map(drop)
}

pub fn fdatasync(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain integer argument.
    cvt(unsafe { libc::fdatasync(fd.as_raw_fd()) }).map(drop)
}

/// Write back every dirty page and inode of the filesystem `fd` is on (`syncfs`).
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain integer argument.
    cvt(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// Drop `fd`'s clean pages from the page cache, so the next read comes from the medium.
pub fn fadvise_dontneed(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain integer arguments. posix_fadvise returns the error number instead of -1.
    match unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) }).map(drop)
}

/// `fchownat(AT_SYMLINK_NOFOLLOW)`: changes a symlink itself, never its target.
pub fn lchownat(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid descriptor and NUL-terminated name.
    cvt(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) }).map(drop)
}

/// `fchmodat` for entries we cannot open (FIFOs, devices, sockets); never used on symlinks.
pub fn fchmodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid descriptor and NUL-terminated name.
    cvt(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, 0) })
        .map(drop)
}

fn timespecs(st: &Stat) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ]
}

/// Set atime and mtime (nanoseconds) of `fd` to those in `st`.
pub fn futimens(fd: BorrowedFd<'_>, st: &Stat) -> io::Result<()> {
    let ts = timespecs(st);
    // SAFETY: `ts` is an array of two initialised timespecs.
    cvt(unsafe { libc::futimens(fd.as_raw_fd(), ts.as_ptr()) }).map(drop)
}

/// `utimensat(AT_SYMLINK_NOFOLLOW)`: the times of the entry itself, symlinks included.
pub fn lutimensat(dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> io::Result<()> {
    let ts = timespecs(st);
    // SAFETY: see futimens; `name` is NUL-terminated.
    cvt(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            name.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// `flistxattr`: the NUL-separated list of attribute names.
pub fn flistxattr(fd: BorrowedFd<'_>, buf: &mut Vec<u8>) -> io::Result<()> {
    loop {
        // SAFETY: a zero-size query writes nothing.
        let need = cvt_size(unsafe { libc::flistxattr(fd.as_raw_fd(), std::ptr::null_mut(), 0) })?;
        buf.resize(need, 0);
        if need == 0 {
            return Ok(());
        }
        // SAFETY: the kernel writes at most `buf.len()` bytes.
        match cvt_size(unsafe {
            libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
        }) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(());
            }
            // The list grew between the two calls: ask again.
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut Vec<u8>) -> io::Result<()> {
    loop {
        // SAFETY: a zero-size query writes nothing.
        let need = cvt_size(unsafe {
            libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), std::ptr::null_mut(), 0)
        })?;
        buf.resize(need, 0);
        // SAFETY: the kernel writes at most `buf.len()` bytes.
        match cvt_size(unsafe {
            libc::fgetxattr(
                fd.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        }) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(());
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: the kernel reads `value.len()` bytes from `value`; `name` is NUL-terminated.
    cvt(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

/// The filesystem magic (`f_type`) of the filesystem holding `fd`.
pub fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    let mut sfs = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `sfs` is writable memory of the right size.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), sfs.as_mut_ptr()) })?;
    // SAFETY: fstatfs succeeded.
    #[allow(clippy::unnecessary_cast)] // f_type is i64 on x86_64 but not on every target
    Ok(unsafe { sfs.assume_init() }.f_type as i64)
}

pub fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: getegid cannot fail.
    unsafe { libc::getegid() }
}

/// Raise the soft open-file limit to the hard limit, and return the limit now in force
/// (1024, the usual default, if it cannot be read); the pool bounds how many we use.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: `lim` is writable memory of the right size.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, lim.as_mut_ptr()) } != 0 {
        return 1024;
    }
    // SAFETY: getrlimit succeeded.
    let mut lim = unsafe { lim.assume_init() };
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is initialised. Failure only leaves the old limit in place.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    lim.rlim_cur
}

/// The process umask, read without changing it (`umask(2)` would race other threads).
pub fn current_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

mod block;
pub use block::{device_size, loop_backing, punch_hole, set_direct, AlignedBuf};

#[cfg(test)]
mod tests;
