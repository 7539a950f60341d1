//! The property behind the path fuzzer (`fuzz/`) and its exhaustive twin
//! (`path_oracle.rs`): Ferry's resolution of a tenant's path inside a root
//! (`ferry_engine::resolve_beneath`) agrees with the kernel's own `openat2` on a tree full
//! of traps, and never yields anything outside the root.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ferry_engine::{resolve_beneath, Error, Reason};

/// The kernel's own `openat2`, called directly: an oracle that shares no code with the
/// engine's private `sys` module (std has no `openat2`).
#[allow(unsafe_code)]
mod sys {
    use std::ffi::CStr;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

    pub fn openat2(
        dir: BorrowedFd<'_>,
        path: &CStr,
        flags: libc::c_int,
        resolve: u64,
    ) -> io::Result<OwnedFd> {
        // `struct open_how` (linux/openat2.h).
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
        // SAFETY: valid fd, NUL-terminated path, and `how` outlives the call with its size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd, and nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }
}

/// A root with directories, files and every kind of symlink a tenant could plant, next to
/// an `outside` directory.
pub struct Fixture {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub root_fd: OwnedFd,
}

/// Path components the fuzzer and the exhaustive test combine.
pub const TOKENS: [&str; 13] = [
    "a", "b", "f", "..", ".", "up", "abs", "in", "link", "loop", "outside", "missing", "",
];

pub fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("a/b")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("outside")).expect("mkdir");
    std::fs::write(root.join("f"), b"in").expect("write");
    std::fs::write(root.join("a/b/f"), b"in").expect("write");
    std::fs::write(dir.path().join("outside/f"), b"out").expect("write");
    let links: [(&str, &str); 6] = [
        ("a/up", "../.."),
        ("a/abs", "/etc"),
        ("a/in", "b"),
        ("link", "a"),
        ("loop", "loop"),
        ("a/outside", "../../outside"),
    ];
    for (at, to) in links {
        std::os::unix::fs::symlink(to, root.join(at)).expect("symlink");
    }
    let root_fd = OwnedFd::from(std::fs::File::open(&root).expect("open root"));
    Fixture {
        _dir: dir,
        root,
        root_fd,
    }
}

/// Turn fuzzer bytes into a path: each byte picks a token; a high bit adds a leading `/`.
pub fn path_from(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    if data.first().is_some_and(|b| b & 0x80 != 0) {
        out.push(b'/');
    }
    for (i, b) in data.iter().take(8).enumerate() {
        if i > 0 {
            out.push(b'/');
        }
        out.extend_from_slice(TOKENS[*b as usize % TOKENS.len()].as_bytes());
    }
    out
}

fn ident(fd: &OwnedFd) -> (u64, u64) {
    let st = std::fs::File::from(fd.try_clone().expect("dup"))
        .metadata()
        .expect("fstat");
    (st.dev(), st.ino())
}

fn lexically_clean(path: &[u8]) -> bool {
    !path.starts_with(b"/") && !path.contains(&0) && !path.split(|&b| b == b'/').any(|c| c == b"..")
}

/// Check one path; `Err` describes a disagreement.
pub fn check(fx: &Fixture, path: &[u8]) -> Result<(), String> {
    let shown = String::from_utf8_lossy(path).into_owned();
    let p = Path::new(std::ffi::OsStr::from_bytes(path));
    let ours = resolve_beneath(fx.root_fd.as_fd(), p, libc::O_PATH);
    let Ok(cpath) = CString::new(path) else {
        // A NUL byte: refused as an escape, before any system call.
        return match ours {
            Err(Error::Refused {
                reason: Reason::PathEscape,
                ..
            }) => Ok(()),
            other => Err(format!("{shown:?} with NUL: {other:?}")),
        };
    };
    let flags = libc::O_PATH | libc::O_NOFOLLOW;
    // The kernel, containing but allowing symlinks, and strictly.
    let contained = sys::openat2(fx.root_fd.as_fd(), &cpath, flags, libc::RESOLVE_BENEATH);
    let strict = sys::openat2(
        fx.root_fd.as_fd(),
        &cpath,
        flags,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    );
    let empty = path
        .split(|&b| b == b'/')
        .all(|c| c.is_empty() || c == b".");
    match &ours {
        Ok(fd) => {
            if !lexically_clean(path) {
                return Err(format!("{shown:?} is not clean but was resolved"));
            }
            // Inside the root, by the kernel's own account of the fd.
            let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .map_err(|e| e.to_string())?;
            if !real.starts_with(&fx.root) {
                return Err(format!(
                    "{shown:?} resolved outside the root: {}",
                    real.display()
                ));
            }
            // The same object the strict kernel walk reaches (the root for an empty path).
            if !empty {
                match &strict {
                    Ok(k) if ident(k) == ident(fd) => {}
                    other => return Err(format!("{shown:?}: ours {real:?}, kernel {other:?}")),
                }
            }
        }
        Err(e) => {
            // Anything the kernel sees escaping must be refused.
            if matches!(&contained, Err(k) if k.raw_os_error() == Some(libc::EXDEV))
                && !matches!(e, Error::Refused { .. })
            {
                return Err(format!(
                    "{shown:?} escapes but was not refused as such: {e}"
                ));
            }
            // A clean path the strict kernel walk opens must not be refused.
            if lexically_clean(path) && !empty && strict.is_ok() {
                return Err(format!("{shown:?} opens strictly but was refused: {e}"));
            }
            if let Error::Refused { reason, .. } = e {
                let expect_escape = !lexically_clean(path);
                if (*reason == Reason::PathEscape) != expect_escape
                    && !matches!(&contained, Err(k) if k.raw_os_error() == Some(libc::EXDEV))
                {
                    return Err(format!("{shown:?}: refused as {reason}"));
                }
            }
        }
    }
    Ok(())
}
