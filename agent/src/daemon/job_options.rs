//! What a CopyJob's spec makes of the engine's options, for every run that reads or
//! writes its trees (a shard's run, and the sender serving one): its policies, workers,
//! the compiled include/exclude (compiled once per run and handed on), the mirror pass's
//! options and the state directory kept out of the data.

use std::path::PathBuf;

use ferry_crds::{CopyJobSpec, Filter, Reason, STATE_DIR};

use crate::daemon::error::ShardError;

/// [`STATE_DIR`], the name reserved at the top of a root, when `path` (a job's relative
/// path) names the root itself.
pub(super) fn reserved_top(path: &str) -> Option<std::ffi::CString> {
    path.split('/')
        .all(|c| c.is_empty() || c == ".")
        .then(|| std::ffi::CString::new(STATE_DIR).unwrap_or_default())
}

/// The workers a shard runs (or a sender serves it with): the job's, else the agent's.
/// At most MAX_WORKERS whatever asks (a job the operator let through, a node with more
/// CPUs): with 1 MiB of buffer a worker, that bounds a shard's buffers. 0 stays 0: the
/// engine's default pool (at most 64) runs only as many workers as CPUs while the copy
/// does not wait on storage; a number asked for always runs.
pub(super) fn workers_of(spec: &CopyJobSpec, agent_workers: usize) -> usize {
    match spec.parallelism.workers_per_agent {
        n if n > 0 => n as usize,
        _ => agent_workers,
    }
    .min(ferry_crds::MAX_WORKERS as usize)
}

pub(super) fn engine_options(
    spec: &CopyJobSpec,
    workers: usize,
    manifest: Option<PathBuf>,
) -> ferry_engine::Options {
    ferry_engine::Options {
        workers: workers_of(spec, workers),
        reflink: spec.reflink,
        verify: spec.verify,
        overwrite: spec.overwrite,
        compare: spec.compare,
        preserve: spec.preserve,
        manifest,
        ..ferry_engine::Options::default()
    }
}

/// The job's include/exclude, compiled (the operator refuses a job whose patterns do not
/// compile; one that reached the agent anyway fails InvalidSpec, never copies everything).
pub(super) fn filter_of(spec: &CopyJobSpec) -> Result<Filter, ShardError> {
    Filter::new(&spec.include, &spec.exclude).map_err(|e| ShardError::Refused {
        reason: Reason::InvalidSpec,
        message: format!("spec.{e}"),
    })
}

/// What the mirror pass of this job may remove (deleteExtraneous): its filter, and never
/// Ferry's state directory at the top of the destination.
pub(super) fn prune_options(spec: &CopyJobSpec, filter: &Filter) -> ferry_engine::PruneOptions {
    ferry_engine::PruneOptions {
        filter: filter.clone(),
        delete_excluded: spec.delete_excluded,
        reserved_top: std::ffi::CString::new(STATE_DIR).ok(),
        ..ferry_engine::PruneOptions::default()
    }
}
