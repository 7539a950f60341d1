//! The worker pool and the walk: tasks (a directory to list, a batch of a large directory's
//! entries, chunks of a large file) on a dedicated rayon pool, directory listing, opening
//! or creating each subdirectory, and dispatching every other entry by its type.
//!
//! Directories are the unit of parallelism because creating entries in one directory
//! serialises on that directory's lock (fuc); a large directory is cut into batches so a
//! flat tree still uses every worker (fcp, xcp win there). Each worker runs its own tasks
//! LIFO (rayon's deques) and an idle one steals the oldest: depth first, which keeps the
//! directories in progress near depth × workers instead of the tree's width.
//!
//! A directory is listed a `getdents64` buffer at a time and its entries copied in batches
//! as they come: a batch goes to the pool for an idle worker to steal while only a few wait
//! there, and is copied by the listing worker itself otherwise, so a directory of millions
//! of entries is never held whole (and still keeps every worker busy).
//!
//! A directory's metadata is applied when its last child is done (a pending counter per
//! directory, released up the parent chain), so a 0555 directory gets its mode after its
//! children exist and directory mtimes are not disturbed by later creates. Tasks that wait
//! in the pool hold a directory's [`DirNode`], never its descriptors, which are opened
//! when the task runs (see `dirs`).

use std::ffi::{CStr, CString};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::dirent::{DType, Listing};
use crate::meta::{self, SrcXattrs, XattrBufs};
use crate::options::{part_of, Part};
use crate::sys;

use super::chunks::LargeFile;
use super::overwrite::takes_source_meta;
use super::remote::{rec_of, SrcDir};
use super::{is_type, lock, Ctx, DirNode, Fail, Local, OpenDir, Rec, Skip, CANCELLED};

/// Entries per batch when a directory is split across workers.
const BATCH: usize = 512;

/// Batches of one directory waiting in the pool, per worker, before its listing worker
/// copies the next batch itself: enough for idle workers to find one, few enough that a
/// directory's names in memory stay a few batches' worth however many it has.
const WAITING_PER_WORKER: usize = 2;

/// An entry of a listing kept past its buffer (a batch handed to another worker): its
/// name, the listing's type hint, and from another node its record.
pub(super) struct Listed {
    name: CString,
    dtype: DType,
    rec: Option<Box<Rec>>,
}

pub(super) enum Task {
    /// List a directory that is already open on both sides (the copy's top).
    List(Arc<OpenDir>),
    /// Open, create and list a subdirectory (from another node, with its record).
    Dir {
        parent: Arc<DirNode>,
        name: CString,
        rec: Option<Box<Rec>>,
    },
    /// Copy these entries of a (large) directory.
    Batch {
        dir: Arc<DirNode>,
        entries: Vec<Listed>,
    },
    /// Copy chunks of a large file.
    Chunks(Arc<LargeFile>),
    /// Copy one entry under a different destination name (the top-level file case).
    Entry {
        dir: Arc<OpenDir>,
        src_name: CString,
        dst_name: CString,
    },
}

/// Run one task on the pool thread that picked it up, with that thread's scratch buffers.
/// The tasks it spawns go onto this thread's deque.
fn exec<'s>(ctx: &'s Ctx<'_>, task: Task, scope: &rayon::Scope<'s>) {
    let spawn = |t: Task| scope.spawn(move |s| exec(ctx, t, s));
    let index = rayon::current_thread_index().unwrap_or(0);
    if !ctx.depth.runs(index) {
        spawn(task);
        ctx.depth.rest(index);
        return;
    }
    // Tasks never block on the pool, so no other task runs on this thread meanwhile and the
    // slot is free; `try_lock` and fresh buffers only guard against that changing.
    let slot = ctx.scratch.get(index);
    let scratch = slot
        .and_then(|m| m.try_lock().ok().map(|mut g| std::mem::take(&mut *g)))
        .unwrap_or_default();
    let mut local = Local {
        scratch,
        spawn: &spawn,
    };
    if ctx.stopping() {
        ctx.cancel(task, &mut local);
    } else {
        ctx.run_task(task, &mut local);
    }
    match slot.map(Mutex::try_lock) {
        Some(Ok(mut g)) => *g = local.scratch,
        _ => ctx.add_tally(local.scratch.tally),
    }
}

