//! Mirroring: after a copy, remove from the destination what the source does not have
//! (`spec.deleteExtraneous`, the CLI's `--delete`), as rsync's `--delete-after` does.
//!
//! What it never does: leave the destination (every directory is opened from its parent's
//! descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and `O_NOFOLLOW`; a
//! symlink is removed as a link, never followed, wherever it points); enter or remove
//! Ferry's state directory at the top (`reserved_top`) or any staging name `.ferry-*.tmp`
//! (another copy may be writing it); touch what the filter does not select, unless
//! `delete_excluded`; replace an entry the source has with another type (the copy reported
//! that conflict; it is left as it is). A deletion that fails is a listed failure, and the
//! rest goes on. One thread: removals are metadata operations the filesystem serialises
//! per directory anyway.
//!
//! The source may be on another node ([`prune_from`]): each of its directories is then the
//! listing its sender gives (the names, and which are directories), asked once the
//! destination's directory is read. A listing that fails removes nothing from that
//! directory; what the sender says is bounded ([`MAX_SOURCE_NAMES`] names a directory).

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use std::collections::HashMap;

use ferry_transfer::frame::Frame;

use crate::dirent::Listing;
use crate::error::{reason_of_io, Failure};
use crate::options::Filter;
use crate::recv::Connection;
use crate::{sys, Error};

/// How many paths a dry run names (it counts all of them).
pub const LISTED: usize = 20;
/// How many failures are kept (all are counted).
const FAILURES_KEPT: usize = 1000;
/// The most names a sender's listing of one directory may give a mirror pass (what it
/// keeps of them is one map per level being walked).
const MAX_SOURCE_NAMES: usize = 4 << 20;

/// What a mirror pass may remove.
#[derive(Debug, Clone, Default)]
pub struct PruneOptions {
    /// The copy's include/exclude: what it does not select is kept (not the source's to
    /// mirror) unless `delete_excluded`.
    pub filter: Filter,
    /// Also remove what the filter does not select (rsync's `--delete-excluded`).
    pub delete_excluded: bool,
    /// Count and name what would be removed; remove nothing.
    pub dry_run: bool,
    /// A name at the top that is never touched (the agent's `.ferry` state directory).
    pub reserved_top: Option<CString>,
    /// Set from another thread to stop between entries.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Asked before each removal: once it says this copy no longer owns the destination,
    /// the pass stops and removes nothing more.
    pub fence: Option<crate::Fence>,
}

/// What a mirror pass removed (or, in a dry run, would remove).
#[derive(Debug, Default)]
pub struct Pruned {
    /// It stopped early: cancelled, or its fence said the destination is no longer its own.
    pub stopped: bool,
    /// Entries removed: every file, link, special file and directory, those inside a
    /// removed directory included.
    pub deleted: u64,
    /// The first [`LISTED`] removed (or to be removed) paths, relative to the destination;
    /// a removed directory is named once, with a trailing `/`.
    pub listed: Vec<PathBuf>,
    /// Removals that failed, with the path and the reason.
    pub failures: Vec<Failure>,
    pub failed: u64,
}

/// Mirror `src` onto `dst` (both directories): remove what `dst` has beneath it and `src`
/// lacks. Paths as the user gave them (the CLI).
pub fn prune(src: &Path, dst: &Path, opts: &PruneOptions) -> Result<Pruned, Error> {
    let dir = libc::O_RDONLY | libc::O_DIRECTORY;
    let open = |p: &Path, op| {
        let c = CString::new(p.as_os_str().as_bytes())
            .map_err(|_| Error::Usage(format!("{} contains a NUL byte", p.display())))?;
        sys::open(&c, dir).map_err(|e| Error::io(op, p, e))
    };
    prune_fds(
        open(src, "open source")?,
        open(dst, "open destination")?,
        opts,
    )
}

