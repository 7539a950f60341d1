//! What a copy should do: the policies (defined with the API, in `ferry_crds::policy`, so a
//! CopyJob, the CLI and the engine share one set of defaults), the part of the tree (and
//! [`part_of`], which part owns an entry: the one rule the copy and its plan share), and
//! the hooks a caller steers a running copy by.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use twox_hash::XxHash3_64;

pub use ferry_crds::{Compare, Filter, Overwrite, Part, Preserve, Reflink, Verify};

/// Which part of a split copy owns an entry: by its path from the top, or for a hard-linked
/// file by its inode, so all names of one file land in the same part.
pub(crate) fn part_of(path: &[u8], inode: Option<(u64, u64)>, count: u32) -> u32 {
    let h = match inode {
        Some((dev, ino)) => {
            let mut key = [0u8; 16];
            key[..8].copy_from_slice(&dev.to_le_bytes());
            key[8..].copy_from_slice(&ino.to_le_bytes());
            XxHash3_64::oneshot(&key)
        }
        None => XxHash3_64::oneshot(path),
    };
    (h % u64::from(count.max(1))) as u32
}

/// Asked before anything becomes visible under a final name (a file linked or renamed
/// into place, a staged directory renamed, the manifest's buffered lines written).
/// `false` means this copy no longer owns the destination (the node agent lost its
/// heartbeat lease, or the shard moved to another agent, who may already be resuming it):
/// the copy then stops and makes nothing more visible, leaving its staging for the new
/// owner to adopt. Cheap, as it runs once per file.
#[derive(Clone)]
pub struct Fence(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fence")
    }
}

/// Workers a copy has unless told otherwise: at least [`IO_WORKERS`], more on a machine with
/// more CPUs, at most 64. A worker blocks in every read of data that is not in the page
/// cache, so with one worker per CPU a cold copy keeps as many reads in flight as there are
/// CPUs, and the CPUs idle while they wait. Measured on 2 cores, 20k files of 10 KB from the
/// disk to a fresh ext4, caches dropped: 2 workers 1.55 s, 4 1.11 s, 8 0.90 s, 16 0.78 s
/// (xcp, 4 workers and a walker: 1.10 s); warm on tmpfs, 100k files: 2, 4, 8 and 16 workers
/// all 0.88-0.96 s. Deep queues (NVMe) and network filesystems (an RPC per read) want the
/// reads in flight. A warm copy does not, and on XFS the extra workers contend in file
/// creation (100k files: 16 workers 3.1 s, 2 workers 2.0 s): so of this default pool only
/// as many workers as CPUs run while the copy reads nothing from storage (see
/// `depth`); a worker count asked for (`Options::workers` > 0) always runs whole.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(IO_WORKERS, 64)
}

/// The fewest workers a copy has by default (see [`default_workers`]).
pub const IO_WORKERS: usize = 16;

/// Everything a copy needs besides the two paths.
#[derive(Debug, Clone)]
pub struct Options {
    /// Worker threads; 0 means [`default_workers`] (16, or the CPUs if more), of which as
    /// many as CPUs run while the copy reads nothing from storage.
    pub workers: usize,
    pub reflink: Reflink,
    pub verify: Verify,
    pub overwrite: Overwrite,
    /// How `Overwrite::IfChanged` tells a changed file (see [`Compare`]).
    pub compare: Compare,
    pub preserve: Preserve,
    /// Write an `xxh128sum -c` compatible manifest here (paths relative to the destination).
    /// Requires `verify` other than `None` for the hashes to exist; the engine forces
    /// hashing on when a manifest is requested.
    pub manifest: Option<PathBuf>,
    /// Records of the files copies into this destination listed (see [`Records`]). Needs
    /// `manifest` and kept timestamps; without them it is ignored.
    pub records: Option<Records>,
    /// Which entries of the tree this run copies (all of them, or one part of a split copy).
    pub select: Part,
    /// `include`/`exclude` (see [`ferry_crds::filter`]): what is not selected is neither
    /// copied nor counted, and an excluded directory is not entered.
    pub filter: Filter,
    /// Set from another thread to stop the copy: between files, and inside a large one
    /// between blocks (a file cut off is discarded, not reported failed). Files already
    /// committed stay; unfinished directories get their final names but not their metadata
    /// (a later run with `resume` finishes them); no partial file is ever visible.
    pub cancel: Option<Arc<AtomicBool>>,
    /// This run continues an interrupted copy into the same destination: directories that
    /// already exist get the source's metadata even under `Overwrite::Never` (the
    /// interrupted run created them and could not finish them), and the manifest is
    /// appended to rather than replaced.
    pub resume: bool,
    /// Names this copy's staging entries (`.ferry-<tag>-<n>.tmp` for files and special
    /// files, `.ferry-<tag>-d<hash of the final name>.tmp` for directories) instead of
    /// using the process id: 1 to 32 ASCII letters and digits, unique to one copy (the agent
    /// uses 12 hex digits of the job's and shard's identity). With `resume`, a run with the
    /// same tag adopts the staging directories an interrupted run left (merging into them
    /// and renaming them into place when complete) and removes its leftover staging files
    /// in every existing directory it visits; entries without this tag are never touched.
    /// Inside an adopted directory, a file whose size or mtime is not the source's, or that
    /// is neither in the manifest nor equal to the source, was being written when the
    /// earlier run died and is copied again. `None`: pid-based names, no adoption.
    pub staging_tag: Option<String>,
    /// Flush the destination filesystem (`syncfs`) once after the walk, so what the summary
    /// reports as copied is on stable storage. A failed flush is reported (never retried:
    /// after a failed flush the kernel may have dropped the dirty pages it could not write).
    pub sync: bool,
    /// A copy from another node (`copy_from`): ask the source half to compress file data
    /// with zstd where that makes it smaller (for slow links; it costs CPU on both sides).
    pub compress: bool,
    /// Whether this copy still owns the destination; see [`Fence`]. `None`: always.
    pub fence: Option<Fence>,
    /// A name directly inside the copy's top directory that is neither read from the
    /// source nor written to the destination: the agent's `.ferry` state directory, when
    /// either end of a copy is the top of a root or volume. Not counted anywhere.
    pub reserved_top: Option<std::ffi::CString>,
    /// Whether a source's privileged content (device nodes, setuid/setgid bits, file
    /// capabilities) is recreated at the destination; see [`Privileged`]. Default: dropped.
    pub privileged: Privileged,
    /// Test-only fault injection; empty in normal use.
    #[doc(hidden)]
    pub faults: Faults,
}

