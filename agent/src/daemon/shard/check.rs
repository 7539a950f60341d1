//! A check job's run (`spec.check`, `kubectl ferry verify`): the destination read against
//! the manifest in its `.ferry/` on an OS thread (`ferry_engine::check_beneath`), its
//! progress published as a copy's is, then how it compared: Succeeded when every listed
//! file matched, Failed with the counts and the first files that did not. Nothing is
//! written to the destination, not even its state directory.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferry_crds::{CheckCounts, Reason, ShardState};
use kube::ResourceExt;

use super::copy::publish_until;
use super::node::{Active, Node};
use super::open::Roots;
use crate::daemon::error::{engine_reason, ShardError};
use crate::daemon::job_options::workers_of;
use crate::daemon::publish::{Live, Target};
use crate::with_causes;

pub(super) async fn check(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
    roots: &Roots,
) -> Result<ShardState, ShardError> {
    let (job, shard) = (target.job, target.shard);
    // Validated by the operator and again by the agent's resolve (`reach_both`).
    let name = job
        .spec
        .check
        .as_ref()
        .and_then(|c| c.file_name())
        .ok_or_else(|| ShardError::Refused {
            reason: Reason::InvalidSpec,
            message: "spec.check.manifest is not .ferry/<job uid>.xxh128".into(),
        })?
        .to_string();
    let lapses = node.fence.lapses();
    let live = Arc::new(Live::default());
    node.publish(target, ShardState::Running, &live, None)
        .await?;
    tracing::info!(job = %job.name_any(), shard = %shard.id, epoch = shard.epoch, manifest = %name, "checking the destination against its manifest");
    let opts = ferry_engine::CheckOptions {
        workers: workers_of(&job.spec, node.settings.workers),
        cancel: Some(active.cancel.clone()),
    };
    let done = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let (live, done, dst) = (live.clone(), done.clone(), roots.dst.clone());
        let top = PathBuf::from(&job.spec.destination.path);
        std::thread::Builder::new()
            .name("ferry-check".into())
            .spawn(move || {
                let result = ferry_engine::check_beneath(dst.as_fd(), &top, &name, &opts, &*live);
                done.store(true, Ordering::Relaxed);
                let _ = tx.send(result);
            })
            .map_err(ShardError::Spawn)?;
    }
    let result = publish_until(node, target, active, &live, &done, rx, || {}).await?;
    let state = match &result {
        Ok(c) if c.cancelled => match active.deleting.load(Ordering::Relaxed) {
            true => ShardState::Stopped,
            false => ShardState::Suspended,
        },
        Ok(c) => {
            let n = |v: u64| v as i64;
            *crate::lock(&live.check) = Some(CheckCounts {
                listed: n(c.listed),
                matched: n(c.matched),
                changed: n(c.changed),
                missing: n(c.missing),
                not_regular: n(c.not_regular),
                unreadable: n(c.unreadable),
            });
            live.files.store(c.matched, Ordering::Relaxed);
            live.bytes.store(c.bytes, Ordering::Relaxed);
            live.failed.store(c.listed - c.matched, Ordering::Relaxed);
            live.keep_failures(&c.failures);
            match c.matched == c.listed {
                true => ShardState::Succeeded,
                false => ShardState::Failed,
            }
        }
        Err(e) => {
            tracing::warn!(job = %job.name_any(), error = %with_causes(e), "the check could not be made");
            live.set_start_error(engine_reason(e), with_causes(e));
            live.failed.store(1, Ordering::Relaxed);
            ShardState::Failed
        }
    };
    if active.fenced.load(Ordering::Relaxed) || !node.fence.holds_since(lapses) {
        return Err(ShardError::Fenced);
    }
    if let Ok(c) = &result {
        tracing::info!(job = %job.name_any(), shard = %shard.id, %state, listed = c.listed, matched = c.matched, changed = c.changed, missing = c.missing, not_regular = c.not_regular, ms = c.elapsed.as_millis() as u64, "check finished");
    }
    node.publish(target, state, &live, None).await?;
    Ok(state)
}