/// [`prune`] of `src_path` in `src_root` onto `dst_path` in `dst_root`, each resolved
/// beneath its root as the copy resolves it (the agent).
pub fn prune_beneath(
    src_root: BorrowedFd<'_>,
    src_path: &Path,
    dst_root: BorrowedFd<'_>,
    dst_path: &Path,
    opts: &PruneOptions,
) -> Result<Pruned, Error> {
    let dir = libc::O_RDONLY | libc::O_DIRECTORY;
    let src = crate::beneath::resolve_beneath(src_root, src_path, dir)?;
    let dst = crate::beneath::resolve_beneath(dst_root, dst_path, dir)?;
    prune_fds(src, dst, opts)
}

/// [`prune_beneath`] with the source on another node, served on `conn` (its top is the
/// sender's; a single file there has nothing to mirror).
pub fn prune_from(
    conn: &Arc<Connection>,
    dst_root: BorrowedFd<'_>,
    dst_path: &Path,
    opts: &PruneOptions,
) -> Result<Pruned, Error> {
    let st = conn
        .stat(&[])
        .map(|top| crate::record::stat_of(&top))
        .map_err(|e| Error::io("stat source", Path::new("(source)"), e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Ok(Pruned::default());
    }
    let dir = libc::O_RDONLY | libc::O_DIRECTORY;
    let dst = crate::beneath::resolve_beneath(dst_root, dst_path, dir)?;
    run(
        Source::Remote {
            conn,
            path: Vec::new(),
            ino: st.st_ino,
        },
        dst,
        opts,
    )
}

fn prune_fds(src: OwnedFd, dst: OwnedFd, opts: &PruneOptions) -> Result<Pruned, Error> {
    run(Source::Fd(src), dst, opts)
}

fn run(src: Source<'_>, dst: OwnedFd, opts: &PruneOptions) -> Result<Pruned, Error> {
    let mut pass = Pass {
        opts,
        fenced: false,
        out: Pruned::default(),
        buf: Vec::new(),
    };
    // Depth first, a listing at a time: what is open is one descriptor pair per level.
    pass.mirror(src, &dst, Vec::new(), true);
    pass.out.stopped = pass.stopping();
    Ok(pass.out)
}

/// A source directory of a mirror pass: open here, or on another node (its path from the
/// sender's top, and the inode its parent's listing gave, which the sender checks).
enum Source<'c> {
    Fd(OwnedFd),
    Remote {
        conn: &'c Arc<Connection>,
        path: Vec<u8>,
        ino: u64,
    },
}

/// What a source directory has, read before its destination's names are compared: its
/// descriptor, or its sender's listing (name → directory, and inode).
enum Has<'c> {
    Fd(OwnedFd),
    Listed {
        conn: &'c Arc<Connection>,
        path: Vec<u8>,
        names: HashMap<Vec<u8>, (bool, u64)>,
    },
}

/// What the source has under one name.
enum Entry<'c> {
    Missing,
    Dir(Source<'c>),
    Other,
}

impl<'c> Has<'c> {
    fn read(src: Source<'c>) -> std::io::Result<Self> {
        match src {
            Source::Fd(fd) => Ok(Has::Fd(fd)),
            Source::Remote { conn, path, ino } => {
                let names = listed(conn, &path, ino)?;
                Ok(Has::Listed { conn, path, names })
            }
        }
    }

    fn entry(&self, name: &CStr) -> std::io::Result<Entry<'c>> {
        match self {
            Has::Fd(fd) => match sys::lstatat(fd.as_fd(), name) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Entry::Missing),
                Err(e) => Err(e),
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                    sys::open_beneath(fd.as_fd(), name, flags | libc::O_NOATIME)
                        .or_else(|_| sys::open_beneath(fd.as_fd(), name, flags))
                        .map(|fd| Entry::Dir(Source::Fd(fd)))
                }
                Ok(_) => Ok(Entry::Other),
            },
            Has::Listed { conn, path, names } => Ok(match names.get(name.to_bytes()) {
                None => Entry::Missing,
                Some((true, ino)) => Entry::Dir(Source::Remote {
                    conn,
                    path: join(path, name.to_bytes()),
                    ino: *ino,
                }),
                Some((false, _)) => Entry::Other,
            }),
        }
    }
}