/// What a copy does with a source's privileged content: device nodes, the setuid and
/// setgid bits of files, and file capabilities (the `security.capability` attribute). Made
/// at the destination, each is a way to act with privileges the writer of the source may
/// not have had there: a device node opens hardware (or the node's disks), a setuid root
/// program or a file with capabilities runs with them wherever the destination is mounted
/// without `nosuid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Privileged {
    /// Recreated as the source has them; except that, as GNU cp does, setuid and setgid
    /// bits (and, likewise, file capabilities) are not given to a copy whose owner is not
    /// the source's (ownership not kept, or not allowed).
    Keep,
    /// Not recreated: a device node is not made (a failure of that entry, PermissionDenied,
    /// whose message says what allows it, so nothing is lost silently), files get their
    /// mode without the setuid and setgid bits (a directory keeps its setgid bit, which
    /// only passes its group on), and `security.capability` is not copied. FIFOs, sockets
    /// and symlinks are copied as ever.
    #[default]
    Drop,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            workers: 0,
            reflink: Reflink::default(),
            verify: Verify::default(),
            overwrite: Overwrite::default(),
            compare: Compare::default(),
            preserve: Preserve::default(),
            manifest: None,
            records: None,
            select: Part::All,
            filter: Filter::default(),
            cancel: None,
            resume: false,
            staging_tag: None,
            fence: None,
            reserved_top: None,
            sync: false,
            compress: false,
            privileged: Privileged::default(),
            faults: Faults::default(),
        }
    }
}

/// Records of what copies into one destination wrote and verified: a re-run that keeps a
/// file by the quick check (`Overwrite::IfChanged` with `Compare::SizeAndTime`: type, size
/// and mtime equal, the source not opened) lists it in the manifest with the hash the
/// record has, when the record has the file's size and mtime. So the manifest of a re-run
/// covers the whole tree at the cost of a stat walk. The records are believed: keep them
/// where the destination's owner cannot write (the agent keeps them on the node, never in
/// a tenant's volume).
#[derive(Debug, Clone)]
pub struct Records {
    /// Read at the start (missing: no records). Only a file `write` was renamed to.
    pub earlier: PathBuf,
    /// This copy's records, one per manifest line: created, or appended to by a resumed
    /// copy. Rename it over `earlier` once the copy has ended without being cancelled.
    pub write: PathBuf,
}

/// Kernel misbehaviour that tests cannot summon on demand, injected at the `sys` seam.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// `copy_file_range` returns 0 at offset 0, as it does on procfs and some overlayfs.
    pub copy_file_range_returns_zero: bool,
    /// `copy_file_range` fails with this errno (e.g. EXDEV, ENOSYS, EPERM).
    pub copy_file_range_errno: Option<i32>,
    /// `FICLONE` fails with this errno.
    pub ficlone_errno: Option<i32>,
    /// Flip the first byte of this destination file (by name) after it is written and
    /// before it is verified: the verification must catch it.
    pub corrupt_after_write: Option<Vec<u8>>,
    /// Sleep this long before copying each regular file (files a merge or resume keeps take
    /// none): makes a copy slow enough for tests to act while it runs (cancel it, kill its
    /// process), and lets a resumed copy get past what was done quickly.
    pub delay_per_file: Option<std::time::Duration>,
    /// Modify the source file with this name (append one byte) after its data was copied
    /// and before the engine checks whether it changed, on this many attempts at it.
    pub change_source: Option<(Vec<u8>, u32)>,
    /// With `Verify::Full`, the `fdatasync` of this file's copy (by name) fails with EIO on
    /// this many attempts at it.
    pub fdatasync_eio: Option<(Vec<u8>, u32)>,
    /// `syncfs` of the destination fails with this errno.
    pub syncfs_errno: Option<i32>,
}

impl Options {
    /// Refuse a staging tag that could not be told apart from other names (or from another
    /// tag): 1 to 32 ASCII letters and digits.
    pub(crate) fn check_staging_tag(&self) -> Result<(), String> {
        match &self.staging_tag {
            Some(t)
                if t.is_empty()
                    || t.len() > 32
                    || !t.bytes().all(|b| b.is_ascii_alphanumeric()) =>
            {
                Err(format!(
                    "staging tag {t:?} must be 1 to 32 ASCII letters and digits"
                ))
            }
            _ => Ok(()),
        }
    }

    /// The worker count to use: `workers`, or the number of CPUs when it is 0.
    pub fn workers_resolved(&self) -> usize {
        match self.workers {
            0 => default_workers(),
            n => n,
        }
    }
}
