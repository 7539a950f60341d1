//! The Kubernetes resources (`CopyJob`, `StorageRoot`) and their status. Every field's doc
//! comment becomes its description in the CRD schema, and the `x_kube(validation)` rules
//! are enforced by the kube-apiserver at admission.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::{Compare, CopyMethod, FailedPath, Overwrite, Preserve, Reflink, ShardStatus, Verify};

/// A relative path inside a root or volume: never absolute, never `..`, never NUL.
/// (The same rules are checked again by the operator and by the agent at open time.)
pub(crate) const PATH_RULES: &str =
    "!self.startsWith('/') && !self.split('/').exists(c, c == '..') && !self.contains('\\u0000')";
/// Nor a path into Ferry's state directory at the top of a root or volume (`in_state_dir`).
pub(crate) const STATE_DIR_RULE: &str =
    "self.split('/').filter(c, c != '' && c != '.').size() == 0 || self.split('/').filter(c, c != '' && c != '.')[0] != '.ferry'";

/// Where data comes from or goes to: a `StorageRoot`, a `PersistentVolumeClaim` or (a source
/// only) a `VolumeSnapshot` in the job's namespace, plus a path inside it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.root), has(self.pvc), has(self.snapshot), has(self.export)].filter(x, x).size() == 1").message("set exactly one of root, pvc, snapshot or export"))]
#[x_kube(validation = Rule::new("!has(self.copyMethod) || self.copyMethod == 'Direct' || has(self.pvc)").message("copyMethod Snapshot snapshots a claim: it needs pvc"))]
#[x_kube(validation = Rule::new("!has(self.volumeSnapshotClassName) || (has(self.copyMethod) && self.copyMethod == 'Snapshot')").message("volumeSnapshotClassName is for copyMethod Snapshot"))]
pub struct Endpoint {
    /// Name of a cluster-scoped `StorageRoot` that this namespace may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub root: Option<String>,
    /// Name of a `PersistentVolumeClaim` in the job's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub pvc: Option<String>,
    /// Source only: name of a ready `VolumeSnapshot` in the job's own namespace. The operator
    /// restores it to a temporary claim, copies from that, and deletes the claim afterwards
    /// (the snapshot is yours and stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub snapshot: Option<String>,
    /// Source only: the name of an export Secret (type `ferry.dev/export`) in the job's
    /// namespace, carried from another cluster where a `CopyExport` wrote it: the job
    /// reads that export (`path` is beneath it) from that cluster's agents over mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub export: Option<String>,
    /// How a source claim is read (the schema shows [`CopyMethod`]'s description).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_method: Option<CopyMethod>,
    /// With copyMethod Snapshot: the `VolumeSnapshotClass` to take it with (default: the
    /// class the cluster marks default for the claim's CSI driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub volume_snapshot_class_name: Option<String>,
    /// Path inside the root or volume, relative ("" or "." for all of it). Absolute paths,
    /// `..` components and NUL bytes are refused, and so is `.ferry` (Ferry's state directory)
    /// or anything in it.
    #[serde(default)]
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new(PATH_RULES).message("path must be relative, without '..' components or NUL bytes"))]
    #[x_kube(validation = Rule::new(STATE_DIR_RULE).message("path cannot be in .ferry, the directory where Ferry keeps its state at the top of every root and volume; choose another path"))]
    pub path: String,
}

/// How much of the cluster a job may use at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Parallelism {
    /// Copy workers per agent, at most 64 (0: the agent's default, 16 or the node's CPU count
    /// if more, at most 64; a worker waits in every read of uncached data, so a cold copy
    /// wants more reads in flight than there are CPUs; of the default, only as many as CPUs
    /// run while the copy reads nothing from the disk). Each holds a 1 MiB buffer.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 64").message("workersPerAgent must be between 0 and 64"))]
    pub workers_per_agent: i32,
    /// Agents that may share the work when both sides are shared (`shared: true`) roots.
    #[serde(default = "one")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 64").message("maxAgents must be between 1 and 64"))]
    pub max_agents: i32,
}

fn one() -> i32 {
    1
}

impl Default for Parallelism {
    fn default() -> Self {
        Self {
            workers_per_agent: 0,
            max_agents: 1,
        }
    }
}

