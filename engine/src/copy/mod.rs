//! The parallel tree copy. One `Ctx` holds a copy's shared state; its work is split by
//! responsibility across the submodules: `walk` (the rayon pool, listing, dispatch), `regular`
//! and `chunks` (file data), `stage` (staging and commit), `links` (hard-link groups),
//! `special` (symlinks, devices), `resume` and `manifest` (finishing an interrupted copy),
//! `overwrite` (the one place the overwrite policy is decided), `failure` (recording what
//! went wrong), and `run` (the copy once both ends are open, and its summary). The
//! entry points that open the ends are `api`'s; nothing outside `api` reaches in here.

mod chunks;
mod dirs;
mod failure;
mod links;
mod manifest;
mod overwrite;
mod patch;
mod records;
mod regular;
mod remote;
mod resume;
mod run;
mod special;
mod stage;
mod walk;

pub(crate) use manifest::{parse_line, MAX_LINE};
pub use records::MAX_RECORDS;
pub(crate) use run::run;

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use twox_hash::XxHash3_64;

use crate::data::{self, CapsCache, Guard};
use crate::depth::Depth;
use crate::error::Failure;
use crate::meta::{Identity, XattrBufs};
use crate::options::{Options, Verify};
use crate::progress::Progress;
use crate::sys::{self, Stat};

use dirs::{OpenDir, OpenDirs};
use failure::not_owner;
use links::Group;
use remote::{Rec, SrcDir, SrcEntry, SrcFile};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking worker cannot leave these maps half-updated in a way later readers could
    // misuse (every update is a single insert or take), so poisoning is not fatal.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `Summary::aborted` of a cancelled copy.
const CANCELLED: &str = "cancelled";

fn is_type(st: &Stat, t: u32) -> bool {
    st.st_mode & libc::S_IFMT == t
}

/// One directory of the copy: where it is and what is left to do in it. It holds no
/// descriptor (an [`OpenDir`] does, while work in the directory needs one: see `dirs`) and
/// of its path only its own name: a path is built from the names up the parents when one
/// is needed (a failure, a manifest line), so what a directory costs does not grow with its
/// depth (full paths cost depth² bytes: 1.1 GB for 3,000 levels of 255-byte names).
struct DirNode {
    /// Its name in its parent, the same on both sides (for a staged directory, the final
    /// one); empty for the top of a copy into an existing directory.
    name: CString,
    parent: Option<Arc<DirNode>>,
    /// The copy's top: paths are relative to it, and it is never closed (nor the directory
    /// above it when it is staged: see `dirs`).
    top: bool,
    /// Source metadata to apply when done; `None` for a directory we keep as it was.
    meta: Option<Stat>,
    /// A source directory on another node: its extended attributes, as its record carried
    /// them (a local one's are read from its descriptor).
    xattrs: Vec<ferry_transfer::Xattr>,
    /// Outstanding work: the listing itself plus every child task still running.
    pending: AtomicUsize,
    /// We created this directory, so no entry in it pre-exists.
    fresh: bool,
    /// This directory, or one above it, is still under a staging name: nothing in it is
    /// visible under its final path yet, so entries are created under their final names
    /// directly (one rename per directory instead of one per file).
    hidden: bool,
    /// The staging name this directory has in its parent until it is complete, when it is
    /// renamed to `name`.
    staged_as: Option<CString>,
    /// Set once a staged directory has its final name (a later reopen looks for that one).
    renamed: AtomicBool,
    /// This directory is, or is inside, a staging directory with this copy's tag that a
    /// resumed copy adopted: everything in it was made by an earlier run of this copy, so
    /// a file in it that is not a finished copy was being written when that run died, and
    /// is replaced (never a tenant's file: tenants have nothing under our staging names).
    ours: bool,
    src_dev: u64,
    dst_dev: u64,
    /// The copy's permission bits when it was opened (a merged directory that has its final
    /// mode already is not given it again).
    dst_mode: u32,
    /// Inodes of the source directory and of its copy: a directory opened again must still
    /// be the one it was (see `dirs`).
    src_ino: u64,
    dst_ino: u64,
    /// Its descriptors, while something holds them (see `dirs`).
    open: Mutex<Weak<OpenDir>>,
    /// Batches of its entries handed to other workers that none has started yet; a listing
    /// that has enough waiting copies the next batch itself (see `walk::list`).
    batches_waiting: AtomicUsize,
}

impl DirNode {
    /// A directory whose source is `src` and whose copy is `dst` (both from `fstat`),
    /// visible under its final name, with one unit of pending work: its listing.
    fn new(
        name: CString,
        parent: Option<Arc<DirNode>>,
        src: &Stat,
        dst: &Stat,
        meta: Option<Stat>,
        fresh: bool,
    ) -> Self {
        Self {
            name,
            parent,
            top: false,
            meta,
            xattrs: Vec::new(),
            pending: AtomicUsize::new(1),
            fresh,
            hidden: false,
            staged_as: None,
            renamed: AtomicBool::new(false),
            ours: false,
            src_dev: src.st_dev,
            dst_dev: dst.st_dev,
            dst_mode: dst.st_mode & 0o7777,
            src_ino: src.st_ino,
            dst_ino: dst.st_ino,
            open: Mutex::new(Weak::new()),
            batches_waiting: AtomicUsize::new(0),
        }
    }

    /// Path of entry `name` of this directory, from the copy's top.
    fn child_path(&self, name: &CStr) -> Vec<u8> {
        self.path_with(name.to_bytes())
    }

    /// This directory's path from the copy's top (empty for the top).
    fn path(&self) -> Vec<u8> {
        self.path_with(b"")
    }

