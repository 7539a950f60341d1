//! The parallel tree copy: a bounded pool of workers taking tasks (a directory to list, a
//! batch of a large directory's entries, chunks of a large file) from one LIFO queue.
//!
//! Directories are the unit of parallelism because creating entries in one directory
//! serialises on that directory's lock (fuc); a large directory is cut into batches so a
//! flat tree still uses every worker (fcp, xcp win there). LIFO order keeps the number of
//! open directories near depth × workers instead of the tree's width.
//!
//! A directory's metadata is applied when its last child is done (a pending counter per
//! directory, released up the parent chain), so a 0555 directory gets its mode after its
//! children exist and directory mtimes are not disturbed by later creates.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::data::{self, Caps, CapsCache, Clone, Moved, Range};
use crate::dirent::{self, DType};
use crate::error::Failure;
use crate::meta::{self, Identity, XattrBufs};
use crate::options::{Options, Overwrite, Part, Reflink, Verify};
use crate::progress::{Progress, Strategy};
use crate::sys::{self, Stat};
use crate::Reason;

/// Entries per batch when a directory is split across workers.
const BATCH: usize = 512;
/// Files at least this large (and not cloned, sparse or hashed) are copied in chunks by
/// several workers.
const CHUNK_THRESHOLD: u64 = 128 << 20;
/// Chunk size: a multiple of every filesystem block size, so `copy_file_range` can still
/// clone or offload each chunk (rsync#153: unaligned ranges are not cloned).
const CHUNK: u64 = 64 << 20;
/// Failures kept in the summary; the count goes on past it.
const MAX_FAILURES_KEPT: usize = 1000;
/// Attempts at a file whose source keeps changing while it is copied, in all.
const ATTEMPTS_WHILE_CHANGING: u32 = 3;
/// Fresh rewrites of a file after an I/O error reading its source or writing its copy.
const REWRITES_AFTER_IO_ERROR: u32 = 1;
/// How a regular file's source is opened. O_NONBLOCK: if a FIFO was swapped in since the
/// listing, opening it must not hang; it is then recreated, never read.
const SOURCE_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking worker cannot leave these maps half-updated in a way later readers could
    // misuse (every update is a single insert or take), so poisoning is not fatal.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `Summary::aborted` of a cancelled copy.
pub(crate) const CANCELLED: &str = "cancelled";

/// Which part of a split copy owns an entry: by its path from the top, or for a hard-linked
/// file by its inode, so all names of one file land in the same part.
pub(crate) fn part_of(path: &[u8], inode: Option<(u64, u64)>, count: u32) -> u32 {
    let h = match inode {
        Some((dev, ino)) => {
            let mut key = [0u8; 16];
            key[..8].copy_from_slice(&dev.to_le_bytes());
            key[8..].copy_from_slice(&ino.to_le_bytes());
            xxhash_rust::xxh3::xxh3_64(&key)
        }
        None => xxhash_rust::xxh3::xxh3_64(path),
    };
    (h % u64::from(count.max(1))) as u32
}

fn is_type(st: &Stat, t: u32) -> bool {
    st.st_mode & libc::S_IFMT == t
}

/// One destination directory being filled, and the source directory it mirrors.
pub(crate) struct DirNode {
    pub src: OwnedFd,
    pub dst: OwnedFd,
    parent: Option<Arc<DirNode>>,
    /// Path from the copy's root, for failures and the manifest.
    rel: Vec<u8>,
    /// Source metadata to apply when done; `None` for a directory we keep as it was.
    meta: Option<Stat>,
    /// Outstanding work: the listing itself plus every child task still running.
    pending: AtomicUsize,
    /// We created this directory, so no entry in it pre-exists.
    fresh: bool,
    /// This directory, or one above it, is still under a staging name: nothing in it is
    /// visible under its final path yet, so entries are created under their final names
    /// directly (one rename per directory instead of one per file).
    hidden: bool,
    /// The staging name this directory has in its parent until it is complete, and the
    /// final name it is renamed to then.
    staged_as: Option<(CString, CString)>,
    /// This directory is, or is inside, a staging directory with this copy's tag that a
    /// resumed copy adopted: everything in it was made by an earlier run of this copy, so
    /// a file in it that is not a finished copy was being written when that run died, and
    /// is replaced (never a tenant's file: tenants have nothing under our staging names).
    ours: bool,
    src_dev: u64,
    dst_dev: u64,
}

impl DirNode {
    pub(crate) fn new(
        src: OwnedFd,
        dst: OwnedFd,
        meta: Option<Stat>,
        fresh: bool,
    ) -> io::Result<Self> {
        let src_dev = sys::fstat(src.as_fd())?.st_dev;
        let dst_dev = sys::fstat(dst.as_fd())?.st_dev;
        Ok(Self {
            src,
            dst,
            parent: None,
            rel: Vec::new(),
            meta,
            pending: AtomicUsize::new(1),
            fresh,
            hidden: false,
            staged_as: None,
            ours: false,
            src_dev,
            dst_dev,
        })
    }

    /// The top of a new copy: built as `tmp` inside `parent` and renamed to `name` when
    /// everything under it is complete, so the destination appears whole.
    pub(crate) fn staged_root(
        src: OwnedFd,
        dst: OwnedFd,
        meta: Stat,
        parent: OwnedFd,
        tmp: CString,
        name: CString,
        fresh: bool,
    ) -> io::Result<Self> {
        // The parent only serves the final rename: an empty node whose release is a no-op.
        let parent_src = parent.try_clone()?;
        let parent = DirNode::new(parent_src, parent, None, false)?;
        // Not fresh: a resumed copy adopted the staging directory its interrupted run left.
        let mut root = DirNode::new(src, dst, Some(meta), fresh)?;
        root.parent = Some(Arc::new(parent));
        root.hidden = true;
        root.ours = !fresh;
        root.staged_as = Some((tmp, name));
        Ok(root)
    }

    fn child_path(&self, name: &CStr) -> Vec<u8> {
        let mut p = self.rel.clone();
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name.to_bytes());
        p
    }
}

/// A file large enough to be copied in chunks by several workers.
pub(crate) struct LargeFile {
    node: Arc<DirNode>,
    src_name: CString,
    dst_name: CString,
    src: OwnedFd,
    staged: Mutex<Staged>,
    st: Stat,
    caps: Caps,
    chunks: u64,
    next_chunk: AtomicU64,
    /// Tasks still working on it; the last one out finishes the file.
    workers: AtomicUsize,
    error: Mutex<Option<(&'static str, io::Error)>>,
    /// When its source was opened, for the per-file copy time.
    started: Instant,
    /// Attempts before this one (a failed one is retried from `finish_chunked`).
    tries: Tries,
}

/// Earlier attempts at one regular file, by why they failed.
#[derive(Debug, Clone, Copy, Default)]
struct Tries {
    /// The source changed while it was copied.
    changed: u32,
    /// An I/O error reading the source or writing (or flushing) the copy.
    io: u32,
}

/// Where a file being written lives until it is committed.
enum StagedAt {
    /// Under its final name, inside a directory that is itself still staged.
    Final(CString),
    /// Nowhere (`O_TMPFILE`): linked to its name when complete.
    Unnamed,
    /// Under a staging name (filesystems without `O_TMPFILE`): renamed when complete.
    Named(CString),
    /// Committed, or discarded.
    Committed,
}

/// A regular file being written: unnamed (`O_TMPFILE`) until committed, or, where the
/// filesystem cannot do that, under a staging name.
pub(crate) struct Staged {
    fd: OwnedFd,
    at: StagedAt,
    /// Created with its final mode already (no fchmod needed).
    mode_done: bool,
}

pub(crate) enum Task {
    /// List a directory that is already open on both sides.
    List(Arc<DirNode>),
    /// Open, create and list a subdirectory.
    Dir { parent: Arc<DirNode>, name: CString },
    /// Copy these entries of a (large) directory.
    Batch {
        dir: Arc<DirNode>,
        entries: Vec<dirent::DirEntry>,
    },
    /// Copy chunks of a large file.
    Chunks(Arc<LargeFile>),
    /// Copy one entry under a different destination name (the top-level file case).
    Entry {
        dir: Arc<DirNode>,
        src_name: CString,
        dst_name: CString,
    },
}

#[derive(Default)]
struct Queue {
    tasks: Vec<Task>,
    active: usize,
    done: bool,
}

/// What a finished hard-link group leader left for its followers.
enum Link {
    /// The first path is being copied; these entries wait to be linked to it.
    /// (directory, name, replace): `replace` for a name a resumed copy adopted, which
    /// becomes a link to the leader in place of its own inode.
    Copying(Vec<(Arc<DirNode>, CString, bool)>),
    Done {
        dir: Arc<DirNode>,
        name: CString,
        hash: Option<u128>,
    },
    Failed(String),
}

#[derive(Default)]
pub(crate) struct Counters {
    pub files: AtomicU64,
    pub dirs: AtomicU64,
    pub symlinks: AtomicU64,
    pub specials: AtomicU64,
    pub hardlinks: AtomicU64,
    pub skipped: AtomicU64,
    pub files_resumed: AtomicU64,
    pub bytes_resumed: AtomicU64,
    pub verified: AtomicU64,
    pub bytes: AtomicU64,
    pub by_strategy: [AtomicU64; 3],
    pub failed: AtomicU64,
}

/// Worker-local state: buffers and the capability cache, so the hot path takes no lock.
#[derive(Default)]
struct Local {
    buf: Vec<u8>,
    dents: Vec<u8>,
    caps: CapsCache,
    xattrs: XattrBufs,
}

pub(crate) struct Ctx<'a> {
    pub opts: &'a Options,
    progress: &'a dyn Progress,
    who: Identity,
    hash: bool,
    queue: Mutex<Queue>,
    wake: Condvar,
    links: Mutex<HashMap<(u64, u64), Link>>,
    manifest: Option<Mutex<BufWriter<File>>>,
    /// xxh3-64 of every path an interrupted run's manifest lists (resume only).
    listed: HashSet<u64>,
    pub counters: Counters,
    pub failures: Mutex<Vec<Failure>>,
    pub aborted: Mutex<Option<String>>,
    abort: AtomicBool,
    /// `Options::fence` said no: this copy makes nothing more visible.
    fenced: AtomicBool,
    tmp_counter: AtomicU64,
    pid: u32,
}

