//! Shared helpers for the engine's tests, and (included by path) the agent's black-box tests
//! of `ferry-agent copy`: build source trees (through libc where std cannot: FIFOs,
//! devices, xattrs, ns timestamps, paths longer than PATH_MAX), compare two trees
//! completely, mount a FUSE source whose reads fail, and read manifests.
//!
//! Trees are walked through directory fds (`openat`/`fstatat`), so paths of any length and
//! names of any bytes work. A source tree is snapshotted *before* the copy (the copy reads
//! the source and so may move its atimes); the destination is snapshotted after it and
//! compared with that snapshot, then file contents are compared byte by byte.

// Raw libc calls here: chmod, mknod, mkfifo and geteuid to build test trees, independent of the engine.
#![allow(unsafe_code)]
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// The engine's options as they were when these tests were written: `Options::default()`
/// with verification off. Verification is on by default now (a CopyJob's default), and a
/// hash forces the user-space read/write path, which would take the kernel's copy paths
/// (reflink, `copy_file_range`, chunks) these tests exercise out of them. Tests about
/// verification set it themselves.
pub fn unverified() -> ferry_engine::Options {
    ferry_engine::Options {
        verify: ferry_engine::Verify::None,
        ..ferry_engine::Options::default()
    }
}

// ---------------------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------------------

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True when the test may go on; otherwise prints why it is skipped.
pub fn require_root(what: &str) -> bool {
    if is_root() {
        true
    } else {
        eprintln!("skipped: {what} needs root (euid 0)");
        false
    }
}

