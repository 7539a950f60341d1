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

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::dirent::Listing;
use crate::error::{reason_of_io, Failure};
use crate::options::Filter;
use crate::{sys, Error};

/// How many paths a dry run names (it counts all of them).
pub const LISTED: usize = 20;
/// How many failures are kept (all are counted).
const FAILURES_KEPT: usize = 1000;

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

fn prune_fds(src: OwnedFd, dst: OwnedFd, opts: &PruneOptions) -> Result<Pruned, Error> {
    let mut pass = Pass {
        opts,
        fenced: false,
        out: Pruned::default(),
        buf: Vec::new(),
    };
    // Depth first, a listing at a time: what is open is one descriptor pair per level.
    pass.mirror(&src, &dst, Vec::new(), true);
    pass.out.stopped = pass.stopping();
    Ok(pass.out)
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
    fn mirror(&mut self, src: &OwnedFd, dst: &OwnedFd, rel: Vec<u8>, top: bool) {
        let Some(names) = self.names(dst.as_fd(), &rel) else {
            return;
        };
        for name in names {
            if self.stopping() {
                return;
            }
            let bytes = name.to_bytes();
            if is_staging(bytes) || (top && self.opts.reserved_top.as_deref() == Some(&*name)) {
                continue;
            }
            let path = join(&rel, bytes);
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
            match sys::lstatat(src.as_fd(), &name) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    self.remove(dst.as_fd(), &name, &path, is_dir, true);
                }
                Err(e) => self.fail(&path, "stat source", &e),
                Ok(src_st) if is_dir && src_st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                    let src_child = sys::open_beneath(src.as_fd(), &name, flags | libc::O_NOATIME)
                        .or_else(|_| sys::open_beneath(src.as_fd(), &name, flags));
                    // The destination's too: listing it must not undo the atime the copy
                    // gave it (relatime moves it once, its ctime being newer).
                    let dst_child = sys::open_beneath(dst.as_fd(), &name, flags | libc::O_NOATIME)
                        .or_else(|_| sys::open_beneath(dst.as_fd(), &name, flags));
                    match (src_child, dst_child) {
                        (Ok(s), Ok(d)) => self.mirror(&s, &d, path, false),
                        (Err(e), _) => self.fail(&path, "open source directory", &e),
                        (_, Err(e)) => self.fail(&path, "open directory", &e),
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
