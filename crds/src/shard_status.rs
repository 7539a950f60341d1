//! A job's shards as its status carries them: the operator's assignment and the
//! agent's progress ([`ShardStatus`], [`ShardProgress`]), the failures a shard lists
//! ([`FailedPath`]), and the fenced JSON patch an agent publishes its progress with
//! ([`ShardProgress::fenced_patch`]): the one place the status's field names are written.

use serde::{Deserialize, Serialize};

use crate::{Part, Reason, ShardState};

/// One shard of a job. The operator owns the assignment (`id`, `node`, `epoch`); the agent
/// running it owns the progress fields. Both write with server-side apply under their own
/// field managers, so neither overwrites the other.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ShardStatus {
    /// Shard identity, stable for the job's life (list map key).
    pub id: String,
    /// Node whose agent runs it (in a copy between nodes, the destination's node).
    pub node: String,
    /// In a copy between nodes: the node whose agent serves the source to `node`'s agent.
    /// Unset (or empty) for a copy on one node.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_is_none"
    )]
    #[schemars(with = "String")]
    pub sender: Option<String>,
    /// The digest of the spec this shard was cut for (`CopyJobSpec::digest`): an agent
    /// runs it only while the job's spec still has it, and the operator fails the job
    /// with SpecChanged when it no longer does. Empty on shards cut before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub spec_digest: String,
    /// Assignment epoch, raised each time the shard is given to an agent: an agent's
    /// updates are refused by the API server unless `node` and `epoch` are still the ones
    /// it was given (a JSON patch `test`), so an agent that lost its shard cannot publish.
    pub epoch: i64,
    /// Host path of the source's root or volume, as resolved by the operator (the agent
    /// joins the endpoint's relative path below it, under its host-root mount).
    pub source_root: String,
    /// Host path of the destination's root or volume.
    pub destination_root: String,
    /// Which part of the tree: empty for all of it; `i/n` for the entries whose path
    /// hashes to i of n (a tree on shared roots split across agents); `directories` for
    /// the last step of a split copy, which gives every directory its metadata and joins
    /// the parts' manifests.
    #[schemars(with = "String")]
    pub part: Part,
    /// What the agent running it reports (and the operator, when it fails the shard).
    #[serde(flatten)]
    pub progress: ShardProgress,
}

/// A shard's progress: the fields of [`ShardStatus`] its agent writes, declared once here
/// and serialised whole by the agent's fenced status update (each field it sets is a key
/// of this struct's JSON, so no field name is written out anywhere else).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ShardProgress {
    /// Pending (or unset: not started), Running, Suspended (stopped by `suspend`; resumes
    /// where it stopped), Stopped (the job is being deleted), Succeeded or Failed.
    pub state: ShardState,
    /// Regular files committed by this shard (a hard-linked file once).
    pub files_done: i64,
    /// Bytes (apparent size) of the files committed by this shard.
    pub bytes_done: i64,
    /// Bytes shared by reflink.
    pub bytes_reflinked: i64,
    /// Entries left as the destination had them, by the overwrite policy: not copied and
    /// not verified by this job.
    pub skipped: i64,
    /// Entries that failed.
    pub failed: i64,
    /// Files this shard kept by the quick check that its manifest does not list (see
    /// `progress.unlisted`).
    pub unlisted: i64,
    /// Files of `filesDone` that the destination had with a few chunks different, mended
    /// from its copy and those chunks (see `progress.patched`).
    pub patched: i64,
    /// Average throughput of this shard so far, in bytes per second.
    pub bytes_per_second: i64,
    /// Entries this shard removed from the destination (deleteExtraneous), those inside a
    /// removed directory included.
    pub deleted: i64,
    /// Dry run with deleteExtraneous: entries this shard would remove.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned_deletions: Option<i64>,
    /// Dry run with deleteExtraneous: the first 20 paths it would remove (a directory once,
    /// with a trailing `/`), relative to the destination path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub to_delete: Vec<String>,
    /// Dry run: regular files this shard would copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned_files: Option<i64>,
    /// Dry run: bytes this shard would copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned_bytes: Option<i64>,
    /// The first failures of this shard.
    pub failures: Vec<FailedPath>,
    /// A slice of a split job that succeeded: its part of the manifest as it wrote it to
    /// the destination's `.ferry/`. The directories pass joins only parts that still
    /// match, so nothing planted there gets into the job's manifest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_part: Option<ManifestPart>,
    /// A raw block copy, once it finished: what it read and wrote, chunk by chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockProgress>,
    /// A check (`spec.check`): what its manifest lists and how the destination compares.
    /// `filesDone` and `bytesDone` count the files that matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckCounts>,
    /// What the shard waits for while its agent keeps trying (the job's Scheduled
    /// condition says it); empty once it goes on. Every progress update clears it.
    pub waiting: Waiting,
}