/// The path of `tool` on PATH, if it is installed.
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let extra = [PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")];
    std::env::split_paths(&path)
        .chain(extra)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// True when every tool is installed; otherwise prints which one is missing.
pub fn require_tools(tools: &[&str]) -> bool {
    for t in tools {
        if which(t).is_none() {
            eprintln!("skipped: `{t}` is not installed");
            return false;
        }
    }
    true
}

/// Run a helper command (mkfs, mount, setfacl...) and fail with its output if it fails.
pub fn sh(program: &str, args: &[&OsStr]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {:?} failed ({}): {}{}",
            args,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A mounted filesystem, unmounted (and its loop device released) on drop.
pub struct Mount {
    pub dir: PathBuf,
}

impl Mount {
    /// `mount -t tmpfs -o size=SIZE tmpfs DIR` (root only).
    pub fn tmpfs(dir: &Path, size: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        sh(
            "mount",
            &[
                "-t".as_ref(),
                "tmpfs".as_ref(),
                "-o".as_ref(),
                format!("size={size},mode=0755").as_ref(),
                "tmpfs".as_ref(),
                dir.as_os_str(),
            ],
        )?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Give this tmpfs a new size (`mount -o remount,size=SIZE`), e.g. to free space.
    pub fn resize(&self, size: &str) -> Result<()> {
        let opts = format!("remount,size={size}");
        sh(
            "mount",
            &["-o".as_ref(), opts.as_ref(), self.dir.as_os_str()],
        )?;
        Ok(())
    }

    /// `mount -o loop IMAGE DIR`.
    pub fn loop_image(image: &Path, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        sh(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_os_str(),
                dir.as_os_str(),
            ],
        )?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }
}

impl Mount {
    /// `mount -o OPTIONS DEVICE DIR` (a block device's filesystem, e.g. a [`Loop`]'s).
    pub fn device(dev: &Path, dir: &Path, options: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        sh(
            "mount",
            &[
                "-o".as_ref(),
                options.as_ref(),
                dev.as_os_str(),
                dir.as_os_str(),
            ],
        )?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }
}

/// A loop device over a file (`losetup --find --show`), detached on drop.
pub struct Loop {
    pub dev: PathBuf,
}

impl Loop {
    pub fn over(file: &Path) -> Result<Loop> {
        let out = sh(
            "losetup",
            &["--find".as_ref(), "--show".as_ref(), file.as_os_str()],
        )?;
        Ok(Loop {
            dev: PathBuf::from(out.trim()),
        })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = sh("losetup", &["-d".as_ref(), self.dev.as_os_str()]);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if sh("umount", &[self.dir.as_os_str()]).is_err() {
            let _ = sh("umount", &["-l".as_ref(), self.dir.as_os_str()]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Building trees
// ---------------------------------------------------------------------------------------

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL bytes")
}

pub fn cname(name: &[u8]) -> CString {
    CString::new(name).expect("name without NUL bytes")
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A path from raw bytes (names need not be UTF-8).
pub fn bytes_path(base: &Path, name: &[u8]) -> PathBuf {
    base.join(OsStr::from_bytes(name))
}

pub fn write(path: &Path, data: &[u8]) -> Result<()> {
    std::fs::write(path, data).with_context(|| format!("write {}", path.display()))
}

pub fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("mkdir {}", path.display()))
}

pub fn symlink(target: impl AsRef<Path>, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target.as_ref(), link)
        .with_context(|| format!("symlink {}", link.display()))
}

/// `chmod` (follows links; never call it on a symlink).
pub fn chmod(path: &Path, mode: u32) -> Result<()> {
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::chmod(cpath(path).as_ptr(), mode as libc::mode_t) })
        .with_context(|| format!("chmod {:o} {}", mode, path.display()))?;
    Ok(())
}

pub fn lchown(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
        .with_context(|| format!("lchown {}", path.display()))
}

/// Set atime and mtime (seconds, nanoseconds) without following a final symlink.
pub fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> Result<()> {
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    cvt(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            cpath(path).as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .with_context(|| format!("utimensat {}", path.display()))?;
    Ok(())
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> Result<()> {
    let n = cname(name.as_bytes());
    // SAFETY: valid strings and a value buffer of the given length.
    cvt(unsafe {
        libc::lsetxattr(
            cpath(path).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .with_context(|| format!("setxattr {name} on {}", path.display()))?;
    Ok(())
}

/// The value of extended attribute `name` of `path` (not following a symlink), `None` when
/// it has none of that name.
pub fn get_xattr(path: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let n = cname(name.as_bytes());
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid strings and a buffer of the given length.
    let got = unsafe {
        libc::lgetxattr(
            cpath(path).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if got < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODATA) {
            return Ok(None);
        }
        return Err(e).with_context(|| format!("getxattr {name} on {}", path.display()));
    }
    buf.truncate(got as usize);
    Ok(Some(buf))
}

pub fn mkfifo(path: &Path, mode: u32) -> Result<()> {
    // SAFETY: valid path.
    cvt(unsafe { libc::mkfifo(cpath(path).as_ptr(), mode as libc::mode_t) })
        .with_context(|| format!("mkfifo {}", path.display()))?;
    Ok(())
}

/// `mknod` of a character (`'c'`) or block (`'b'`) device (root only).
pub fn mknod(path: &Path, kind: char, mode: u32, major: u32, minor: u32) -> Result<()> {
    let fmt = if kind == 'b' {
        libc::S_IFBLK
    } else {
        libc::S_IFCHR
    };
    let dev = libc::makedev(major, minor);
    // SAFETY: valid path.
    cvt(unsafe { libc::mknod(cpath(path).as_ptr(), fmt | mode as libc::mode_t, dev) })
        .with_context(|| format!("mknod {}", path.display()))?;
    Ok(())
}

/// A bound unix socket left on disk (the listener is closed; the inode stays).
pub fn unix_socket(path: &Path) -> Result<()> {
    let l = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("bind {}", path.display()))?;
    drop(l);
    Ok(())
}

/// A tree with everything `cp -a` keeps, each in a form that is easy to get wrong: setuid,
/// setgid and sticky modes and a 0555 directory, owners other than the copier's (as root),
/// nanosecond times on files, directories, symlinks and a FIFO, user xattrs and POSIX ACLs
/// (access and default), a hard link group spanning directories, symlinks verbatim
/// (absolute, dangling, `..`), a FIFO and (as root) a character device, a sparse file, an
/// empty file and directory, and names with a newline, invalid UTF-8 and 255 bytes. Times
/// are set last, directories bottom-up, so building the tree does not move them.
pub fn adversarial_tree(root: &Path) -> Result<()> {
    let root_user = is_root();
    mkdir(&root.join("modes/ro"))?;
    mkdir(&root.join("links/a/deep"))?;
    mkdir(&root.join("links/b"))?;
    mkdir(&root.join("specials"))?;
    mkdir(&root.join("names"))?;
    mkdir(&root.join("empty/dir"))?;
    for (name, mode) in [("setuid", 0o4755), ("setgid", 0o2750), ("plain", 0o640)] {
        write(&root.join("modes").join(name), name.as_bytes())?;
        chmod(&root.join("modes").join(name), mode)?;
    }
    mkdir(&root.join("modes/sticky"))?;
    chmod(&root.join("modes/sticky"), 0o1777)?;
    write(&root.join("modes/ro/inside"), b"under a 0555 directory")?;
    write(&root.join("empty/file"), b"")?;
    write_pattern_file(&root.join("links/a/deep/data"), 300_000)?;
    std::fs::hard_link(root.join("links/a/deep/data"), root.join("links/b/same"))
        .context("hard link")?;
    std::fs::hard_link(root.join("links/a/deep/data"), root.join("links/third"))
        .context("hard link")?;
    symlink("/etc/passwd", &root.join("links/absolute"))?;
    symlink("nowhere/at/all", &root.join("links/dangling"))?;
    symlink("../modes/plain", &root.join("links/up"))?;
    mkfifo(&root.join("specials/fifo"), 0o620)?;
    if root_user {
        mknod(&root.join("specials/null"), 'c', 0o666, 1, 3)?;
    }
    // Sparse: 8 MiB with data only at 0, 3 MiB and the last 4 KiB.
    {
        let f = File::create(root.join("sparse")).context("create sparse")?;
        f.set_len(8 << 20)?;
        use std::os::unix::fs::FileExt;
        f.write_all_at(&pattern(0, 4096), 0)?;
        f.write_all_at(&pattern(3 << 20, 65536), 3 << 20)?;
        f.write_all_at(&pattern((8 << 20) - 4096, 4096), (8 << 20) - 4096)?;
    }
    write(&bytes_path(&root.join("names"), b"new\nline"), b"1")?;
    write(&bytes_path(&root.join("names"), b"bad\xff\xfeutf8"), b"2")?;
    write(&bytes_path(&root.join("names"), &[b'n'; 255]), b"3")?;
    write(&root.join("names/-dash and space"), b"4")?;
    set_xattr(&root.join("modes/plain"), "user.team", b"storage")?;
    set_xattr(&root.join("links/a"), "user.dir", b"yes")?;
    if which("setfacl").is_some() {
        let acl = |args: &[&str], p: &Path| -> Result<()> {
            let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
            all.push(p.as_os_str());
            sh("setfacl", &all).map(|_| ())
        };
        acl(&["-m", "u:4242:rw"], &root.join("modes/plain"))?;
        acl(&["-d", "-m", "g:4243:rx"], &root.join("links"))?;
    }
    if root_user {
        lchown(&root.join("modes/plain"), 4242, 4243)?;
        lchown(&root.join("links/absolute"), 4244, 4245)?;
        lchown(&root.join("specials"), 4246, 4246)?;
    }
    let mut t = 1_600_000_000i64;
    let mut stamp = |p: &Path| -> Result<()> {
        t += 1;
        set_times(p, (t, 123_456_789), (t - 86_400, 987_654_321))
    };
    for p in [
        "modes/setuid",
        "modes/plain",
        "links/a/deep/data",
        "links/absolute",
        "links/dangling",
        "specials/fifo",
        "sparse",
        "empty/file",
    ] {
        stamp(&root.join(p))?;
    }
    for d in [
        "modes/ro",
        "modes/sticky",
        "modes",
        "links/a/deep",
        "links/a",
        "links/b",
        "links",
        "specials",
        "names",
        "empty/dir",
        "empty",
    ] {
        stamp(&root.join(d))?;
    }
    // Last: a 0555 directory refuses new entries, and chmod keeps the times.
    chmod(&root.join("modes/ro"), 0o555)?;
    Ok(())
}

/// A v2 `security.capability` value (linux/capability.h `vfs_cap_data`): revision 2 with
/// the effective flag, CAP_NET_BIND_SERVICE (10) permitted, nothing inheritable.
pub const FILE_CAPS: [u8; 20] = {
    let mut v = [0u8; 20];
    let magic = 0x0200_0001u32.to_le_bytes();
    let permitted = (1u32 << 10).to_le_bytes();
    let mut i = 0;
    while i < 4 {
        v[i] = magic[i];
        v[4 + i] = permitted[i];
        i += 1;
    }
    v
};

/// Beside [`adversarial_tree`] (as root): what only a copier holding each of the agent's
/// capabilities keeps. A `trusted.*` attribute (SYS_ADMIN), file capabilities (SETFCAP),
/// a setgid file of a group the copier is not in (FSETID), a block and a character device
/// (MKNOD), a 0000 file and a 0700 directory of another user (DAC_OVERRIDE); owners and
/// times of others' files (CHOWN, FOWNER) are in the adversarial tree already.
pub fn root_only_tree(root: &Path) -> Result<()> {
    mkdir(&root.join("root-only/private"))?;
    let at = |rel: &str| root.join("root-only").join(rel);
    write(&at("trusted"), b"trusted.* needs CAP_SYS_ADMIN")?;
    set_xattr(&at("trusted"), "trusted.ferry", b"kept")?;
    write(&at("caps"), b"file capabilities")?;
    chmod(&at("caps"), 0o755)?;
    set_xattr(&at("caps"), "security.capability", &FILE_CAPS)?;
    write(&at("setgid-other-group"), b"setgid")?;
    lchown(&at("setgid-other-group"), 4242, 4243)?;
    chmod(&at("setgid-other-group"), 0o2750)?;
    mknod(&at("block"), 'b', 0o660, 7, 200)?;
    mknod(&at("char"), 'c', 0o666, 1, 3)?;
    write(&at("unreadable"), b"mode 0000")?;
    lchown(&at("unreadable"), 4242, 4243)?;
    chmod(&at("unreadable"), 0)?;
    write(
        &at("private/inside"),
        b"under another user's 0700 directory",
    )?;
    lchown(&at("private/inside"), 4244, 4244)?;
    chmod(&at("private/inside"), 0o600)?;
    lchown(&at("private"), 4244, 4244)?;
    chmod(&at("private"), 0o700)?;
    Ok(())
}

/// Position-dependent bytes: every 8-byte word holds a mix of its offset, so a chunk copied
/// to the wrong place, duplicated or dropped never compares equal.
pub fn pattern(offset: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let first_word = offset / 8;
    let skip = (offset % 8) as usize;
    let mut w = first_word;
    while v.len() < len + skip {
        let x = (w.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (w >> 7);
        v.extend_from_slice(&x.to_le_bytes());
        w += 1;
    }
    v.drain(..skip);
    v.truncate(len);
    v
}

/// xorshift64: numbers reproducible from `seed` (not 0), for sizes and choices a test
/// makes at random.
pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The tree the tests of faults between nodes and between clusters copy: 600 files of 80
/// to 320 kB (20 directories of 30) under `src`, their sizes from `next`.
pub fn write_varied_tree(src: &Path, next: &mut impl FnMut() -> u64) -> Result<()> {
    for d in 0..20 {
        let dir = src.join(format!("d{d}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..30 {
            let len = 80_000 + next() % 240_000;
            write_pattern_file(&dir.join(format!("f{f}")), len)?;
        }
    }
    Ok(())
}

/// Write `len` bytes of [`pattern`] to a new file.
pub fn write_pattern_file(path: &Path, len: u64) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(4 << 20) as usize;
        f.write_all(&pattern(off, n))?;
        off += n as u64;
    }
    Ok(())
}

/// `mkdirat`/`openat` chain: create `depth` nested directories named `name` under `root`,
/// each holding a file `f` with its level number, without ever passing a long path to the
/// kernel (so the total may exceed PATH_MAX). Returns the byte length of the deepest
/// directory's path relative to `root`.
pub fn build_deep_tree(root: &Path, name: &[u8], depth: usize) -> Result<usize> {
    let n = cname(name);
    let f = cname(b"f");
    let mut dir = open_dir(root)?;
    let mut rel_len = 0usize;
    for level in 0..depth {
        // SAFETY: live descriptor, NUL-terminated name.
        cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), n.as_ptr(), 0o755) })
            .with_context(|| format!("mkdirat at level {level}"))?;
        let next = openat(
            dir.as_fd(),
            &n,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .with_context(|| format!("open level {level}"))?;
        rel_len += name.len() + usize::from(level > 0);
        let file = openat(
            next.as_fd(),
            &f,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )?;
        File::from(file).write_all(format!("level {level}\n").as_bytes())?;
        dir = next;
    }
    Ok(rel_len)
}

// ---------------------------------------------------------------------------------------
// Reading trees
// ---------------------------------------------------------------------------------------

pub fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    // SAFETY: live descriptor and NUL-terminated name.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: the kernel just returned this new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open for reading without moving atime when we may (owner or CAP_FOWNER).
fn open_noatime_at(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    match openat(dir, name, flags | libc::O_NOATIME, 0) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => openat(dir, name, flags, 0),
        r => r,
    }
}

pub fn open_dir(path: &Path) -> Result<OwnedFd> {
    let c = cpath(path);
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: valid path.
    let fd = match cvt(unsafe { libc::open(c.as_ptr(), flags | libc::O_NOATIME) }) {
        // SAFETY: valid path.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            cvt(unsafe { libc::open(c.as_ptr(), flags) })
        }
        r => r,
    }
    .with_context(|| format!("open directory {}", path.display()))?;
    // SAFETY: new descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn lstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: live descriptor, NUL-terminated name, writable stat.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: as in lstatat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: live descriptor, writable stat.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `lstat` of a path (follows nothing at the end).
pub fn lstat(path: &Path) -> Result<libc::stat> {
    // SAFETY: as in lstatat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and writable stat.
    cvt(unsafe { libc::lstat(cpath(path).as_ptr(), &mut st) })
        .with_context(|| format!("lstat {}", path.display()))?;
    Ok(st)
}

fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: the kernel writes at most buf.len() bytes.
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(buf);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// Every name in a directory except `.` and `..`.
pub fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    // A second descriptor for fdopendir to own (it shares the open file description).
    // SAFETY: live descriptor.
    let dup = cvt(unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: `dup` is ours; on success fdopendir takes it over.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `dup` is still ours to close.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // SAFETY: `d` is a live DIR stream.
    unsafe { libc::rewinddir(d) };
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is a live DIR stream.
        let ent = unsafe { libc::readdir64(d) };
        if ent.is_null() {
            // SAFETY: errno is thread-local.
            let errno = unsafe { *libc::__errno_location() };
            break if errno == 0 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(errno))
            };
        }
        // SAFETY: d_name is NUL-terminated inside the entry readdir returned.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: `d` is live and closed once.
    unsafe { libc::closedir(d) };
    result.map(|()| names)
}

