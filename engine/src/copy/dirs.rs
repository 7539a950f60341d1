//! Directory descriptors, bounded whatever the tree's shape. A directory of the copy
//! ([`DirNode`]) holds none; an [`OpenDir`] holds its two (source and destination) while
//! tasks work in it, and the copy keeps the most recently used ones open between uses (at
//! most [`MAX_KEPT`], fewer under a low `RLIMIT_NOFILE`). So a chain of 3,000 directories,
//! each of which waits on the one below it, or a thousand finished directories whose files
//! lead hard-link groups, cost a bounded number of descriptors rather than two apiece.
//!
//! A directory whose descriptors were closed is opened again when it is needed (a
//! subdirectory of it to open, a batch of its entries, its metadata when its last child is
//! done, a staged child's rename, a link to a file in it), beneath its nearest open
//! ancestor and down one name at a time, with `open_beneath` (`openat2` with
//! `RESOLVE_BENEATH` and no symlinks, `O_NOFOLLOW`) exactly as it was first opened; and it
//! must still be the directory it was on both sides (device and inode). A directory replaced or moved meanwhile is a failure, never followed, and
//! nothing is ever reached from outside the copy's two top directories.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::source_changed;
use crate::sys::{self, Stat};

use super::{lock, Ctx, DirNode, Fail, SrcDir};

/// Directories kept open between uses, at most: two descriptors each. Deep enough for the
/// directories a depth-first walk returns to soon (a normal tree's ancestors and their
/// next siblings, a few per worker), small next to common descriptor limits.
pub(super) const MAX_KEPT: usize = 64;

const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

/// A directory's two descriptors, held by whatever works in it (and by [`OpenDirs`] for a
/// while after). Dereferences to its [`DirNode`].
pub(super) struct OpenDir {
    pub(super) node: Arc<DirNode>,
    pub(super) src: SrcDir,
    pub(super) dst: OwnedFd,
    /// When it was last asked for, on [`OpenDirs::clock`]: the least recent goes first.
    used: AtomicU64,
}

impl std::ops::Deref for OpenDir {
    type Target = DirNode;
    fn deref(&self) -> &DirNode {
        &self.node
    }
}

/// The descriptors a copy keeps open between uses.
pub(super) struct OpenDirs {
    kept: Mutex<Vec<Arc<OpenDir>>>,
    capacity: usize,
    clock: AtomicU64,
    /// The copy's top (and the directory above it when it is staged): opened from the paths
    /// the caller named, so never closed, and never opened again.
    pinned: Mutex<Vec<Arc<OpenDir>>>,
}

impl OpenDirs {
    /// `fd_limit`: the process's descriptor limit, of which these take at most an eighth;
    /// the rest is for the workers' files and directories in use.
    pub(super) fn new(fd_limit: u64) -> Self {
        let capacity = (fd_limit / 16).clamp(2, MAX_KEPT as u64) as usize;
        Self {
            kept: Mutex::new(Vec::with_capacity(capacity)),
            capacity,
            clock: AtomicU64::new(0),
            pinned: Mutex::new(Vec::new()),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// `node`'s descriptors if they are open.
    fn in_use(&self, node: &DirNode) -> Option<Arc<OpenDir>> {
        let dir = lock(&node.open).upgrade()?;
        dir.used.store(self.tick(), Ordering::Relaxed);
        Some(dir)
    }

    /// Keep `dir` open after its users are done with it, closing the least recently used
    /// one kept if there are too many.
    fn keep(&self, dir: Arc<OpenDir>) {
        let evicted = {
            let mut kept = lock(&self.kept);
            let evicted = match kept.len() >= self.capacity {
                true => kept
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, d)| d.used.load(Ordering::Relaxed))
                    .map(|(i, _)| i)
                    .map(|i| kept.swap_remove(i)),
                false => None,
            };
            kept.push(dir);
            evicted
        };
        // Closed (if no task holds it) outside the lock.
        drop(evicted);
    }
}

impl<'a> Ctx<'a> {
    /// A directory just opened by name in its parent: remembered, to be found by
    /// [`Ctx::open_dir`] while it is open.
    pub(super) fn opened(&self, node: Arc<DirNode>, src: SrcDir, dst: OwnedFd) -> Arc<OpenDir> {
        let dir = self.remember(node, src, dst);
        self.dirs.keep(dir.clone());
        dir
    }

    /// The copy's top, or the directory above a staged top: open until the copy ends.
    pub(super) fn pinned(&self, node: DirNode, src: SrcDir, dst: OwnedFd) -> Arc<OpenDir> {
        let dir = self.remember(Arc::new(node), src, dst);
        lock(&self.dirs.pinned).push(dir.clone());
        dir
    }