/// Why a shard's agent cannot go on yet, and keeps trying: another install's agent that
/// serves the export cannot be reached (PeerUnreachable). Written by the agent, shown by
/// the operator: bounded ([`FailedPath::SHARD_MESSAGE_BYTES`]), never acted upon.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct Waiting {
    /// PeerUnreachable, or unset: not waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// What it tried, what happened, and how often it tries again.
    #[serde(skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 2048))]
    pub message: String,
}

impl Waiting {
    /// Waiting for `reason`, the message shortened as a whole shard's failure's is.
    pub fn new(reason: Reason, message: &str) -> Self {
        Self {
            reason: Some(reason),
            message: shorten(message, FailedPath::SHARD_MESSAGE_BYTES),
        }
    }

    /// The JSON patch that sets only this of `shard`'s progress (at `index`), fenced as
    /// [`ShardProgress::fenced_patch`] is: what an agent publishes while it waits, without
    /// touching the counts its last update carried.
    pub fn fenced_patch(
        &self,
        index: usize,
        shard: &ShardStatus,
        node: &str,
    ) -> Result<serde_json::Value, serde_json::Error> {
        let mut fields = serde_json::Map::new();
        fields.insert("waiting".into(), serde_json::to_value(self)?);
        ShardProgress::fenced(index, shard, node, fields)
    }
}

/// A check's counts (`spec.check`): every file its manifest lists is one of these.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase", default)]
pub struct CheckCounts {
    /// Files the manifest lists (each path once).
    pub listed: i64,
    /// Files whose bytes hash to what the manifest lists.
    pub matched: i64,
    /// Files whose bytes do not (ChecksumMismatch).
    pub changed: i64,
    /// Files not on the destination (NotFound).
    pub missing: i64,
    /// Names that are not regular files there, or are reached through a symlink
    /// (DestinationConflict).
    pub not_regular: i64,
    /// Files that could not be read (PermissionDenied, IOError).
    pub unreadable: i64,
}

/// What a finished raw block copy did (`progress.bytesDone` is the device's size).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockProgress {
    /// The device's chunks (of `chunkBytes`).
    pub chunks: i64,
    pub chunk_bytes: i64,
    /// Chunks written: they differed from the destination's, or it was not compared.
    pub written: i64,
    /// Chunks of zeros punched (discard or write-zeroes) instead of written.
    pub punched: i64,
    /// Chunks the destination already held, by their hashes.
    pub unchanged: i64,
    /// Bytes of the source read: less than the device only when the chunks to read came
    /// from the CSI driver's changed-block tracking (`changedBlocksOnly`).
    pub source_bytes_read: i64,
    /// Whether only the chunks the CSI driver said changed since the snapshot the
    /// destination held were read (the rest kept their hashes from the last copy).
    pub changed_blocks_only: bool,
}

/// A file as its writer left it: its length and xxHash3-64.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestPart {
    pub bytes: i64,
    /// 16 hex digits.
    #[schemars(length(max = 16))]
    pub xxh3: String,
}

impl ShardStatus {
    /// The operator failed this shard itself (its node stayed away too long, or the job
    /// stopped being allowed: [`Reason::REVOKES`]): its state and failure are the
    /// operator's, and no agent may run it.
    pub fn failed_by_operator(&self) -> bool {
        self.progress.state == ShardState::Failed
            && self.progress.failures.iter().any(|f| {
                f.is_whole_shard()
                    && (f.reason == Reason::NodeUnavailable || Reason::REVOKES.contains(&f.reason))
            })
    }

    /// Copied between nodes: another node's agent serves its source (`sender`).
    pub fn between_nodes(&self) -> bool {
        self.sender.is_some()
    }
}

/// One failed path (the first few are kept).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedPath {
    /// Path relative to the source.
    pub path: String,
    /// Stable reason. Per entry: PermissionDenied, NotFound, SourceChanged (changed on
    /// every one of 3 attempts), ChecksumMismatch, IOError (failed again on a fresh
    /// rewrite), DestinationConflict (the name is taken by another type of entry, or by a
    /// symlink where a directory is needed), ReflinkUnsupported (reflink Always where the
    /// filesystems cannot clone), DestinationFull. For a whole shard (path "."):
    /// DestinationFull (says how much more is needed), NodeUnavailable (its node's agent
    /// did not come back in time), PathEscape (a path would leave its root),
    /// SymlinkRejected (a path passes a symlink), Openat2Unavailable (the kernel cannot
    /// resolve paths safely), CannotStart (see the message).
    pub reason: Reason,
    /// What happened.
    pub message: String,
}