fn xattr_list(path: &CStr, fd: Option<BorrowedFd<'_>>) -> io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let list = |buf: &mut [u8]| -> isize {
        match fd {
            // SAFETY: the kernel writes at most buf.len() bytes (0 = size query).
            Some(fd) => unsafe {
                libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
            },
            // SAFETY: as above.
            None => unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) },
        }
    };
    let size = list(&mut []);
    if size < 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENOTSUP)) {
            return Ok(out);
        }
        return Err(e);
    }
    let mut names = vec![0u8; size as usize + 256];
    let n = list(&mut names);
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    names.truncate(n as usize);
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = cname(name);
        let get = |buf: &mut [u8]| -> isize {
            match fd {
                // SAFETY: the kernel writes at most buf.len() bytes.
                Some(fd) => unsafe {
                    libc::fgetxattr(
                        fd.as_raw_fd(),
                        cn.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                },
                // SAFETY: as above.
                None => unsafe {
                    libc::lgetxattr(
                        path.as_ptr(),
                        cn.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                },
            }
        };
        let size = get(&mut []);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut value = vec![0u8; size as usize];
        let n = get(&mut value);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        value.truncate(n as usize);
        out.insert(name.to_vec(), value);
    }
    Ok(out)
}

/// xattrs of `dir/name`, read through `/proc/self/fd` so deep paths work, never
/// following a final symlink and never opening the entry (FIFOs, devices).
fn xattrs_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    p.extend_from_slice(name.to_bytes());
    xattr_list(&cname(&p), None)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Char,
    Block,
}

