//! The `VolumeSource` resource: the data a new claim is populated with. A
//! `PersistentVolumeClaim` whose `spec.dataSourceRef` names a VolumeSource of its own
//! namespace is bound only once a CopyJob from that source has filled and verified a volume
//! for it (the operator's `populator` module runs it, as Kubernetes' volume populators do),
//! and the names it gives what it makes: the prime claim, the CopyJob, their labels, the
//! events on the user's claim.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::api::{
    PATTERN_BYTES_MESSAGE, PATTERN_BYTES_RULE, PATTERN_WILDCARDS_MESSAGE, PATTERN_WILDCARDS_RULE,
};
use crate::{Endpoint, Parallelism, Preserve, Reflink, Transfer, Verify};

/// Label on a prime claim and on the CopyJob that fills it: the uid of the user's claim.
pub const POPULATE_FOR: &str = "ferry.dev/populate-for";
/// Label on the CopyJob that fills a prime claim: the name of the VolumeSource it copies.
pub const VOLUME_SOURCE_LABEL: &str = "ferry.dev/volume-source";
/// Annotation on that CopyJob: the VolumeSource's `metadata.generation` it was made from (a
/// failed population is tried again once the source changes).
pub const SOURCE_GENERATION_ANNOTATION: &str = "ferry.dev/volume-source-generation";
/// The annotation the scheduler puts on a `WaitForFirstConsumer` claim once a pod that uses
/// it has a node; copied to the prime claim so the volume is made where that pod runs.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// Most claims a VolumeSource's status lists (the newest); the rest are counted.
pub const MAX_LISTED_CLAIMS: usize = 32;

/// The prime claim of the user's claim with uid `uid`: the claim the operator provisions and
/// fills in its place, whose volume is then bound to the user's claim.
pub fn prime_claim_name(uid: &str) -> String {
    format!("ferry-prime-{uid}")
}

/// The CopyJob that fills the prime claim of the claim with uid `uid`.
pub fn populate_job_name(uid: &str) -> String {
    format!("ferry-populate-{uid}")
}

wire_enum! {
    /// Reasons of the events on a claim being populated, and of its entry in the
    /// VolumeSource's status.
    pub enum PopulateReason {
        /// The claim waits for a pod that uses it to be scheduled (WaitForFirstConsumer).
        WaitingForConsumer,
        /// The claim names a VolumeSource that does not exist (yet) in its namespace.
        VolumeSourceNotFound,
        /// The claim's dataSourceRef names another namespace: only sources of the claim's
        /// own namespace populate it.
        CrossNamespace,
        /// The claim cannot be populated as it is (no storage class, no size, a name Ferry
        /// needs taken by another object); the message says what to change.
        InvalidClaim,
        /// The prime claim and the CopyJob that fills it were made.
        Populating,
        /// The CopyJob failed; the message has its reason. It is tried again when the
        /// VolumeSource changes, or when the CopyJob is deleted.
        PopulateFailed,
        /// The copy was verified and its volume handed to the claim.
        Populated,
    }
}

/// Where a claim is in its population.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum PopulatePhase {
    /// Waiting: for a consumer, for the source, or for the CopyJob to start.
    #[default]
    Pending,
    /// The CopyJob is copying into the prime claim.
    Populating,
    /// The copy failed (see message); the claim stays unbound.
    Failed,
    /// The verified volume was handed to the claim.
    Populated,
}

/// Data a new claim is populated with: a claim whose `spec.dataSourceRef` is `{apiGroup:
/// ferry.dev, kind: VolumeSource, name: <this>}` in this namespace is bound only once it
/// holds a verified copy of `source` (a CopyJob into a claim provisioned like it, whose
/// volume is then bound to it). Many claims may name one VolumeSource.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "VolumeSource",
    plural = "volumesources",
    shortname = "vsrc",
    namespaced,
    status = "VolumeSourceStatus",
    printcolumn = r#"{"name":"Populating","type":"integer","jsonPath":".status.populating"}"#,
    printcolumn = r#"{"name":"Populated","type":"integer","jsonPath":".status.populated"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.failed"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    // The CopyJobs that fill claims from it carry its name as a label value.
    validation = Rule::new("self.metadata.name.size() <= 63").message("a VolumeSource's name has at most 63 characters (the CopyJobs that populate claims from it are labelled with it)"),
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSourceSpec {
    /// Where the data comes from, as a CopyJob's source says it: a claim (`pvc`, with
    /// `copyMethod`), a `snapshot`, or a `root`, each with a `path` inside it; of this
    /// namespace only. Its contents become the top of the new volume.
    #[x_kube(validation = Rule::new("!has(self.export)").message("a VolumeSource reads a root, claim or snapshot of this cluster; another cluster's export is read by a CopyJob"))]
    pub source: Endpoint,
    /// Reflink policy of the copy.
    #[serde(default)]
    pub reflink: Reflink,
    /// Verification of the copy: Checksum (the default) or Full. A claim is bound only to a
    /// verified copy, so None is refused.
    #[serde(default = "checksum")]
    #[x_kube(validation = Rule::new("self != 'None'").message("a populated claim is bound only to a verified copy: verify must be Checksum or Full"))]
    pub verify: Verify,
    /// Metadata to keep.
    #[serde(default)]
    pub preserve: Preserve,
    /// Copy only what matches (as a CopyJob's include).
    #[serde(default)]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    #[x_kube(validation = Rule::new(PATTERN_BYTES_RULE).message(PATTERN_BYTES_MESSAGE))]
    #[x_kube(validation = Rule::new(PATTERN_WILDCARDS_RULE).message(PATTERN_WILDCARDS_MESSAGE))]
    pub include: Vec<String>,
    /// Skip what matches (as a CopyJob's exclude).
    #[serde(default)]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    #[x_kube(validation = Rule::new(PATTERN_BYTES_RULE).message(PATTERN_BYTES_MESSAGE))]
    #[x_kube(validation = Rule::new(PATTERN_WILDCARDS_RULE).message(PATTERN_WILDCARDS_MESSAGE))]
    pub exclude: Vec<String>,
    /// Workers and agents of the copy.
    #[serde(default)]
    pub parallelism: Parallelism,
    /// How data crosses the network when the source and the new volume are on different
    /// nodes.
    #[serde(default)]
    pub transfer: Transfer,
}

fn checksum() -> Verify {
    Verify::Checksum
}

/// One claim populated (or being populated) from a VolumeSource.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PopulatedClaim {
    /// The claim's name.
    pub name: String,
    /// Where it is.
    pub phase: PopulatePhase,
    /// Why.
    pub reason: PopulateReason,
    /// What happens next, or what to change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The CopyJob that fills it, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_job: Option<String>,
    /// The copy's progress, as its CopyJob's PROGRESS column says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<String>,
    /// When its volume was handed to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub populated_at: Option<Time>,
}

/// Observed state of a VolumeSource: the claims that name it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSourceStatus {
    /// Claims of this namespace that name this source and are not populated yet, or were
    /// populated from it (at most 32, the newest first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<PopulatedClaim>,
    /// Claims being populated now.
    #[serde(default)]
    pub populating: i32,
    /// Claims populated from this source that still exist.
    #[serde(default)]
    pub populated: i32,
    /// Claims whose population failed.
    #[serde(default)]
    pub failed: i32,
}