    fn remember(&self, node: Arc<DirNode>, src: SrcDir, dst: OwnedFd) -> Arc<OpenDir> {
        let dir = Arc::new(OpenDir {
            node,
            src,
            dst,
            used: AtomicU64::new(self.dirs.tick()),
        });
        *lock(&dir.node.open) = Arc::downgrade(&dir);
        dir
    }

    /// `node`'s descriptors: those open now, or opened again beneath its nearest open
    /// ancestor, every directory on the way checked to be the one it was.
    pub(super) fn open_dir(&self, node: &Arc<DirNode>) -> Result<Arc<OpenDir>, Fail> {
        if let Some(dir) = self.dirs.in_use(node) {
            return Ok(dir);
        }
        let mut closed = vec![node];
        let mut dir = loop {
            let Some(parent) = &closed[closed.len() - 1].parent else {
                // Never: the top is pinned.
                let e = io::Error::other("internal: the copy's top directory was closed");
                return Err(("reopen directory", e));
            };
            match self.dirs.in_use(parent) {
                Some(open) => break open,
                None => closed.push(parent),
            }
        };
        for node in closed.into_iter().rev() {
            dir = self.reopen(&dir, node)?;
        }
        Ok(dir)
    }

    /// Open `node` again in its open parent `parent`.
    fn reopen(&self, parent: &OpenDir, node: &Arc<DirNode>) -> Result<Arc<OpenDir>, Fail> {
        // On another node a directory is its path; the sender checks it is still the
        // directory it was (by inode) when it is listed, and each file by its record.
        if let SrcDir::Remote(_) = &parent.src {
            let dst = reopen_dst(parent, node).map_err(|e| ("reopen destination directory", e))?;
            if let Some(dir) = self.dirs.in_use(node) {
                return Ok(dir);
            }
            return Ok(self.opened(node.clone(), SrcDir::Remote(node.path()), dst));
        }
        let src = self
            .open_source(parent, &node.name, DIR_FLAGS)
            .and_then(|fd| {
                let st = sys::fstat(fd.as_fd())?;
                match (st.st_dev, st.st_ino) == (node.src_dev, node.src_ino) {
                    true => Ok(fd),
                    false => Err(source_changed(
                        "the source directory was replaced or moved while it was copied".into(),
                    )),
                }
            })
            .map_err(|e| ("reopen source directory", e))?;
        let dst = reopen_dst(parent, node).map_err(|e| ("reopen destination directory", e))?;
        // Another worker may have opened it meanwhile: one is enough.
        if let Some(dir) = self.dirs.in_use(node) {
            return Ok(dir);
        }
        Ok(self.opened(node.clone(), SrcDir::Fd(src), dst))
    }
}