/// The sender's listing of directory `path` (with inode `ino`): each name, whether it is a
/// directory, and its inode; at most [`MAX_SOURCE_NAMES`] names.
fn listed(
    conn: &Arc<Connection>,
    path: &[u8],
    ino: u64,
) -> std::io::Result<HashMap<Vec<u8>, (bool, u64)>> {
    let mut req = conn.request(|req| Frame::List {
        req,
        path: path.to_vec(),
        ino,
        inline: false,
        hash: false,
        // Names and types are all a mirror needs.
        attrs: false,
    })?;
    let mut names = HashMap::new();
    loop {
        let (entries, last) = match req.next()? {
            Frame::Listing { entries, last, .. } => (entries, last),
            _ => {
                return Err(std::io::Error::other(
                    "the sender answered a listing with something else",
                ))
            }
        };
        for e in entries {
            let st = crate::record::stat_of(&e);
            names.insert(
                e.name,
                (st.st_mode & libc::S_IFMT == libc::S_IFDIR, st.st_ino),
            );
        }
        if names.len() > MAX_SOURCE_NAMES {
            return Err(std::io::Error::other(format!(
                "the sender listed more than {MAX_SOURCE_NAMES} names in one directory"
            )));
        }
        if last {
            return Ok(names);
        }
        req.send(&Frame::More { req: req.id() })?;
    }
}

struct Pass<'a> {
    opts: &'a PruneOptions,
    /// The fence said no: nothing more is removed.
    fenced: bool,
    out: Pruned,
    /// Listing buffers, one per level in use.
    buf: Vec<Vec<u8>>,
}

