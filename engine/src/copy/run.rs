//! A copy from start to end, once both ends are open (`ends`, `beneath`): refuse a copy
//! into itself, set up the manifest and the top directory node (staged under a temporary
//! name when new), run the workers, and turn the counters into a [`Summary`].

use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use super::manifest::read_manifest;
use super::overwrite::takes_source_meta;
use super::records::{self, Earlier, Lazy};
use super::walk::Task;
use super::{Ctx, DirNode, OpenDir, SrcDir, CANCELLED};
use crate::depth::Depth;
use crate::ends::{DstAt, SrcAt};
use crate::open::final_name;
use crate::options::{Compare, Options, Overwrite, Part};
use crate::progress::{Progress, Strategy};
use crate::sys;
use crate::{Error, Summary};
use ferry_transfer::Xattr;

/// Refuse to copy a directory into itself: walk up from the destination through `..`
/// (which crosses mounts correctly) looking for the source's inode.
fn check_not_inside(
    src: &libc::stat,
    dst_dir: &OwnedFd,
    src_path: &Path,
    dst_path: &Path,
) -> Result<(), Error> {
    let dotdot = c"..";
    let mut cur = dst_dir
        .try_clone()
        .map_err(|e| Error::io("dup", dst_path, e))?;
    loop {
        let st = sys::fstat(cur.as_fd()).map_err(|e| Error::io("stat", dst_path, e))?;
        if st.st_dev == src.st_dev && st.st_ino == src.st_ino {
            return Err(Error::Usage(format!(
                "cannot copy {} into itself ({} is inside it); choose a destination outside the source",
                src_path.display(),
                dst_path.display()
            )));
        }
        let up = sys::openat(cur.as_fd(), dotdot, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| Error::io("open ..", dst_path, e))?;
        let up_st = sys::fstat(up.as_fd()).map_err(|e| Error::io("stat", dst_path, e))?;
        if up_st.st_dev == st.st_dev && up_st.st_ino == st.st_ino {
            return Ok(());
        }
        cur = up;
    }
}

/// The top of a copy into an existing directory (or the directories of a single file's
/// copy). `xattrs`: a remote top's attributes.
fn top(
    ctx: &Ctx<'_>,
    (src, src_st, xattrs): (SrcDir, sys::Stat, Vec<Xattr>),
    dst: OwnedFd,
    meta: Option<sys::Stat>,
    fresh: bool,
) -> std::io::Result<Arc<OpenDir>> {
    let dst_st = sys::fstat(dst.as_fd())?;
    let mut node = DirNode::new(CString::default(), None, &src_st, &dst_st, meta, fresh);
    node.top = true;
    node.xattrs = xattrs;
    Ok(ctx.pinned(node, src, dst))
}

/// A source's top as `top` takes it, from a local descriptor.
fn local_top(fd: OwnedFd) -> std::io::Result<(SrcDir, sys::Stat, Vec<Xattr>)> {
    let st = sys::fstat(fd.as_fd())?;
    Ok((SrcDir::Fd(fd), st, Vec::new()))
}

/// The top of a new copy: built as `tmp` inside `parent` and renamed to `name` when
/// everything under it is complete, so the destination appears whole. Not `fresh`: a
/// resumed copy adopted the staging directory its interrupted run left.
fn staged_top(
    ctx: &Ctx<'_>,
    (src, src_st, xattrs): (SrcDir, sys::Stat, Vec<Xattr>),
    dst: OwnedFd,
    parent: OwnedFd,
    (tmp, name): (CString, CString),
    fresh: bool,
) -> std::io::Result<Arc<OpenDir>> {
    // The parent only serves the final rename: a node whose release is a no-op.
    let parent_st = sys::fstat(parent.as_fd())?;
    let parent_node = DirNode::new(
        CString::default(),
        None,
        &parent_st,
        &parent_st,
        None,
        false,
    );
    let parent = ctx.pinned(parent_node, SrcDir::Fd(parent.try_clone()?), parent);
    let dst_st = sys::fstat(dst.as_fd())?;
    let mut node = DirNode::new(
        name,
        Some(parent.node.clone()),
        &src_st,
        &dst_st,
        Some(src_st),
        fresh,
    );
    node.top = true;
    node.hidden = true;
    node.ours = !fresh;
    node.staged_as = Some(tmp);
    node.xattrs = xattrs;
    Ok(ctx.pinned(node, src, dst))
}

/// A copy's source as the walk starts from it.
enum TopSrc {
    Dir((SrcDir, sys::Stat, Vec<Xattr>)),
    Entry {
        parent: (SrcDir, sys::Stat, Vec<Xattr>),
        name: CString,
    },
}