    /// The names from the top down to this directory, then `leaf` if it is not empty,
    /// joined by `/`: measured, then written back to front, in one allocation.
    fn path_with(&self, leaf: &[u8]) -> Vec<u8> {
        let dirs =
            || std::iter::successors(Some(self), |d| d.parent.as_deref()).take_while(|d| !d.top);
        let parts = || {
            std::iter::once(leaf)
                .filter(|l| !l.is_empty())
                .chain(dirs().map(|d| d.name.to_bytes()))
        };
        let (count, bytes) = parts().fold((0, 0), |(c, b), p| (c + 1, b + p.len()));
        let mut path = vec![b'/'; (bytes + count).saturating_sub(1)];
        let mut end = path.len();
        for part in parts() {
            path[end - part.len()..end].copy_from_slice(part);
            // The separator before it stays as filled; the first part ends at 0.
            end = (end - part.len()).saturating_sub(1);
        }
        path
    }
}

impl Drop for DirNode {
    fn drop(&mut self) {
        // Parents dropped with their last child go one at a time: dropped by nested calls,
        // a chain of thousands of directories would take as many stack frames.
        let mut next = self.parent.take();
        while let Some(parent) = next {
            next = match Arc::try_unwrap(parent) {
                Ok(mut dir) => dir.parent.take(),
                Err(_) => None,
            };
        }
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
    /// Kept by the quick check and listed from an earlier copy's record.
    listed_from_records: AtomicU64,
    /// Kept by the quick check, and not listed: no record says Ferry wrote them as they are.
    unlisted: AtomicU64,
    files_resumed: AtomicU64,
    bytes_resumed: AtomicU64,
    verified: AtomicU64,
    bytes: AtomicU64,
    by_strategy: [AtomicU64; 3],
    failed: AtomicU64,
    /// File bytes that came from another node.
    bytes_received: AtomicU64,
    /// Files mended from the destination's copy and the chunks that differ.
    patched: AtomicU64,
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
    /// Hard-link groups with names still to come, by (device, inode).
    links: Mutex<HashMap<(u64, u64), Group>>,
    /// The directories' descriptors kept open between uses.
    dirs: OpenDirs,
    manifest: Option<Mutex<BufWriter<File>>>,
    /// xxh3-64 of every path an interrupted run's manifest lists (resume only).
    listed: HashSet<u64>,
    /// What earlier copies into this destination recorded (see `records`).
    earlier: records::Lazy,
    /// Where this copy records what it lists.
    records: Option<Mutex<BufWriter<File>>>,
    /// Manifest lines and records each worker has not written out yet.
    pending: Vec<Mutex<manifest::Pending>>,
    counters: Counters,
    failures: Mutex<Vec<Failure>>,
    aborted: Mutex<Option<String>>,
    abort: AtomicBool,
    /// `Options::fence` said no: this copy makes nothing more visible.
    fenced: AtomicBool,
    tmp_counter: AtomicU64,
    pid: u32,
    /// Which of the pool's workers run.
    depth: Depth,
    /// The connection to the source half on another node, for a copy from there.
    remote: Option<Arc<crate::recv::Connection>>,
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
        (earlier, records): (records::Lazy, Option<File>),
        fd_limit: u64,
        depth: Depth,
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
            dirs: OpenDirs::new(fd_limit),
            manifest: manifest.map(|f| Mutex::new(BufWriter::with_capacity(1 << 16, f))),
            listed,
            earlier,
            records: records.map(|f| Mutex::new(BufWriter::with_capacity(1 << 16, f))),
            pending: (0..opts.workers_resolved())
                .map(|_| Mutex::default())
                .collect(),
            counters: Counters::default(),
            failures: Mutex::new(Vec::new()),
            aborted: Mutex::new(None),
            abort: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            tmp_counter: AtomicU64::new(first_tmp),
            pid: std::process::id(),
            depth,
            remote: None,
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

    /// How this copy gives metadata (see `meta::Rules`).
    fn rules(&self) -> crate::meta::Rules<'_> {
        crate::meta::Rules {
            preserve: &self.opts.preserve,
            who: &self.who,
            privileged: self.opts.privileged,
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

    /// Open a subdirectory of a source directory (`flags` has `O_DIRECTORY`, which the
    /// kernel checks before it opens anything: a device or FIFO at the name is refused
    /// unopened). As root, with `O_NOATIME`: a copy does not disturb the source's access
    /// times (nor dirty every source inode to record them).
    fn open_source(&self, dir: &OpenDir, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
        debug_assert!(flags & libc::O_DIRECTORY != 0);
        let src = Self::local_src(dir)?;
        if self.who.euid == 0 {
            match sys::open_beneath(src, name, flags | libc::O_NOATIME) {
                // Refused on files of other owners without CAP_FOWNER (e.g. in a user namespace).
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return other,
            }
        }
        sys::open_beneath(src, name, flags)
    }

    /// Open an entry of a source directory for its data, only if it is a regular file
    /// (see [`sys::open_regular`]: anything else, a device above all, is never opened, and
    /// its stat comes back instead). `O_NOATIME` as root, as [`Ctx::open_source`] does.
    fn open_source_file(
        &self,
        dir: &OpenDir,
        name: &CStr,
        flags: libc::c_int,
    ) -> io::Result<sys::Opened> {
        let src = Self::local_src(dir)?;
        let noatime = if self.who.euid == 0 {
            libc::O_NOATIME
        } else {
            0
        };
        sys::open_regular(src, name, flags | noatime)
    }

    fn local_src(dir: &OpenDir) -> io::Result<BorrowedFd<'_>> {
        dir.src
            .fd()
            .ok_or_else(|| io::Error::other("internal: a local open in a remote directory"))
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
                let h = XxHash3_64::oneshot(name.to_bytes());
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
