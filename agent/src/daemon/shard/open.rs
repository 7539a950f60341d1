//! Step 1 of a shard's run: its roots opened (inside the node's filesystem, or the source
//! reached through the sender's agent) and the destination's state directory.

use std::os::fd::OwnedFd;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::Arc;

use ferry_crds::{Filter, ManifestName, STATE_DIR};
use kube::ResourceExt;

use super::node::{Active, Node};
use super::sender::{connect, Link};
use crate::daemon::error::ShardError;
use crate::daemon::job_options::filter_of;
use crate::daemon::journal;
use crate::daemon::publish::Target;
use crate::daemon::roots::{open_root, own};

/// The shard's source and destination roots, opened inside the node's filesystem (the
/// source: or reached through the sender's agent), and what of the source it copies.
pub(super) struct Roots {
    pub(super) src: Src,
    pub(super) dst: Arc<OwnedFd>,
    /// The job's include/exclude, compiled once for every step of the run (the copy, its
    /// counts, the mirror pass).
    pub(super) filter: Arc<Filter>,
}

/// Where a shard's source is.
#[derive(Clone)]
pub(super) enum Src {
    /// On this node: its root's directory.
    Local(Arc<OwnedFd>),
    /// On the sender's node, through a connection to its agent.
    Remote(Arc<Link>),
}

/// The state directory under the destination root, where the shard's manifest lives.
pub(super) struct StateDir {
    /// Held open: `path` reaches the directory through this fd.
    pub(super) _fd: OwnedFd,
    pub(super) path: PathBuf,
    pub(super) names: ManifestName,
}

impl StateDir {
    /// The manifest lives with the data it describes, under the destination root; each
    /// part of a split job writes its own, and the directories pass joins them.
    /// (Reached through /proc/self/fd: the directory itself, whatever its path does later.)
    pub(super) fn open(dst: &OwnedFd, names: ManifestName) -> Result<Self, ShardError> {
        let fd = ferry_engine::state_dir(dst.as_fd(), STATE_DIR)?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok(Self {
            _fd: fd,
            path,
            names,
        })
    }
}

/// Open the shard's roots: the destination (and the source, on one node) inside this
/// node's filesystem, as the operator's assignment and the job's StorageRoot or claim
/// allow, never one that holds the agent's own state; the source of a copy between nodes
/// through its sender's agent. Returns the roots and the destination's host path.
pub(super) async fn roots(
    node: &Node,
    target: Target<'_>,
    active: &Active,
) -> Result<(Roots, String), ShardError> {
    let (job, shard) = (target.job, target.shard);
    let filter = Arc::new(filter_of(&job.spec)?);
    for (field, path) in [
        ("spec.source.path", &job.spec.source.path),
        ("spec.destination.path", &job.spec.destination.path),
    ] {
        if ferry_crds::in_state_dir(path) {
            let path = path.clone();
            return Err(ShardError::StatePath { field, path });
        }
    }
    // A copy between nodes: the source is served by the sender's agent, which resolves and
    // opens it itself; this agent has only the destination.
    let me = &node.settings.node;
    let sender = shard.sender.as_deref().filter(|s| s != me);
    let network = sender.is_some();
    // The operator refuses such a job when it pairs the nodes; a guard, should one get here.
    if network {
        ferry_resolve::validate::between_nodes(&job.spec).map_err(|r| ShardError::Refused {
            reason: r.reason,
            message: r.message,
        })?;
    }
    let wanted: &[(&'static str, &str)] = if network {
        &[("destination", &shard.destination_root)]
    } else {
        &[
            ("source", &shard.source_root),
            ("destination", &shard.destination_root),
        ]
    };
    let mut paths = own(&node.client, me, job, wanted).await?;
    let dst = paths.pop().unwrap_or_default();
    let src = paths.pop();
    // Opening a root can hang (an NFS server gone away): never on a runtime thread, where
    // it would stop the heartbeat and every other shard with it.
    let (src_fd, dst_fd) = {
        let (host, node_name) = (node.settings.host_root.clone(), node.settings.node.clone());
        let (src, dst) = (src.clone(), dst.clone());
        let state = node.journals.state_dir().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let src_fd = src
                .as_deref()
                .map(|p| open_root(&host, &node_name, "source", p))
                .transpose()?;
            let dst_fd = open_root(&host, &node_name, "destination", &dst)?;
            let roots = [
                ("source", src.as_ref(), src_fd.as_ref()),
                ("destination", Some(&dst), Some(&dst_fd)),
            ];
            for (what, path, fd) in roots {
                let (Some(path), Some(fd)) = (path, fd) else {
                    continue;
                };
                // Unreadable as a path (it is there: the agent made it) means no.
                if journal::is_within(&state, fd).unwrap_or(false) {
                    return Err(ShardError::RootHoldsAgentState {
                        what,
                        path: path.clone(),
                        node: node_name.clone(),
                        state: state.display().to_string(),
                    });
                }
            }
            Ok((src_fd, dst_fd))
        })
        .await??
    };
    let src = match src_fd {
        Some(fd) => Src::Local(Arc::new(fd)),
        None => Src::Remote(Arc::new(connect(node, target, active).await?)),
    };
    let roots = Roots {
        src,
        dst: Arc::new(dst_fd),
        filter,
    };
    Ok((roots, dst))
}

/// The destination's state directory (where the shard's manifest lives), opened on the
/// blocking pool.
pub(super) async fn state_dir(
    roots: &Roots,
    job: &ferry_crds::CopyJob,
) -> Result<StateDir, ShardError> {
    let dst = roots.dst.clone();
    let names = ManifestName::new(&job.uid().unwrap_or_default());
    tokio::task::spawn_blocking(move || StateDir::open(&dst, names)).await?
}