/// `.ferry-<tag>-<n>.tmp` and `.ferry-<tag>-d<hash>.tmp`: a copy's staging entries.
fn is_staging(name: &[u8]) -> bool {
    name.starts_with(b".ferry-") && name.ends_with(b".tmp")
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    p.extend_from_slice(rel);
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

impl Pass<'_> {
    fn stopping(&self) -> bool {
        self.fenced
            || self
                .opts
                .cancel
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn fail(&mut self, rel: &[u8], op: &'static str, e: &std::io::Error) {
        self.out.failed += 1;
        if self.out.failures.len() < FAILURES_KEPT {
            self.out.failures.push(Failure {
                path: PathBuf::from(std::ffi::OsStr::from_bytes(rel)),
                op,
                kind: reason_of_io(e),
                message: e.to_string(),
            });
        }
    }

    fn note(&mut self, rel: &[u8], dir: bool) {
        if self.out.listed.len() < LISTED {
            let mut p = rel.to_vec();
            if dir {
                p.push(b'/');
            }
            self.out
                .listed
                .push(PathBuf::from(std::ffi::OsStr::from_bytes(&p)));
        }
    }

    /// The names of a directory, read whole before anything in it is removed (removing
    /// while listing may skip entries). One level's names: bounded by that directory.
    fn names(&mut self, dir: BorrowedFd<'_>, rel: &[u8]) -> Option<Vec<CString>> {
        let mut buf = self.buf.pop().unwrap_or_default();
        if buf.is_empty() {
            buf.resize(64 * 1024, 0);
        }
        let mut names = Vec::new();
        let mut listing = Listing::new(dir, &mut buf);
        let result = loop {
            match listing.next_entry() {
                Ok(Some((name, _))) => names.push(name.to_owned()),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.buf.push(buf);
        match result {
            Ok(()) => Some(names),
            Err(e) => {
                self.fail(rel, "read directory", &e);
                None
            }
        }
    }

    /// Remove what `dst` has and `src` lacks, then go down the directories both have.
    fn mirror(&mut self, src: Source<'_>, dst: &OwnedFd, rel: Vec<u8>, top: bool) {
        // Its times as the copy left them (the source's): a removal moves its mtime, which
        // is put back once the pass is done with it, as rsync's --delete-after does.
        let times = sys::fstat(dst.as_fd()).ok();
        let deleted = self.out.deleted;
        self.mirror_dir(src, dst, &rel, top);
        if let Some(st) = times.filter(|_| self.out.deleted > deleted && !self.opts.dry_run) {
            if let Err(e) = sys::futimens(dst.as_fd(), &st) {
                self.fail(&rel, "set times", &e);
            }
        }
    }

    fn mirror_dir(&mut self, src: Source<'_>, dst: &OwnedFd, rel: &[u8], top: bool) {
        let Some(names) = self.names(dst.as_fd(), rel) else {
            return;
        };
        // Asked once the destination is read: what it lists, it has by then.
        let has = match Has::read(src) {
            Ok(has) => has,
            Err(e) => {
                self.fail(rel, "list source directory", &e);
                return;
            }
        };
        for name in names {
            if self.stopping() {
                return;
            }
            let bytes = name.to_bytes();
            if is_staging(bytes) || (top && self.opts.reserved_top.as_deref() == Some(&*name)) {
                continue;
            }
            let path = join(rel, bytes);
            let dst_st = match sys::lstatat(dst.as_fd(), &name) {
                Ok(st) => st,
                // Gone meanwhile: nothing to remove.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => {
                    self.fail(&path, "stat", &e);
                    continue;
                }
            };
            let is_dir = dst_st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if !self.opts.filter.admits(&path, is_dir) {
                if self.opts.delete_excluded {
                    self.remove(dst.as_fd(), &name, &path, is_dir, true);
                }
                continue;
            }
            match has.entry(&name) {
                Ok(Entry::Missing) => self.remove(dst.as_fd(), &name, &path, is_dir, true),
                Err(e) => self.fail(&path, "stat source", &e),
                Ok(Entry::Dir(src_child)) if is_dir => {
                    // The destination's too: listing it must not undo the atime the copy
                    // gave it (relatime moves it once, its ctime being newer).
                    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                    match sys::open_beneath(dst.as_fd(), &name, flags | libc::O_NOATIME)
                        .or_else(|_| sys::open_beneath(dst.as_fd(), &name, flags))
                    {
                        Ok(d) => self.mirror(src_child, &d, path, false),
                        Err(e) => self.fail(&path, "open directory", &e),
                    }
                }
                // The source has it (a type conflict the copy reported is left as is).
                Ok(_) => {}
            }
        }
    }

    /// Remove `name` from `dir`: a directory with everything beneath it, opened from its
    /// parent's descriptor, never through a link. `named`: listed on its own (not an entry
    /// inside a directory being removed).
    fn remove(&mut self, dir: BorrowedFd<'_>, name: &CStr, rel: &[u8], is_dir: bool, named: bool) {
        if named {
            self.note(rel, is_dir);
        }
        if is_dir {
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            match sys::open_beneath(dir, name, flags) {
                Ok(fd) => self.empty(&fd, rel),
                Err(e) => {
                    self.fail(rel, "open directory", &e);
                    return;
                }
            }
        }
        if self.opts.dry_run {
            self.out.deleted += 1;
            return;
        }
        if self.stopping() {
            return;
        }
        if self.opts.fence.as_ref().is_some_and(|f| !(f.0)()) {
            self.fenced = true;
            return;
        }
        match sys::unlinkat(dir, name, is_dir) {
            Ok(()) => self.out.deleted += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => self.fail(rel, "remove", &e),
        }
    }

    /// Remove (or, in a dry run, count) everything in the directory `fd`.
    fn empty(&mut self, fd: &OwnedFd, rel: &[u8]) {
        let Some(names) = self.names(fd.as_fd(), rel) else {
            return;
        };
        for name in names {
            if self.stopping() {
                return;
            }
            let path = join(rel, name.to_bytes());
            match sys::lstatat(fd.as_fd(), &name) {
                Ok(st) => {
                    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
                    self.remove(fd.as_fd(), &name, &path, is_dir, false);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => self.fail(&path, "stat", &e),
            }
        }
    }
}
