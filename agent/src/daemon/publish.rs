//! A running shard's counters ([`Live`], fed by the engine) and the fenced status update
//! that publishes them ([`publish`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferry_crds::{
    CopyJob, FailedPath, ManifestPart, Reason, ShardProgress, ShardState, ShardStatus, Waiting,
};
use ferry_engine::{Failure, Progress, Strategy};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::lock;

/// Failures a shard's status lists; its `failed` count carries the rest.
const FAILURES_KEPT: usize = 20;

/// Counters one running shard publishes.
pub(super) struct Live {
    started: std::time::Instant,
    pub(super) files: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) reflinked: AtomicU64,
    pub(super) failed: AtomicU64,
    /// Entries the overwrite policy kept as the destination had them, resumed files
    /// (committed by an earlier run of this shard) included: see `skipped()`.
    kept: AtomicU64,
    /// Files an earlier run of this shard committed: done, not skipped.
    resumed_files: AtomicU64,
    /// Files kept by the quick check that the manifest does not list.
    unlisted: AtomicU64,
    patched: AtomicU64,
    /// A slice's part of the manifest, once exported (see journal::export).
    pub(super) manifest_part: Mutex<Option<ManifestPart>>,
    failures: Mutex<Vec<Failure>>,
    /// Why the shard could not start at all (reported with reason `CannotStart`).
    start_error: Mutex<Option<(Reason, String)>>,
    /// Bytes of files an earlier run committed (a resumed shard), left out of its rate.
    resumed_bytes: AtomicU64,
    /// What this shard carries in all (files, bytes), once a plan has counted it.
    planned: Mutex<Option<(i64, i64)>>,
    /// Entries the mirror pass removed (deleteExtraneous).
    pub(super) deleted: AtomicU64,
    /// A dry run's mirror: entries it would remove, and the first paths.
    planned_deletions: Mutex<Option<(u64, Vec<String>)>>,
    /// A finished raw block copy's counts.
    pub(super) block: Mutex<Option<ferry_crds::BlockProgress>>,
    /// A finished check's counts (`spec.check`).
    pub(super) check: Mutex<Option<ferry_crds::CheckCounts>>,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            started: std::time::Instant::now(),
            files: AtomicU64::default(),
            bytes: AtomicU64::default(),
            reflinked: AtomicU64::default(),
            failed: AtomicU64::default(),
            kept: AtomicU64::default(),
            resumed_files: AtomicU64::default(),
            unlisted: AtomicU64::default(),
            patched: AtomicU64::default(),
            manifest_part: Mutex::default(),
            failures: Mutex::default(),
            start_error: Mutex::default(),
            resumed_bytes: AtomicU64::default(),
            planned: Mutex::default(),
            deleted: AtomicU64::default(),
            planned_deletions: Mutex::default(),
            block: Mutex::default(),
            check: Mutex::default(),
        }
    }
}

impl Live {
    /// Report the shard as a whole failing for `reason` ([`FailedPath::whole_shard`]).
    pub(super) fn set_start_error(&self, reason: Reason, message: String) {
        *lock(&self.start_error) = Some((reason, message));
    }

    /// Entries left as the destination had them, which this job neither copied nor
    /// verified (the engine reports a resumed file as kept too; it is done instead).
    pub(super) fn skipped(&self) -> u64 {
        let kept = self.kept.load(Ordering::Relaxed);
        kept.saturating_sub(self.resumed_files.load(Ordering::Relaxed))
    }

    /// The final counts, from the engine's summary rather than the live counters.
    pub(super) fn set_final(&self, summary: &ferry_engine::Summary) {
        self.files
            .store(summary.files + summary.files_resumed, Ordering::Relaxed);
        self.bytes
            .store(summary.bytes + summary.bytes_resumed, Ordering::Relaxed);
        self.reflinked
            .store(summary.bytes_reflinked, Ordering::Relaxed);
        self.failed.store(summary.failed, Ordering::Relaxed);
        self.kept.store(summary.skipped, Ordering::Relaxed);
        self.resumed_files
            .store(summary.files_resumed, Ordering::Relaxed);
        self.unlisted.store(summary.unlisted, Ordering::Relaxed);
        self.patched.store(summary.patched, Ordering::Relaxed);
    }

