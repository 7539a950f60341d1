//! The parallel tree copy. One `Ctx` holds a copy's shared state; its work is split by
//! responsibility across the submodules: `walk` (the rayon pool, listing, dispatch), `regular`
//! and `chunks` (file data), `stage` (staging and commit), `links` (hard-link groups),
//! `special` (symlinks, devices), `resume` and `manifest` (finishing an interrupted copy),
//! `overwrite` (the one place the overwrite policy is decided), `failure` (recording what
//! went wrong), and `run` (opening both ends and producing the summary).

mod chunks;
mod failure;
mod links;
mod manifest;
mod overwrite;
mod regular;
mod resume;
mod run;
mod special;
mod stage;
mod walk;

pub use run::copy;
pub(crate) use run::{cstring, open_source_dir, run, DstAt, SrcAt};

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use xxhash_rust::xxh3::xxh3_64;

use crate::data::{self, CapsCache, Guard};
use crate::error::Failure;
use crate::meta::{Identity, XattrBufs};
use crate::options::{Options, Verify};
use crate::progress::Progress;
use crate::sys::{self, Stat};

use failure::not_owner;
use links::Link;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking worker cannot leave these maps half-updated in a way later readers could
    // misuse (every update is a single insert or take), so poisoning is not fatal.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `Summary::aborted` of a cancelled copy.
const CANCELLED: &str = "cancelled";

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
struct DirNode {
    src: OwnedFd,
    dst: OwnedFd,
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
    fn new(src: OwnedFd, dst: OwnedFd, meta: Option<Stat>, fresh: bool) -> io::Result<Self> {
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
    fn staged_root(
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

#[derive(Default)]
struct Counters {
    files: AtomicU64,
    dirs: AtomicU64,
    symlinks: AtomicU64,
    specials: AtomicU64,
    hardlinks: AtomicU64,
    skipped: AtomicU64,
    files_resumed: AtomicU64,
    bytes_resumed: AtomicU64,
    verified: AtomicU64,
    bytes: AtomicU64,
    by_strategy: [AtomicU64; 3],
    failed: AtomicU64,
}

/// A worker thread's buffers and capability cache, so the hot path takes no lock. Kept
/// per pool thread across tasks (see `walk::exec`).
#[derive(Default)]
struct Scratch {
    buf: Vec<u8>,
    dents: Vec<u8>,
    caps: CapsCache,
    xattrs: XattrBufs,
    tally: Tally,
}

/// What a worker counts for every file (and every chunk of a large one), added up on its own
/// and handed to `Ctx::counters` when the copy ends (`Ctx::add_tally`, the only writer of
/// those three counters): a shared atomic bumped per file bounces its cache line between
/// the workers (a measurable share of a small-file copy's user time).
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    files: u64,
    bytes: u64,
    by_strategy: [u64; 3],
}

/// What a running task has of its worker: the scratch buffers, and a way to hand new tasks
/// to the pool (the rayon scope it runs in).
struct Local<'w> {
    scratch: Scratch,
    spawn: &'w dyn Fn(walk::Task),
}

impl Local<'_> {
    /// Queue a task on this worker's deque: run next by this worker (LIFO), or stolen by
    /// an idle one.
    fn push(&self, task: walk::Task) {
        (self.spawn)(task);
    }
}

impl std::ops::Deref for Local<'_> {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        &self.scratch
    }
}

impl std::ops::DerefMut for Local<'_> {
    fn deref_mut(&mut self) -> &mut Scratch {
        &mut self.scratch
    }
}

struct Ctx<'a> {
    opts: &'a Options,
    progress: &'a dyn Progress,
    who: Identity,
    hash: bool,
    /// One per pool thread, by `rayon::current_thread_index`.
    scratch: Vec<Mutex<Scratch>>,
    links: Mutex<HashMap<(u64, u64), Link>>,
    manifest: Option<Mutex<BufWriter<File>>>,
    /// xxh3-64 of every path an interrupted run's manifest lists (resume only).
    listed: HashSet<u64>,
    counters: Counters,
    failures: Mutex<Vec<Failure>>,
    aborted: Mutex<Option<String>>,
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

impl<'a> Ctx<'a> {
    fn new(
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
            scratch: (0..opts.workers_resolved())
                .map(|_| Mutex::default())
                .collect(),
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
    fn owns(&self) -> bool {
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

    /// What a file's data loops consult: the test faults and this copy's stop signal.
    fn guard(&self) -> Guard<'_> {
        Guard {
            faults: &self.opts.faults,
            stop: self,
        }
    }

    /// `owns`, as a step of a file's commit.
    fn may_finish(&self) -> Result<(), Fail> {
        match self.owns() {
            true => Ok(()),
            false => Err(("finish", not_owner())),
        }
    }

    /// Flush the destination filesystem once (`Options::sync`). A failure is reported and
    /// stops the copy's success, never retried: after failed writeback the kernel may have
    /// dropped the pages, and a second `syncfs` could succeed without them (fsyncgate).
    fn sync_destination(&self, fd: BorrowedFd<'_>) {
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

    fn tmp_name(&self) -> CString {
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
    fn dir_tmp_name(&self, name: &CStr) -> CString {
        match &self.opts.staging_tag {
            Some(tag) => {
                let h = xxh3_64(name.to_bytes());
                CString::new(format!(".ferry-{tag}-d{h:016x}.tmp")).unwrap_or_default()
            }
            None => self.tmp_name(),
        }
    }

    /// Add a worker's tally to the copy's counters.
    fn add_tally(&self, t: Tally) {
        let c = &self.counters;
        c.files.fetch_add(t.files, Ordering::Relaxed);
        c.bytes.fetch_add(t.bytes, Ordering::Relaxed);
        for (total, n) in c.by_strategy.iter().zip(t.by_strategy) {
            total.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn count_skipped(&self) {
        self.counters.skipped.fetch_add(1, Ordering::Relaxed);
        self.progress.skipped();
    }
}

impl data::Stop for Ctx<'_> {
    fn should_stop(&self) -> bool {
        self.stopping()
    }
}