/// Why an entry ended without being copied.
enum Skip {
    /// It exists and the overwrite policy keeps it.
    Kept,
    /// It waits on its hard-link group leader, who will finish it.
    Deferred,
}

type Fail = (&'static str, io::Error);

fn conflict(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::AlreadyExists, msg.to_string())
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(
        opts: &'a Options,
        progress: &'a dyn Progress,
        manifest: Option<File>,
        listed: HashSet<u64>,
    ) -> Self {
        // With a tag, staging names must not repeat those of an earlier attempt in the
        // directories a resumed walk does not sweep: start the counter from the clock.
        let first_tmp = match &opts.staging_tag {
            Some(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            None => 0,
        };
        Self {
            opts,
            progress,
            who: Identity::current(),
            hash: opts.verify != Verify::None || manifest.is_some(),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            links: Mutex::new(HashMap::new()),
            manifest: manifest.map(|f| Mutex::new(BufWriter::with_capacity(1 << 16, f))),
            listed,
            counters: Counters::default(),
            failures: Mutex::new(Vec::new()),
            aborted: Mutex::new(None),
            abort: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            tmp_counter: AtomicU64::new(first_tmp),
            pid: std::process::id(),
        }
    }

    /// Whether this copy may still make things visible at the destination (see
    /// `Options::fence`). Once it may not, it never may again, and the copy stops.
    pub(crate) fn owns(&self) -> bool {
        if self.fenced.load(Ordering::Relaxed) {
            return false;
        }
        match &self.opts.fence {
            Some(f) if !(f.0)() => {
                if !self.fenced.swap(true, Ordering::Relaxed) {
                    self.abort.store(true, Ordering::Relaxed);
                    *lock(&self.aborted) = Some(CANCELLED.into());
                }
                false
            }
            _ => true,
        }
    }

    /// `owns`, as a step of a file's commit.
    fn may_finish(&self) -> Result<(), Fail> {
        match self.owns() {
            true => Ok(()),
            false => Err(("finish", not_owner())),
        }
    }

    /// Flush the manifest (its lines were written as files committed).
    /// With `Options::sync` it is also flushed to stable storage: it may live on another
    /// filesystem than the destination's.
    pub(crate) fn finish_manifest(&self) -> io::Result<()> {
        let Some(m) = &self.manifest else {
            return Ok(());
        };
        let mut m = lock(m);
        if self.fenced.load(Ordering::Relaxed) {
            // Not ours to write any more (the new owner may be appending): drop the
            // buffered lines; the new owner verifies those files and lists them itself.
            let file = m.get_ref().try_clone()?;
            let (_, _unwritten) = std::mem::replace(&mut *m, BufWriter::new(file)).into_parts();
            return Ok(());
        }
        m.flush()?;
        match self.opts.sync {
            true => m.get_ref().sync_data(),
            false => Ok(()),
        }
    }

    /// Flush the destination filesystem once (`Options::sync`). A failure is reported and
    /// stops the copy's success, never retried: after failed writeback the kernel may have
    /// dropped the pages, and a second `syncfs` could succeed without them (fsyncgate).
    pub(crate) fn sync_destination(&self, fd: BorrowedFd<'_>) {
        let result = match self.opts.faults.syncfs_errno {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => sys::syncfs(fd),
        };
        if let Err(e) = result {
            self.fail(b"", "syncfs", &e);
            lock(&self.aborted).get_or_insert_with(|| {
                format!("flushing the destination filesystem failed ({e}): files reported copied may not be on stable storage")
            });
        }
    }

    pub(crate) fn push(&self, task: Task) {
        lock(&self.queue).tasks.push(task);
        self.wake.notify_one();
    }

    /// Run the queue to completion on `workers` threads.
    pub(crate) fn run(&self, workers: usize) {
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| self.worker());
            }
        });
    }

    fn worker(&self) {
        let mut local = Local::default();
        loop {
            let task = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(t) = q.tasks.pop() {
                        q.active += 1;
                        break t;
                    }
                    if q.active == 0 || q.done {
                        q.done = true;
                        self.wake.notify_all();
                        return;
                    }
                    q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            if self.stopping() {
                self.cancel(task, &mut local);
            } else {
                self.run_task(task, &mut local);
            }
            let mut q = lock(&self.queue);
            q.active -= 1;
            if q.active == 0 && q.tasks.is_empty() {
                q.done = true;
                self.wake.notify_all();
            }
        }
    }

    /// Whether the copy is stopping: the destination filled up, or the caller cancelled.
    fn stopping(&self) -> bool {
        if self.abort.load(Ordering::Relaxed) {
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
            Task::List(node) => self.release(node),
            Task::Dir { parent, .. } => self.release(parent),
            Task::Batch { dir, .. } | Task::Entry { dir, .. } => self.release(dir),
            Task::Chunks(file) => self.chunks(&file, local),
        }
    }

    fn run_task(&self, task: Task, local: &mut Local) {
        match task {
            Task::List(node) => self.list(node, local),
            Task::Dir { parent, name } => {
                // The parent's count for this child is released when the child directory
                // completes (`release` walks up), or here if it could not be opened.
                match self.open_subdir(&parent, &name) {
                    Ok(node) => self.list(node, local),
                    Err((op, e)) => {
                        self.fail(&parent.child_path(&name), op, &e);
                        self.release(parent);
                    }
                }
            }
            Task::Batch { dir, entries } => {
                for e in &entries {
                    if self.stopping() {
                        break;
                    }
                    self.entry(&dir, &e.name, &e.name, e.dtype, local);
                }
                self.release(dir);
            }
            Task::Chunks(file) => self.chunks(&file, local),
            Task::Entry {
                dir,
                src_name,
                dst_name,
            } => {
                self.entry(&dir, &src_name, &dst_name, DType::Unknown, local);
                self.release(dir);
            }
        }
    }

    /// Record one failed entry. A full destination stops the whole copy: every later file
    /// would fail the same way.
    fn fail(&self, path: &[u8], op: &'static str, err: &io::Error) {
        self.fail_kind(path, op, kind_of(err), err.to_string());
    }

    fn fail_kind(&self, path: &[u8], op: &'static str, kind: Reason, message: String) {
        let path = if path.is_empty() {
            PathBuf::from(".")
        } else {
            PathBuf::from(std::ffi::OsStr::from_bytes(path))
        };
        let failure = Failure {
            path,
            op,
            kind,
            message,
        };
        self.progress.failed(&failure);
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        if kind == Reason::DestinationFull && !self.abort.swap(true, Ordering::Relaxed) {
            *lock(&self.aborted) = Some(format!("destination is full: {}", failure.message));
        }
        let mut f = lock(&self.failures);
        if f.len() < MAX_FAILURES_KEPT {
            f.push(failure);
        }
    }

    /// One unit of a directory's work is done; finish directories whose work is all done,
    /// walking up the parents.
    pub(crate) fn release(&self, mut node: Arc<DirNode>) {
        loop {
            if node.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
                return;
            }
            // After an abort the directory still gets its final name (its finished entries
            // are good), but its metadata is left: it is known to be incomplete.
            if let Some(st) = node.meta.filter(|_| !self.abort.load(Ordering::Relaxed)) {
                match meta::apply_fd(
                    node.src.as_fd(),
                    node.dst.as_fd(),
                    &st,
                    &self.opts.preserve,
                    &self.who,
                    false,
                    &mut XattrBufs::default(),
                ) {
                    Ok(()) => {}
                    Err((op, e)) => self.fail(&node.rel, op, &e),
                }
            }
            // A fenced copy leaves its staging directories for the new owner to adopt.
            let staged = node
                .staged_as
                .as_ref()
                .filter(|_| !self.fenced.load(Ordering::Relaxed));
            if let (Some((tmp, name)), Some(parent)) = (staged, &node.parent) {
                if let Err(e) =
                    sys::renameat(parent.dst.as_fd(), tmp, parent.dst.as_fd(), name, true)
                {
                    self.fail(&node.rel, "rename directory into place", &e);
                }
            }
            match node.parent.clone() {
                Some(p) => node = p,
                None => return,
            }
        }
    }

    /// Open an entry of a source directory. As root, with `O_NOATIME`: a copy does not
    /// disturb the source's access times (nor dirty every source inode to record them).
    fn open_source(&self, dir: &DirNode, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
        if self.who.euid == 0 {
            match sys::open_beneath(dir.src.as_fd(), name, flags | libc::O_NOATIME) {
                // Refused on files of other owners without CAP_FOWNER (e.g. in a user namespace).
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return other,
            }
        }
        sys::open_beneath(dir.src.as_fd(), name, flags)
    }

    /// Open source subdirectory `name` and create (or, when merging, open) its twin.
    fn open_subdir(&self, parent: &Arc<DirNode>, name: &CStr) -> Result<Arc<DirNode>, Fail> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let src = self
            .open_source(parent, name, flags)
            .map_err(|e| ("open source directory", e))?;
        let st = sys::fstat(src.as_fd()).map_err(|e| ("stat source directory", e))?;
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
            Some((dst, tmp)) => (dst, false, Some((tmp, name.to_owned()))),
            None => {
                let staged_as = (parent.fresh && !parent.hidden && !split)
                    .then(|| (self.dir_tmp_name(name), name.to_owned()));
                let create_as: &CStr = staged_as.as_ref().map_or(name, |(tmp, _)| tmp.as_c_str());
                // 0700 while we fill it; the final mode comes after the children.
                let fresh = match sys::mkdirat(parent.dst.as_fd(), create_as, 0o700) {
                    Ok(()) => true,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EEXIST) && (!parent.fresh || split) =>
                    {
                        false
                    }
                    Err(e) => return Err(("create directory", e)),
                };
                // O_NOFOLLOW: a symlink planted at this name is refused, never entered.
                let dst = sys::open_beneath(parent.dst.as_fd(), create_as, flags)
                    .map_err(|e| ("open destination directory", e))?;
                (dst, fresh, staged_as)
            }
        };
        // Merging under if-changed or always makes existing directories match the source too
        // (that is what finishes an interrupted copy); under never they are left alone.
        // A resumed copy finishes the directories the interrupted one made. A part of a split
        // copy leaves directory metadata to the final `DirsOnly` run.
        let keep_meta = match self.opts.select {
            Part::All => fresh || self.opts.overwrite != Overwrite::Never || self.opts.resume,
            Part::Slice { .. } => false,
            Part::Directories => true,
        };
        let dst_dev = if fresh {
            parent.dst_dev
        } else {
            sys::fstat(dst.as_fd())
                .map_err(|e| ("stat destination directory", e))?
                .st_dev
        };
        self.counters.dirs.fetch_add(1, Ordering::Relaxed);
        if !matches!(self.opts.select, Part::Slice { .. }) {
            // Every part walks every directory; only one run counts them.
            self.progress.entry_done();
        }
        Ok(Arc::new(DirNode {
            src,
            dst,
            parent: Some(parent.clone()),
            rel: parent.child_path(name),
            meta: keep_meta.then_some(st),
            pending: AtomicUsize::new(1),
            fresh,
            hidden: staged_as.is_some() || (fresh && parent.hidden),
            staged_as,
            ours,
            src_dev: st.st_dev,
            dst_dev,
        }))
    }

    fn list(&self, node: Arc<DirNode>, local: &mut Local) {
        if local.dents.is_empty() {
            local.dents.resize(64 * 1024, 0);
        }
        // Before this directory's own work starts, so none of this run's names are swept.
        if self.opts.resume && !node.fresh {
            self.sweep_leftovers(&node, local);
        }
        let entries = match dirent::read_all(node.src.as_fd(), &mut local.dents) {
            Ok(e) => e,
            Err(e) => {
                self.fail(&node.rel, "read directory", &e);
                self.release(node);
                return;
            }
        };
        let mut files = Vec::with_capacity(entries.len());
        for e in entries {
            let is_dir = match e.dtype {
                DType::Dir => true,
                DType::Unknown => sys::lstatat(node.src.as_fd(), &e.name)
                    .map(|st| is_type(&st, libc::S_IFDIR))
                    .unwrap_or(false),
                _ => false,
            };
            if is_dir {
                node.pending.fetch_add(1, Ordering::Relaxed);
                self.push(Task::Dir {
                    parent: node.clone(),
                    name: e.name,
                });
            } else {
                files.push(e);
            }
        }
        // Cut a large directory into batches for other workers; keep the first one.
        while files.len() > BATCH {
            let rest = files.split_off(files.len() - BATCH);
            node.pending.fetch_add(1, Ordering::Relaxed);
            self.push(Task::Batch {
                dir: node.clone(),
                entries: rest,
            });
        }
        for e in &files {
            if self.stopping() {
                break;
            }
            self.entry(&node, &e.name, &e.name, e.dtype, local);
        }
        self.release(node);
    }

    pub(crate) fn tmp_name(&self) -> CString {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        // Short, so a 255-byte source name still has a legal staging name; the tag (or the
        // pid) keeps concurrent copies into one directory apart.
        let name = match &self.opts.staging_tag {
            Some(tag) => format!(".ferry-{tag}-{n:x}.tmp"),
            None => format!(".ferry-{:x}-{n:x}.tmp", self.pid),
        };
        CString::new(name).unwrap_or_default()
    }

    /// The staging name of a new directory that will be renamed to `name`. With a tag it is
    /// the same in every attempt (`d` and the name's hash: at most 61 bytes, never one of
    /// `tmp_name`'s, whose counter has at most 16 hex digits), so a resumed copy finds it.
    pub(crate) fn dir_tmp_name(&self, name: &CStr) -> CString {
        match &self.opts.staging_tag {
            Some(tag) => {
                let h = xxh3_64(name.to_bytes());
                CString::new(format!(".ferry-{tag}-d{h:016x}.tmp")).unwrap_or_default()
            }
            None => self.tmp_name(),
        }
    }

    /// The staging directory an interrupted run with this copy's tag left in `parent` for
    /// `name`, opened, and its staging name; only for a resumed copy, and only while `name`
    /// itself is free (a directory made there since is merged into instead).
    pub(crate) fn adopt_staged(
        &self,
        parent: BorrowedFd<'_>,
        name: &CStr,
    ) -> Option<(OwnedFd, CString)> {
        if !self.opts.resume || self.opts.staging_tag.is_none() {
            return None;
        }
        let tmp = self.dir_tmp_name(name);
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let fd = sys::open_beneath(parent, &tmp, flags).ok()?;
        match sys::lstatat(parent, name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Some((fd, tmp)),
            _ => None,
        }
    }

    /// Remove the staging files, symlinks and special files an interrupted attempt with
    /// this copy's tag left in `node`, a directory that existed before this run (its
    /// staging directories are adopted by `open_subdir` instead). Names without our tag are
    /// never touched, whatever they look like: they may be a tenant's, or another copy's.
    fn sweep_leftovers(&self, node: &DirNode, local: &mut Local) {
        let Some(tag) = &self.opts.staging_tag else {
            return;
        };
        let prefix = format!(".ferry-{tag}-");
        let entries = match dirent::read_all(node.dst.as_fd(), &mut local.dents) {
            Ok(e) => e,
            Err(e) => return self.fail(&node.rel, "read destination directory", &e),
        };
        for e in entries {
            let n = e.name.to_bytes();
            if !(n.starts_with(prefix.as_bytes()) && n.ends_with(b".tmp")) {
                continue;
            }
            let is_dir = match e.dtype {
                DType::Dir => true,
                DType::Unknown => sys::lstatat(node.dst.as_fd(), &e.name)
                    .map_or(true, |st| is_type(&st, libc::S_IFDIR)),
                _ => false,
            };
            if is_dir {
                continue;
            }
            match sys::unlinkat(node.dst.as_fd(), &e.name, false) {
                Ok(()) => {}
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
                Err(err) => self.fail(&node.child_path(&e.name), "remove staging leftover", &err),
            }
        }
    }

    /// Whether entries of `dir` are created under their final names directly: inside a
    /// staged directory nothing is visible yet, so one rename of the directory stands for
    /// all of them. (A resumed copy that adopts such a directory tells finished files from
    /// the one being written when it died: see `DirNode::ours`.)
    fn names_directly(&self, dir: &DirNode) -> bool {
        dir.hidden
    }

    /// Whether `dir/name`, found by a resumed copy in one of its own staging directories,
    /// may be a finished copy of `st`: a regular file of its size, and (when times are
    /// kept) its mtime, which is applied after the data. A file caught mid-write has
    /// neither yet.
    fn may_be_finished(&self, dir: &DirNode, name: &CStr, st: &Stat) -> Result<bool, Fail> {
        let d = match sys::lstatat(dir.dst.as_fd(), name) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(("stat destination", e)),
        };
        Ok(is_type(&d, libc::S_IFREG)
            && d.st_size == st.st_size
            && (!self.opts.preserve.timestamps
                || (d.st_mtime, d.st_mtime_nsec) == (st.st_mtime, st.st_mtime_nsec)))
    }

    /// Copy one non-directory entry. `dtype` is the listing's hint; the real type comes
    /// from `fstat` of what was opened (or `lstat` for things never opened).
    fn entry(
        &self,
        dir: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        dtype: DType,
        local: &mut Local,
    ) {
        let mut dtype = dtype;
        match self.opts.select {
            Part::All => {}
            // The listing sends directories elsewhere; only an unknown type may be one.
            Part::Directories if dtype != DType::Unknown => return,
            Part::Directories => {}
            Part::Slice { index, count } => {
                let st = match sys::lstatat(dir.src.as_fd(), src_name) {
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
            match sys::lstatat(dir.src.as_fd(), src_name) {
                Ok(st) if is_type(&st, libc::S_IFDIR) => {
                    dir.pending.fetch_add(1, Ordering::Relaxed);
                    self.push(Task::Dir {
                        parent: dir.clone(),
                        name: src_name.to_owned(),
                    });
                }
                Ok(_) => {}
                Err(e) => self.fail(&dir.child_path(dst_name), "stat", &e),
            }
            return;
        }
        let result = match dtype {
            DType::Regular => self.regular(dir, src_name, dst_name, local),
            _ => match sys::lstatat(dir.src.as_fd(), src_name) {
                Err(e) => Err(("stat", e)),
                Ok(st) if is_type(&st, libc::S_IFREG) => {
                    self.regular(dir, src_name, dst_name, local)
                }
                Ok(st) if is_type(&st, libc::S_IFDIR) => {
                    // A directory appeared where the listing saw something else.
                    dir.pending.fetch_add(1, Ordering::Relaxed);
                    self.push(Task::Dir {
                        parent: dir.clone(),
                        name: src_name.to_owned(),
                    });
                    return;
                }
                Ok(st) => self.non_regular(dir, src_name, dst_name, &st),
            },
        };
        match result {
            Ok(None) => {}
            Ok(Some(Skip::Kept)) => self.count_skipped(),
            Ok(Some(Skip::Deferred)) => {}
            Err((op, e)) => self.fail(&dir.child_path(dst_name), op, &e),
        }
    }

    /// Under a merge, decide whether an existing destination entry stops this one.
    fn keep_existing(&self, dir: &DirNode, name: &CStr, st: &Stat) -> Result<bool, Fail> {
        if dir.fresh {
            return Ok(false);
        }
        let existing = match sys::lstatat(dir.dst.as_fd(), name) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(("stat destination", e)),
        };
        if is_type(&existing, libc::S_IFDIR) {
            return Err((
                "replace",
                conflict("destination is a directory; the source is not"),
            ));
        }
        Ok(match self.opts.overwrite {
            Overwrite::Never => true,
            // Same type, size, mtime (and device number): the rsync quick check, for
            // links and special files as well as regular files.
            Overwrite::IfChanged => {
                existing.st_mode & libc::S_IFMT == st.st_mode & libc::S_IFMT
                    && existing.st_size == st.st_size
                    && existing.st_rdev == st.st_rdev
                    && existing.st_mtime == st.st_mtime
                    && existing.st_mtime_nsec == st.st_mtime_nsec
            }
            Overwrite::Always => false,
        })
    }

    /// Move a finished staging entry to its final name. `Ok(false)` when an entry that
    /// appeared meanwhile is kept by the overwrite policy (the staging entry is removed).
    fn commit(&self, dir: &DirNode, tmp: &CStr, name: &CStr) -> Result<bool, Fail> {
        if !self.owns() {
            let _ = sys::unlinkat(dir.dst.as_fd(), tmp, false);
            return Err(("rename into place", not_owner()));
        }
        let no_replace = dir.fresh || self.opts.overwrite == Overwrite::Never;
        match sys::renameat(dir.dst.as_fd(), tmp, dir.dst.as_fd(), name, no_replace) {
            Ok(()) => Ok(true),
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST)
                    && self.opts.overwrite == Overwrite::Never
                    && !dir.fresh =>
            {
                let _ = sys::unlinkat(dir.dst.as_fd(), tmp, false);
                Ok(false)
            }
            Err(e) => {
                let _ = sys::unlinkat(dir.dst.as_fd(), tmp, false);
                Err(("rename into place", e))
            }
        }
    }

    fn regular(
        &self,
        dir: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        local: &mut Local,
    ) -> Result<Option<Skip>, Fail> {
        // One clock read per file, for the copy-time histogram; the commit reads it again.
        let started = Instant::now();
        let src = match self.open_source(dir, src_name, SOURCE_FLAGS) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                // It became a symlink since the listing: copy the link.
                let st = sys::lstatat(dir.src.as_fd(), src_name).map_err(|e| ("stat", e))?;
                return self.non_regular(dir, src_name, dst_name, &st);
            }
            Err(e) => return Err(("open source", e)),
        };
        let st = sys::fstat(src.as_fd()).map_err(|e| ("stat source", e))?;
        if !is_type(&st, libc::S_IFREG) {
            drop(src);
            return self.non_regular(dir, src_name, dst_name, &st);
        }
        // Under `overwrite: Always` an existing file is replaced, except by a resumed copy
        // when an earlier run of this copy listed it and it is still what it wrote.
        let done_before = self.opts.resume
            && self.opts.overwrite == Overwrite::Always
            && !dir.fresh
            && self.is_listed(&dir.child_path(dst_name))
            && self.may_be_finished(dir, dst_name, &st)?;
        if done_before || self.keep_existing(dir, dst_name, &st)? {
            let resumed_ours = self.opts.resume && dir.ours;
            let partial = resumed_ours && !self.may_be_finished(dir, dst_name, &st)?;
            if !partial {
                if self.opts.resume && self.opts.preserve.hard_links && st.st_nlink > 1 {
                    return self.adopt_linked(dir, &src, dst_name, &st, local);
                }
                let committed = match self.opts.resume {
                    true => self.committed_earlier(dir, dst_name, &src, &st, local)?,
                    false => true,
                };
                if committed || !resumed_ours {
                    return Ok(Some(Skip::Kept));
                }
            }
            // Our own file, not finished: the run that died was writing it.
            sys::unlinkat(dir.dst.as_fd(), dst_name, false)
                .map_err(|e| ("remove an unfinished file", e))?;
        }
        self.in_link_group(dir, dst_name, &st, || {
            let first = Tries::default();
            self.copy_regular(dir, src, src_name, &st, dst_name, started, local, first)
        })
    }

    /// Whether `path` is in the manifest an interrupted run wrote.
    fn is_listed(&self, path: &[u8]) -> bool {
        self.listed.contains(&xxh3_64(path))
    }

    /// A resumed copy keeps regular file `dir/name`: count it as committed by an earlier
    /// attempt if it is. Listed in the manifest, it is. Not listed (its line was lost with
    /// the process that committed it, or it is a tenant's file), it is if it equals the
    /// source byte for byte, and then gets its line now, so the manifest lists every file
    /// once. Without a manifest there is nothing to tell them apart: every kept file counts.
    fn committed_earlier(
        &self,
        dir: &DirNode,
        name: &CStr,
        src: &OwnedFd,
        st: &Stat,
        local: &mut Local,
    ) -> Result<bool, Fail> {
        let path = dir.child_path(name);
        let ours = if self.manifest.is_none() || self.is_listed(&path) {
            true
        } else {
            match self.same_as_source(dir, name, src, st, local)? {
                Some(hash) => {
                    self.manifest_line(hash, &path);
                    true
                }
                None => false,
            }
        };
        if ours {
            self.count_resumed(st.st_size as u64);
        }
        Ok(ours)
    }

    fn count_resumed(&self, size: u64) {
        self.counters.files_resumed.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_resumed
            .fetch_add(size, Ordering::Relaxed);
        self.progress.resumed(size);
    }

    /// The xxHash3-128 of destination file `dir/name` if it is a regular file with the same
    /// bytes as the source `src`, `None` if it is anything else.
    fn same_as_source(
        &self,
        dir: &DirNode,
        name: &CStr,
        src: &OwnedFd,
        st: &Stat,
        local: &mut Local,
    ) -> Result<Option<u128>, Fail> {
        // O_NOATIME: reading it must not undo the atime it was given; O_NONBLOCK: a FIFO
        // there must not hang the open.
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let dst = match sys::open_beneath(dir.dst.as_fd(), name, flags | libc::O_NOATIME)
            .or_else(|_| sys::open_beneath(dir.dst.as_fd(), name, flags))
        {
            Ok(fd) => fd,
            // A symlink there is not our file.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
            Err(e) => return Err(("open destination", e)),
        };
        let dst_st = sys::fstat(dst.as_fd()).map_err(|e| ("stat destination", e))?;
        if !is_type(&dst_st, libc::S_IFREG) || dst_st.st_size != st.st_size {
            return Ok(None);
        }
        let size = st.st_size as u64;
        let (want, n) =
            data::hash_fd(src.as_fd(), size, &mut local.buf).map_err(|e| ("read source", e))?;
        let (got, m) = data::hash_fd(dst.as_fd(), size, &mut local.buf)
            .map_err(|e| ("read destination", e))?;
        Ok((n == size && m == size && got == want).then_some(want))
    }

    /// Copy an entry that may be one name of a hard-link group (regular file, symlink or
    /// special file, as `cp -a` keeps them all): the first name seen is copied by
    /// `copy_leader`, which answers `Some(hash)` once committed (`None` when chunk workers
    /// finish it); the other names become links to it, made as soon as it exists.
    fn in_link_group(
        &self,
        dir: &Arc<DirNode>,
        dst_name: &CStr,
        st: &Stat,
        copy_leader: impl FnOnce() -> Result<Option<Option<u128>>, Fail>,
    ) -> Result<Option<Skip>, Fail> {
        if !(self.opts.preserve.hard_links && st.st_nlink > 1) {
            return copy_leader().map(|_| None);
        }
        let key = (st.st_dev, st.st_ino);
        {
            let mut links = lock(&self.links);
            match links.get_mut(&key) {
                None => {
                    links.insert(key, Link::Copying(Vec::new()));
                }
                Some(Link::Copying(waiters)) => {
                    dir.pending.fetch_add(1, Ordering::Relaxed);
                    waiters.push((dir.clone(), dst_name.to_owned(), false));
                    return Ok(Some(Skip::Deferred));
                }
                Some(Link::Done {
                    dir: leader,
                    name,
                    hash,
                }) => {
                    let (leader, name, hash) = (leader.clone(), name.clone(), *hash);
                    drop(links);
                    return self
                        .link_to(&leader, &name, dir, dst_name, hash, false)
                        .map(|()| None);
                }
                Some(Link::Failed(why)) => {
                    return Err((
                        "link",
                        io::Error::other(format!("first link of this file failed: {why}")),
                    ));
                }
            }
        }
        let result = copy_leader();
        // Finish the hard-link group whatever happened to its leader.
        let outcome = match &result {
            Ok(Some(hash)) => Ok(*hash),
            // Never: linked files are not chunked, so their leader is done here.
            Ok(None) => Err("internal: hard-linked file was chunked".to_string()),
            Err((op, e)) => Err(format!("{op}: {e}")),
        };
        self.finish_group(key, dir, dst_name, outcome);
        result.map(|_| None)
    }

    /// Record how a hard-link group's leader `dir/name` ended (its hash, or why it failed)
    /// and settle the names that waited for it: linked to it, or failed.
    fn finish_group(
        &self,
        key: (u64, u64),
        dir: &Arc<DirNode>,
        name: &CStr,
        outcome: Result<Option<u128>, String>,
    ) {
        let next = match &outcome {
            Ok(hash) => Link::Done {
                dir: dir.clone(),
                name: name.to_owned(),
                hash: *hash,
            },
            Err(why) => Link::Failed(why.clone()),
        };
        let waiters = match lock(&self.links).insert(key, next) {
            Some(Link::Copying(w)) => w,
            _ => Vec::new(),
        };
        for (wdir, wname, replace) in waiters {
            let r = match &outcome {
                Ok(hash) => self.link_to(dir, name, &wdir, &wname, *hash, replace),
                Err(_) => Err(("link", io::Error::other("first link of this file failed"))),
            };
            if let Err((op, e)) = r {
                self.fail(&wdir.child_path(&wname), op, &e);
            }
            self.release(wdir);
        }
    }

    /// A resumed copy found one name of a hard-linked source file already at the
    /// destination. If it is the interrupted run's copy (same size and mtime as the
    /// source), it rejoins its link group: it becomes the group's leader when the group
    /// has none yet, or is replaced by a link to the leader (an identical copy) when it has.
    /// Anything else at that name is kept as it is. With a manifest, a name it does not
    /// list must also equal the source byte for byte (and is listed now).
    fn adopt_linked(
        &self,
        dir: &Arc<DirNode>,
        src: &OwnedFd,
        name: &CStr,
        st: &Stat,
        local: &mut Local,
    ) -> Result<Option<Skip>, Fail> {
        let existing = sys::lstatat(dir.dst.as_fd(), name).map_err(|e| ("stat destination", e))?;
        let ours = is_type(&existing, libc::S_IFREG)
            && existing.st_size == st.st_size
            && (existing.st_mtime, existing.st_mtime_nsec) == (st.st_mtime, st.st_mtime_nsec);
        if !ours {
            return Ok(Some(Skip::Kept));
        }
        let path = dir.child_path(name);
        let proven = match self.manifest.is_some() && !self.is_listed(&path) {
            true => match self.same_as_source(dir, name, src, st, local)? {
                Some(hash) => Some(hash),
                None => return Ok(Some(Skip::Kept)),
            },
            false => None,
        };
        let key = (st.st_dev, st.st_ino);
        let mut links = lock(&self.links);
        match links.get_mut(&key) {
            None => {
                // The leader. Other names that arrive meanwhile wait for it.
                links.insert(key, Link::Copying(Vec::new()));
                drop(links);
                // Hash what is there, so the other names get manifest lines.
                let result = if let Some(hash) = proven {
                    self.manifest_line(hash, &path);
                    Ok(Some(hash))
                } else if self.hash {
                    // O_NOATIME: reading it must not undo the atime it was given.
                    let flags = libc::O_RDONLY | libc::O_NOFOLLOW;
                    sys::open_beneath(dir.dst.as_fd(), name, flags | libc::O_NOATIME)
                        .or_else(|_| sys::open_beneath(dir.dst.as_fd(), name, flags))
                        .map_err(|e| ("open destination", e))
                        .and_then(|fd| {
                            data::hash_fd(fd.as_fd(), existing.st_size as u64, &mut local.buf)
                                .map(|(h, _)| Some(h))
                                .map_err(|e| ("read destination", e))
                        })
                } else {
                    Ok(None)
                };
                let outcome = match &result {
                    Ok(hash) => {
                        self.count_resumed(st.st_size as u64);
                        Ok(*hash)
                    }
                    Err((op, e)) => Err(format!("{op}: {e}")),
                };
                self.finish_group(key, dir, name, outcome);
                result.map(|_| Some(Skip::Kept))
            }
            Some(Link::Copying(waiters)) => {
                dir.pending.fetch_add(1, Ordering::Relaxed);
                waiters.push((dir.clone(), name.to_owned(), true));
                Ok(Some(Skip::Deferred))
            }
            Some(Link::Done {
                dir: leader,
                name: leader_name,
                hash,
            }) => {
                let (leader, leader_name, hash) = (leader.clone(), leader_name.clone(), *hash);
                drop(links);
                self.link_to(&leader, &leader_name, dir, name, hash, true)
                    .map(|()| None)
            }
            Some(Link::Failed(why)) => Err((
                "link",
                io::Error::other(format!("first link of this file failed: {why}")),
            )),
        }
    }

    /// Make `dst_dir/dst_name` a hard link to the already committed `leader_dir/leader`.
    fn link_to(
        &self,
        leader_dir: &DirNode,
        leader: &CStr,
        dst_dir: &DirNode,
        dst_name: &CStr,
        hash: Option<u128>,
        replace: bool,
    ) -> Result<(), Fail> {
        if !self.owns() {
            return Err(("link", not_owner()));
        }
        // linkat cannot replace; a kept or replaced name was settled by keep_existing.
        if replace || (!dst_dir.fresh && self.opts.overwrite != Overwrite::Never) {
            match sys::unlinkat(dst_dir.dst.as_fd(), dst_name, false) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(("remove replaced entry", e)),
            }
        }
        match sys::linkat(
            leader_dir.dst.as_fd(),
            leader,
            dst_dir.dst.as_fd(),
            dst_name,
        ) {
            Ok(()) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST)
                    && self.opts.overwrite == Overwrite::Never
                    && !dst_dir.fresh =>
            {
                self.count_skipped();
                return Ok(());
            }
            Err(e) => return Err(("link", e)),
        }
        self.counters.hardlinks.fetch_add(1, Ordering::Relaxed);
        // A relinked name was listed by the run that first committed it, unless its line
        // was lost with that run's process.
        let path = dst_dir.child_path(dst_name);
        if let Some(h) = hash.filter(|_| !replace || !self.is_listed(&path)) {
            self.manifest_line(h, &path);
        }
        self.progress.entry_done();
        Ok(())
    }

    fn manifest_line(&self, hash: u128, path: &[u8]) {
        let Some(m) = &self.manifest else { return };
        // A newline would end the line: such names are escaped GNU-style (a leading
        // backslash marks the line; `\\` and `\n` inside), which xxhsum 0.8.2+ and the
        // coreutils *sum tools read. Other names are written raw, which is what xxhsum
        // 0.8.1 (Debian 12) expects even for backslashes.
        let needs_escape = path.contains(&b'\n');
        let mut line = Vec::with_capacity(path.len() + 36);
        if needs_escape {
            line.push(b'\\');
        }
        line.extend_from_slice(format!("{hash:032x}  ").as_bytes());
        for &b in path {
            match b {
                b'\n' if needs_escape => line.extend_from_slice(b"\\n"),
                b'\\' if needs_escape => line.extend_from_slice(b"\\\\"),
                _ => line.push(b),
            }
        }
        line.push(b'\n');
        let _ = lock(m).write_all(&line);
    }

    /// Create the destination file for `st`: unnamed (`O_TMPFILE`) where the filesystem
    /// allows, so nothing is ever visible before it is complete and a crash leaves
    /// nothing behind; under a staging name otherwise.
    fn stage(
        &self,
        dir: &DirNode,
        st: &Stat,
        name: &CStr,
        caps: &mut Caps,
    ) -> Result<Staged, Fail> {
        let access = if self.hash {
            libc::O_RDWR
        } else {
            libc::O_WRONLY
        };
        let (mode, mode_done) = self.who.creation_mode(st, &self.opts.preserve, dir.fresh);
        let create = access | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        if self.names_directly(dir) {
            let fd = sys::openat(dir.dst.as_fd(), name, create, mode).map_err(|e| ("create", e))?;
            return Ok(Staged {
                fd,
                at: StagedAt::Final(name.to_owned()),
                mode_done,
            });
        }
        if caps.tmpfile {
            match sys::open_tmpfile(dir.dst.as_fd(), access, mode) {
                Ok(fd) => {
                    return Ok(Staged {
                        fd,
                        at: StagedAt::Unnamed,
                        mode_done,
                    })
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
                    ) =>
                {
                    caps.tmpfile = false;
                }
                Err(e) => return Err(("create", e)),
            }
        }
        let tmp = self.tmp_name();
        let fd = sys::openat(dir.dst.as_fd(), &tmp, create, mode).map_err(|e| ("create", e))?;
        Ok(Staged {
            fd,
            at: StagedAt::Named(tmp),
            mode_done,
        })
    }

    /// Give a finished file its final name. `Ok(false)` when an entry that appeared
    /// meanwhile is kept by the overwrite policy.
    fn commit_staged(&self, dir: &DirNode, staged: &mut Staged, name: &CStr) -> Result<bool, Fail> {
        if !self.owns() {
            return Err(("link into place", not_owner()));
        }
        let replace = !dir.fresh && self.opts.overwrite != Overwrite::Never;
        match std::mem::replace(&mut staged.at, StagedAt::Committed) {
            StagedAt::Final(_) | StagedAt::Committed => Ok(true),
            StagedAt::Unnamed if !replace => {
                match sys::link_fd(staged.fd.as_fd(), dir.dst.as_fd(), name) {
                    Ok(()) => Ok(true),
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) && !dir.fresh => Ok(false),
                    Err(e) => Err(("link into place", e)),
                }
            }
            StagedAt::Unnamed => {
                // linkat cannot replace: name it, then rename over the old entry atomically.
                let tmp = self.tmp_name();
                sys::link_fd(staged.fd.as_fd(), dir.dst.as_fd(), &tmp)
                    .map_err(|e| ("link into place", e))?;
                self.commit(dir, &tmp, name)
            }
            StagedAt::Named(tmp) => self.commit(dir, &tmp, name),
        }
    }

    /// Remove a staged file that will not be committed.
    fn discard(&self, dir: &DirNode, staged: &mut Staged) {
        match std::mem::replace(&mut staged.at, StagedAt::Committed) {
            // A fenced copy leaves a file it was writing under its final name (inside a
            // staging directory) to the new owner, who may already have adopted the
            // directory and made that name again: unlinking it could remove the new
            // owner's file. The new owner tells an unfinished file by its size and mtime.
            StagedAt::Final(_) if self.fenced.load(Ordering::Relaxed) => {}
            StagedAt::Final(name) | StagedAt::Named(name) => {
                let _ = sys::unlinkat(dir.dst.as_fd(), &name, false);
            }
            StagedAt::Unnamed | StagedAt::Committed => {}
        }
    }

    /// Copy a regular file's data and metadata to a staged file, verify, and commit it.
    /// `Ok(Some(hash))` when committed (hash when hashing), `Ok(None)` when handed to
    /// chunk workers that will finish it. An attempt that fails because the source changed
    /// under it, or with an I/O error, is discarded and the file copied again from a fresh
    /// open of its source (see [`Ctx::retry`]); `tries` counts the attempts before this call.
    #[allow(clippy::too_many_arguments)]
    fn copy_regular(
        &self,
        dir: &Arc<DirNode>,
        mut src: OwnedFd,
        src_name: &CStr,
        st: &Stat,
        name: &CStr,
        started: Instant,
        local: &mut Local,
        mut tries: Tries,
    ) -> Result<Option<Option<u128>>, Fail> {
        if let Some(d) = self.opts.faults.delay_per_file {
            std::thread::sleep(d);
        }
        let mut st = *st;
        loop {
            let mut caps =
                local
                    .caps
                    .get(dir.src_dev, dir.dst_dev, dir.dst.as_fd(), self.opts.reflink);
            let mut staged = self.stage(dir, &st, name, &mut caps)?;
            let result = self.fill_regular(
                dir,
                &src,
                src_name,
                &mut staged,
                &st,
                name,
                started,
                &mut caps,
                local,
                tries,
            );
            local.caps.set(dir.src_dev, dir.dst_dev, caps);
            let err = match result {
                Ok(FillOutcome::Committed(hash)) => return Ok(Some(hash)),
                Ok(FillOutcome::Chunk(caps)) => {
                    let file = (src_name, name, caps, started, tries);
                    self.start_chunks(dir, &src, staged, &st, file);
                    return Ok(None);
                }
                Ok(FillOutcome::Kept) => {
                    // An entry appeared at its name meanwhile, and the policy keeps it.
                    self.count_skipped();
                    return Ok(Some(None));
                }
                Err(err) => err,
            };
            self.discard(dir, &mut staged);
            drop(staged);
            (src, st) = self.retry(dir, src_name, &mut tries, err)?;
        }
    }

    /// After a failed attempt at a regular file (its staged copy already discarded): the
    /// source to copy it again from, or the error to report. A source that changed while
    /// it was copied is tried again, up to [`ATTEMPTS_WHILE_CHANGING`] attempts in all; an
    /// I/O error (reading the source, writing or flushing the copy) gets one fresh rewrite.
    /// Always from a new open of the source and into a new staged file: a handle that
    /// failed may keep failing (FUSE, NFS), and after a failed flush the kernel may have
    /// dropped the pages it could not write, so the old fd is never flushed again.
    fn retry(
        &self,
        dir: &DirNode,
        src_name: &CStr,
        tries: &mut Tries,
        (op, err): Fail,
    ) -> Result<(OwnedFd, Stat), Fail> {
        if self.stopping() {
            return Err((op, err));
        }
        match kind_of(&err) {
            Reason::SourceChanged => {
                tries.changed += 1;
                if tries.changed >= ATTEMPTS_WHILE_CHANGING {
                    let msg = format!(
                        "{err}; gave up after {} attempts, the source changed during each",
                        tries.changed
                    );
                    return Err((op, source_changed(msg)));
                }
            }
            // Only errors the kernel reported: ours (a stopped copy...) are final.
            Reason::IOError if err.raw_os_error().is_some() => {
                if tries.io >= REWRITES_AFTER_IO_ERROR {
                    let msg = format!("{err} (again on a fresh rewrite from the source)");
                    return Err((op, io::Error::other(msg)));
                }
                tries.io += 1;
            }
            _ => return Err((op, err)),
        }
        let src = self
            .open_source(dir, src_name, SOURCE_FLAGS)
            .map_err(|e| ("open source", e))?;
        let st = sys::fstat(src.as_fd()).map_err(|e| ("stat source", e))?;
        if !is_type(&st, libc::S_IFREG) {
            let msg = "the source stopped being a regular file while it was copied";
            return Err(("open source", source_changed(msg.into())));
        }
        Ok((src, st))
    }

    #[allow(clippy::too_many_arguments)]
    fn fill_regular(
        &self,
        dir: &Arc<DirNode>,
        src: &OwnedFd,
        src_name: &CStr,
        staged: &mut Staged,
        st: &Stat,
        name: &CStr,
        started: Instant,
        caps: &mut Caps,
        local: &mut Local,
        tries: Tries,
    ) -> Result<FillOutcome, Fail> {
        let opts = self.opts;
        let size = st.st_size as u64;
        let dst = staged.fd.as_fd();
        let mut moved = Moved::default();
        let mut cloned = false;
        // Bytes the destination holds once written (holes included).
        let mut logical_len = size;
        if caps.ficlone && size > 0 {
            match data::try_ficlone(dst, src.as_fd(), &opts.faults).map_err(|e| ("clone", e))? {
                Clone::Done => {
                    cloned = true;
                    moved = Moved {
                        bytes: size,
                        strategy: Some(Strategy::Reflink),
                        short: false,
                    };
                }
                Clone::Unsupported => caps.ficlone = false,
                Clone::NotThisFile => {}
            }
        }
        if !cloned && opts.reflink == Reflink::Always && size > 0 {
            return Err(("clone", io::Error::other(ReflinkRefused)));
        }
        let src_hash = if cloned {
            match self.hash {
                true => {
                    let (hash, n) = data::hash_fd(src.as_fd(), size, &mut local.buf)
                        .map_err(|e| ("read source", e))?;
                    if n != size {
                        return Err((
                            "read source",
                            source_changed(format!(
                                "source shrank from {size} to {n} bytes while copying"
                            )),
                        ));
                    }
                    Some(hash)
                }
                false => None,
            }
        } else {
            let sparse = opts.preserve.sparseness && (st.st_blocks as u64) * 512 < size;
            // Hard-linked files are copied whole so their followers can link at once.
            let linked = opts.preserve.hard_links && st.st_nlink > 1;
            if !sparse
                && !self.hash
                && !linked
                && size >= CHUNK_THRESHOLD
                && opts.workers_resolved() > 1
            {
                return Ok(FillOutcome::Chunk(*caps));
            }
            let mut hasher = self.hash.then(Xxh3::new);
            moved = if sparse {
                data::copy_sparse(
                    src.as_fd(),
                    dst,
                    size,
                    caps,
                    &mut local.buf,
                    hasher.as_mut(),
                    &opts.faults,
                )
            } else {
                // Size 0 may be a procfs file that lies: read to EOF.
                let len = (size > 0).then_some(size);
                let range = Range {
                    src: src.as_fd(),
                    dst,
                    off: 0,
                    len,
                };
                data::copy_range(range, caps, &mut local.buf, hasher.as_mut(), &opts.faults)
            }
            .map_err(|e| ("copy data", e))?;
            if moved.short {
                let msg = format!("source shrank below its {size} bytes while copying");
                return Err(("copy data", source_changed(msg)));
            }
            if !sparse {
                // What was read, not what stat said: procfs files report size 0.
                logical_len = moved.bytes;
            }
            hasher.map(|h| h.digest128())
        };
        if let Some(victim) = &opts.faults.corrupt_after_write {
            if victim.as_slice() == name.to_bytes() {
                let _ = sys::pwrite(dst, b"\xff", 0);
            }
        }
        if let Some((victim, times)) = &opts.faults.change_source {
            if victim.as_slice() == src_name.to_bytes() && tries.changed < *times {
                change_source(dir, src_name);
            }
        }
        check_unchanged(src.as_fd(), st)?;
        let hash = match src_hash {
            Some(expected) => {
                let fail_flush =
                    opts.faults
                        .fdatasync_eio
                        .as_ref()
                        .is_some_and(|(victim, times)| {
                            victim.as_slice() == name.to_bytes() && tries.io < *times
                        });
                Some(self.verify_dst(dst, expected, logical_len, local, fail_flush)?)
            }
            None => None,
        };
        // A file named directly (inside a staging directory) is finished by its times,
        // which come last: a copy that no longer owns the destination leaves it without.
        self.may_finish()?;
        meta::apply_fd(
            src.as_fd(),
            dst,
            st,
            &opts.preserve,
            &self.who,
            staged.mode_done,
            &mut local.xattrs,
        )?;
        if !self.commit_staged(dir, staged, name)? {
            return Ok(FillOutcome::Kept);
        }
        self.count_file(size, &moved, &dir.child_path(name), hash, started);
        Ok(FillOutcome::Committed(hash))
    }

    /// Re-read the destination and compare with the source's hash; with `Verify::Full`
    /// the destination is flushed and evicted first so the bytes come from the medium.
    /// (The source was checked unchanged before: a mix of two versions is never verified.)
    /// `fail_flush`: the `fdatasync_eio` fault.
    fn verify_dst(
        &self,
        dst: BorrowedFd<'_>,
        expected: u128,
        len: u64,
        local: &mut Local,
        fail_flush: bool,
    ) -> Result<u128, Fail> {
        if self.opts.verify == Verify::Full {
            match fail_flush {
                true => Err(io::Error::from_raw_os_error(libc::EIO)),
                false => sys::fdatasync(dst),
            }
            .map_err(|e| ("fdatasync", e))?;
            sys::fadvise_dontneed(dst).map_err(|e| ("fadvise", e))?;
        }
        if self.opts.verify != Verify::None {
            let (got, n) = data::hash_fd(dst, len, &mut local.buf)
                .map_err(|e| ("read back destination", e))?;
            if got != expected || n != len {
                return Err(("verify", checksum_mismatch(expected, got)));
            }
            self.counters.verified.fetch_add(1, Ordering::Relaxed);
            self.progress.bytes_verified(n);
        }
        Ok(expected)
    }

    fn count_file(
        &self,
        size: u64,
        moved: &Moved,
        path: &[u8],
        hash: Option<u128>,
        started: Instant,
    ) {
        self.counters.files.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes.fetch_add(size, Ordering::Relaxed);
        if let Some(s) = moved.strategy {
            self.counters.by_strategy[s as usize].fetch_add(moved.bytes, Ordering::Relaxed);
            self.progress.bytes_copied(moved.bytes, s);
        }
        if let Some(h) = hash {
            self.manifest_line(h, path);
        }
        self.progress.file_done(size, started.elapsed());
        self.progress.entry_done();
    }

    fn count_skipped(&self) {
        self.counters.skipped.fetch_add(1, Ordering::Relaxed);
        self.progress.skipped();
    }

    /// Hand a large file to chunk workers. `file`: its source and destination names, the
    /// capabilities to copy with, when it was opened, and the attempts before this one.
    fn start_chunks(
        &self,
        dir: &Arc<DirNode>,
        src: &OwnedFd,
        staged: Staged,
        st: &Stat,
        file: (&CStr, &CStr, Caps, Instant, Tries),
    ) {
        let (src_name, name, caps, started, tries) = file;
        let chunks = (st.st_size as u64).div_ceil(CHUNK);
        let helpers = (self.opts.workers_resolved() as u64).min(chunks) as usize;
        let src = match src.try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                let mut staged = staged;
                self.discard(dir, &mut staged);
                self.fail(&dir.child_path(name), "duplicate descriptor", &e);
                return;
            }
        };
        dir.pending.fetch_add(1, Ordering::Relaxed);
        let file = Arc::new(LargeFile {
            node: dir.clone(),
            src_name: src_name.to_owned(),
            dst_name: name.to_owned(),
            src,
            staged: Mutex::new(staged),
            st: *st,
            caps,
            chunks,
            next_chunk: AtomicU64::new(0),
            workers: AtomicUsize::new(helpers),
            error: Mutex::new(None),
            started,
            tries,
        });
        // All its tasks go to the queue and this worker returns to its directory: with
        // several large files each worker takes its own (buffered writes to one inode
        // serialise on its lock, so one file per worker is the fast case) and the spare
        // tasks help with whichever file still has chunks left.
        for _ in 0..helpers {
            self.push(Task::Chunks(file.clone()));
        }
    }

    fn chunks(&self, file: &Arc<LargeFile>, local: &mut Local) {
        let size = file.st.st_size as u64;
        let mut caps = file.caps;
        // The fd is only borrowed for the pwrites; the lock guards commit, not I/O.
        let dst = match lock(&file.staged).fd.try_clone() {
            Ok(fd) => Some(fd),
            Err(e) => {
                lock(&file.error).get_or_insert(("duplicate descriptor", e));
                None
            }
        };
        while let Some(dst) = &dst {
            let i = file.next_chunk.fetch_add(1, Ordering::Relaxed);
            if self.abort.load(Ordering::Relaxed) {
                let stopped = io::Error::other("copy stopped before this file was complete");
                lock(&file.error).get_or_insert(("copy data", stopped));
            }
            if i >= file.chunks || lock(&file.error).is_some() {
                break;
            }
            let off = i * CHUNK;
            let len = CHUNK.min(size - off);
            let r = Range {
                src: file.src.as_fd(),
                dst: dst.as_fd(),
                off,
                len: Some(len),
            };
            match data::copy_range(r, &mut caps, &mut local.buf, None, &self.opts.faults) {
                Ok(m) if m.bytes == len => {
                    if let Some(s) = m.strategy {
                        self.counters.by_strategy[s as usize].fetch_add(m.bytes, Ordering::Relaxed);
                        self.progress.bytes_copied(m.bytes, s);
                    }
                }
                Ok(m) => {
                    let msg = format!(
                        "source shrank: chunk at {off} got {} of {len} bytes",
                        m.bytes
                    );
                    lock(&file.error).get_or_insert(("copy data", source_changed(msg)));
                }
                Err(e) => {
                    lock(&file.error).get_or_insert(("copy data", e));
                }
            }
        }
        drop(dst);
        if file.workers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish_chunked(file, local);
            self.release(file.node.clone());
        }
    }

    fn finish_chunked(&self, file: &LargeFile, local: &mut Local) {
        let dir = &file.node;
        let mut staged = lock(&file.staged);
        let result = match lock(&file.error).take() {
            Some(err) => Err(err),
            None => check_unchanged(file.src.as_fd(), &file.st)
                .and_then(|()| self.may_finish())
                .and_then(|()| {
                    meta::apply_fd(
                        file.src.as_fd(),
                        staged.fd.as_fd(),
                        &file.st,
                        &self.opts.preserve,
                        &self.who,
                        staged.mode_done,
                        &mut local.xattrs,
                    )
                })
                .and_then(|()| self.commit_staged(dir, &mut staged, &file.dst_name)),
        };
        match result {
            Ok(true) => {
                self.counters.files.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes
                    .fetch_add(file.st.st_size as u64, Ordering::Relaxed);
                self.progress
                    .file_done(file.st.st_size as u64, file.started.elapsed());
                self.progress.entry_done();
            }
            Ok(false) => self.count_skipped(),
            Err(err) => {
                self.discard(dir, &mut staged);
                drop(staged);
                // Copied again (whole, or in chunks by new tasks) when the error allows.
                let mut tries = file.tries;
                let again =
                    self.retry(dir, &file.src_name, &mut tries, err)
                        .and_then(|(src, st)| {
                            self.copy_regular(
                                dir,
                                src,
                                &file.src_name,
                                &st,
                                &file.dst_name,
                                file.started,
                                local,
                                tries,
                            )
                        });
                if let Err((op, e)) = again {
                    self.fail(&dir.child_path(&file.dst_name), op, &e);
                }
            }
        }
    }

    /// Symlinks (copied verbatim, never followed), FIFOs, sockets and devices (recreated
    /// with mknod, never opened).
    fn non_regular(
        &self,
        dir: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<Option<Skip>, Fail> {
        if self.keep_existing(dir, dst_name, st)? {
            return Ok(Some(Skip::Kept));
        }
        // Links and specials have no hash: the group's leader is "committed" with None.
        let make = || {
            self.make_special(dir, src_name, dst_name, st)
                .map(|_| Some(None))
        };
        self.in_link_group(dir, dst_name, st, make)
    }

    /// Create a symlink or special file (the leader of its link group, if any).
    fn make_special(
        &self,
        dir: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<Option<Skip>, Fail> {
        // Inside a staged directory the final name is not visible yet: create it directly.
        let direct = self.names_directly(dir);
        let tmp = if direct {
            dst_name.to_owned()
        } else {
            self.tmp_name()
        };
        let is_link = is_type(st, libc::S_IFLNK);
        if is_link {
            let target =
                sys::readlinkat(dir.src.as_fd(), src_name).map_err(|e| ("read link", e))?;
            sys::symlinkat(&target, dir.dst.as_fd(), &tmp).map_err(|e| ("create symlink", e))?;
        } else {
            let kind = st.st_mode & libc::S_IFMT;
            sys::mknodat(dir.dst.as_fd(), &tmp, kind | 0o600, st.st_rdev)
                .map_err(|e| ("mknod", e))?;
        }
        let staged = meta::apply_at(dir.dst.as_fd(), &tmp, st, &self.opts.preserve, &self.who)
            .and_then(|()| {
                if direct {
                    Ok(true)
                } else {
                    self.commit(dir, &tmp, dst_name)
                }
            });
        match staged {
            Ok(true) => {}
            Ok(false) => return Ok(Some(Skip::Kept)),
            Err(err) => {
                let _ = sys::unlinkat(dir.dst.as_fd(), &tmp, false);
                return Err(err);
            }
        }
        if is_link {
            self.counters.symlinks.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.specials.fetch_add(1, Ordering::Relaxed);
        }
        self.progress.entry_done();
        Ok(None)
    }
}

enum FillOutcome {
    Committed(Option<u128>),
    /// Large enough to be copied in chunks by several workers, with these capabilities.
    Chunk(Caps),
    Kept,
}

/// What kind of failure `err` is (marker payloads first, then the errno).
fn kind_of(err: &io::Error) -> Reason {
    match err.kind() {
        io::ErrorKind::AlreadyExists => Reason::DestinationConflict,
        _ if err.raw_os_error() == Some(libc::ELOOP)
            || err.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Reason::DestinationConflict
        }
        _ => match err.get_ref() {
            Some(inner) if inner.is::<SourceChanged>() => Reason::SourceChanged,
            Some(inner) if inner.is::<ChecksumMismatch>() => Reason::ChecksumMismatch,
            Some(inner) if inner.is::<ReflinkRefused>() => Reason::ReflinkUnsupported,
            _ => crate::error::reason_of_io(err),
        },
    }
}