    /// Counters back to zero for a new run of the engine in the same run of the shard (a
    /// copy between nodes resumed on a new connection), which counts the tree again: what
    /// the earlier one committed as resumed, what it failed on (the connection lost) not
    /// at all unless it fails again.
    pub(super) fn restart(&self) {
        for c in [
            &self.files,
            &self.bytes,
            &self.reflinked,
            &self.failed,
            &self.kept,
            &self.resumed_files,
            &self.unlisted,
            &self.patched,
            &self.resumed_bytes,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        lock(&self.failures).clear();
    }

    /// Bytes an earlier run of this shard committed (a block copy's resumed chunks): done,
    /// and left out of the rate.
    pub(super) fn count_resumed(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.resumed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn planned(&self) -> Option<(i64, i64)> {
        *lock(&self.planned)
    }

    pub(super) fn set_planned(&self, files: i64, bytes: i64) {
        *lock(&self.planned) = Some((files, bytes));
    }

    pub(super) fn set_planned_deletions(&self, count: u64, paths: Vec<String>) {
        *lock(&self.planned_deletions) = Some((count, paths));
    }

    /// The summary's failures, if none were reported while the copy ran.
    pub(super) fn keep_failures(&self, failures: &[Failure]) {
        let mut f = lock(&self.failures);
        if f.is_empty() {
            f.extend(failures.iter().take(FAILURES_KEPT).cloned());
        }
    }
}

impl Progress for Live {
    fn bytes_copied(&self, bytes: u64, strategy: Strategy) {
        if strategy == Strategy::Reflink {
            self.reflinked.fetch_add(bytes, Ordering::Relaxed);
        }
        crate::serve::metrics().bytes_copied(bytes, strategy);
    }
    // Counted as the summary counts them, so the last update does not jump.
    fn file_done(&self, size: u64, took: Duration) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        crate::serve::metrics().file_copied(took.as_secs_f64());
    }
    fn bytes_verified(&self, bytes: u64) {
        crate::serve::metrics().bytes_verified.inc_by(bytes);
    }
    fn file_checked(&self, size: u64) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        crate::serve::metrics().bytes_verified.inc_by(size);
    }
    fn skipped(&self) {
        self.kept.fetch_add(1, Ordering::Relaxed);
        crate::serve::metrics().file_skipped();
    }
    // Committed by an earlier run of this shard: done, but not copied by this one (the
    // counters start from zero and count the tree as it is, so they are exact whatever
    // the earlier run managed to publish before it died).
    fn resumed(&self, size: u64) {
        self.resumed_files.fetch_add(1, Ordering::Relaxed);
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        self.resumed_bytes.fetch_add(size, Ordering::Relaxed);
    }
    fn resent(&self) {
        crate::serve::metrics().resends.inc();
    }
    fn failed(&self, failure: &Failure) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        crate::serve::metrics().file_failed(failure.kind);
        let mut f = lock(&self.failures);
        if f.len() < FAILURES_KEPT {
            f.push(failure.clone());
        }
    }
}

/// The shard a run is for: where it sits in the job's status, for the fenced update.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) job: &'a CopyJob,
    pub(super) shard: &'a ShardStatus,
    pub(super) index: usize,
}

/// Why a status update was not made.
#[derive(Debug, thiserror::Error)]
pub(super) enum PublishError {
    /// The API server refused the patch as unprocessable (422): one of its `test`s of the
    /// shard's id, node and epoch did not hold, so the shard is no longer this agent's.
    #[error(transparent)]
    Fenced(kube::Error),
    /// Any other failure of the API call; the next update may succeed.
    #[error(transparent)]
    Api(kube::Error),
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
}

impl From<kube::Error> for PublishError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.code == 422 => Self::Fenced(kube::Error::Api(s)),
            e => Self::Api(e),
        }
    }
}

/// Publish what the shard waits for (and nothing else of its progress), fenced as
/// [`publish`] is; the next [`publish`] clears it.
pub(super) async fn publish_waiting(
    client: &Client,
    node: &str,
    target: Target<'_>,
    waiting: &Waiting,
) -> Result<(), PublishError> {
    let ops = waiting.fenced_patch(target.index, target.shard, node)?;
    patch_shard(client, node, target, ops).await
}