// The cost bounds of a pattern list (crate::filter's MAX_LIST_BYTES and MAX_WILDCARDS),
// at admission; the controller checks the same before it compiles anything.
pub(crate) const PATTERN_BYTES_RULE: &str = "self.map(p, size(p)).sum() <= 16384";
pub(crate) const PATTERN_BYTES_MESSAGE: &str = "the patterns of a list may have at most 16384 bytes in all: use fewer or shorter patterns (a directory pattern such as cache/ covers everything beneath it)";
pub(crate) const PATTERN_WILDCARDS_RULE: &str =
    "self.map(p, size(p.findAll('[*?\\\\[]'))).sum() <= 1024";
pub(crate) const PATTERN_WILDCARDS_MESSAGE: &str = "the patterns of a list may have at most 1024 wildcards (*, ? and [, escaped or not) in all: each costs memory to compile, so use fewer";

/// A copy of one tree (or file) from `source` to `destination`, carried out by Ferry's
/// node agents.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "CopyJob",
    plural = "copyjobs",
    // Not "cj": that is CronJob's built-in short name, and kubectl resolves it there.
    shortname = "cpj",
    namespaced,
    status = "CopyJobStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.percent"}"#,
    printcolumn = r#"{"name":"Rate","type":"string","jsonPath":".status.progress.rate"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".status.mode","priority":1}"#,
    printcolumn = r#"{"name":"ETA","type":"string","jsonPath":".status.progress.eta"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new(
        "!has(oldSelf.status) || ((!has(oldSelf.status.phase) || oldSelf.status.phase == 'Pending') && (!has(oldSelf.status.shards) || size(oldSelf.status.shards) == 0)) || \
         (has(self.spec.source) == has(oldSelf.spec.source) && (!has(self.spec.source) || self.spec.source == oldSelf.spec.source) && \
          has(self.spec.check) == has(oldSelf.spec.check) && (!has(self.spec.check) || self.spec.check == oldSelf.spec.check) && \
          self.spec.destination == oldSelf.spec.destination && \
          self.spec.reflink == oldSelf.spec.reflink && self.spec.verify == oldSelf.spec.verify && \
          self.spec.overwrite == oldSelf.spec.overwrite && self.spec.compare == oldSelf.spec.compare && self.spec.preserve == oldSelf.spec.preserve && \
          self.spec.include == oldSelf.spec.include && self.spec.exclude == oldSelf.spec.exclude && \
          self.spec.deleteExtraneous == oldSelf.spec.deleteExtraneous && self.spec.deleteExcluded == oldSelf.spec.deleteExcluded && \
          self.spec.dryRun == oldSelf.spec.dryRun && self.spec.transfer == oldSelf.spec.transfer)"
    ).message("a started CopyJob's spec (one with shards, or past Pending) cannot change except suspend, parallelism and ttlSecondsAfterFinished; create a new CopyJob instead"),
    validation = Rule::new("has(self.spec.source) != has(self.spec.check)").message("set spec.source (what to copy), or spec.check to check spec.destination against an earlier job's manifest; one of the two, not both"),
    validation = Rule::new("!has(self.spec.destination.export)").message("spec.destination cannot be an export: an export is read from another cluster; copy into a root or claim of this one"),
)]
#[serde(rename_all = "camelCase")]
pub struct CopyJobSpec {
    /// What to copy. Unset only with `check`, which copies nothing.
    #[serde(default, skip_serializing_if = "Endpoint::is_unset")]
    pub source: Endpoint,
    /// Copy nothing: check `destination` against the manifest an earlier job wrote there
    /// (`kubectl ferry verify`). Every file the manifest lists is opened beneath the
    /// destination path (no symlink on the way, nothing but a regular file read) and its
    /// bytes hashed with xxHash3-128; the job Succeeds (Complete, Verified) when all match,
    /// and Fails (Differs) naming the first files that changed (ChecksumMismatch), are
    /// missing (NotFound) or are no longer regular files (DestinationConflict). Only
    /// `destination`, `parallelism.workersPerAgent`, `suspend` (a resumed check starts
    /// over) and `ttlSecondsAfterFinished` apply; the copy's other fields are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// Where to copy it. A missing path becomes a copy of the source; an existing directory
    /// gets the source's contents merged into it under `overwrite`. A root or a pvc.
    #[x_kube(validation = Rule::new("!has(self.snapshot) && !has(self.copyMethod) && !has(self.volumeSnapshotClassName)").message("a destination is a root or a pvc: snapshot, copyMethod and volumeSnapshotClassName are for the source"))]
    pub destination: Endpoint,
    /// Reflink policy.
    #[serde(default)]
    pub reflink: Reflink,
    /// Verification policy; the checksum manifest is written to `.ferry/` on the destination.
    #[serde(default)]
    pub verify: Verify,
    /// What to do with entries the destination already has.
    #[serde(default)]
    pub overwrite: Overwrite,
    /// How overwrite IfChanged tells a changed file: SizeAndTime (the default: reads no
    /// data) or Checksum (reads files of equal size on both sides; only with IfChanged).
    #[serde(default)]
    pub compare: Compare,
    /// Metadata to keep.
    #[serde(default)]
    pub preserve: Preserve,
    /// Copy only files, symlinks and special files that match one of these patterns, or
    /// whose parent directory does (gitignore syntax, relative to the source path: `*.csv`
    /// at any depth, `/top.txt` anchored, `data/**/*.bin`, `keep/` for a directory).
    /// Directories are walked and made whatever this says. Empty: everything. At most 256
    /// patterns of at most 4096 bytes each, 16384 bytes and 1024 wildcards (`*`, `?`, `[`)
    /// in all: what compiling them costs the operator is bounded, not only their size.
    #[serde(default)]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    #[x_kube(validation = Rule::new(PATTERN_BYTES_RULE).message(PATTERN_BYTES_MESSAGE))]
    #[x_kube(validation = Rule::new(PATTERN_WILDCARDS_RULE).message(PATTERN_WILDCARDS_MESSAGE))]
    pub include: Vec<String>,
    /// Skip what matches one of these patterns (gitignore syntax, relative to the source
    /// path; `cache/` a directory, `*.tmp` at any depth, `!keep.tmp` takes an earlier one
    /// back); a matching directory is not entered. Wins over include. At most 256 patterns
    /// of at most 4096 bytes each, 16384 bytes and 1024 wildcards (`*`, `?`, `[`) in all.
    #[serde(default)]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    #[x_kube(validation = Rule::new(PATTERN_BYTES_RULE).message(PATTERN_BYTES_MESSAGE))]
    #[x_kube(validation = Rule::new(PATTERN_WILDCARDS_RULE).message(PATTERN_WILDCARDS_MESSAGE))]
    pub exclude: Vec<String>,
    /// Mirror: after a copy without failures, remove from the destination path what the
    /// source path lacks (rsync's `--delete-after`). Only beneath the destination path,
    /// never through a symlink (a link is removed as a link), never `.ferry/` or a staging
    /// name `.ferry-*.tmp`, never what include/exclude leave out (unless deleteExcluded).
    /// A dry run lists what it would remove.
    #[serde(default)]
    pub delete_extraneous: bool,
    /// With deleteExtraneous: also remove what include/exclude leave out, even where the
    /// source has it (rsync's `--delete-excluded`).
    #[serde(default)]
    pub delete_excluded: bool,
    /// Workers and agents.
    #[serde(default)]
    pub parallelism: Parallelism,
    /// While true, no new work starts; running shards stop at the next file boundary.
    #[serde(default)]
    pub suspend: bool,
    /// Delete the job this many seconds after it finished (unset: keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("ttlSecondsAfterFinished cannot be negative"))]
    pub ttl_seconds_after_finished: Option<i64>,
    /// Plan only: fill status.plan (files, bytes, nodes, shards) and copy nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// How data crosses the network when the source and the destination are on different
    /// nodes (status.mode `Network`); a copy on one node ignores it.
    #[serde(default)]
    pub transfer: Transfer,
}