impl FailedPath {
    /// Bytes an entry keeps of its path and of its message. A status holds up to 65 shards of
    /// 20 entries each, and the whole object must stay under the API server's 1.5 MiB: paths
    /// inside a tree have no length limit (only each name has), so they are shortened.
    pub const ENTRY_BYTES: usize = 256;
    /// Bytes a whole shard's failure (path ".") keeps of its message, which says what to do.
    pub const SHARD_MESSAGE_BYTES: usize = 2048;
    /// The path of a failure of the whole shard rather than of one entry (what users read
    /// in the status: the tree's top).
    const WHOLE_SHARD: &'static str = ".";

    /// A failure as status carries it: path and message shortened to the bounds above
    /// (head and tail kept around "…").
    pub fn new(path: &str, reason: Reason, message: &str) -> Self {
        let message_bytes = if path == Self::WHOLE_SHARD {
            Self::SHARD_MESSAGE_BYTES
        } else {
            Self::ENTRY_BYTES
        };
        Self {
            path: shorten(path, Self::ENTRY_BYTES),
            reason,
            message: shorten(message, message_bytes),
        }
    }

    /// The whole shard failed (it stopped, or never started), for `reason`.
    pub fn whole_shard(reason: Reason, message: &str) -> Self {
        Self::new(Self::WHOLE_SHARD, reason, message)
    }

    /// A failure of the whole shard rather than of one entry.
    pub fn is_whole_shard(&self) -> bool {
        self.path == Self::WHOLE_SHARD
    }
}

/// `s` if it has at most `max` bytes, else its beginning and end around "…" in at most
/// `max` bytes, cut at character boundaries (the end of a path names the file, the start
/// where it is).
pub fn shorten(s: &str, max: usize) -> String {
    const MARK: &str = "…";
    if s.len() <= max {
        return s.to_string();
    }
    let room = max.saturating_sub(MARK.len());
    let mut head = room * 2 / 5;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - (room - head);
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}{MARK}{}", &s[..head], &s[tail..])
}

/// An empty string read as no value: the operator writes `sender: ""` for a copy on one
/// node (so that server-side apply clears a sender it set before).
fn empty_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    Ok(s.filter(|s| !s.is_empty()))
}

impl ShardProgress {
    /// The JSON patch an agent on `node` publishes this progress of `shard` (at `index` in
    /// the job's `status.shards`) with: first `test`s that the shard is still `node`'s at
    /// its epoch, so the API server refuses an agent that lost it (422) whatever it
    /// believes; then an `add` for every field this struct serialises (an unset option is
    /// left as the status has it). The field names come from the declarations above.
    pub fn fenced_patch(
        &self,
        index: usize,
        shard: &ShardStatus,
        node: &str,
    ) -> Result<serde_json::Value, serde_json::Error> {
        let serde_json::Value::Object(progress) = serde_json::to_value(self)? else {
            unreachable!("a struct serialises to an object")
        };
        Self::fenced(index, shard, node, progress)
    }

