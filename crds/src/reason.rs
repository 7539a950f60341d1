//! Every reason Ferry gives, in one list: the reasons a path or a shard failed (a CopyJob's
//! `status.failures[].reason`, the engine's per-entry failures, the agent's
//! `ferry_failures_total{reason}`), and the reasons of its conditions and events. The
//! CRD schema documents them (a test checks that each one is), and docs/copyjob.md's
//! "Why a job failed" and "Refusals" say what to do about each.

wire_enum! {
    /// Why something failed, or why a condition is what it is. Stable: they are API.
    pub enum Reason {
        // One entry (or, with path ".", a whole shard).
        /// The destination filesystem is full or over quota; the copy stops (the shard's
        /// message says how much more is needed).
        DestinationFull,
        /// Permission denied reading the source or writing the destination.
        PermissionDenied,
        /// The source entry vanished during the copy.
        NotFound,
        /// The source changed while it was copied, on each of 3 attempts.
        SourceChanged,
        /// The destination's bytes did not hash to the source's.
        ChecksumMismatch,
        /// A read or write error, again on a fresh rewrite (a failed flush is never retried).
        IOError,
        /// A destination name is taken by an entry of another type, or by a symlink where a
        /// directory is needed.
        DestinationConflict,
        /// `reflink: Always` on a filesystem pair that cannot clone.
        ReflinkUnsupported,
        // A whole shard (path ".").
        /// The node's agent stopped heartbeating and did not come back in time; the volumes
        /// are only on that node.
        NodeUnavailable,
        /// A path would leave its root (absolute, `..`, NUL).
        PathEscape,
        /// A path passes a symlink (which is never followed inside a root).
        SymlinkRejected,
        /// The spec changed after the job's shards were cut for it (what was copied is
        /// where the old spec said); create a new CopyJob for the new spec.
        SpecChanged,
        /// The kernel has no `openat2`, so paths cannot be resolved safely.
        Openat2Unavailable,
        /// The shard could not start (its root is not there on the node, ...): see the message.
        CannotStart,
        // The job's Failed condition.
        /// Some entries failed; the rest were copied.
        PartiallyFailed,
        // Accepted.
        /// The spec is valid and allowed.
        Valid,
        /// An endpoint names neither or both of root and pvc.
        InvalidEndpoint,
        /// A field is out of range or malformed.
        InvalidSpec,
        /// The job names something of another namespace.
        CrossNamespace,
        /// The StorageRoot does not allow the job's namespace.
        RootNotAllowed,
        /// The destination's StorageRoot is read-only.
        ReadOnlyRoot,
        /// One end is a raw block claim (`volumeMode: Block`) and the other a filesystem.
        VolumeModeMismatch,
        /// A raw block destination is smaller than its source.
        DestinationTooSmall,
        /// A field that means something only for files (a path, include/exclude, mirror,
        /// preserve, overwrite Never) on a job between raw block claims.
        NotForBlock,
        // Resolved.
        /// Both endpoints resolve to host paths on nodes.
        Resolved,
        /// No such PersistentVolumeClaim in the job's namespace.
        PVCNotFound,
        /// The claim is not bound to a volume yet (or its volume does not name it back).
        PVCNotBound,
        /// No Running pod mounts the CSI claim yet.
        VolumeNotMounted,
        /// No `VolumeSnapshot` of that name in the job's namespace, or none can be taken
        /// (no snapshot API, no class).
        SnapshotNotFound,
        /// The snapshot (or the claim restored from it) is not ready yet; the message says
        /// what it waits for, or the snapshot's error.
        SnapshotNotReady,
        /// A `ReadWriteOncePod` claim is used by a pod that is not Ferry's: only one pod
        /// may use it, so the job waits until that pod stops.
        VolumeInUse,
        /// The claim's volume is of a kind Ferry cannot reach.
        VolumeNotSupported,
        /// No such StorageRoot.
        RootNotFound,
        // Scheduled.
        /// Shards are assigned to agents.
        Assigned,
        /// A node-local volume's agent stopped heartbeating; waiting for it until the deadline.
        WaitingForNode,
        /// No node with a live Ferry agent has the volumes.
        NoAgent,
        // Complete.
        /// Every file was copied.
        Copied,
        /// A dry run counted what would be copied.
        Planned,
        // Events.
        /// A lost agent's shard was given to another agent.
        Reassigned,
    }
}

impl Reason {
    /// The reasons one entry fails with (every other entry goes on), in metric-label order.
    pub const PER_ENTRY: [Reason; 8] = [
        Reason::DestinationFull,
        Reason::PermissionDenied,
        Reason::NotFound,
        Reason::SourceChanged,
        Reason::ChecksumMismatch,
        Reason::ReflinkUnsupported,
        Reason::DestinationConflict,
        Reason::IOError,
    ];

    /// The reasons that stop a whole shard rather than one entry, strongest first: the
    /// job's Failed condition names the first one any shard has.
    pub const STOPS_SHARD: [Reason; 19] = [
        Reason::SpecChanged,
        Reason::DestinationFull,
        Reason::DestinationTooSmall,
        Reason::VolumeModeMismatch,
        Reason::NotForBlock,
        Reason::NodeUnavailable,
        Reason::RootNotAllowed,
        Reason::ReadOnlyRoot,
        Reason::CrossNamespace,
        Reason::RootNotFound,
        Reason::PVCNotFound,
        Reason::PVCNotBound,
        Reason::VolumeNotSupported,
        Reason::InvalidSpec,
        Reason::InvalidEndpoint,
        Reason::PathEscape,
        Reason::SymlinkRejected,
        Reason::Openat2Unavailable,
        Reason::CannotStart,
    ];

    /// Refusals that stop a job already running: it is no longer allowed (a root stopped
    /// admitting its namespace or became read-only, a claim is no longer its own) or its
    /// endpoints no longer exist. The operator fails the job's unfinished shards with it, at
    /// a new epoch, so their agents stop. Agents never fail a shard with one of these.
    pub const REVOKES: [Reason; 10] = [
        Reason::SpecChanged,
        Reason::RootNotAllowed,
        Reason::ReadOnlyRoot,
        Reason::CrossNamespace,
        Reason::RootNotFound,
        Reason::PVCNotFound,
        Reason::PVCNotBound,
        Reason::VolumeNotSupported,
        Reason::InvalidSpec,
        Reason::InvalidEndpoint,
    ];
}

wire_enum! {
    /// The types of a CopyJob's conditions, in the order a job meets them.
    pub enum ConditionType {
        /// The spec is valid and allowed (False: refused, see the reason).
        Accepted,
        /// The volumes resolve to host paths on nodes.
        Resolved,
        /// The shards are assigned to agents (False: waiting, see the reason).
        Scheduled,
        /// Every file was copied (or a dry run planned).
        Complete,
        /// The job failed; the reason says why.
        Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoking_reason_is_one_that_names_a_failed_job() {
        // REVOKES repeats part of STOPS_SHARD (each list is a const array): a revoked job's
        // Failed condition is named by its reason only if STOPS_SHARD has it too.
        for r in Reason::REVOKES {
            assert!(
                Reason::STOPS_SHARD.contains(&r),
                "{r:?} is not in STOPS_SHARD"
            );
        }
    }

    #[test]
    fn reasons_serialize_as_their_names() {
        for r in Reason::ALL {
            let json = serde_json::to_string(r).expect("serialize");
            assert_eq!(json, format!("\"{}\"", r.as_str()));
        }
    }
}
