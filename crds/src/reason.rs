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
        /// The source entry vanished during the copy; checked against a manifest
        /// (`spec.check`), a file it lists is not on the destination.
        NotFound,
        /// The source changed while it was copied, on each of 3 attempts.
        SourceChanged,
        /// The destination's bytes did not hash to the source's; checked against a manifest
        /// (`spec.check`), to the hash it lists.
        ChecksumMismatch,
        /// A read or write error, again on a fresh rewrite (a failed flush is never retried).
        IOError,
        /// A destination name is taken by an entry of another type, or by a symlink where a
        /// directory is needed; checked against a manifest (`spec.check`), what it lists as a
        /// file is not a regular file there, or is reached through a symlink.
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
        /// A check (`spec.check`): files its manifest lists changed, are missing or are not
        /// regular files on the destination (status.failures names the first).
        Differs,
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
        /// The source's export Secret is missing, unreadable by the operator, or not an
        /// export's (the message says which and what to do).
        ExportNotFound,
        /// The export Secret's peering CA is not one a FerryPeer of this cluster holds for
        /// that install with `imports: Allow` and this namespace (the message names its
        /// fingerprint), or peering is off here.
        PeerNotTrusted,
        /// The source install's agent refused the export (its reason in the message:
        /// BadCredential, NotAReader, Expired, Deleted, NotReady, InUse, ExportNotFound).
        ExportRefused,
        // Scheduled.
        /// Shards are assigned to agents.
        Assigned,
        /// A node-local volume's agent stopped heartbeating; waiting for it until the deadline.
        WaitingForNode,
        /// No node with a live Ferry agent has the volumes.
        NoAgent,
        /// The agent reading another install's export cannot reach that install's agent
        /// (no connection, or not one that proves to be that install's); it keeps trying.
        PeerUnreachable,
        // Complete.
        /// Every file was copied.
        Copied,
        /// A dry run counted what would be copied.
        Planned,
        /// A check (`spec.check`): every file its manifest lists is on the destination with
        /// the bytes it lists.
        Verified,
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
    pub const STOPS_SHARD: [Reason; 20] = [
        Reason::SpecChanged,
        Reason::ExportRefused,
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

impl Reason {
    /// What to change about it, in a sentence (`kubectl ferry why` prints it; docs/copyjob.md's
    /// "Why a job failed" and "Refusals" say the same at more length). Empty for a reason that
    /// needs nothing changed.
    pub fn remedy(self) -> &'static str {
        use Reason::*;
        match self {
            DestinationFull => "free or add the space the message names, then create the job again: what was copied is kept and not copied again (unless overwrite: Always)",
            PermissionDenied => "give the paths listed in status.failures read access on the source, or write access on the destination, then run the job again",
            NotFound => "the listed entries vanished while the job ran (a check: they are not on the destination); run the copy again once the source is at rest",
            SourceChanged => "the listed files kept changing; stop the writer, or copy from a snapshot (source.snapshot, or copyMethod: Snapshot)",
            ChecksumMismatch => "the destination does not hold the bytes its source had (a check: the listed files changed since the copy): check its device, then run the copy again (overwrite: IfChanged with compare: Checksum rewrites only those)",
            IOError => "check the device of the listed paths (each failed file was already rewritten once)",
            DestinationConflict => "remove or rename the destination entries listed (another type, or a symlink where a directory is needed; a check: not a regular file, or behind a symlink), or choose another destination path",
            ReflinkUnsupported => "use reflink: Auto (clone where the filesystems can, copy elsewhere), or a destination on the source's reflink-capable filesystem",
            NodeUnavailable => "bring the node (or its Ferry agent) back, then create the job again: what it committed is kept",
            PathEscape => "use a relative path inside the root or volume: no leading /, no .., no NUL",
            SymlinkRejected => "name the path without a symlink in it: links inside a root are copied, never followed",
            SpecChanged => "create a new CopyJob for the new spec: a started job's spec does not change",
            Openat2Unavailable => "run the agent on a kernel with openat2 (Linux 5.6 or later)",
            CannotStart => "the message names what is missing on the node (a root's path not mounted, for one): fix that, or the StorageRoot's nodeSelector",
            PartiallyFailed => "fix the entries status.failures lists (the message counts them by reason), then run the job again",
            Differs => "the destination is not what the copy left: copy it again (overwrite: IfChanged, compare: Checksum rewrites only what differs), then check again",
            Valid | Resolved | Assigned | Copied | Planned | Verified | Reassigned => "",
            InvalidEndpoint => "set exactly one of root, pvc, snapshot or export in each endpoint",
            InvalidSpec => "change the field the message names",
            CrossNamespace => "name a claim, snapshot or VolumeSource of the job's own namespace (a volume whose claimRef names another claim is not this claim's)",
            RootNotAllowed => "ask an admin to add this namespace to the StorageRoot's spec.namespaces",
            ReadOnlyRoot => "choose a destination that is not read-only (the StorageRoot's readOnly, or a claim mounted read-only)",
            VolumeModeMismatch => "copy a raw block claim onto a raw block claim and a filesystem onto a filesystem",
            DestinationTooSmall => "make the destination claim at least as large as the source",
            NotForBlock => "remove the fields the message names: a copy between raw block claims copies the whole device",
            PVCNotFound => "create the claim in the job's namespace, or fix its name",
            PVCNotBound => "wait for the claim to be bound (or give it a StorageClass that can provision it): the job resolves once it is",
            VolumeNotMounted => "start a pod that mounts the claim, or let the operator hold it (the chart's operator.holderPods)",
            SnapshotNotFound => "create the VolumeSnapshot in the job's namespace, or a VolumeSnapshotClass for the claim's driver",
            SnapshotNotReady => "wait: the message says what the snapshot waits for, or its error",
            VolumeInUse => "stop the pod the message names: a ReadWriteOncePod claim has one user at a time",
            VolumeNotSupported => "use a claim on a local, hostPath or CSI volume (a raw block volume must be CSI)",
            RootNotFound => "create the StorageRoot, or fix its name",
            ExportNotFound => "carry the export's Secret from the source cluster into the job's namespace, and let the operator read it (the message gives the two kubectl commands)",
            PeerNotTrusted => "ask this cluster's admin to pair with the export's install (a FerryPeer holding its peering CA, imports: Allow, admitting this namespace)",
            ExportRefused => "the source cluster refused the export (the message says why): ask its owner to renew it, add this namespace to its readers, or hand over its current Secret",
            WaitingForNode => "bring the node's Ferry agent back before the operator's deadline",
            NoAgent => "run a Ferry agent on a node that has the volumes (the message names what is missing)",
            PeerUnreachable => "let this cluster's nodes reach the export's address (its Service, a firewall between the clusters), or carry the export's current Secret if it moved: the job goes on by itself, and what it copied is kept",
        }
    }
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
        /// Every file was copied (or a dry run planned, or a check matched).
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
    fn every_reason_that_is_a_refusal_or_failure_says_what_to_change() {
        let fine = [
            Reason::Valid,
            Reason::Resolved,
            Reason::Assigned,
            Reason::Copied,
            Reason::Planned,
            Reason::Verified,
            Reason::Reassigned,
        ];
        for r in Reason::ALL {
            assert_eq!(r.remedy().is_empty(), fine.contains(r), "{r:?}");
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