/// Refuse a copy whose source moved while it was read: size, mtime or ctime (which also
/// catches a write that kept the size and reset the mtime) differ from when it was opened.
/// Its bytes may be a mix of two versions, and must never be committed or verified.
fn check_unchanged(src: BorrowedFd<'_>, st: &Stat) -> Result<(), Fail> {
    let after = sys::fstat(src).map_err(|e| ("stat source", e))?;
    let fingerprint = |s: &Stat| {
        (
            s.st_size,
            (s.st_mtime, s.st_mtime_nsec),
            (s.st_ctime, s.st_ctime_nsec),
        )
    };
    if fingerprint(&after) != fingerprint(st) {
        let msg = "source was modified while it was copied".to_string();
        return Err(("copy data", source_changed(msg)));
    }
    Ok(())
}

/// The `change_source` fault: append a byte to source file `dir/name`, as a writer would.
fn change_source(dir: &DirNode, name: &CStr) {
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_NOFOLLOW;
    if let Ok(fd) = sys::openat(dir.src.as_fd(), name, flags, 0) {
        let _ = sys::pwrite(fd.as_fd(), b"+", 0);
    }
}

/// Read the manifest an interrupted run wrote: the xxh3-64 of each path it lists (8 bytes
/// a file, however long the paths). A last line cut short (the process died while its
/// buffer was written out) is removed, so the lines appended next start on a line.
pub(crate) fn read_manifest(file: &mut File) -> io::Result<HashSet<u64>> {
    file.rewind()?;
    let mut listed = HashSet::new();
    let mut whole = 0u64;
    let mut reader = BufReader::with_capacity(1 << 16, &*file);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        whole += n as u64;
        if let Some(path) = manifest_path(&line[..n - 1]) {
            listed.insert(xxh3_64(&path));
        }
    }
    drop(reader);
    if file.metadata()?.len() > whole {
        file.set_len(whole)?;
    }
    Ok(listed)
}