/// What a check job (`spec.check`) reads the destination against.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// The manifest, as the job that wrote it names it in `status.manifest`:
    /// `.ferry/<job uid>.xxh128`, in the destination's root or volume. Its paths are
    /// relative to `destination.path`, so give the destination that job had.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new(MANIFEST_RULE).message("check.manifest is a job's status.manifest: .ferry/<job uid>.xxh128"))]
    pub manifest: String,
}

/// A job's `status.manifest`: `.ferry/` and a uid's 36 lowercase characters.
const MANIFEST_RULE: &str =
    "self.matches('^[.]ferry/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}[.]xxh128$')";

impl Check {
    /// The manifest's file name in `.ferry/`, when `manifest` is what `status.manifest`
    /// says (the schema's rule again, for specs that did not pass through it).
    pub fn file_name(&self) -> Option<&str> {
        let name = self.manifest.strip_prefix(".ferry/")?;
        let uid = name.strip_suffix(".xxh128")?;
        let shape = uid.split('-').map(str::len).eq([8, 4, 4, 4, 12]);
        let hex = uid
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (shape && hex).then_some(name)
    }
}

impl Endpoint {
    /// No root, claim or snapshot named, and no path: a check job's absent source.
    pub fn is_unset(&self) -> bool {
        self == &Endpoint::default()
    }
}

