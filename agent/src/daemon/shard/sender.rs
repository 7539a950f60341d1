//! A copy between nodes, the receiver's side: the connection to the sender's agent
//! ([`Link`]), dialled until it answers and again when it is lost.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use super::node::{Active, Node};
use crate::daemon::error::{refused, ShardError};
use crate::daemon::network::{dial, DIAL_FOR};
use crate::daemon::publish::{publish_waiting, PublishError, Target};

/// The connection of a copy between nodes, dialled again when it is lost.
pub(crate) struct Link {
    pub(super) conn: std::sync::Mutex<Arc<ferry_engine::recv::Connection>>,
}

impl Link {
    pub(super) fn current(&self) -> Arc<ferry_engine::recv::Connection> {
        crate::lock(&self.conn).clone()
    }
}

/// Reach the shard's sender, trying again while it cannot be reached (its agent starting,
/// its certificate not issued yet, the ticket not yet seen) for up to
/// [`DIAL_FOR`], unless the run is stopped meanwhile.
pub(super) async fn connect(
    node: &Node,
    target: Target<'_>,
    active: &Active,
) -> Result<Link, ShardError> {
    let conn = dial_until(node, target, active).await?;
    receivers().inc();
    Ok(Link {
        conn: std::sync::Mutex::new(conn),
    })
}

pub(super) fn receivers() -> prometheus::IntGauge {
    crate::serve::metrics()
        .connections
        .with_label_values(&["receiver"])
}

impl Drop for Link {
    fn drop(&mut self) {
        receivers().dec();
    }
}

/// Between installs, how long dials fail before the shard says what it waits for
/// (PeerUnreachable, in the job's Scheduled condition).
const PEER_PATIENCE: Duration = Duration::from_secs(10);
/// Between installs, the longest pause between dials once waiting.
const PEER_RETRY: Duration = Duration::from_secs(15);

/// Dial the sender until it answers. Between nodes, for up to [`DIAL_FOR`]. From another
/// install's export, an agent that answers and refuses also fails the shard after
/// [`DIAL_FOR`] (ExportRefused: only its owner changes that); one that cannot be reached
/// (no connection, or not one proving to be that install's) is waited for, said in the
/// status after [`PEER_PATIENCE`], until the job is stopped or the operator gives the
/// ticket a new address: a network between clusters comes back, and the copy resumes
/// where it stood.
pub(super) async fn dial_until(
    node: &Node,
    target: Target<'_>,
    active: &Active,
) -> Result<Arc<ferry_engine::recv::Connection>, ShardError> {
    let (job, shard) = (target.job, target.shard);
    let export = shard.sender.as_deref() == Some(ferry_crds::EXPORT_SENDER);
    let began = std::time::Instant::now();
    let mut wait = Duration::from_millis(100);
    let mut said = ferry_crds::Waiting::default();
    loop {
        match dial(
            &node.client,
            &node.settings,
            (node.identity.as_ref(), node.peering.as_ref()),
            job,
            shard,
        )
        .await
        {
            Ok(conn) => return Ok(conn),
            // Another install's agent that cannot be reached is waited for, and said.
            Err(why) if export && !refused(&why) => {
                if began.elapsed() >= PEER_PATIENCE {
                    said = say_unreachable(node, target, &why, said).await?;
                } else {
                    tracing::info!(job = %job.name_any(), shard = %shard.id, %why, "the export's agent cannot be reached yet; trying again");
                }
            }
            Err(why) if began.elapsed() >= DIAL_FOR => {
                return Err(ShardError::Sender {
                    node: shard.sender.clone().unwrap_or_default(),
                    secs: DIAL_FOR.as_secs(),
                    why,
                })
            }
            Err(why) => {
                tracing::info!(job = %job.name_any(), shard = %shard.id, sender = ?shard.sender, %why, "the sender cannot be reached yet; trying again");
            }
        }
        // A second at a time: a suspend or a move is heard within one, however long the
        // pause between dials.
        let until = tokio::time::Instant::now() + wait;
        loop {
            if active.cancel.load(Ordering::Relaxed) || active.fenced.load(Ordering::Relaxed) {
                return Err(ShardError::Fenced);
            }
            let now = tokio::time::Instant::now();
            if now >= until {
                break;
            }
            tokio::time::sleep((until - now).min(Duration::from_secs(1))).await;
        }
        let most = match export {
            true if began.elapsed() >= PEER_PATIENCE => PEER_RETRY,
            _ => Duration::from_secs(2),
        };
        wait = (wait * 2).min(most);
    }
}

/// Say in the shard's status that the export's agent cannot be reached (`why`), unless
/// that is what was `said` last; what is said now.
async fn say_unreachable(
    node: &Node,
    target: Target<'_>,
    why: &str,
    said: ferry_crds::Waiting,
) -> Result<ferry_crds::Waiting, ShardError> {
    let shard = target.shard;
    let waiting = ferry_crds::Waiting::new(
        ferry_crds::Reason::PeerUnreachable,
        &format!(
            "node {} cannot reach the agent serving the export: {why}; trying again every {}s (what was copied is kept)",
            node.settings.node,
            PEER_RETRY.as_secs()
        ),
    );
    tracing::warn!(job = %target.job.name_any(), shard = %shard.id, %why, "the export's agent cannot be reached; trying again");
    // Said once per new message (every progress update clears it once the copy goes on).
    if waiting == said {
        return Ok(said);
    }
    match publish_waiting(&node.client, &node.settings.node, target, &waiting).await {
        Ok(()) => Ok(waiting),
        Err(PublishError::Fenced(_)) => Err(ShardError::Fenced),
        Err(e) => {
            tracing::warn!(shard = %shard.id, error = %crate::with_causes(&e), "could not say what the shard waits for");
            Ok(said)
        }
    }
}

/// Connections of a copy between nodes dialled again after one was lost, at most, in one
/// run (each dial itself tries for up to [`DIAL_FOR`]).
pub(super) const MAX_REDIALS: u32 = 1000;
