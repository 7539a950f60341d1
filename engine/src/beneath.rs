//! Paths that tenants name inside roots that admins name, resolved: the agent opens each
//! root's directory, and every path inside it is resolved from that fd with `openat2`
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`. No component may be a
//! symlink (in the source or the destination, at any depth), `..` cannot climb out, and a
//! kernel without `openat2` gets a refusal, never a weaker walk. This is the fix kubelet
//! adopted for its subPath CVEs (resolve from a trusted fd, refuse symlinks) applied to
//! both ends of a copy, which are opened here (`api` copies between them), and to the
//! roots themselves and Ferry's state directory in them.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::ends::{DstAt, SrcAt};
use crate::{sys, Error, Reason};

fn refused(reason: Reason, message: String) -> Error {
    Error::Refused { reason, message }
}

/// The components of a tenant's relative path: no absolute path, no `..`, no NUL, and
/// `""` or `"."` for the root itself.
pub fn check_relative(path: &Path) -> Result<Vec<&[u8]>, Error> {
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(refused(
            Reason::PathEscape,
            format!("{:?} contains a NUL byte", path),
        ));
    }
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n.as_bytes()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(refused(
                    Reason::PathEscape,
                    format!(
                        "{} is absolute; paths inside a root are relative",
                        path.display()
                    ),
                ))
            }
            Component::ParentDir => {
                return Err(refused(
                    Reason::PathEscape,
                    format!("{} has a '..' component", path.display()),
                ))
            }
        }
    }
    Ok(parts)
}

fn join(parts: &[&[u8]]) -> CString {
    // Components come from check_relative: no NUL inside.
    CString::new(parts.join(&b'/')).unwrap_or_default()
}

/// Open `parts` (relative to `root`) with openat2, naming the failure the way a user can act
/// on: escape, symlink, kernel too old. Flags without `O_PATH` or `O_DIRECTORY` (which open
/// nothing, or refuse anything but a directory before opening it) open only a regular file
/// or a directory: the path is opened `O_PATH` first, and anything else there (a device, a
/// FIFO) is refused unopened (see `sys::open_regular`).
fn open_in(
    root: BorrowedFd<'_>,
    parts: &[&[u8]],
    flags: libc::c_int,
    shown: &Path,
) -> Result<OwnedFd, Error> {
    if flags & (libc::O_PATH | libc::O_DIRECTORY) == 0 {
        let path = open_in(root, parts, libc::O_PATH, shown)?;
        return match sys::opened_if(path, flags, true).map_err(|e| Error::io("open", shown, e))? {
            sys::Opened::Open(fd, _) => Ok(fd),
            sys::Opened::Other(_) => Err(Error::io(
                "open",
                shown,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "neither a regular file nor a directory (Ferry opens nothing else)",
                ),
            )),
        };
    }
    if parts.is_empty() {
        // The root itself.
        let fd = sys::openat(root, c".", flags | libc::O_NOFOLLOW, 0)
            .map_err(|e| Error::io("open", shown, e))?;
        return Ok(fd);
    }
    sys::openat2_beneath(root, &join(parts), flags).map_err(|e| {
        // With O_DIRECTORY the kernel may answer ENOTDIR for a symlinked component: find
        // out which it was, for the message (the open has already failed safely).
        if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) {
            if let Some(at) = first_symlink(root, parts) {
                return refused(
                    Reason::SymlinkRejected,
                    format!(
                        "{}: {at} is a symlink; Ferry never follows symlinks inside a root (name the real path)",
                        shown.display()
                    ),
                );
            }
        }
        classify(e, shown)
    })
}

/// The first component of `parts` that is a symlink, as a path from the root.
fn first_symlink(root: BorrowedFd<'_>, parts: &[&[u8]]) -> Option<String> {
    for i in 0..parts.len() {
        let parent = if i == 0 {
            sys::openat(root, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0).ok()?
        } else {
            sys::openat2_beneath(root, &join(&parts[..i]), libc::O_RDONLY | libc::O_DIRECTORY)
                .ok()?
        };
        let name = CString::new(parts[i]).ok()?;
        let st = sys::lstatat(parent.as_fd(), &name).ok()?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Some(String::from_utf8_lossy(&parts[..=i].join(&b'/')).into_owned());
        }
    }
    None
}

pub(crate) fn classify(e: io::Error, shown: &Path) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => refused(
            Reason::SymlinkRejected,
            format!(
                "{}: a component is a symlink; Ferry never follows symlinks inside a root (name the real path)",
                shown.display()
            ),
        ),
        Some(libc::EXDEV) => refused(
            Reason::PathEscape,
            format!("{} resolves outside its root", shown.display()),
        ),
        Some(libc::ENOSYS) => refused(
            Reason::Openat2Unavailable,
            format!(
                "{}: this kernel has no openat2 (Linux 5.6+), which Ferry needs to resolve paths inside a root safely; the copy is refused rather than done without it",
                shown.display()
            ),
        ),
        _ => Error::io("open", shown, e),
    }
}

/// Open `path` inside `root` as the agent resolves a tenant's path: checked by
/// [`check_relative`], then one `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS` (a symlink as the last component is refused too). `flags` are
/// `open(2)` flags, e.g. `O_PATH`.
pub fn resolve_beneath(
    root: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
) -> Result<OwnedFd, Error> {
    let parts = check_relative(path)?;
    let flags = if names_a_directory(path) {
        flags | libc::O_DIRECTORY
    } else {
        flags
    };
    open_in(root, &parts, flags, path)
}

/// A trailing `/` or `/.` says "a directory", as it does to the kernel: `file/` is not
/// `file`, and `link/` would follow the link.
fn names_a_directory(path: &Path) -> bool {
    let b = path.as_os_str().as_bytes();
    b.ends_with(b"/") || b.ends_with(b"/.")
}

/// Open a root's directory by its absolute host path (from a StorageRoot or a volume: an
/// admin's or the kubelet's path, never a tenant's), inside `host_root` (where the node's
/// filesystem is mounted in the agent's container). Symlinks on the way are allowed, as
/// they are on the host, but resolved as if `host_root` were `/` (`RESOLVE_IN_ROOT`), so
/// none leads out of the node's filesystem into the container's.
pub fn open_host_path(host_root: BorrowedFd<'_>, path: &str) -> Result<OwnedFd, Error> {
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let c = CString::new(rel)
        .map_err(|_| refused(Reason::PathEscape, format!("{path:?} contains a NUL byte")))?;
    sys::openat2(
        host_root,
        &c,
        libc::O_RDONLY | libc::O_DIRECTORY,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSYS) => classify(e, Path::new(path)),
        _ => Error::io("open root", path, e),
    })
}

/// Whether the directory `fd` (from [`open_host_path`]) is a mount's root: a volume the
/// kubelet mounted there, not the empty directory under it, which is on the node's own disk
/// before the mount and after it is gone. Asked of the descriptor that is then served, so
/// no unmount in between goes unseen.
pub fn is_mount_root(fd: BorrowedFd<'_>) -> std::io::Result<bool> {
    sys::is_mount_root(fd)?.ok_or_else(|| {
        std::io::Error::other("this kernel does not say whether a directory is a mount's root (statx STATX_ATTR_MOUNT_ROOT, Linux 5.8)")
    })
}

/// The destination root's `.ferry` directory (manifests, resume state), created if missing;
/// a symlink planted at that name is refused.
pub fn state_dir(dst_root: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Error> {
    make_dirs_in(dst_root, &[name.as_bytes()], Path::new(name))
}

/// Create the directories of `parts` that do not exist yet, each with `mkdirat` in its
/// parent's fd (so nothing is created through a symlink), and return the last one.
fn make_dirs_in(root: BorrowedFd<'_>, parts: &[&[u8]], shown: &Path) -> Result<OwnedFd, Error> {
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY;
    let mut dir = open_in(root, &[], dir_flags, shown)?;
    for (i, part) in parts.iter().enumerate() {
        let name = CString::new(*part).unwrap_or_default();
        match sys::mkdirat(dir.as_fd(), &name, 0o755) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(Error::io("create directory", shown, e)),
        }
        let sofar: PathBuf = parts[..=i]
            .iter()
            .map(|p| std::ffi::OsStr::from_bytes(p))
            .collect();
        dir = match sys::openat2_beneath(dir.as_fd(), &name, dir_flags) {
            Ok(fd) => fd,
            Err(e) => {
                // ENOTDIR or ELOOP on a name that is a symlink: say so.
                let is_link = sys::lstatat(dir.as_fd(), &name)
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK);
                if is_link {
                    return Err(refused(
                        Reason::SymlinkRejected,
                        format!(
                            "{}: {} is a symlink; Ferry never creates or writes through symlinks inside a root",
                            shown.display(),
                            sofar.display()
                        ),
                    ));
                }
                return Err(classify(e, &sofar));
            }
        };
    }
    Ok(dir)
}

/// A copy's source at `parts` (from [`check_relative`] of `path`) inside `root`: a
/// directory, or an entry of its parent directory. A symlink anywhere on the way, its last
/// component included, is refused.
pub(crate) fn open_source_in(
    root: BorrowedFd<'_>,
    parts: &[&[u8]],
    path: &Path,
) -> Result<SrcAt, Error> {
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY;
    match open_in(root, parts, dir_flags | libc::O_NOATIME, path).or_else(|e| {
        match e {
            // O_NOATIME is refused on files of other owners without CAP_FOWNER.
            Error::Io { ref source, .. } if source.raw_os_error() == Some(libc::EPERM) => {
                open_in(root, parts, dir_flags, path)
            }
            other => Err(other),
        }
    }) {
        Ok(fd) => {
            let st = sys::fstat(fd.as_fd()).map_err(|e| Error::io("stat source", path, e))?;
            Ok(SrcAt::Dir { fd, st })
        }
        Err(Error::Io { ref source, .. })
            if source.raw_os_error() == Some(libc::ENOTDIR) && !names_a_directory(path) =>
        {
            let Some((name, parent)) = parts.split_last() else {
                // The root itself is not a directory.
                return Err(Error::io(
                    "open source",
                    path,
                    io::Error::from_raw_os_error(libc::ENOTDIR),
                ));
            };
            let parent = open_in(root, parent, dir_flags, path)?;
            let name = CString::new(*name).unwrap_or_default();
            let st = sys::lstatat(parent.as_fd(), &name)
                .map_err(|e| Error::io("stat source", path, e))?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                return Err(refused(
                        Reason::SymlinkRejected,
                        format!(
                            "{} is a symlink; Ferry never follows symlinks inside a root (name the real path)",
                            path.display()
                        ),
                    ));
            }
            Ok(SrcAt::Entry { parent, name })
        }
        Err(e) => Err(e),
    }
}

/// A copy's destination at `parts` (from [`check_relative`] of `shown`) inside `root`: the
/// root itself, or a name in a parent made inside the root (see [`make_dirs_in`] and
/// [`dst_entry`]).
pub(crate) fn open_destination_in(
    root: BorrowedFd<'_>,
    parts: &[&[u8]],
    shown: &Path,
) -> Result<DstAt, Error> {
    match parts.split_last() {
        None => Ok(DstAt::Dir(open_in(
            root,
            &[],
            libc::O_RDONLY | libc::O_DIRECTORY,
            shown,
        )?)),
        Some((name, parent)) => {
            let parent = make_dirs_in(root, parent, shown)?;
            let name = CString::new(*name).unwrap_or_default();
            dst_entry(parent, name, shown)
        }
    }
}

/// What is at `name` in `parent`, never following a symlink there.
fn dst_entry(parent: OwnedFd, name: CString, shown: &Path) -> Result<DstAt, Error> {
    let st = match sys::lstatat(parent.as_fd(), &name) {
        Ok(st) => st,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            return Ok(DstAt::Entry {
                parent,
                name,
                exists: false,
            })
        }
        Err(e) => return Err(Error::io("stat destination", shown, e)),
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => {
            let fd = sys::openat2_beneath(parent.as_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY)
                .map_err(|e| classify(e, shown))?;
            Ok(DstAt::Dir(fd))
        }
        libc::S_IFLNK => Err(refused(
            Reason::SymlinkRejected,
            format!(
                "{} is a symlink; Ferry never writes through links: remove it or choose another destination",
                shown.display()
            ),
        )),
        _ => Ok(DstAt::Entry {
            parent,
            name,
            exists: true,
        }),
    }
}
