//! Ferry's copy engine: copies a tree (or one file) with `cp -a` fidelity, in parallel,
//! through directory fds, with reflink → `copy_file_range` → sparse → read/write per file,
//! optional xxHash3-128 verification and an `xxh128sum -c` manifest.
//!
//! Synchronous and free of Kubernetes, tokio and Prometheus: callers watch it through
//! [`Progress`]. All `unsafe` lives in the private `sys` module.
//!
//! ```no_run
//! use ferry_engine::{copy, NoProgress, Options};
//! let summary = copy("/data/src".as_ref(), "/data/dst".as_ref(), &Options::default(), &NoProgress)?;
//! assert!(summary.failures.is_empty());
//! # Ok::<(), ferry_engine::Error>(())
//! ```

// The modules in layers: each uses only those before it in this list (and `Summary`,
// defined here), so nothing low reaches up into the copy; `scripts/module-cycles.py
// engine/src --allow copy` finds any import circle (one is allowed, inside `copy/`).
// - `sys` (all `unsafe`), `options`, `error`, `progress`, `dirent`, `volume`: syscalls, what
//   a copy is asked to do, errors and their labels, the progress seam;
// - `data`, `sums`, `meta`, `depth`, `record`, `open`: file data, its chunk hashes,
//   metadata, how many workers run, the transfer protocol's records of a stat, opening the
//   paths a caller names;
// - `block`: raw block devices copied by chunks (uses `data` and below);
// - `plan`, `recv`, `ends`, `beneath`, `prune`: counting, the connection to a source half,
//   a copy's two ends opened by path or inside a root, pruning;
// - `copy` (the copy), `send` (the source half of a copy between nodes), `check` (a
//   destination read against its manifest: `copy`'s manifest lines, `beneath`'s opens);
// - `api`: the entry points, re-exported here.
mod api;
mod beneath;
pub mod block;
mod check;
mod copy;
mod data;
mod depth;
mod dirent;
mod ends;
mod error;
mod meta;
mod open;
mod options;
mod plan;
mod progress;
mod prune;
mod record;
pub mod recv;
pub mod send;
mod sums;
mod sys;
pub mod volume;

use std::time::Duration;

pub use api::{copy, copy_beneath, copy_from, copy_from_beneath, plan_beneath};
pub use beneath::{check_relative, is_mount_root, open_host_path, resolve_beneath, state_dir};
pub use check::{check_beneath, CheckOptions, Checked, MAX_LISTED};
pub use copy::MAX_RECORDS;
pub use error::{reason_of_io, Error, Failure};
pub use ferry_crds::Reason;
pub use options::{default_workers, IO_WORKERS};
pub use options::{
    Compare, Faults, Fence, Filter, Options, Overwrite, Part, Preserve, Privileged, Records,
    Reflink, Verify,
};
pub use plan::{plan, plan_part, Totals};
pub use progress::{NoProgress, Progress, Strategy};
pub use prune::{prune, prune_beneath, prune_from, PruneOptions, Pruned};

/// What a copy did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Regular files committed under their final names.
    pub files: u64,
    /// Directories copied (created or merged into), the top one included.
    pub dirs: u64,
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes recreated.
    pub specials: u64,
    /// Extra names of hard-linked files, made as links.
    pub hardlinks: u64,
    /// Entries left alone because the destination had them (overwrite policy).
    pub skipped: u64,
    /// Regular files kept by the quick check (`overwrite: IfChanged`) and listed in the
    /// manifest from the record of an earlier copy (see `Options::records`). In `skipped`.
    pub listed_from_records: u64,
    /// Regular files kept by the quick check with a manifest requested, that it does not
    /// list: no record says Ferry wrote them as they are (another tool did, or they changed
    /// since). `compare: Checksum` reads and lists them. In `skipped`.
    pub unlisted: u64,
    /// Regular files (counted once per link group) that a resumed copy found committed by
    /// an earlier attempt: listed in the manifest, or verified equal to the source and
    /// listed now; without a manifest, every regular file it kept. Included in `skipped`.
    /// `files + files_resumed` is what all attempts together copied.
    pub files_resumed: u64,
    /// Apparent size of the `files_resumed` files.
    pub bytes_resumed: u64,
    /// Files whose destination bytes were re-read and matched the source's hash.
    pub verified: u64,
    /// Files from another node that the destination had with a few chunks different
    /// (`compare: Checksum`), mended from its own copy and only those chunks, then
    /// verified whole. In `files`.
    pub patched: u64,
    /// Apparent size of the committed files.
    pub bytes: u64,
    /// Data bytes moved, by strategy (holes are not moved).
    pub bytes_reflinked: u64,
    pub bytes_copy_file_range: u64,
    pub bytes_read_write: u64,
    /// Entries that failed (the first 1000 of them; `failed` counts all).
    pub failures: Vec<Failure>,
    pub failed: u64,
    /// Set when the copy stopped early (destination full, or cancelled).
    pub aborted: Option<String>,
    /// The copy stopped because `Options::cancel` was set.
    pub cancelled: bool,
    pub elapsed: Duration,
}