wire_enum! {
    /// Compression of file data sent between nodes.
    #[derive(Default)]
    pub enum Compression {
        /// Sent as it is: the fastest when the network is not the bottleneck.
        #[default]
        None,
        /// zstd (level 1), per chunk: fewer bytes on a slow link for data that compresses.
        Zstd,
    }
}

/// How a copy between nodes uses the network.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Transfer {
    /// None (the default) or Zstd.
    #[serde(default)]
    pub compression: Compression,
    /// At most this many file bytes a second leave the sender for this job, as a quantity
    /// (`200Mi`: 200 MiB/s; `1G`: 10^9 B/s; at least 1Mi). Unset: as fast as the disks and
    /// the network go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).compareTo(quantity('1Mi')) >= 0").message("bandwidthLimit must be a quantity of bytes per second of at least 1Mi, e.g. 200Mi"))]
    pub bandwidth_limit: Option<String>,
}

/// A byte rate given as a Kubernetes quantity (`200Mi`, `1.5G`, `1048576`): bytes a second,
/// or why not. Binary (Ki..Ei) and decimal (k, M..E) suffixes; no milli, no exponents.
pub fn parse_rate(q: &str) -> Result<u64, String> {
    let bad = || format!("{q:?} is not a quantity of bytes per second, e.g. 200Mi or 1G");
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let scale: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return Err(bad()),
    };
    if num.is_empty() || num.starts_with('.') || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let v = whole.checked_mul(scale).ok_or_else(bad)?;
    // The fraction as one ratio, so that `1.5Gi` is exact (rounded down below a byte).
    if frac.len() > 18 {
        return Err(bad());
    }
    let digits: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| bad())?
    };
    let part = digits * u128::from(scale) / 10u128.pow(frac.len() as u32);
    v.checked_add(part as u64).ok_or_else(bad)
}

wire_enum! {
    /// How a job's data moves.
    pub enum CopyMode {
        /// On one node, from volume to volume (reflink and copy_file_range where they apply).
        Local,
        /// From the agent on the source's node to the agent on the destination's node, over
        /// the agents' mutually authenticated transfer port.
        Network,
    }
}

/// Where a job is in its life.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum Phase {
    /// Accepted or waiting for validation, resolution or an agent.
    #[default]
    Pending,
    /// Agents are copying.
    Running,
    /// Suspended by the user.
    Suspended,
    /// Every file copied (and verified, if asked).
    Succeeded,
    /// Finished with failures; see conditions and status.failures.
    Failed,
}

/// Aggregated progress of all shards.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Files committed (copied by this job; a suspended or interrupted run's files count
    /// once it has checked them).
    pub files_done: i64,
    /// Entries left as the destination had them, by the overwrite policy: not copied and
    /// not verified by this job.
    #[serde(default)]
    pub skipped: i64,
    /// Entries removed from the destination (deleteExtraneous).
    #[serde(default)]
    pub deleted: i64,
    /// Files kept by the quick check (overwrite IfChanged) that the manifest does not list:
    /// no record on the node says Ferry wrote them as they are (another tool wrote them, or
    /// they changed since). `compare: Checksum` reads them and lists them.
    #[serde(default)]
    pub unlisted: i64,
    /// Files of `filesDone` from another node that the destination had at the same size
    /// with a few chunks different (`compare: Checksum`): mended from the destination's
    /// own copy and only the chunks whose hashes differ, then verified whole.
    #[serde(default)]
    pub patched: i64,
    /// Files in the plan, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_total: Option<i64>,
    /// Bytes committed.
    pub bytes_done: i64,
    /// Bytes in the plan, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<i64>,
    /// Bytes shared by reflink rather than copied.
    pub bytes_reflinked: i64,
    /// Bytes copied (copy_file_range or read/write).
    pub bytes_copied: i64,
    /// Recent throughput in bytes per second.
    pub bytes_per_second: i64,
    /// Human-readable percentage for the PROGRESS column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<String>,
    /// Human-readable rate for the RATE column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Human-readable estimate of the time left, for the ETA column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
}