/// Open `node`'s copy in `parent`'s: under its staging name until it is complete, under its
/// final name after. Both are tried, as the rename may fall between the look and the open;
/// only the directory this copy made is taken.
fn reopen_dst(parent: &OpenDir, node: &DirNode) -> io::Result<OwnedFd> {
    let names: [&CStr; 2] = match &node.staged_as {
        Some(tmp) if node.renamed.load(Ordering::Acquire) => [&node.name, tmp],
        Some(tmp) => [tmp, &node.name],
        None => [&node.name, &node.name],
    };
    let ours = |st: &Stat| (st.st_dev, st.st_ino) == (node.dst_dev, node.dst_ino);
    let mut last = None;
    for (i, name) in names.into_iter().enumerate() {
        if i == 1 && node.staged_as.is_none() {
            break;
        }
        match sys::open_beneath(parent.dst.as_fd(), name, DIR_FLAGS) {
            Ok(fd) => match sys::fstat(fd.as_fd()) {
                Ok(st) if ours(&st) => return Ok(fd),
                Ok(_) => last = Some(replaced()),
                Err(e) => return Err(e),
            },
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(replaced))
}

fn replaced() -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        "the destination directory was replaced or moved while it was copied",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::ffi::CString;

    use crate::options::Options;
    use crate::progress::NoProgress;

    fn open_path(p: &std::path::Path) -> io::Result<(OwnedFd, Stat)> {
        let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default();
        let fd = sys::open(&c, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let st = sys::fstat(fd.as_fd())?;
        Ok((fd, st))
    }

    /// Open two other directories in `ctx` (whose capacity is 2), so the others kept close.
    fn open_two_others(ctx: &Ctx<'_>) -> io::Result<()> {
        for _ in 0..2 {
            let (fd, st) = open_path(std::path::Path::new("/"))?;
            let node = DirNode::new(CString::default(), None, &st, &st, None, false);
            ctx.opened(Arc::new(node), SrcDir::Fd(fd.try_clone()?), fd);
        }
        Ok(())
    }

    #[test]
    fn a_closed_directory_is_reopened_only_if_it_is_still_the_one_it_was_and_never_through_a_symlink(
    ) -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
        for d in [&src, &dst] {
            std::fs::create_dir_all(d.join("sub"))?;
        }
        std::fs::create_dir(tmp.path().join("outside"))?;
        let opts = Options::default();
        let ctx = Ctx::new(
            &opts,
            &NoProgress,
            None,
            HashSet::new(),
            Default::default(),
            32,
            crate::depth::Depth::fixed(),
        );
        assert_eq!(ctx.dirs.capacity, 2);
        let ((s, sst), (d, dst_st)) = (open_path(&src)?, open_path(&dst)?);
        let mut top = DirNode::new(CString::default(), None, &sst, &dst_st, None, false);
        top.top = true;
        let top = ctx.pinned(top, SrcDir::Fd(s), d);
        let ((s, sst), (d, dst_st)) = (open_path(&src.join("sub"))?, open_path(&dst.join("sub"))?);
        let node = DirNode::new(
            c"sub".into(),
            Some(top.node.clone()),
            &sst,
            &dst_st,
            None,
            true,
        );
        let node = ctx.opened(Arc::new(node), SrcDir::Fd(s), d).node.clone();
        open_two_others(&ctx)?;
        assert!(ctx.dirs.in_use(&node).is_none(), "still open");

        // The same directory: opened again.
        let again = ctx.open_dir(&node).map_err(|(_, e)| e)?;
        assert_eq!(sys::fstat(again.dst.as_fd())?.st_ino, dst_st.st_ino);
        drop(again);
        open_two_others(&ctx)?;

        // Moved away, and a symlink to a directory outside put at its name: refused.
        std::fs::rename(dst.join("sub"), dst.join("moved"))?;
        std::os::unix::fs::symlink(tmp.path().join("outside"), dst.join("sub"))?;
        let refused = ctx
            .open_dir(&node)
            .err()
            .map(|(op, e)| (op, e.raw_os_error()));
        // (With O_DIRECTORY the kernel may say ENOTDIR rather than ELOOP.)
        assert!(
            matches!(
                refused,
                Some((
                    "reopen destination directory",
                    Some(libc::ELOOP | libc::ENOTDIR)
                ))
            ),
            "{refused:?}"
        );

        // Another directory at its name: refused as a conflict.
        std::fs::remove_file(dst.join("sub"))?;
        std::fs::create_dir(dst.join("sub"))?;
        let Err((_, e)) = ctx.open_dir(&node) else {
            panic!("another directory was taken for it");
        };
        assert_eq!(
            crate::error::kind_of(&e),
            crate::Reason::DestinationConflict
        );

        // Back in place: opened again.
        std::fs::remove_dir(dst.join("sub"))?;
        std::fs::rename(dst.join("moved"), dst.join("sub"))?;
        assert!(ctx.open_dir(&node).is_ok());
        Ok(())
    }

    #[test]
    fn the_least_recently_used_directory_is_closed_first_and_only_beyond_capacity() {
        let dirs = OpenDirs::new(64);
        assert_eq!(dirs.capacity, 4);
        let open = |n: u64| -> io::Result<Arc<OpenDir>> {
            let fd = sys::open(c"/", libc::O_RDONLY | libc::O_DIRECTORY)?;
            let st = sys::fstat(fd.as_fd())?;
            let name = std::ffi::CString::new(format!("d{n}")).unwrap_or_default();
            let node = Arc::new(DirNode::new(name, None, &st, &st, None, false));
            let dir = Arc::new(OpenDir {
                node,
                src: SrcDir::Fd(fd.try_clone()?),
                dst: fd,
                used: AtomicU64::new(dirs.tick()),
            });
            *lock(&dir.node.open) = Arc::downgrade(&dir);
            dirs.keep(dir.clone());
            Ok(dir)
        };
        let first: Vec<Arc<DirNode>> = (0..4)
            .map(|n| open(n).map(|d| d.node.clone()))
            .collect::<io::Result<_>>()
            .expect("open");
        // d0 is asked for again: d1 is now the least recently used.
        assert!(dirs.in_use(&first[0]).is_some());
        open(4).expect("open");
        assert!(dirs.in_use(&first[1]).is_none(), "d1 was kept");
        assert!(dirs.in_use(&first[0]).is_some(), "d0 was closed");
        assert_eq!(lock(&dirs.kept).len(), 4);
    }
}