/// The path of one manifest line (without its newline), as `manifest_line` wrote it: raw,
/// or GNU-escaped (`\` first, `\\` and `\n` inside) for a name with a newline.
fn manifest_path(line: &[u8]) -> Option<Vec<u8>> {
    let (escaped, rest) = match line.strip_prefix(b"\\") {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let hex = rest.get(..32)?;
    let sep = rest.get(32..34)?;
    if !hex.iter().all(u8::is_ascii_hexdigit) || (sep != b"  " && sep != b" *") {
        return None;
    }
    let raw = &rest[34..];
    if !escaped {
        return Some(raw.to_vec());
    }
    let mut path = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        match (b, bytes.clone().next()) {
            (b'\\', Some(b'n')) => {
                path.push(b'\n');
                bytes.next();
            }
            (b'\\', Some(b'\\')) => {
                path.push(b'\\');
                bytes.next();
            }
            _ => path.push(b),
        }
    }
    Some(path)
}

/// The copy no longer owns the destination (`Options::fence`).
fn not_owner() -> io::Error {
    io::Error::other("this copy no longer owns the destination (fenced); nothing more is committed")
}

fn source_changed(msg: String) -> io::Error {
    io::Error::other(SourceChanged(msg))
}

fn checksum_mismatch(expected: u128, got: u128) -> io::Error {
    io::Error::other(ChecksumMismatch(format!(
        "destination hashes to {got:032x}, source to {expected:032x}"
    )))
}