/// What a dry run found.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Regular files to copy.
    pub files: i64,
    /// Their total size.
    pub bytes: i64,
    /// Nodes that would run it (a copy between nodes: the source's node, then the
    /// destination's).
    pub nodes: Vec<String>,
    /// Local, or Network (between two nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<CopyMode>,
    /// Shards it would be cut into.
    pub shards: i64,
    /// With deleteExtraneous: entries the mirror would remove from the destination.
    #[serde(default)]
    pub deletions: i64,
    /// With deleteExtraneous: the first 20 paths it would remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to_delete: Vec<String>,
}

/// The Secret, in Ferry's namespace, that holds the tickets of a job's shards copied between
/// nodes (`ferry-ticket-<job uid>`): written by the operator before it assigns a pair, read
/// by the two agents, deleted when the job finishes or goes. No tenant can read it, and a
/// CopyJob's status (which an agent can write) never carries a ticket nor decides a pairing.
pub fn ticket_secret(job_uid: &str) -> String {
    format!("ferry-ticket-{job_uid}")
}

/// One shard's entry in its job's ticket Secret (key: the shard's id; value: this, as JSON):
/// the only pairing a sender serves. A receiver presents `ticket` in its hello; the sender
/// serves the shard only to `receiver`'s certificate, at `epoch`, with that ticket, and only
/// if it is itself `sender`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub epoch: i64,
    pub sender: String,
    pub receiver: String,
    /// 32 random bytes, as 64 lowercase hex digits.
    pub ticket: String,
    /// A shard read from another install's export ([`EXPORT_SENDER`]): what the receiver
    /// dials and says, from the export Secret the operator read for the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportTicket>,
}

/// The sender of a shard read from another install's export: no node of this cluster (a
/// node name cannot hold parentheses).
pub const EXPORT_SENDER: &str = "(export)";

/// What a receiver needs to read an export, copied by the operator from the job's export
/// Secret into its ticket (agents read no tenant's Secret).
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExportTicket {
    /// The export's `host:port`.
    pub address: String,
    /// The source install's name; its agents' certificates must name it.
    pub install: String,
    /// Its peering CA certificate (PEM): the server must chain to it.
    pub ca: String,
    /// The export's uid.
    pub export: String,
    /// The credential, as 64 lowercase hex digits.
    pub credential: String,
}

impl std::fmt::Debug for ExportTicket {
    // Never the credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportTicket")
            .field("address", &self.address)
            .field("install", &self.install)
            .field("export", &self.export)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    pub fn new(epoch: i64, sender: &str, receiver: &str, ticket: [u8; 32]) -> Self {
        Self {
            epoch,
            sender: sender.into(),
            receiver: receiver.into(),
            ticket: hex32(&ticket),
            export: None,
        }
    }

    /// The ticket's bytes; `None` unless it is exactly 64 hex digits.
    pub fn bytes(&self) -> Option<[u8; 32]> {
        unhex32(&self.ticket)
    }
}