/// Apply a fenced JSON patch of the shard's fields, under this agent's field manager.
async fn patch_shard(
    client: &Client,
    node: &str,
    target: Target<'_>,
    ops: serde_json::Value,
) -> Result<(), PublishError> {
    let (job, shard) = (target.job, target.shard);
    let patch: json_patch::Patch = serde_json::from_value(ops)?;
    let pp = PatchParams {
        field_manager: Some(ferry_crds::agent_manager(node, &shard.id)),
        ..Default::default()
    };
    Api::<CopyJob>::namespaced(client.clone(), &job.namespace().unwrap_or_default())
        .patch_status(&job.name_any(), &pp, &Patch::<()>::Json(patch))
        .await?;
    Ok(())
}

/// Publish this shard's progress fields (and only those: the operator owns the
/// assignment), as a JSON patch that first tests the shard is still this node's, at this
/// epoch ([`ShardProgress::fenced_patch`]): an agent that lost its shard (its heartbeat
/// expired and the work moved on) is refused by the API server, whatever it believes. `planned`: a dry run's (files, bytes).
pub(super) async fn publish(
    client: &Client,
    node: &str,
    target: Target<'_>,
    state: ShardState,
    live: &Live,
    planned: Option<(i64, i64)>,
) -> Result<(), PublishError> {
    let (job, shard) = (target.job, target.shard);
    let planned = planned.or(*lock(&live.planned));
    let bytes = live.bytes.load(Ordering::Relaxed);
    let rate = bytes.saturating_sub(live.resumed_bytes.load(Ordering::Relaxed)) as f64
        / live.started.elapsed().as_secs_f64().max(1e-3);
    // The whole shard's failure, then the entries'.
    let start = lock(&live.start_error)
        .as_ref()
        .map(|(reason, message)| FailedPath::whole_shard(*reason, message));
    let failures: Vec<FailedPath> = start
        .into_iter()
        .chain(
            lock(&live.failures)
                .iter()
                .map(|f| FailedPath::new(&f.path.to_string_lossy(), f.kind, &f.message)),
        )
        .collect();
    let (planned_deletions, to_delete) = match &*lock(&live.planned_deletions) {
        Some((count, paths)) => (
            Some(*count as i64),
            paths
                .iter()
                .map(|p| ferry_crds::shorten(p, FailedPath::ENTRY_BYTES))
                .collect(),
        ),
        None => (None, Vec::new()),
    };
    let progress = ShardProgress {
        state,
        files_done: live.files.load(Ordering::Relaxed) as i64,
        bytes_done: bytes as i64,
        bytes_reflinked: live.reflinked.load(Ordering::Relaxed) as i64,
        skipped: live.skipped() as i64,
        failed: live.failed.load(Ordering::Relaxed) as i64,
        unlisted: live.unlisted.load(Ordering::Relaxed) as i64,
        patched: live.patched.load(Ordering::Relaxed) as i64,
        bytes_per_second: rate as i64,
        deleted: live.deleted.load(Ordering::Relaxed) as i64,
        planned_deletions,
        to_delete,
        planned_files: planned.map(|p| p.0),
        planned_bytes: planned.map(|p| p.1),
        failures,
        manifest_part: lock(&live.manifest_part).clone(),
        block: lock(&live.block).clone(),
        check: *lock(&live.check),
        // Whatever the shard waited for, it is going on.
        waiting: Default::default(),
    };
    let ops = progress.fenced_patch(target.index, shard, node)?;
    patch_shard(client, node, target, ops).await?;
    let ns = job.namespace().unwrap_or_default();
    // The gauges follow what the status says, after it says it (a dry run and a check copy
    // nothing).
    if !job.spec.dry_run && job.spec.check.is_none() {
        let bytes_total = match state {
            // A finished shard carried what it did, whatever its count said beforehand.
            ShardState::Succeeded => Some(bytes),
            _ => planned.map(|p| p.1.max(0) as u64),
        };
        crate::serve::metrics().shard_progress(
            &ns,
            &job.name_any(),
            &shard.id,
            crate::serve::ShardProgress {
                files_done: live.files.load(Ordering::Relaxed),
                bytes_done: bytes,
                bytes_total,
            },
        );
    }
    Ok(())
}