    /// A fenced patch of the shard at `index`: the `test`s that it is still `node`'s at its
    /// epoch, then an `add` of each of `fields`.
    fn fenced(
        index: usize,
        shard: &ShardStatus,
        node: &str,
        fields: serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Value, serde_json::Error> {
        let at = format!("/status/shards/{index}");
        let fence = ShardStatus {
            id: shard.id.clone(),
            node: node.to_string(),
            epoch: shard.epoch,
            ..Default::default()
        };
        let serde_json::Value::Object(fence) = serde_json::to_value(fence)? else {
            unreachable!("a struct serialises to an object")
        };
        let tests = fence
            .into_iter()
            .filter(|(k, _)| Self::FENCE.contains(&k.as_str()))
            .map(
                |(k, v)| serde_json::json!({"op": "test", "path": format!("{at}/{k}"), "value": v}),
            );
        let adds = fields.into_iter().map(
            |(k, v)| serde_json::json!({"op": "add", "path": format!("{at}/{k}"), "value": v}),
        );
        Ok(serde_json::Value::Array(tests.chain(adds).collect()))
    }

    /// The assignment fields a progress update is fenced by, as `ShardStatus` serialises
    /// them (a test checks each is one of its keys).
    const FENCE: [&'static str; 3] = ["id", "node", "epoch"];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_failures_a_status_can_hold_stay_well_under_the_object_size_limit() {
        // 65 shards (64 slices and the directories pass), each with its own failure and the
        // 20 entries an agent keeps, plus the job's 20: every path and message as long as a
        // tree allows (a path has no length limit; 64 KiB here).
        let path = "deep/".repeat(64 * 1024 / 5);
        let message = "x".repeat(64 * 1024);
        let shard: Vec<FailedPath> =
            std::iter::once(FailedPath::whole_shard(Reason::CannotStart, &message))
                .chain((0..20).map(|_| FailedPath::new(&path, Reason::IOError, &message)))
                .collect();
        let job: Vec<FailedPath> = (0..20)
            .map(|_| FailedPath::new(&path, Reason::IOError, &message))
            .collect();
        let bytes = 65 * serde_json::to_vec(&shard).map_or(0, |v| v.len())
            + serde_json::to_vec(&job).map_or(0, |v| v.len());
        assert!(
            bytes < 1024 * 1024,
            "{bytes} bytes of failures (limit 1.5 MiB for the object)"
        );
    }

    #[test]
    fn an_empty_or_missing_sender_is_a_copy_on_one_node() -> Result<(), serde_json::Error> {
        for json in [
            serde_json::json!({"id": "0", "sender": ""}),
            serde_json::json!({"id": "0"}),
            serde_json::json!({"id": "0", "sender": null}),
        ] {
            let s: ShardStatus = serde_json::from_value(json.clone())?;
            assert!(!s.between_nodes(), "{json}");
        }
        let s: ShardStatus = serde_json::from_value(serde_json::json!({"sender": "node-a"}))?;
        assert_eq!(s.sender.as_deref(), Some("node-a"));
        assert!(s.between_nodes());
        Ok(())
    }

    #[test]
    fn a_progress_patch_tests_the_assignment_and_sets_every_progress_field_and_nothing_else(
    ) -> Result<(), serde_json::Error> {
        let shard = ShardStatus {
            id: "3".into(),
            node: "node-a".into(),
            sender: Some("node-b".into()),
            epoch: 7,
            source_root: "/src".into(),
            ..Default::default()
        };
        let progress = ShardProgress {
            state: ShardState::Running,
            files_done: 5,
            planned_files: Some(9),
            failures: vec![FailedPath::whole_shard(Reason::CannotStart, "why")],
            ..Default::default()
        };
        let patch = progress.fenced_patch(2, &shard, "node-x")?;
        let ops = patch.as_array().expect("an array of operations");
        let tests: Vec<_> = ops.iter().filter(|o| o["op"] == "test").collect();
        assert_eq!(
            tests,
            [
                &serde_json::json!({"op": "test", "path": "/status/shards/2/epoch", "value": 7}),
                &serde_json::json!({"op": "test", "path": "/status/shards/2/id", "value": "3"}),
                &serde_json::json!({"op": "test", "path": "/status/shards/2/node", "value": "node-x"}),
            ]
        );
        // Applied to the shard as the status carries it, the adds give the same shard with
        // this progress: every field of the patch is a field of ShardStatus, and the
        // assignment is untouched.
        let mut doc =
            serde_json::json!({"status": {"shards": [{}, {}, serde_json::to_value(&shard)?]}});
        for op in ops.iter().filter(|o| o["op"] == "add") {
            let path = op["path"].as_str().expect("a path");
            let (parent, key) = path.rsplit_once('/').expect("a field");
            doc.pointer_mut(parent).expect("the shard")[key] = op["value"].clone();
        }
        let published: ShardStatus = serde_json::from_value(doc["status"]["shards"][2].clone())?;
        assert_eq!(published, ShardStatus { progress, ..shard });
        assert!(
            !published.progress.failures.is_empty()
                && published.progress.failures[0].is_whole_shard()
        );
        Ok(())
    }

    #[test]
    fn a_waiting_patch_is_fenced_and_sets_only_waiting_which_a_progress_update_clears(
    ) -> Result<(), serde_json::Error> {
        let shard = ShardStatus {
            id: "0".into(),
            node: "west-1".into(),
            epoch: 2,
            ..Default::default()
        };
        let waiting = Waiting::new(Reason::PeerUnreachable, &"x".repeat(10_000));
        assert!(waiting.message.len() <= FailedPath::SHARD_MESSAGE_BYTES);
        let patch = waiting.fenced_patch(0, &shard, "west-1")?;
        let ops = patch.as_array().expect("operations");
        assert_eq!(ops.iter().filter(|o| o["op"] == "test").count(), 3);
        let adds: Vec<_> = ops.iter().filter(|o| o["op"] == "add").collect();
        assert_eq!(adds.len(), 1);
        assert_eq!(adds[0]["path"], "/status/shards/0/waiting");
        assert_eq!(adds[0]["value"]["reason"], "PeerUnreachable");
        // Every progress update sets waiting back to nothing.
        let cleared = ShardProgress::default().fenced_patch(0, &shard, "west-1")?;
        assert!(cleared
            .as_array()
            .expect("operations")
            .iter()
            .any(|o| o["op"] == "add"
                && o["path"] == "/status/shards/0/waiting"
                && o["value"] == serde_json::json!({})));
        Ok(())
    }
}
