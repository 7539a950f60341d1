//! Step 3 of a shard's run: the copy, on its own OS thread, its progress published while
//! it runs and stopped the moment the shard is no longer this agent's; a copy between
//! nodes dials its sender again when the connection is lost.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::ShardState;
use ferry_engine::Summary;
use kube::ResourceExt;

use super::node::{Active, Node};
use super::open::{Roots, Src};
use super::sender::{dial_until, MAX_REDIALS};
use crate::daemon::error::ShardError;
use crate::daemon::publish::{Live, PublishError, Target};

/// How often running shards publish progress: bounded, whatever the copy rate.
pub(super) const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// The copy, on its own OS thread; the async side only publishes its progress, and stops
/// it the moment the API server says the shard is no longer ours. A copy between nodes
/// whose connection is lost dials the sender again and resumes from what this node
/// committed (finished files are not sent again).
pub(super) async fn copy(
    node: &Node,
    target: Target<'_>,
    active: &Active,
    live: &Arc<Live>,
    done: &Arc<AtomicBool>,
    roots: &Roots,
    mut opts: ferry_engine::Options,
) -> Result<Result<Summary, ferry_engine::Error>, ShardError> {
    let shard = target.shard;
    let mut redials = 0;
    loop {
        let result = copy_once(node, target, active, live, done, roots, opts.clone()).await?;
        let Src::Remote(link) = &roots.src else {
            return Ok(result);
        };
        let conn = link.current();
        let Some(why) = conn.lost() else {
            return Ok(result);
        };
        let stopped =
            active.cancel.load(Ordering::Relaxed) || active.fenced.load(Ordering::Relaxed);
        if stopped || redials >= MAX_REDIALS {
            return Ok(result);
        }
        redials += 1;
        crate::serve::metrics().redials.inc();
        tracing::warn!(shard = %shard.id, sender = ?shard.sender, %why, redials, "the connection to the sender was lost: dialling again to resume");
        let fresh = dial_until(node, target, active).await?;
        *crate::lock(&link.conn) = fresh;
        // What the lost connection's run committed is kept (the journal): the next run
        // resumes, and counts the tree again from zero as any resumed run does.
        opts.resume = true;
        live.restart();
        done.store(false, Ordering::Relaxed);
    }
}

/// One run of the engine on the shard's source, to its end.
pub(super) async fn copy_once(
    node: &Node,
    target: Target<'_>,
    active: &Active,
    live: &Arc<Live>,
    done: &Arc<AtomicBool>,
    roots: &Roots,
    opts: ferry_engine::Options,
) -> Result<Result<Summary, ferry_engine::Error>, ShardError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let (live, done) = (live.clone(), done.clone());
        let (src, dst_root) = (roots.src.clone(), roots.dst.clone());
        let src_path = PathBuf::from(&target.job.spec.source.path);
        let dst_path = PathBuf::from(&target.job.spec.destination.path);
        std::thread::Builder::new()
            .name("ferry-shard".into())
            .spawn(move || {
                let result = match src {
                    Src::Local(src_root) => ferry_engine::copy_beneath(
                        src_root.as_fd(),
                        &src_path,
                        dst_root.as_fd(),
                        &dst_path,
                        &opts,
                        &*live,
                    ),
                    Src::Remote(link) => ferry_engine::copy_from_beneath(
                        &link.current(),
                        &src_path,
                        dst_root.as_fd(),
                        &dst_path,
                        &opts,
                        &*live,
                    ),
                };
                done.store(true, Ordering::Relaxed);
                let _ = tx.send(result);
            })
            .map_err(ShardError::Spawn)?;
    }
    let conn = match &roots.src {
        Src::Remote(link) => Some(link.current()),
        Src::Local(_) => None,
    };
    publish_until(
        node,
        target,
        active,
        live,
        done,
        rx,
        count_received(target, conn),
    )
    .await
}

/// A `tick` for [`publish_until`]: a copy between nodes counts what it received over
/// `conn` as it goes (for the network rate); a local copy (`None`) counts nothing.
pub(super) fn count_received(
    target: Target<'_>,
    conn: Option<Arc<ferry_engine::recv::Connection>>,
) -> impl FnMut() {
    let (ns, name) = (
        target.job.namespace().unwrap_or_default(),
        target.job.name_any(),
    );
    let mut received = 0;
    move || {
        if let Some(conn) = &conn {
            let now = conn.bytes_received();
            crate::serve::metrics().network("received", &ns, &name, now.saturating_sub(received));
            received = now;
        }
    }
}

/// The copy thread's result (sent on `rx`), publishing the shard Running every
/// [`PUBLISH_EVERY`] until it is `done`, and stopping it (cancel) the moment the API server
/// says the shard is no longer ours. `tick` runs at every beat and at the end.
pub(super) async fn publish_until<T>(
    node: &Node,
    target: Target<'_>,
    active: &Active,
    live: &Live,
    done: &AtomicBool,
    mut rx: tokio::sync::oneshot::Receiver<T>,
    mut tick: impl FnMut(),
) -> Result<T, ShardError> {
    let shard = target.shard;
    loop {
        tokio::select! {
            r = &mut rx => {
                tick();
                return r.map_err(ShardError::CopyThreadVanished);
            }
            _ = tokio::time::sleep(PUBLISH_EVERY) => {
                tick();
                if !done.load(Ordering::Relaxed) && !active.fenced.load(Ordering::Relaxed) {
                    match node.publish(target, ShardState::Running, live, None).await {
                        // Not ours any more: stop copying at once.
                        Err(PublishError::Fenced(_)) => {
                            active.fenced.store(true, Ordering::Relaxed);
                            active.cancel.store(true, Ordering::Relaxed);
                            tracing::warn!(shard = %shard.id, epoch = shard.epoch, "the API server refused our progress for this epoch: stopping");
                        }
                        Err(e) => tracing::warn!(error = %e, "progress update failed"),
                        Ok(()) => {}
                    }
                }
            }
        }
    }
}