/// The copy itself, once both ends are open (`src`/`dst` only label messages, but for a
/// single file from another node copied into a directory: it takes `src`'s last name).
pub(crate) fn run(
    src_at: SrcAt,
    dst_at: DstAt,
    src: &Path,
    dst: &Path,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Summary, Error> {
    let started = Instant::now();
    let (remote, dst_at) = match (&src_at, dst_at) {
        // One file into a directory: named as the source is (the sender's file is its
        // top, at path "", so the name is the source path's).
        (SrcAt::Remote { conn, st, .. }, DstAt::Dir(parent))
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR =>
        {
            let name = final_name(src)?;
            let exists = sys::lstatat(parent.as_fd(), &name).is_ok();
            let dst_at = DstAt::Entry {
                parent,
                name,
                exists,
            };
            (Some(conn.clone()), dst_at)
        }
        (SrcAt::Remote { conn, .. }, dst_at) => (Some(conn.clone()), dst_at),
        (_, dst_at) => (None, dst_at),
    };
    options.check_staging_tag().map_err(Error::Usage)?;
    let fd_limit = sys::raise_nofile_limit();
    let mut listed = HashSet::new();
    let manifest = match &options.manifest {
        // A resumed copy adds the files it commits to those the interrupted run listed.
        Some(p) => {
            // Never written through a link planted at its name, and only a regular file
            // is opened (a FIFO or device planted there never is).
            let flags = match options.resume {
                true => libc::O_RDWR | libc::O_APPEND,
                false => libc::O_WRONLY | libc::O_TRUNC,
            };
            let mut file = records::open_own_file(p, flags, true)
                .map_err(|e| Error::io("create manifest", p, e))?;
            if options.resume {
                listed = read_manifest(&mut file).map_err(|e| Error::io("read manifest", p, e))?;
            }
            Some(file)
        }
        None => None,
    };
    // The filesystem to flush at the end: the destination's (or, for a new one, its parent's).
    let sync_fd = match (&dst_at, options.sync) {
        (DstAt::Dir(fd), true) | (DstAt::Entry { parent: fd, .. }, true) => Some(
            fd.try_clone()
                .map_err(|e| Error::io("duplicate descriptor", dst, e))?,
        ),
        (_, false) => None,
    };
    let records = match (&options.records, &manifest) {
        // Records need a manifest (their hashes are its lines) and kept times (a record
        // is matched by mtime).
        (Some(r), Some(_)) if options.preserve.timestamps => {
            // Read only by a run that keeps files by the quick check without opening them.
            let quick = options.overwrite == Overwrite::IfChanged
                && options.compare == Compare::SizeAndTime
                && !options.resume;
            let earlier = match quick {
                true => Earlier::open(&r.earlier)
                    .map_err(|e| Error::io("read the records of earlier copies", &r.earlier, e))?,
                false => Lazy::none(),
            };
            let file = records::create(&r.write, options.resume)
                .map_err(|e| Error::io("create records", &r.write, e))?;
            (earlier, Some(file))
        }
        _ => (Lazy::none(), None),
    };
    // Which of the default pool's workers run follows what the copy reads from storage, on
    // filesystems where the kernel counts that (see `depth`); a worker count asked for runs
    // whole.
    // (A source on another node: its reads are the network's, never counted.)
    let depth = match (options.workers, &src_at) {
        (0, SrcAt::Dir { fd: src_fd, .. } | SrcAt::Entry { parent: src_fd, .. }) => {
            let (DstAt::Dir(dst_fd) | DstAt::Entry { parent: dst_fd, .. }) = &dst_at;
            let fs = [src_fd, dst_fd].map(|fd| sys::fs_type(fd.as_fd()).unwrap_or(0));
            Depth::adaptive(options.workers_resolved(), &fs)
        }
        _ => Depth::fixed(),
    };
    let mut ctx = Ctx::new(
        options, progress, manifest, listed, records, fd_limit, depth,
    );
    ctx.remote = remote;
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

    // Both kinds of source as the walk takes them: a directory (a descriptor, or a path
    // on another node) with its stat and (remote) attributes; or an entry of one.
    let src_at = match src_at {
        SrcAt::Dir { fd, st } => TopSrc::Dir((SrcDir::Fd(fd), st, Vec::new())),
        SrcAt::Remote { st, xattrs, .. } if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
            TopSrc::Dir((SrcDir::Remote(Vec::new()), st, xattrs))
        }
        // The top is the file: its path is "", the empty name in the empty path.
        SrcAt::Remote { st, .. } => TopSrc::Entry {
            parent: (SrcDir::Remote(Vec::new()), st, Vec::new()),
            name: CString::default(),
        },
        SrcAt::Entry { parent, name } => TopSrc::Entry {
            parent: local_top(parent).map_err(|e| Error::io("stat", src, e))?,
            name,
        },
    };
    let first = match src_at {
        TopSrc::Dir((src_dir, src_st, src_xattrs)) => {
            // (A directory on another node cannot hold the destination.)
            let is_remote = matches!(src_dir, SrcDir::Remote(_));
            // A part of a split copy (or its final directory pass) shares DST with other
            // agents: it is made in place, never staged, and merged into like an existing one.
            let split = options.select != Part::All;
            let dst_at = match dst_at {
                DstAt::Entry {
                    parent,
                    name,
                    exists: false,
                } if split => {
                    match sys::mkdirat(parent.as_fd(), &name, 0o700) {
                        Err(e) if e.raw_os_error() != Some(libc::EEXIST) => {
                            return Err(Error::io("create directory", dst, e))
                        }
                        _ => {}
                    }
                    DstAt::Dir(
                        sys::open_beneath(parent.as_fd(), &name, dir_flags)
                            .map_err(|e| Error::io("open destination", dst, e))?,
                    )
                }
                other => other,
            };
            let root = match dst_at {
                DstAt::Entry {
                    parent: parent_fd,
                    name,
                    exists: false,
                } => {
                    if !is_remote {
                        check_not_inside(&src_st, &parent_fd, src, dst)?;
                    }
                    // Built under a staging name, renamed to DST when complete. A resumed
                    // copy takes over the staging directory its interrupted run left.
                    let (fd, tmp, fresh) = match ctx.adopt_staged(parent_fd.as_fd(), &name) {
                        Some((fd, tmp)) => (fd, tmp, false),
                        None => {
                            let tmp = ctx.dir_tmp_name(&name);
                            sys::mkdirat(parent_fd.as_fd(), &tmp, 0o700)
                                .map_err(|e| Error::io("create directory", dst, e))?;
                            let fd = sys::openat(parent_fd.as_fd(), &tmp, dir_flags, 0)
                                .map_err(|e| Error::io("open destination", dst, e))?;
                            (fd, tmp, true)
                        }
                    };
                    let src = (src_dir, src_st, src_xattrs);
                    staged_top(&ctx, src, fd, parent_fd, (tmp, name), fresh)
                        .map_err(|e| Error::io("stat", dst, e))?
                }
                DstAt::Dir(fd) => {
                    if !is_remote {
                        check_not_inside(&src_st, &fd, src, dst)?;
                    }
                    let keep_meta = takes_source_meta(options, false);
                    let src = (src_dir, src_st, src_xattrs);
                    top(&ctx, src, fd, keep_meta.then_some(src_st), false)
                        .map_err(|e| Error::io("stat", dst, e))?
                }
                DstAt::Entry { exists: true, .. } => {
                    return Err(Error::Usage(format!(
                        "{} exists and is not a directory, but {} is one; choose a new name or an existing directory",
                        dst.display(),
                        src.display()
                    )))
                }
            };
            ctx.counters.dirs.fetch_add(1, Ordering::Relaxed);
            Task::List(root)
        }
        TopSrc::Entry {
            parent: src_parent,
            name: src_name,
        } => {
            // (A split copy of one file: the part that owns its name copies it.)
            let (dst_parent, dst_name, fresh) = match dst_at {
                DstAt::Dir(fd) => (fd, src_name.clone(), false),
                DstAt::Entry {
                    parent,
                    name,
                    exists,
                } => (parent, name, !exists),
            };
            let parent = top(&ctx, src_parent, dst_parent, None, fresh)
                .map_err(|e| Error::io("stat", dst, e))?;
            Task::Entry {
                dir: parent,
                src_name,
                dst_name,
            }
        }
    };

    // The records are read beside the walk's start, not before it.
    std::thread::scope(|s| {
        s.spawn(|| ctx.earlier.get());
        ctx.run(options.workers_resolved(), first)
    })
    .map_err(|e| Error::io("start copy threads", src, std::io::Error::other(e)))?;
    let manifest_written = ctx.finish_manifest().map_err(|e| {
        Error::io(
            "write manifest",
            options.manifest.clone().unwrap_or_default(),
            e,
        )
    });
    if let Some(fd) = sync_fd {
        ctx.sync_destination(fd.as_fd());
    }
    manifest_written?;

    let c = &ctx.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let failures =
        std::mem::take(&mut *ctx.failures.lock().unwrap_or_else(PoisonError::into_inner));
    let aborted = ctx
        .aborted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let summary = Summary {
        files: get(&c.files),
        dirs: get(&c.dirs),
        symlinks: get(&c.symlinks),
        specials: get(&c.specials),
        hardlinks: get(&c.hardlinks),
        skipped: get(&c.skipped),
        listed_from_records: get(&c.listed_from_records),
        unlisted: get(&c.unlisted),
        files_resumed: get(&c.files_resumed),
        bytes_resumed: get(&c.bytes_resumed),
        verified: get(&c.verified),
        patched: get(&c.patched),
        bytes: get(&c.bytes),
        bytes_reflinked: get(&c.by_strategy[Strategy::Reflink as usize]),
        bytes_copy_file_range: get(&c.by_strategy[Strategy::CopyFileRange as usize]),
        bytes_read_write: get(&c.by_strategy[Strategy::ReadWrite as usize]),
        failures,
        failed: get(&c.failed),
        cancelled: aborted.as_deref() == Some(CANCELLED),
        aborted,
        elapsed: started.elapsed(),
    };
    Ok(summary)
}
