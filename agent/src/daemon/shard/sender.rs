//! A copy between nodes, the receiver's side: the connection to the sender's agent
//! ([`Link`]), dialled until it answers and again when it is lost.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use super::node::{Active, Node};
use crate::daemon::error::ShardError;
use crate::daemon::network::{dial, DIAL_FOR};
use crate::daemon::publish::Target;

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

pub(super) async fn dial_until(
    node: &Node,
    target: Target<'_>,
    active: &Active,
) -> Result<Arc<ferry_engine::recv::Connection>, ShardError> {
    let (job, shard) = (target.job, target.shard);
    let began = std::time::Instant::now();
    let mut wait = Duration::from_millis(100);
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
        if active.cancel.load(Ordering::Relaxed) || active.fenced.load(Ordering::Relaxed) {
            return Err(ShardError::Fenced);
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}

/// Connections of a copy between nodes dialled again after one was lost, at most, in one
/// run (each dial itself tries for up to [`DIAL_FOR`]).
pub(super) const MAX_REDIALS: u32 = 1000;