/// 32 bytes as 64 lowercase hex digits.
pub fn hex32(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 hex digits as 32 bytes; `None` unless it is exactly that.
pub fn unhex32(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(hex.chunks(2)) {
        let s = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

impl Ticket {}

/// Observed state of a CopyJob.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyJobStatus {
    /// Summary phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Standard conditions, by type and the reasons each has. Accepted: Valid, or False
    /// with InvalidEndpoint, InvalidSpec, PathEscape, CrossNamespace, RootNotAllowed,
    /// ReadOnlyRoot, and between raw block claims VolumeModeMismatch, DestinationTooSmall,
    /// NotForBlock. Resolved: Resolved, or False with PVCNotFound, PVCNotBound,
    /// VolumeNotMounted, VolumeInUse, VolumeNotSupported, RootNotFound, SnapshotNotFound,
    /// SnapshotNotReady, and reading another cluster's export ExportNotFound,
    /// PeerNotTrusted, ExportRefused. Scheduled: Assigned, WaitingForNode, PeerUnreachable
    /// (the export's agent cannot be reached; the agent keeps trying), or False with NoAgent. Complete: Copied, Planned (a dry run), or Verified (a
    /// check: every file its manifest lists matched). Failed: Differs (a check found files
    /// changed, missing or of another type), else the
    /// first reason that stopped a shard (SpecChanged, DestinationFull, DestinationTooSmall,
    /// NodeUnavailable, PathEscape,
    /// SymlinkRejected, Openat2Unavailable, CannotStart), else IOError, else
    /// PartiallyFailed. Events carry the same reasons, and Reassigned when a lost agent's
    /// shard moves to another.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Local (on one node) or Network (from the source's node to the destination's), once
    /// scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<CopyMode>,
    /// Aggregated progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Per-shard state, one entry per shard, each owned by its agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "shards_schema")]
    pub shards: Vec<ShardStatus>,
    /// The first failures (at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailedPath>,
    /// Where the checksum manifest was written (relative to the destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Result of a dry run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// When the job reached Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

fn conditions_schema(gen: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = gen.subschema_for::<Vec<Condition>>();
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    s
}

fn shards_schema(gen: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = gen.subschema_for::<Vec<ShardStatus>>();
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["id"]),
    );
    s
}

/// Which namespaces may use a StorageRoot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceAccess {
    /// These namespaces, by name.
    #[serde(default)]
    pub names: Vec<String>,
    /// Namespaces whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// A host directory tree that Ferry's agents may read or write, set up by a cluster admin.
/// Tenants name roots; they never name host paths.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "StorageRoot",
    plural = "storageroots",
    shortname = "sr",
    printcolumn = r#"{"name":"Path","type":"string","jsonPath":".spec.path"}"#,
    printcolumn = r#"{"name":"Shared","type":"boolean","jsonPath":".spec.shared"}"#,
    printcolumn = r#"{"name":"ReadOnly","type":"boolean","jsonPath":".spec.readOnly"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.spec.shared || has(self.spec.nodeSelector)").message("set nodeSelector (which nodes have this path) or shared: true")
)]
#[serde(rename_all = "camelCase")]
pub struct StorageRootSpec {
    /// Absolute path on the host.
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.split('/').exists(c, c == '..')").message("path must be absolute, without '..' components"))]
    pub path: String,
    /// Labels of the nodes that have this path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// The same filesystem is mounted at `path` on every matching node (e.g. NFS), so work
    /// on it can be split across agents.
    #[serde(default)]
    pub shared: bool,
    /// Namespaces allowed to use this root.
    #[serde(default)]
    pub namespaces: NamespaceAccess,
    /// Never a destination.
    #[serde(default)]
    pub read_only: bool,
    /// As a destination, keep a source's privileged files: device nodes (made with mknod),
    /// the setuid and setgid bits of files, and file capabilities (the
    /// `security.capability` attribute). Default false: they are dropped, because each
    /// lets whoever wrote the source act with privileges wherever this root is mounted (a
    /// device node opens the node's hardware; a setuid or capable program runs with them):
    /// a device node is not made (that entry fails with PermissionDenied, saying so),
    /// setuid and setgid bits are cleared (a directory keeps its setgid bit), capabilities
    /// are not copied. A job whose destination is a claim keeps them only when its source
    /// is its own claim or snapshot (they are the tenant's files already). Even kept,
    /// setuid/setgid bits and capabilities are dropped from a copy whose owner could not
    /// be kept, as GNU cp does.
    #[serde(default)]
    pub allow_privileged_files: bool,
}

