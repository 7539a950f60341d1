//! Why a run of a shard ended without a state of its own to publish ([`ShardError`]),
//! and what the shard's status then says: which [`Reason`], which message.

use std::path::PathBuf;

use ferry_crds::Reason;

use super::publish::PublishError;
use crate::copy_cmd::human;
use crate::memcg::Memcg;

/// Why a run of a shard ended without a state of its own to publish.
#[derive(Debug, thiserror::Error)]
pub(super) enum ShardError {
    /// The run stopped itself because the shard is no longer this agent's: it was given
    /// to another node or epoch, or the heartbeat lapsed while it ran.
    #[error("the shard is no longer assigned to this agent's node and epoch")]
    Fenced,
    /// A status update failed; [`PublishError::Fenced`] if the API server said the shard
    /// is no longer ours.
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("open the host root {}", path.display())]
    HostRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the operator assigned no host path for this shard")]
    NoHostPath,
    #[error("the {what} root {path} is not a directory on node {node} (is the volume mounted?)")]
    Root {
        what: &'static str,
        path: String,
        node: String,
        #[source]
        source: ferry_engine::Error,
    },
    /// The job's endpoints could not be looked up (the API server): the run is tried again.
    #[error("looking up the job's endpoints")]
    Api(#[source] kube::Error),
    /// The job's endpoints, resolved by this agent, refuse it (the operator should have).
    #[error("{message}")]
    Refused { reason: Reason, message: String },
    /// The job's endpoint is not on this node by the rules of its StorageRoot or volume:
    /// the shard's status assigned it here, which only a forged status does.
    #[error("the {what} is not on node {node} by its StorageRoot's node selector or its volume's node affinity; this agent does not copy it here")]
    NotOnThisNode { what: &'static str, node: String },
    /// The shard's status names a path that is not the kubelet's mount of the claim's CSI
    /// volume.
    #[error("the shard's {what} path {path} is not the kubelet's mount of the claim's CSI volume {pv}; this agent does not open it")]
    NotTheVolume {
        what: &'static str,
        path: String,
        pv: String,
    },
    /// A job's path names Ferry's state directory (the operator refuses such a job; an
    /// older operator, or a status edited by hand, must not get it through).
    #[error("{field} {path:?} is in .ferry, the directory where Ferry keeps its state at the top of every root and volume; choose another path")]
    StatePath { field: &'static str, path: String },
    /// A root holds the agent's own state (resume journals), which no tenant may write.
    #[error(
        "the {what} root {path} on node {node} contains the agent's own state directory          ({state}); no StorageRoot or volume may hold it: ask an admin to choose a root          that does not contain it"
    )]
    RootHoldsAgentState {
        what: &'static str,
        path: String,
        node: String,
        state: String,
    },
    /// The node's journal of what this shard committed could not be opened or written.
    #[error("the agent's journal for this shard ({})", path.display())]
    Journal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The engine refused a path or failed before copying (the state directory, a dry
    /// run's count).
    #[error(transparent)]
    Engine(#[from] ferry_engine::Error),
    /// The destination keeps its files in memory and the copy would not fit under the
    /// agent's memory limit (see crate::memcg): refused before anything is written.
    #[error(
        "the destination root {root} on node {node} is a tmpfs: the {} this copy writes \
         there count against the agent's memory limit ({}, of which {} are taken by memory \
         that cannot be reclaimed) and would get the agent OOM-killed. Raise the chart's \
         agent.resources.limits.memory to at least {} (or remove the limit), or copy to a \
         disk-backed root; nothing was copied",
        human(*.need), human(.memcg.limit), human(.memcg.unreclaimable), human(at_least(.memcg, *.need))
    )]
    MemoryLimit {
        root: String,
        node: String,
        /// Bytes the copy writes.
        need: u64,
        memcg: Memcg,
    },
    /// A step run on the blocking pool (opening the roots or the state directory, a dry
    /// run's count) panicked or was cancelled.
    #[error(transparent)]
    Count(#[from] tokio::task::JoinError),
    /// The copy thread could not be started.
    #[error(transparent)]
    Spawn(std::io::Error),
    #[error("copy thread vanished")]
    CopyThreadVanished(#[source] tokio::sync::oneshot::error::RecvError),
    /// A copy between nodes could not reach its sender's agent.
    #[error("could not get the source from the agent on node {node} for {secs}s: {why}")]
    Sender {
        node: String,
        secs: u64,
        why: String,
    },
}

/// How [`crate::transfer::TransferError::Refused`] reads: the other side answered, no.
const REFUSED: &str = "the sender refused the shard: ";

/// Whether a failed dial's message says the other side answered and refused (rather than
/// could not be reached).
pub(super) fn refused(why: &str) -> bool {
    why.contains(REFUSED)
}

/// What an agent keeps for itself under its memory limit when a copy goes into memory:
/// the engine's buffers and the runtime (about 30 MiB in use), with room to spare.
pub(super) const MEMORY_MARGIN: u64 = 64 << 20;

/// The memory limit a refused copy into tmpfs asks for. What is taken now stays taken in
/// this pod; a new pod (which raising the limit starts) begins without it, but asking for
/// it keeps the advice right either way.
fn at_least(memcg: &Memcg, need: u64) -> u64 {
    memcg.unreclaimable + need + MEMORY_MARGIN
}

impl ShardError {
    /// The reason a shard that could not start is reported with: the engine's refusal
    /// reason (PathEscape, SymlinkRejected, Openat2Unavailable) when it refused, else
    /// CannotStart.
    pub(super) fn reason(&self) -> Reason {
        match self {
            Self::Root { source, .. } | Self::Engine(source) => engine_reason(source),
            Self::MemoryLimit { .. } => Reason::DestinationFull,
            Self::StatePath { .. } => Reason::PathEscape,
            Self::Refused { reason, .. } => *reason,
            // Another install's agent answered, and refused the export (its reason is in
            // the message); a connection that never got an answer cannot start.
            Self::Sender { node, why, .. } if node == ferry_crds::EXPORT_SENDER && refused(why) => {
                Reason::ExportRefused
            }
            Self::Fenced
            | Self::RootHoldsAgentState { .. }
            | Self::Api(_)
            | Self::NotOnThisNode { .. }
            | Self::NotTheVolume { .. }
            | Self::Journal { .. }
            | Self::Publish(_)
            | Self::HostRoot { .. }
            | Self::NoHostPath
            | Self::Count(_)
            | Self::Spawn(_)
            | Self::CopyThreadVanished(_)
            | Self::Sender { .. } => Reason::CannotStart,
        }
    }
}

pub(super) fn engine_reason(e: &ferry_engine::Error) -> Reason {
    match e {
        ferry_engine::Error::Refused { reason, .. } => *reason,
        ferry_engine::Error::Io { .. } | ferry_engine::Error::Usage(_) => Reason::CannotStart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::with_causes;

    #[test]
    fn an_export_its_source_refused_is_export_refused_and_an_unreachable_one_cannot_start() {
        let refused =
            crate::transfer::TransferError::Refused("Expired: export shop/db has expired".into());
        let e = ShardError::Sender {
            node: ferry_crds::EXPORT_SENDER.into(),
            secs: 60,
            why: format!("192.0.2.10:7451 (east): {}", with_causes(&refused)),
        };
        assert_eq!(e.reason(), Reason::ExportRefused);
        assert!(
            e.to_string()
                .contains("Expired: export shop/db has expired"),
            "{e}"
        );
        let e = ShardError::Sender {
            node: ferry_crds::EXPORT_SENDER.into(),
            secs: 60,
            why: "192.0.2.10:7451 (east): connection refused".into(),
        };
        assert_eq!(e.reason(), Reason::CannotStart);
        // Between nodes, a refusal is not an export's.
        let e = ShardError::Sender {
            node: "node-b".into(),
            secs: 60,
            why: with_causes(&crate::transfer::TransferError::Refused("no".into())),
        };
        assert_eq!(e.reason(), Reason::CannotStart);
    }

    #[test]
    fn a_root_the_engine_refused_is_reported_with_the_engines_reason_and_each_cause_once() {
        let e = ShardError::Root {
            what: "source",
            path: "/data".into(),
            node: "node-a".into(),
            source: ferry_engine::Error::Refused {
                reason: Reason::SymlinkRejected,
                message: "/data passes a symlink".into(),
            },
        };
        assert_eq!(e.reason(), Reason::SymlinkRejected);
        assert_eq!(
            with_causes(&e),
            "the source root /data is not a directory on node node-a (is the volume mounted?): \
             /data passes a symlink"
        );
    }

    #[test]
    fn a_host_root_that_cannot_be_opened_cannot_start_and_says_why_once() {
        let e = ShardError::HostRoot {
            path: "/host".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(e.reason(), Reason::CannotStart);
        assert_eq!(
            with_causes(&e),
            "open the host root /host: No such file or directory (os error 2)"
        );
    }
}