/// Marker payloads so [`Ctx::fail`] can tell these kinds from plain I/O errors.
#[derive(Debug)]
pub(crate) struct SourceChanged(pub String);
#[derive(Debug)]
pub(crate) struct ChecksumMismatch(pub String);

impl std::fmt::Display for SourceChanged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for SourceChanged {}
impl std::fmt::Display for ChecksumMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ChecksumMismatch {}
#[derive(Debug)]
pub(crate) struct ReflinkRefused;
impl std::fmt::Display for ReflinkRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reflink is `always` but this file cannot be cloned here (both sides must be on one XFS or btrfs filesystem); use `auto` to copy instead")
    }
}
impl std::error::Error for ReflinkRefused {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn manifest_paths_are_read_back_raw_or_unescaped() {
        let hash = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            manifest_path(format!("{hash}  a/b c\\d").as_bytes()),
            Some(b"a/b c\\d".to_vec())
        );
        assert_eq!(
            manifest_path(format!("\\{hash}  new\\nline\\\\x").as_bytes()),
            Some(b"new\nline\\x".to_vec())
        );
        assert_eq!(manifest_path(b"not a manifest line"), None);
    }

    #[test]
    fn a_manifest_line_cut_short_is_dropped_and_removed() -> io::Result<()> {
        let mut f = tempfile::tempfile()?;
        let hash = "0123456789abcdef0123456789abcdef";
        f.write_all(format!("{hash}  one\n{hash}  two\n{hash}  thr").as_bytes())?;
        let listed = read_manifest(&mut f)?;
        assert_eq!(listed.len(), 2);
        assert!(listed.contains(&xxh3_64(b"one")) && listed.contains(&xxh3_64(b"two")));
        let mut text = String::new();
        f.rewind()?;
        f.read_to_string(&mut text)?;
        assert_eq!(text, format!("{hash}  one\n{hash}  two\n"));
        Ok(())
    }
}
