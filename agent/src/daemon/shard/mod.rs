//! One run of one shard, as a list of named steps: open its roots ([`open`]), prepare
//! (memory, privileged files, the engine's options: [`prepare`]), publish Running, copy
//! on an OS thread while publishing progress ([`copy`]), then settle the outcome (a full
//! destination, the split job's manifests, the mirror, the flush: [`settle`]) and publish
//! it. A dry run counts instead ([`count`]), a check reads the destination against its
//! manifest ([`check`]); a copy between nodes reaches its source through the sender's
//! agent ([`sender`]).

mod block;
mod check;
mod copy;
mod count;
mod delta;
mod node;
mod open;
mod prepare;
mod sender;
mod settle;
mod witness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferry_crds::ShardState;
use kube::ResourceExt;

use crate::daemon::error::ShardError;
use crate::daemon::publish::{Live, PublishError, Target};
use crate::with_causes;
use copy::copy;
use count::{count_later, dry_run};
pub(super) use node::{Active, Node};
use prepare::{fits_in_memory, options, privileged_files};
use settle::{keep_records, settle, Settled};

/// Run the shard to its end and publish how it ended, unless it is fenced. `None`: fenced
/// (the shard moved, or the heartbeat lapsed while it ran).
pub(super) async fn run(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
) -> Option<ShardState> {
    let (job, shard) = (target.job, target.shard);
    match run_shard(node, target, active).await {
        Ok(state) => Some(state),
        // Said where it was noticed.
        Err(ShardError::Fenced) => None,
        // Not the job's fault: a rescan tries again (None, not fenced, is not finished).
        Err(ShardError::Api(e)) => {
            tracing::warn!(job = %job.name_any(), shard = %shard.id, error = %with_causes(&e), "looking up the job's endpoints failed; trying again");
            None
        }
        Err(ShardError::Publish(PublishError::Fenced(_))) => {
            tracing::warn!(job = %job.name_any(), shard = %shard.id, "the API server refused our update: the shard was given to another node or epoch");
            None
        }
        Err(e) => {
            tracing::warn!(job = %job.name_any(), error = %with_causes(&e), "shard failed to start");
            let live = Live::default();
            live.set_start_error(e.reason(), with_causes(&e));
            live.failed.store(1, Ordering::Relaxed);
            let _ = node.publish(target, ShardState::Failed, &live, None).await;
            Some(ShardState::Failed)
        }
    }
}

async fn run_shard(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
) -> Result<ShardState, ShardError> {
    let (job, shard) = (target.job, target.shard);
    // Between raw block claims: devices handed over by the job's holders, not roots.
    if block::is_block(target) {
        // The operator refuses a check of a block claim (resolve's modes_agree): a guard.
        if job.spec.check.is_some() {
            return Err(ShardError::Refused {
                reason: ferry_crds::Reason::NotForBlock,
                message: "spec.check reads files, and the destination is a raw block claim".into(),
            });
        }
        return block::run(node, target, active).await;
    }
    // 1. The roots, opened: inside this node's filesystem, or the source through the
    //    sender's agent (a copy between nodes).
    let (roots, dst) = open::roots(node, target, active).await?;
    // A dry run counts what it would do, and stops there; a check reads the destination
    // against its manifest, and writes nothing.
    if job.spec.dry_run {
        return dry_run(node, target, &roots).await;
    }
    if job.spec.check.is_some() {
        return check::check(node, target, active, &roots).await;
    }
    // 2. Prepared: the copy fits in the agent's memory, the destination's state directory,
    //    whether privileged files are kept, and the engine's options.
    fits_in_memory(node, target, &roots, &dst).await?;
    let state_dir = open::state_dir(&roots, job).await?;
    // Nothing becomes visible once the shard is not ours (it moved, per the watch or the
    // API server) or may not be (the heartbeat lapsed since this run began).
    let lapses = node.fence.lapses();
    let privileged = privileged_files(&node.client, job).await?;
    let opts = options(
        node,
        target,
        active,
        (&state_dir, &dst, &roots),
        lapses,
        privileged,
    )?;
    let live = Arc::new(Live::default());
    let resume = opts.resume;
    let (uid, base) = (
        state_dir.names.base(),
        format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any()),
    );
    tracing::info!(job = %base, %uid, shard = %shard.id, epoch = shard.epoch, part = %shard.part, resume, "starting shard");
    // 3. Running, published; the copy, with its totals counted beside it if it lasts.
    let done = Arc::new(AtomicBool::new(false));
    let began = std::time::Instant::now();
    node.publish(target, ShardState::Running, &live, None)
        .await?;
    let published = began.elapsed();
    count_later(&live, &done, &roots, target);
    let journal = opts.manifest.clone();
    let records = opts.records.clone();
    let fence = opts.fence.clone();
    let result = copy(node, target, active, &live, &done, &roots, opts).await?;
    let settled = Settled {
        result: &result,
        journal: journal.as_deref(),
        fence,
    };
    let copied = began.elapsed();
    // 4. Settled: how the copy ended, as the shard's state (manifest, mirror, flush).
    let state = settle(node, target, active, &live, &roots, &state_dir, settled).await;
    // Where a shard's time went: publishing Running, the copy, then the manifest, the
    // mirror and the flush.
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    tracing::info!(
        job = %base,
        shard = %shard.id,
        %state,
        start_ms = ms(published),
        copy_ms = ms(copied - published),
        settle_ms = ms(began.elapsed() - copied),
        "shard finished"
    );
    // Another agent (or epoch) owns the shard now, or may: say nothing more.
    if active.fenced.load(Ordering::Relaxed) {
        tracing::warn!(job = %base, shard = %shard.id, epoch = shard.epoch, "stopped: the shard was given to another node or epoch");
        return Err(ShardError::Fenced);
    }
    if !node.fence.holds_since(lapses) {
        tracing::warn!(job = %base, shard = %shard.id, epoch = shard.epoch, "stopped: the heartbeat not renewed in time while the shard ran (another agent may be given it)");
        return Err(ShardError::Fenced);
    }
    // 5. Published, once the shard is still ours: the outcome, and the records the next
    //    job into this destination reads.
    keep_records(records, &result).await;
    node.publish(target, state, &live, None).await?;
    Ok(state)
}