impl CopyJobSpec {
    /// Whether this job's copy keeps a source's privileged files (device nodes,
    /// setuid/setgid bits, file capabilities): into a root, when its StorageRoot
    /// (`dst_root`, the destination's, if the destination is a root) allows them; into a
    /// claim, only from the job's own claim or snapshot, whose files the tenant has already.
    pub fn keeps_privileged_files(&self, dst_root: Option<&StorageRootSpec>) -> bool {
        match (&self.destination.root, dst_root) {
            (Some(_), Some(root)) => root.allow_privileged_files,
            // A root that could not be read allows nothing.
            (Some(_), None) => false,
            (None, _) => self.source.root.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;
    use crate::{shorten, Reason, ShardState};

    fn descriptions(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("description", serde_json::Value::String(d)) => {
                            out.push_str(d);
                            out.push('\n');
                        }
                        _ => descriptions(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| descriptions(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_reason_is_explained_in_the_crd_schema() {
        let crd = serde_json::to_value(CopyJob::crd()).expect("serialize the CRD");
        let mut text = String::new();
        descriptions(&crd, &mut text);
        let words: std::collections::BTreeSet<&str> =
            text.split(|c: char| !c.is_ascii_alphanumeric()).collect();
        let missing: Vec<&str> = Reason::ALL
            .iter()
            .map(|r| r.as_str())
            .filter(|r| !words.contains(r))
            .collect();
        assert!(missing.is_empty(), "not described in the CRD: {missing:?}");
    }

    #[test]
    fn the_crd_lists_every_shard_state_and_condition_type() {
        let crd = serde_json::to_string(&CopyJob::crd()).expect("serialize the CRD");
        for s in [
            ShardState::Pending,
            ShardState::Running,
            ShardState::Suspended,
            ShardState::Stopped,
            ShardState::Succeeded,
            ShardState::Failed,
        ] {
            assert!(crd.contains(&format!("\"{s}\"")), "{s}");
        }
        for t in crate::ConditionType::ALL {
            assert!(crd.contains(t.as_str()), "{t}");
        }
    }

    #[test]
    fn privileged_files_are_kept_only_where_a_root_allows_them_or_a_claim_copies_its_own() {
        let spec = |src: Endpoint, dst: Endpoint| -> CopyJobSpec {
            serde_json::from_value(serde_json::json!({
                "source": src,
                "destination": dst,
            }))
            .expect("a spec")
        };
        let root = |n: &str| Endpoint {
            root: Some(n.into()),
            ..Endpoint::default()
        };
        let pvc = |n: &str| Endpoint {
            pvc: Some(n.into()),
            ..Endpoint::default()
        };
        let snapshot = Endpoint {
            snapshot: Some("snap".into()),
            ..Endpoint::default()
        };
        let mut allows: StorageRootSpec =
            serde_json::from_value(serde_json::json!({"path": "/data", "shared": true}))
                .expect("a root");
        let denies = allows.clone();
        allows.allow_privileged_files = true;
        // Into a root: as the root says, whatever the source.
        for src in [root("a"), pvc("c"), snapshot.clone()] {
            let job = spec(src, root("b"));
            assert!(job.keeps_privileged_files(Some(&allows)));
            assert!(!job.keeps_privileged_files(Some(&denies)));
            assert!(!job.keeps_privileged_files(None));
        }
        // Into a claim: only from the job's own claim or snapshot.
        assert!(spec(pvc("c"), pvc("d")).keeps_privileged_files(None));
        assert!(spec(snapshot, pvc("d")).keeps_privileged_files(None));
        assert!(!spec(root("a"), pvc("d")).keeps_privileged_files(Some(&allows)));
        // The name messages give the field is its JSON name, and it defaults to false.
        let json = serde_json::to_value(&denies).expect("serialize");
        let field = crate::ALLOW_PRIVILEGED_FILES
            .strip_prefix("spec.")
            .and_then(|f| f.strip_suffix(": true"))
            .expect("spec.<field>: true");
        assert_eq!(json[field], serde_json::json!(false));
    }

    #[test]
    fn shorten_keeps_head_and_tail_within_the_bound_at_character_boundaries() {
        assert_eq!(shorten("a/b", 10), "a/b");
        let long = format!("top/{}/file.txt", "é".repeat(5000));
        let short = shorten(&long, 256);
        assert!(short.len() <= 256, "{} bytes", short.len());
        assert!(short.starts_with("top/") && short.ends_with("/file.txt") && short.contains('…'));
    }
}