impl Kind {
    fn of(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::Char,
            _ => Kind::Block,
        }
    }
}

/// Everything a user could observe about one entry, by `lstat` and xattr calls.
#[derive(Debug, Clone)]
pub struct Meta {
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub nlink: u64,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub rdev: u64,
    /// (st_dev, st_ino): the hard-link identity.
    pub inode: (u64, u64),
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Symlink target, as bytes.
    pub target: Option<Vec<u8>>,
}

fn meta_of(st: &libc::stat, xattrs: BTreeMap<Vec<u8>, Vec<u8>>, target: Option<Vec<u8>>) -> Meta {
    Meta {
        kind: Kind::of(st.st_mode),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        nlink: st.st_nlink,
        atime: (st.st_atime, st.st_atime_nsec),
        mtime: (st.st_mtime, st.st_mtime_nsec),
        rdev: st.st_rdev,
        inode: (st.st_dev, st.st_ino),
        xattrs,
        target,
    }
}

/// A tree as seen through `lstat`: relative path bytes (`""` is the root) → metadata.
#[derive(Debug, Clone)]
pub struct Tree {
    pub root: PathBuf,
    pub entries: BTreeMap<Vec<u8>, Meta>,
}

impl Tree {
    pub fn get(&self, rel: &[u8]) -> Option<&Meta> {
        self.entries.get(rel)
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.entries.values().filter(|m| m.kind == kind).count()
    }