impl<'a> Ctx<'a> {
    /// Run `first` and everything it spawns to completion on a pool of `workers` threads
    /// (a dedicated one: a copy's threads block in syscalls, which would starve rayon's
    /// global pool for anyone else in the process). An `Err` means the threads could not
    /// be started.
    pub(super) fn run(
        &self,
        workers: usize,
        first: Task,
    ) -> Result<(), rayon::ThreadPoolBuildError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .thread_name(|i| format!("ferry-copy-{i}"))
            .build()?;
        pool.scope(|s| s.spawn(move |s| exec(self, first, s)));
        for slot in &self.scratch {
            self.add_tally(std::mem::take(&mut lock(slot).tally));
        }
        Ok(())
    }

    /// Whether the copy is stopping: the destination filled up, or the caller cancelled.
    pub(super) fn stopping(&self) -> bool {
        if self.abort.load(Ordering::Relaxed) {
            return true;
        }
        if let Some(why) = self.remote.as_ref().and_then(|r| r.lost()) {
            // Nothing more can be read: the copy stops (a new connection resumes it).
            if !self.abort.swap(true, Ordering::Relaxed) {
                lock(&self.aborted).get_or_insert(format!(
                    "the connection to the source's node was lost: {why}"
                ));
            }
            return true;
        }
        if !self.owns() {
            return true;
        }
        let cancelled = self
            .opts
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed));
        if cancelled && !self.abort.swap(true, Ordering::Relaxed) {
            *lock(&self.aborted) = Some(CANCELLED.into());
        }
        cancelled
    }

    /// Settle a task without doing its work (after an abort), so every directory's
    /// pending count still reaches zero and staged directories get their final names.
    fn cancel(&self, task: Task, local: &mut Local) {
        match task {
            Task::List(dir) | Task::Entry { dir, .. } => self.release(&dir.node),
            Task::Dir { parent, .. } => self.release(&parent),
            Task::Batch { dir, .. } => {
                dir.batches_waiting.fetch_sub(1, Ordering::Relaxed);
                self.release(&dir);
            }
            Task::Chunks(file) => self.chunks(&file, local),
        }
    }

    fn run_task(&self, task: Task, local: &mut Local) {
        match task {
            Task::List(dir) => self.list(dir, local),
            Task::Dir { parent, name, rec } => {
                // The parent's count for this child is released when the child directory
                // completes (`release` walks up), or here if it could not be opened. The
                // parent's descriptors are only needed (and held) until the child is open.
                match self
                    .open_dir(&parent)
                    .and_then(|p| self.open_subdir(&p, &name, rec.as_deref()))
                {
                    Ok(dir) => self.list(dir, local),
                    Err((op, e)) => {
                        self.fail(&parent.child_path(&name), op, &e);
                        self.release(&parent);
                    }
                }
            }
            Task::Batch { dir, entries } => {
                dir.batches_waiting.fetch_sub(1, Ordering::Relaxed);
                match self.open_dir(&dir) {
                    Ok(open) => self.copy_entries(&open, &entries, local),
                    Err((op, e)) => {
                        for entry in &entries {
                            self.fail(&dir.child_path(&entry.name), op, &e);
                        }
                    }
                }
                self.release(&dir);
            }
            Task::Chunks(file) => self.chunks(&file, local),
            Task::Entry {
                dir,
                src_name,
                dst_name,
            } => {
                self.entry(&dir, &src_name, &dst_name, DType::Unknown, None, local);
                self.release(&dir.node);
            }
        }
    }

    /// One unit of a directory's work is done; finish directories whose work is all done,
    /// walking up the parents.
    pub(super) fn release(&self, node: &Arc<DirNode>) {
        let mut node = node;
        loop {
            if node.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
                return;
            }
            self.finish_dir(node);
            match &node.parent {
                Some(p) => node = p,
                None => return,
            }
        }
    }

    /// Everything in `node` is done: its metadata, and for a staged one, its final name.
    fn finish_dir(&self, node: &Arc<DirNode>) {
        // After an abort the directory still gets its final name (its finished entries
        // are good), but its metadata is left: it is known to be incomplete.
        if let Some(st) = node.meta.filter(|_| !self.abort.load(Ordering::Relaxed)) {
            // A directory merged into that has its final mode already keeps it (apply_fd
            // still sets it again after xattrs, which can change it).
            let mode_done =
                !node.fresh && node.dst_mode == self.who.final_mode(&st, &self.opts.preserve);
            let applied = self.open_dir(node).and_then(|dir| {
                let xattrs = match dir.src.fd() {
                    Some(fd) => SrcXattrs::Fd(fd),
                    None => SrcXattrs::List(&node.xattrs),
                };
                meta::apply_fd(
                    xattrs,
                    dir.dst.as_fd(),
                    &st,
                    self.rules(),
                    mode_done,
                    &mut XattrBufs::default(),
                )
                .and_then(|()| meta::apply_times(dir.dst.as_fd(), &st, &self.opts.preserve))
            });
            if let Err((op, e)) = applied {
                self.fail(&node.path(), op, &e);
            }
        }
        // A fenced copy leaves its staging directories for the new owner to adopt.
        let staged = node
            .staged_as
            .as_ref()
            .filter(|_| !self.fenced.load(Ordering::Relaxed));
        if let (Some(tmp), Some(parent)) = (staged, &node.parent) {
            let renamed = self.open_dir(parent).and_then(|p| {
                sys::renameat(p.dst.as_fd(), tmp, p.dst.as_fd(), &node.name, true)
                    .map_err(|e| ("rename directory into place", e))
            });
            match renamed {
                Ok(()) => node.renamed.store(true, Ordering::Release),
                Err((op, e)) => self.fail(&node.path(), op, &e),
            }
        }
    }

    /// Open source subdirectory `name` and create (or, when merging, open) its twin.
    fn open_subdir(
        &self,
        parent: &Arc<OpenDir>,
        name: &CStr,
        rec: Option<&Rec>,
    ) -> Result<Arc<OpenDir>, Fail> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let (src, st, xattrs) = self
            .src_open_dir(parent, name, flags, rec)
            .map_err(|e| ("open source directory", e))?;
        // A new directory under a visible parent is built under a staging name and renamed
        // into place when complete; under a hidden parent it needs no name of its own.
        // Parts of a split copy share directories with other agents: made in place.
        let split = self.opts.select != Part::All;
        // A resumed copy finishes the staging directory an interrupted run left for it.
        let adopted = match parent.fresh || split {
            true => None,
            false => self.adopt_staged(parent.dst.as_fd(), name),
        };
        let ours = adopted.is_some() || parent.ours;
        let (dst, fresh, staged_as) = match adopted {
            Some((dst, tmp)) => (dst, false, Some(tmp)),
            None => {
                let staged_as =
                    (parent.fresh && !parent.hidden && !split).then(|| self.dir_tmp_name(name));
                let create_as: &CStr = staged_as.as_deref().unwrap_or(name);
                // Merging, the directory is most likely there already (a re-run): opened
                // first, made only when missing (a failed mkdirat per directory was 1 in 70
                // of a re-run's syscalls).
                let merging = !parent.fresh || split;
                let existing = match merging {
                    // O_NOFOLLOW: a symlink planted at this name is refused, never entered.
                    true => match sys::open_beneath(parent.dst.as_fd(), create_as, flags) {
                        Ok(fd) => Some(fd),
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                        Err(e) => return Err(("open destination directory", e)),
                    },
                    false => None,
                };
                match existing {
                    Some(dst) => (dst, false, staged_as),
                    None => {
                        // 0700 while we fill it; the final mode comes after the children.
                        let fresh = match sys::mkdirat(parent.dst.as_fd(), create_as, 0o700) {
                            Ok(()) => true,
                            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && merging => false,
                            Err(e) => return Err(("create directory", e)),
                        };
                        let dst = sys::open_beneath(parent.dst.as_fd(), create_as, flags)
                            .map_err(|e| ("open destination directory", e))?;
                        (dst, fresh, staged_as)
                    }
                }
            }
        };
        let keep_meta = takes_source_meta(self.opts, fresh);
        // Its inode, to know it again if it is reopened (see `dirs`).
        let dst_st = sys::fstat(dst.as_fd()).map_err(|e| ("stat destination directory", e))?;
        self.counters.dirs.fetch_add(1, Ordering::Relaxed);
        if !matches!(self.opts.select, Part::Slice { .. }) {
            // Every part walks every directory; only one run counts them.
            self.progress.entry_done();
        }
        let mut node = DirNode::new(
            name.to_owned(),
            Some(parent.node.clone()),
            &st,
            &dst_st,
            keep_meta.then_some(st),
            fresh,
        );
        node.hidden = staged_as.is_some() || (fresh && parent.hidden);
        node.staged_as = staged_as;
        node.ours = ours;
        node.xattrs = xattrs;
        Ok(self.opened(Arc::new(node), src, dst))
    }

    /// List `dir` and copy its entries: subdirectories become tasks as they are met, and
    /// the other entries are copied in batches as the listing goes (see the module's doc).
    fn list(&self, dir: Arc<OpenDir>, local: &mut Local) {
        if local.dents.is_empty() {
            local.dents.resize(64 * 1024, 0);
        }
        // Before this directory's own work starts, so none of this run's names are swept.
        if self.opts.resume && !dir.fresh {
            self.sweep_leftovers(&dir, local);
        }
        let mut batch = Vec::new();
        let listed = match &dir.src {
            SrcDir::Fd(fd) => self.list_local(&dir, fd.as_fd(), &mut batch, local),
            SrcDir::Remote(path) => self.list_remote(&dir, path, &mut batch, local),
        };
        if let Err(e) = listed {
            // What was listed before the error is still copied.
            self.fail(&dir.path(), "read directory", &e);
        }
        self.copy_entries(&dir, &batch, local);
        self.release(&dir.node);
    }

    fn list_local(
        &self,
        dir: &Arc<OpenDir>,
        src: std::os::fd::BorrowedFd<'_>,
        batch: &mut Vec<Listed>,
        local: &mut Local,
    ) -> std::io::Result<()> {
        // The listing buffer is this worker's; the entries copied meanwhile use the rest.
        let mut dents = std::mem::take(&mut local.dents);
        let mut listing = Listing::new(src, &mut dents);
        let listed = loop {
            let (name, dtype) = match listing.next_entry() {
                Ok(Some(entry)) => entry,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            let is_dir = match dtype {
                DType::Dir => true,
                DType::Unknown => sys::lstatat(src, name)
                    .map(|st| is_type(&st, libc::S_IFDIR))
                    .unwrap_or(false),
                _ => false,
            };
            if self.listed(dir, name, is_dir, dtype, None, batch, local) {
                break Ok(());
            }
        };
        local.dents = dents;
        listed
    }

    /// Whether the copy of an existing directory has no entries, read through a
    /// descriptor of its own (the walk's would be moved past its start). Not known (an
    /// error) counts as not empty: the listing then asks no more than a merge's.
    fn dst_is_empty(&self, dir: &OpenDir) -> bool {
        let Ok(fd) = sys::openat(dir.dst.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
        else {
            return false;
        };
        // One record of the longest name fits; an empty directory reads `.` and `..`.
        let mut buf = [0u8; 512];
        matches!(Listing::new(fd.as_fd(), &mut buf).next_entry(), Ok(None))
    }

    /// A directory on another node: its listing comes in batches, each entry with its
    /// record (and for a fresh directory, small files with their bytes); the next batch is
    /// asked for when this one is handed out.
    fn list_remote(
        &self,
        dir: &Arc<OpenDir>,
        path: &[u8],
        batch: &mut Vec<Listed>,
        local: &mut Local,
    ) -> std::io::Result<()> {
        let conn = self
            .remote
            .as_ref()
            .ok_or_else(|| std::io::Error::other("internal: a remote directory in a local copy"))?;
        // Bytes travel with the listing only where every file will be copied: a new
        // directory, or an existing one that is empty (a claim's root on a first copy); a
        // merge decides per file, and may keep most. Where files are kept by their stats,
        // the listing is stats alone: the sender opens no regular file for its attributes,
        // and those that are copied have their record asked again. (Either way is correct:
        // an empty directory that gains entries meanwhile only costs what it saved.)
        let empty = !dir.fresh && self.dst_is_empty(dir);
        let inline = dir.fresh || empty;
        let attrs = !self.keeps_by_stats(dir) || empty;
        let mut req = conn.request(|req| ferry_transfer::Frame::List {
            req,
            path: path.to_vec(),
            ino: dir.src_ino,
            inline,
            hash: self.hash,
            attrs,
        })?;
        loop {
            let (entries, inline, last) = match req.next()? {
                ferry_transfer::Frame::Listing {
                    entries,
                    inline,
                    last,
                    ..
                } => (entries, inline, last),
                _ => {
                    return Err(std::io::Error::other(
                        "the sender answered a listing with something else",
                    ))
                }
            };
            if !last {
                // Asked now, so the next batch travels while this one is copied.
                req.send(&ferry_transfer::Frame::More { req: req.id() })?;
            }
            let mut inline = inline.into_iter().peekable();
            for (i, entry) in entries.into_iter().enumerate() {
                let bytes = match inline.peek() {
                    Some(f) if f.index as usize == i => inline.next().map(|f| (f.data, f.hash)),
                    _ => None,
                };
                let Ok(name) = CString::new(entry.name.as_slice()) else {
                    continue;
                };
                let mut rec = Box::new(rec_of(entry, bytes));
                rec.attrs = attrs || !is_type(&rec.st, libc::S_IFREG);
                let is_dir = is_type(&rec.st, libc::S_IFDIR);
                let dtype = match rec.st.st_mode & libc::S_IFMT {
                    libc::S_IFDIR => DType::Dir,
                    libc::S_IFREG => DType::Regular,
                    _ => DType::Other,
                };
                if self.listed(dir, &name, is_dir, dtype, Some(rec), batch, local) {
                    return Ok(());
                }
            }
            if last {
                return Ok(());
            }
        }
    }

    /// One entry of a listing: a subdirectory becomes a task, anything else joins the
    /// batch, handed out when full. `true` when the copy is stopping.
    #[allow(clippy::too_many_arguments)]
    fn listed(
        &self,
        dir: &Arc<OpenDir>,
        name: &CStr,
        is_dir: bool,
        dtype: DType,
        rec: Option<Box<Rec>>,
        batch: &mut Vec<Listed>,
        local: &mut Local,
    ) -> bool {
        let reserved = self
            .opts
            .reserved_top
            .as_deref()
            .filter(|_| dir.parent.is_none());
        if reserved.is_some_and(|r| r == name) {
            return false;
        }
        // include/exclude: an excluded directory is not entered, an unselected entry
        // not copied (nor counted, nor in the manifest). Without patterns no path is built.
        if !self.opts.filter.is_all() && !self.opts.filter.admits(&dir.child_path(name), is_dir) {
            return false;
        }
        if is_dir {
            dir.pending.fetch_add(1, Ordering::Relaxed);
            local.push(Task::Dir {
                parent: dir.node.clone(),
                name: name.to_owned(),
                rec,
            });
            return false;
        }
        if batch.capacity() == 0 {
            batch.reserve_exact(BATCH);
        }
        batch.push(Listed {
            name: name.to_owned(),
            dtype,
            rec,
        });
        if batch.len() == BATCH {
            // (Checked per batch: `copy_entries` checks each entry.)
            if self.stopping() {
                return true;
            }
            let full = std::mem::take(batch);
            self.hand_out(dir, full, local);
        }
        false
    }

    /// A full batch of `dir`'s entries: to the pool for an idle worker, unless enough of
    /// its batches wait there already; then this worker copies it, and lists on after.
    fn hand_out(&self, dir: &Arc<OpenDir>, batch: Vec<Listed>, local: &mut Local) {
        // (`scratch` has a slot per worker.)
        let most = WAITING_PER_WORKER * self.scratch.len();
        if dir.batches_waiting.load(Ordering::Relaxed) >= most {
            self.copy_entries(dir, &batch, local);
            return;
        }
        dir.batches_waiting.fetch_add(1, Ordering::Relaxed);
        dir.pending.fetch_add(1, Ordering::Relaxed);
        local.push(Task::Batch {
            dir: dir.node.clone(),
            entries: batch,
        });
    }

    fn copy_entries(&self, dir: &Arc<OpenDir>, entries: &[Listed], local: &mut Local) {
        for e in entries {
            if self.stopping() {
                break;
            }
            self.depth.between();
            self.entry(dir, &e.name, &e.name, e.dtype, e.rec.as_deref(), local);
        }
    }

    /// Copy one non-directory entry. `dtype` is the listing's hint; the real type comes
    /// from `fstat` of what was opened (or `lstat` for things never opened).
    fn entry(
        &self,
        dir: &Arc<OpenDir>,
        src_name: &CStr,
        dst_name: &CStr,
        dtype: DType,
        rec: Option<&Rec>,
        local: &mut Local,
    ) {
        let mut dtype = dtype;
        match self.opts.select {
            Part::All => {}
            // The listing sends directories elsewhere; only an unknown type may be one.
            Part::Directories if dtype != DType::Unknown => return,
            Part::Directories => {}
            Part::Slice { index, count } => {
                let st = match self.src_lstat(dir, src_name, rec) {
                    Ok(st) => st,
                    Err(e) => {
                        // Reported by the part that owns the path, once.
                        if part_of(&dir.child_path(src_name), None, count) == index {
                            self.fail(&dir.child_path(dst_name), "stat", &e);
                        }
                        return;
                    }
                };
                if !is_type(&st, libc::S_IFDIR) {
                    let inode = (self.opts.preserve.hard_links && st.st_nlink > 1)
                        .then_some((st.st_dev, st.st_ino));
                    if part_of(&dir.child_path(src_name), inode, count) != index {
                        return;
                    }
                }
                dtype = DType::Unknown;
            }
        }
        if self.opts.select == Part::Directories {
            match self.src_lstat(dir, src_name, rec) {
                Ok(st) if is_type(&st, libc::S_IFDIR) => {
                    dir.pending.fetch_add(1, Ordering::Relaxed);
                    local.push(Task::Dir {
                        parent: dir.node.clone(),
                        name: src_name.to_owned(),
                        rec: None,
                    });
                }
                Ok(_) => {}
                Err(e) => self.fail(&dir.child_path(dst_name), "stat", &e),
            }
            return;
        }
        let result = match dtype {
            DType::Regular => self.regular(dir, src_name, dst_name, rec, local),
            _ => match self.src_lstat(dir, src_name, rec) {
                Err(e) => Err(("stat", e)),
                Ok(st) if is_type(&st, libc::S_IFREG) => {
                    self.regular(dir, src_name, dst_name, rec, local)
                }
                Ok(st) if is_type(&st, libc::S_IFDIR) => {
                    // A directory appeared where the listing saw something else.
                    if !self.opts.filter.admits(&dir.child_path(src_name), true) {
                        return;
                    }
                    dir.pending.fetch_add(1, Ordering::Relaxed);
                    local.push(Task::Dir {
                        parent: dir.node.clone(),
                        name: src_name.to_owned(),
                        rec: None,
                    });
                    return;
                }
                Ok(st) => self.non_regular(dir, src_name, dst_name, &st, rec),
            },
        };
        match result {
            Ok(None) => {}
            Ok(Some(Skip::Kept)) => self.count_skipped(),
            Ok(Some(Skip::Deferred)) => {}
            Err((op, e)) => self.fail(&dir.child_path(dst_name), op, &e),
        }
    }
}