    /// Regular files, each inode counted once.
    pub fn distinct_files(&self) -> usize {
        self.entries
            .values()
            .filter(|m| m.kind == Kind::File)
            .map(|m| m.inode)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Sets of paths sharing one inode (only sets of two or more).
    pub fn link_groups(&self) -> BTreeSet<Vec<Vec<u8>>> {
        let mut by_inode: BTreeMap<(u64, u64), Vec<Vec<u8>>> = BTreeMap::new();
        for (p, m) in &self.entries {
            if m.kind != Kind::Dir {
                by_inode.entry(m.inode).or_default().push(p.clone());
            }
        }
        by_inode
            .into_values()
            .filter(|v| v.len() > 1)
            .map(|mut v| {
                v.sort();
                v
            })
            .collect()
    }

    /// Names of staging files (`.ferry-*.tmp`) anywhere in the tree.
    pub fn staging_files(&self) -> Vec<String> {
        self.entries
            .keys()
            .filter(|p| is_staging(p))
            .map(|p| show(p))
            .collect()
    }
}

pub fn is_staging(rel: &[u8]) -> bool {
    let name = rel.rsplit(|&b| b == b'/').next().unwrap_or(rel);
    name.starts_with(b".ferry-") && name.ends_with(b".tmp")
}

/// A path for messages, quoted, with control and non-ASCII bytes escaped.
pub fn show(p: &[u8]) -> String {
    let escaped: String = p
        .iter()
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    if escaped.len() > 120 {
        // Deep paths: the start and the end say enough.
        let head: String = escaped.chars().take(50).collect();
        let tail: Vec<char> = escaped.chars().rev().take(50).collect();
        let tail: String = tail.into_iter().rev().collect();
        return format!("\"{head}...{tail}\" ({} bytes)", p.len());
    }
    format!("\"{escaped}\"")
}

/// Snapshot a directory tree (the root must be a directory). Reads no file contents and
/// opens only directories, with `O_NOATIME` where allowed, so atimes stay put.
/// Every path beneath `root`, relative and `/`-separated (lossy for names that are not
/// UTF-8), directories with a trailing `/`: what a test of which entries a copy made or
/// removed compares.
pub fn names_beneath(root: &Path) -> Result<BTreeSet<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> Result<()> {
        for e in std::fs::read_dir(dir)? {
            let path = e?.path();
            let rel = String::from_utf8_lossy(path.strip_prefix(root)?.as_os_str().as_bytes())
                .into_owned();
            if path.symlink_metadata()?.is_dir() {
                out.insert(format!("{rel}/"));
                walk(root, &path, out)?;
            } else {
                out.insert(rel);
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out)?;
    Ok(out)
}

pub fn snapshot(root: &Path) -> Result<Tree> {
    let fd = open_dir(root)?;
    let st = fstat(fd.as_fd())?;
    let mut entries = BTreeMap::new();
    let xattrs = xattr_list(c"", Some(fd.as_fd())).context("xattrs of the root")?;
    entries.insert(Vec::new(), meta_of(&st, xattrs, None));
    walk(fd, &mut entries)?;
    Ok(Tree {
        root: root.to_path_buf(),
        entries,
    })
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = rel.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Depth-first, with an explicit stack: trees here are up to 1000 levels deep, too deep
/// for recursion on a test thread's stack.
fn walk(root: OwnedFd, out: &mut BTreeMap<Vec<u8>, Meta>) -> Result<()> {
    let mut stack: Vec<(Vec<u8>, OwnedFd)> = vec![(Vec::new(), root)];
    while let Some((rel, fd)) = stack.pop() {
        let dir = fd.as_fd();
        let names = list_dir(dir).with_context(|| format!("list {}", show(&rel)))?;
        for name in names {
            let path = join(&rel, name.to_bytes());
            let st = lstatat(dir, &name).with_context(|| format!("lstat {}", show(&path)))?;
            let kind = Kind::of(st.st_mode);
            let target = if kind == Kind::Symlink {
                Some(readlinkat(dir, &name).with_context(|| format!("readlink {}", show(&path)))?)
            } else {
                None
            };
            let xattrs =
                xattrs_at(dir, &name).with_context(|| format!("xattrs of {}", show(&path)))?;
            out.insert(path.clone(), meta_of(&st, xattrs, target));
            if kind == Kind::Dir {
                let sub = open_noatime_at(
                    dir,
                    &name,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                )
                .with_context(|| format!("open {}", show(&path)))?;
                stack.push((path, sub));
            }
        }
    }
    Ok(())
}

/// Open `root/rel` one component at a time (no PATH_MAX limit, no symlink followed).
pub fn open_rel(root: &Path, rel: &[u8], flags: libc::c_int) -> Result<OwnedFd> {
    let mut dir = open_dir(root)?;
    let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let f = if last {
            flags | libc::O_NOFOLLOW
        } else {
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW
        };
        let next = open_noatime_at(dir.as_fd(), &cname(part), f)
            .with_context(|| format!("open {} under {}", show(rel), root.display()))?;
        if last {
            return Ok(next);
        }
        dir = next;
    }
    bail!("empty relative path")
}

/// Read until `buf` is full or the file ends.
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Compare two files byte by byte; `Err` describes the first difference.
pub fn compare_files(a: OwnedFd, b: OwnedFd) -> Result<()> {
    let (mut a, mut b) = (File::from(a), File::from(b));
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let na = read_full(&mut a, &mut ba)?;
        let nb = read_full(&mut b, &mut bb)?;
        if ba[..na] != bb[..nb] {
            let i = ba[..na.min(nb)]
                .iter()
                .zip(&bb[..na.min(nb)])
                .position(|(x, y)| x != y)
                .unwrap_or(na.min(nb));
            bail!(
                "contents differ at byte {} (lengths read here: {na} vs {nb})",
                off + i as u64
            );
        }
        if na == 0 {
            return Ok(());
        }
        off += na as u64;
    }
}

/// The bytes of a (small) file under `root`, by relative path.
pub fn read_rel(root: &Path, rel: &[u8]) -> Result<Vec<u8>> {
    let mut f = File::from(open_rel(root, rel, libc::O_RDONLY)?);
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// What [`compare`] checks; all on by default.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub mode: bool,
    pub owner: bool,
    pub mtime: bool,
    /// atime of files, directories and special files (a symlink's atime moves when
    /// anyone reads the link, so it is never compared).
    pub atime: bool,
    pub xattrs: bool,
    pub links: bool,
    /// Compare the root directory's own metadata (off when merging into an existing one).
    pub root_meta: bool,
    /// Destination blocks may exceed the source's by at most this many 512-byte blocks;
    /// `None` skips the check (filesystems with speculative preallocation).
    pub blocks_slack: Option<u64>,
    pub contents: bool,
}

impl Default for Check {
    fn default() -> Self {
        Self {
            mode: true,
            owner: true,
            mtime: true,
            atime: true,
            xattrs: true,
            links: true,
            root_meta: true,
            blocks_slack: Some(512),
            contents: true,
        }
    }
}

/// Compare the bytes of every regular file both trees have, walking them side by side
/// through directory fds (opening by relative path would cost O(depth) per file).
fn compare_contents(
    src: &Tree,
    dst: &Tree,
    dst_root: &Path,
    diffs: &mut Vec<String>,
) -> Result<()> {
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let mut stack = vec![(Vec::new(), open_dir(&src.root)?, open_dir(dst_root)?)];
    while let Some((rel, s, d)) = stack.pop() {
        for name in list_dir(s.as_fd())? {
            let path = join(&rel, name.to_bytes());
            let (Some(sm), Some(dm)) = (src.entries.get(&path), dst.entries.get(&path)) else {
                continue;
            };
            match (sm.kind, dm.kind) {
                (Kind::File, Kind::File) => {
                    let flags = libc::O_RDONLY | libc::O_NOFOLLOW;
                    let a = open_noatime_at(s.as_fd(), &name, flags)
                        .with_context(|| format!("open source {}", show(&path)))?;
                    let b = open_noatime_at(d.as_fd(), &name, flags)
                        .with_context(|| format!("open destination {}", show(&path)))?;
                    if let Err(e) = compare_files(a, b) {
                        diffs.push(format!("{}: {e}", show(&path)));
                    }
                }
                (Kind::Dir, Kind::Dir) => {
                    let a = open_noatime_at(s.as_fd(), &name, dir_flags)?;
                    let b = open_noatime_at(d.as_fd(), &name, dir_flags)?;
                    stack.push((path, a, b));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Compare the source snapshot `src` (taken before the copy) with the tree at `dst` now,
/// and the bytes of every regular file in `src.root` and `dst`. Lists every difference.
pub fn compare(src: &Tree, dst: &Path, check: Check) -> Result<Tree> {
    let got = snapshot(dst)?;
    let mut diffs = Vec::new();
    let src_keys: BTreeSet<&Vec<u8>> = src.entries.keys().collect();
    let dst_keys: BTreeSet<&Vec<u8>> = got.entries.keys().collect();
    for p in src_keys.difference(&dst_keys) {
        diffs.push(format!("missing in destination: {}", show(p)));
    }
    for p in dst_keys.difference(&src_keys) {
        diffs.push(format!("extra in destination: {}", show(p)));
    }
    for (p, s) in &src.entries {
        let Some(d) = got.entries.get(p) else {
            continue;
        };
        let name = if p.is_empty() {
            "<root>".to_string()
        } else {
            show(p)
        };
        let mut diff = |what: &str, a: String, b: String| {
            diffs.push(format!("{name}: {what}: source {a}, destination {b}"))
        };
        if s.kind != d.kind {
            diff("type", format!("{:?}", s.kind), format!("{:?}", d.kind));
            continue;
        }
        if p.is_empty() && !check.root_meta {
            continue;
        }
        if check.mode && s.kind != Kind::Symlink && s.mode != d.mode {
            diff("mode", format!("{:04o}", s.mode), format!("{:04o}", d.mode));
        }
        if check.owner && (s.uid, s.gid) != (d.uid, d.gid) {
            diff(
                "owner",
                format!("{}:{}", s.uid, s.gid),
                format!("{}:{}", d.uid, d.gid),
            );
        }
        if check.mtime && s.mtime != d.mtime {
            diff("mtime", format!("{:?}", s.mtime), format!("{:?}", d.mtime));
        }
        if check.atime && s.kind != Kind::Symlink && s.atime != d.atime {
            diff("atime", format!("{:?}", s.atime), format!("{:?}", d.atime));
        }
        if check.xattrs && s.xattrs != d.xattrs {
            diff(
                "xattrs",
                format!("{:?}", s.xattrs),
                format!("{:?}", d.xattrs),
            );
        }
        if s.kind == Kind::File && s.size != d.size {
            diff("size", s.size.to_string(), d.size.to_string());
        }
        if s.target != d.target {
            diff(
                "symlink target",
                format!("{:?}", s.target.as_deref().map(show)),
                format!("{:?}", d.target.as_deref().map(show)),
            );
        }
        if matches!(s.kind, Kind::Char | Kind::Block) && s.rdev != d.rdev {
            diff("rdev", format!("{:x}", s.rdev), format!("{:x}", d.rdev));
        }
        if let (Some(slack), Kind::File) = (check.blocks_slack, s.kind) {
            if d.blocks > s.blocks + slack {
                diff(
                    "allocated 512-byte blocks (holes filled?)",
                    s.blocks.to_string(),
                    d.blocks.to_string(),
                );
            }
        }
    }
    if check.links {
        let (a, b) = (src.link_groups(), got.link_groups());
        if a != b {
            let fmt = |g: &BTreeSet<Vec<Vec<u8>>>| {
                g.iter()
                    .map(|v| v.iter().map(|p| show(p)).collect::<Vec<_>>().join(" = "))
                    .collect::<Vec<_>>()
            };
            diffs.push(format!(
                "hard-link groups differ: source {:?}, destination {:?}",
                fmt(&a),
                fmt(&b)
            ));
        }
    }
    if check.contents {
        compare_contents(src, &got, dst, &mut diffs)?;
    }
    if !diffs.is_empty() {
        let n = diffs.len();
        diffs.truncate(60);
        bail!(
            "{} differs from {} in {n} ways:\n  {}",
            dst.display(),
            src.root.display(),
            diffs.join("\n  ")
        );
    }
    Ok(got)
}

/// Staging entries (`.ferry-*.tmp`) left anywhere under `dst` (which may be a partial
/// tree, or missing) or next to it: a new destination tree is staged in its parent.
pub fn staging_leftovers(dst: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    if let Some(parent) = dst.parent().filter(|p| p.is_dir()) {
        for e in std::fs::read_dir(parent)? {
            let name = e?.file_name();
            if is_staging(name.as_bytes()) {
                found.push(parent.join(name).display().to_string());
            }
        }
    }
    if std::fs::symlink_metadata(dst).is_ok_and(|m| m.is_dir()) {
        found.extend(snapshot(dst)?.staging_files());
    }
    Ok(found)
}

/// A temporary directory on the disk-backed filesystem the tests otherwise use; mode 0755
/// so an unprivileged child can reach inside.
pub fn tempdir() -> Result<tempfile::TempDir> {
    let t = tempfile::Builder::new().prefix("ferry-test-").tempdir()?;
    chmod(t.path(), 0o755)?;
    Ok(t)
}

/// A temporary directory on tmpfs (`/dev/shm`), if there is one.
pub fn shm_tempdir() -> Option<tempfile::TempDir> {
    let t = tempfile::Builder::new()
        .prefix("ferry-test-")
        .tempdir_in("/dev/shm")
        .ok()?;
    chmod(t.path(), 0o755).ok()?;
    Some(t)
}

/// The filesystem type magic of `path` (statfs f_type).
pub fn fs_type(path: &Path) -> Result<i64> {
    // SAFETY: an all-zero statfs is a valid value of this C struct.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and writable buffer.
    cvt(unsafe { libc::statfs(cpath(path).as_ptr(), &mut s) })
        .with_context(|| format!("statfs {}", path.display()))?;
    Ok(s.f_type as i64)
}

pub const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Watches paths for any open or read (inotify), to prove the copy never opened them.
pub struct OpenWatch {
    fd: OwnedFd,
    names: BTreeMap<i32, PathBuf>,
}

impl OpenWatch {
    pub fn new(paths: &[&Path]) -> Result<Self> {
        // SAFETY: plain syscall.
        let fd = cvt(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        // SAFETY: new descriptor from the kernel.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut names = BTreeMap::new();
        for p in paths {
            // IN_DONT_FOLLOW: watch a symlink itself, not its target.
            // SAFETY: live descriptor and valid path.
            let wd = cvt(unsafe {
                libc::inotify_add_watch(
                    fd.as_raw_fd(),
                    cpath(p).as_ptr(),
                    libc::IN_OPEN | libc::IN_ACCESS | libc::IN_MODIFY | libc::IN_DONT_FOLLOW,
                )
            })
            .with_context(|| format!("inotify watch {}", p.display()))?;
            names.insert(wd, p.to_path_buf());
        }
        Ok(Self { fd, names })
    }

    /// The watched paths that were opened, read or written since `new`.
    pub fn touched(&self) -> Vec<PathBuf> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut out = BTreeSet::new();
        loop {
            // SAFETY: the kernel writes at most buf.len() bytes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            let mut off = 0usize;
            let n = n as usize;
            let hdr = std::mem::size_of::<libc::inotify_event>();
            while off + hdr <= n {
                // SAFETY: the kernel wrote a whole inotify_event header at `off`.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
                if let Some(p) = self.names.get(&ev.wd) {
                    if ev.mask & (libc::IN_OPEN | libc::IN_ACCESS | libc::IN_MODIFY) != 0 {
                        out.insert(p.clone());
                    }
                }
                off += hdr + ev.len as usize;
            }
        }
        out.into_iter().collect()
    }
}

// ---------------------------------------------------------------------------------------
// A FUSE source whose reads fail (tests/fuse/eiofs.py)
// ---------------------------------------------------------------------------------------

/// The eiofs script: a read-only passthrough where `bad-*` files always fail to read with
/// EIO and `flaky-*` files fail through their first open only.
/// Its text, not its path: this file is also compiled into the agent's tests, whose
/// `CARGO_MANIFEST_DIR` is another directory. Run with `python3 -c`.
pub const EIOFS: &str = include_str!("../fuse/eiofs.py");

const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// A mounted eiofs, unmounted (and its process reaped) on drop.
pub struct FuseMount {
    pub dir: PathBuf,
    child: std::process::Child,
}

impl FuseMount {
    /// Mount eiofs of `root` at `dir`. `Ok(None)` (after printing why) where FUSE cannot
    /// be used here: not root, no /dev/fuse, no fusermount3, no python3-fusepy, or the
    /// mount refused.
    pub fn eiofs(root: &Path, dir: &Path) -> Result<Option<Self>> {
        Self::eiofs_with(root, dir, false)
    }

    /// `eiofs`, with `direct_io`: reads bypass the page cache and reach eiofs even past a
    /// file's size (its `endless-*` files then read as size 0 and never end).
    pub fn eiofs_with(root: &Path, dir: &Path, direct_io: bool) -> Result<Option<Self>> {
        if !require_root("mounting a FUSE filesystem") || !require_tools(&["fusermount3"]) {
            return Ok(None);
        }
        if !Path::new("/dev/fuse").exists() {
            eprintln!("skipped: /dev/fuse does not exist");
            return Ok(None);
        }
        let python = Path::new("/usr/bin/python3");
        let has_fusepy = Command::new(python)
            .args(["-c", "import fusepy"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_fusepy {
            eprintln!(
                "skipped: /usr/bin/python3 cannot import fusepy (apt install python3-fusepy)"
            );
            return Ok(None);
        }
        mkdir(dir)?;
        let log = dir.with_extension("log");
        let child = Command::new(python)
            .arg("-c")
            .arg(EIOFS)
            .arg(root)
            .arg(dir)
            .args(direct_io.then_some("--direct-io"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .context("start eiofs")?;
        let mut mount = Self {
            dir: dir.to_path_buf(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if fs_type(dir).ok() == Some(FUSE_SUPER_MAGIC) {
                return Ok(Some(mount));
            }
            if let Some(status) = mount.child.try_wait()? {
                let why = std::fs::read_to_string(&log).unwrap_or_default();
                eprintln!("skipped: eiofs could not mount ({status}): {why}");
                return Ok(None);
            }
            if Instant::now() > deadline {
                bail!("eiofs did not mount {} within 10 s", dir.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if sh("fusermount3", &["-u".as_ref(), self.dir.as_os_str()]).is_err() {
            let _ = sh("umount", &["-l".as_ref(), self.dir.as_os_str()]);
        }
        // Our own child, by its id: it exits once unmounted.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Four directories `d0..d3/inner` of four 200 KiB files each (3.2 MiB), the directories
/// with their own mode and times: a tree that cannot fit in a 1 MiB tmpfs.
pub fn more_than_a_megabyte(src: &Path) -> Result<()> {
    for d in 0..4 {
        let dir = src.join(format!("d{d}/inner"));
        mkdir(&dir)?;
        for i in 0..4u64 {
            write_pattern_file(&dir.join(format!("f{i}")), 200 * 1024 + i)?;
        }
        chmod(&dir, 0o751)?;
        set_times(&dir, (1_400_000_000, 1), (1_300_000_000, 2))?;
    }
    Ok(())
}

/// Normal, flaky (EIO through the first open) and bad (EIO always) files, in two levels.
pub fn eio_tree(base: &Path) -> Result<()> {
    mkdir(&base.join("sub"))?;
    for (i, dir) in [base.to_path_buf(), base.join("sub")].iter().enumerate() {
        for f in 0..4u64 {
            write_pattern_file(&dir.join(format!("normal-{f}")), 1000 + f * 70_000)?;
        }
        write_pattern_file(&dir.join("flaky-1"), 150_000 + i as u64)?;
        write_pattern_file(&dir.join(format!("bad-{i}")), 4096)?;
        set_times(&dir.join("flaky-1"), (1_500_000_000, 1), (1_400_000_000, 2))?;
    }
    write(&base.join("flaky-empty"), b"")?;
    Ok(())
}

/// `eio_tree` at `dir/base`, served through eiofs at `dir/mnt`: the tree's path and the
/// mount, or `None` where FUSE is unavailable (`FuseMount::eiofs` has said why; skip).
pub fn eio_source(dir: &Path) -> Result<Option<(PathBuf, FuseMount)>> {
    let base = dir.join("base");
    eio_tree(&base)?;
    Ok(FuseMount::eiofs(&base, &dir.join("mnt"))?.map(|mnt| (base, mnt)))
}

/// Compare what was copied from an eiofs mount with the directory under it: every file but
/// the bad ones, byte for byte, with its mode and mtime; no bad file under its final name.
pub fn check_eio_copy(base: &Path, dst: &Path) -> Result<()> {
    let want = snapshot(base)?;
    let got = snapshot(dst)?;
    // The top itself is left out: merged into, it keeps its own metadata.
    for (p, m) in want.entries.iter().filter(|(p, _)| !p.is_empty()) {
        let name = p.rsplit(|&b| b == b'/').next().unwrap_or(p);
        if name.starts_with(b"bad-") {
            ensure!(got.get(p).is_none(), "{} exists in the copy", show(p));
            continue;
        }
        let g = got
            .get(p)
            .ok_or_else(|| anyhow::anyhow!("{} was not copied", show(p)))?;
        ensure!(
            (g.kind, g.mode, g.mtime) == (m.kind, m.mode, m.mtime),
            "{}: {g:?} vs {m:?}",
            show(p)
        );
        if m.kind == Kind::File {
            ensure!(
                read_rel(dst, p)? == read_rel(base, p)?,
                "{} differs",
                show(p)
            );
        }
    }
    ensure!(staging_leftovers(dst)?.is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Manifests and staging names
// ---------------------------------------------------------------------------------------

pub fn manifest_lines(manifest: &Path) -> Result<Vec<String>> {
    Ok(std::fs::read_to_string(manifest)?
        .lines()
        .map(str::to_string)
        .collect())
}

/// Names starting `.ferry-` anywhere under `dir` (and `dir` itself).
pub fn ferry_names(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().as_bytes().starts_with(b".ferry-") {
            out.push(e.path());
        }
        if e.path().symlink_metadata()?.is_dir() {
            ferry_names(&e.path(), out)?;
        }
    }
    Ok(())
}

/// Paths listed in a manifest, with how often.
pub fn manifest_counts(manifest: &Path) -> Result<BTreeMap<Vec<u8>, usize>> {
    let text = std::fs::read(manifest).with_context(|| format!("read {}", manifest.display()))?;
    let mut seen = BTreeMap::new();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        // A name with a newline is escaped, the line marked by a leading backslash.
        let line = line.strip_prefix(b"\\").unwrap_or(line);
        ensure!(
            line.len() > 34 && &line[32..34] == b"  ",
            "bad manifest line {}",
            show(line)
        );
        *seen.entry(line[34..].to_vec()).or_insert(0) += 1;
    }
    Ok(seen)
}

pub fn xxh128sum_check(dst: &Path, manifest: &Path) -> Result<()> {
    if which("xxh128sum").is_none() {
        eprintln!("note: xxh128sum is not installed; the manifest is checked by counts only");
        return Ok(());
    }
    let out = Command::new("xxh128sum")
        .arg("-c")
        .arg("--quiet")
        .arg(manifest)
        .current_dir(dst)
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        out.status.success(),
        "xxh128sum -c rejects the manifest: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
