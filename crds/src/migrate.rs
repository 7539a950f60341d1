//! The `ClaimMigration` resource: a claim moved to another StorageClass (or node) keeping
//! its name (the operator's `migrate` module runs it): a live copy while the claim's users
//! run, the users scaled to zero, a final sync, the swap that gives the claim's name a
//! claim bound to the new volume, the users scaled back. Also the names it gives what it
//! makes (the new claim, the two CopyJobs, their label) and its steps and reasons.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::Parallelism;

/// Label on what a migration makes (its new claim, its CopyJobs, and the claim that takes
/// the original name): the ClaimMigration's uid.
pub const MIGRATION_LABEL: &str = "ferry.dev/migration";
/// The finalizer that keeps a ClaimMigration until its users are running again (on the old
/// claim if it is deleted before the swap, on the new volume after).
pub const MIGRATION_FINALIZER: &str = "ferry.dev/migration";
/// Label a user puts on a hook's Job: the name of the ClaimMigration that may start it. The
/// operator starts (unsuspends) only a Job that carries it, and the `-migrations` admission
/// policy holds the operator to exactly that change on Jobs that carry it.
pub const HOOK_LABEL: &str = "ferry.dev/hook-for";
/// Most users (Deployments and StatefulSets) a migration scales.
pub const MAX_MIGRATION_USERS: usize = 16;

/// The claim a migration with uid `uid` provisions in the target class and copies into;
/// its volume is then given to a claim of the original name.
pub fn migration_claim_name(uid: &str) -> String {
    format!("ferry-migrate-{uid}")
}

/// The live copy of a migration (the users run), into [`migration_claim_name`].
pub fn migration_copy_name(uid: &str) -> String {
    format!("ferry-migrate-{uid}")
}

/// The final sync of a migration (the users at zero): what changed since the live copy,
/// by checksum, and what was deleted.
pub fn migration_sync_name(uid: &str) -> String {
    format!("ferry-migrate-final-{uid}")
}

wire_enum! {
    /// Where a migration is. Each step is written to the status before it is taken, so an
    /// operator restarted at any point resumes it, or rolls it back.
    pub enum MigrationStep {
        /// The claim, the target class and the claim's users are checked.
        Checking,
        /// The live copy into the new claim; the users run.
        Copying,
        /// The users are scaled to zero; waiting until no pod has the claim.
        Quiescing,
        /// A hook (`status.hook` says which) runs: the user's suspended Job, started by the
        /// operator, is waited for, within its `timeoutSeconds`.
        RunningHook,
        /// The final sync (checksums, deleted files removed); the users are at zero.
        FinalSync,
        /// The swap: both volumes Retain, the old claim deleted, a claim of the same name
        /// made for the new volume. Once begun it is finished, never undone.
        Swapping,
        /// The users are scaled back to their recorded counts, on the new volume.
        Resuming,
        /// Done: the claim is on the new volume; the old volume is kept (Retain).
        Succeeded,
        /// A step before the swap failed: the users are scaled back, on the old claim.
        RollingBack,
        /// Refused or rolled back: the users run on the old claim, untouched.
        Failed,
    }
}

wire_enum! {
    /// Why a migration is where it is: the reason of its `status.reason`, and of its events.
    pub enum MigrationReason {
        /// The steps are going as they should.
        Migrating,
        /// The claim does not exist in the migration's namespace.
        ClaimNotFound,
        /// The claim is not bound to a volume yet: there is nothing to move.
        ClaimNotBound,
        /// The claim cannot be moved as asked (the same class, a target class that does not
        /// exist, a node for a class that does not wait for a first consumer, a name Ferry
        /// needs taken); the message says what to change.
        InvalidMigration,
        /// A pod that has the claim is not run by a Deployment or StatefulSet Ferry can scale
        /// (a bare pod, a DaemonSet, a Job, another controller), or a StatefulSet deletes its
        /// claims when scaled down; the message names it.
        UnsupportedUser,
        /// Another migration of the same claim is under way.
        AlreadyMigrating,
        /// The live copy failed; the message has its reason.
        CopyFailed,
        /// The users did not stop within `quiesceTimeoutSeconds`.
        QuiesceTimeout,
        /// The final sync failed; the message has its reason.
        FinalSyncFailed,
        /// A hook's Job failed, or went before it completed; the message has its reason.
        HookFailed,
        /// A hook's Job did not complete within its `timeoutSeconds`; it was suspended again
        /// (its pods stopped).
        HookTimedOut,
        /// The ClaimMigration was deleted before the swap: its users were scaled back on the
        /// old claim.
        Cancelled,
        /// The claim is on its new volume.
        Migrated,
    }
}

wire_enum! {
    /// The points of a migration where a hook runs.
    pub enum HookPoint {
        /// After the live copy, the users still running: flush a database, put the
        /// application into maintenance, drain its traffic.
        BeforeScaleDown,
        /// The users at zero and no pod with the claim, before the final sync: clean up,
        /// check what the application left (it counts in the downtime).
        BeforeFinalSync,
    }
}

/// A hook: a Job of the user's, in the migration's namespace, created suspended
/// (`spec.suspend: true`) and labelled `ferry.dev/hook-for: <the ClaimMigration's name>`.
/// The operator only starts it (sets `spec.suspend` to false) at its point and waits for it
/// to complete; it runs with the Job's own ServiceAccount and image, so it can do what its
/// author may (`kubectl exec` into the application, for one), and nothing the operator may.
/// A Job that fails, or does not complete within `timeoutSeconds` (it is then suspended
/// again, which stops its pods), rolls the migration back.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationHook {
    /// The Job's name, in this namespace.
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 63").message("hooks.*.job names a Job of this namespace"))]
    pub job: String,
    /// How long the Job gets to complete once started (10 to 3600 seconds, default 300).
    #[serde(default = "hook_timeout")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 3600").message("hooks.*.timeoutSeconds must be between 10 and 3600"))]
    pub timeout_seconds: i32,
}

fn hook_timeout() -> i32 {
    300
}

/// The hooks of a migration, each optional; a Job runs once, so the two name two Jobs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.beforeScaleDown) || !has(self.beforeFinalSync) || self.beforeScaleDown.job != self.beforeFinalSync.job").message("hooks.beforeScaleDown and hooks.beforeFinalSync name two Jobs: a Job runs once"))]
pub struct MigrationHooks {
    /// Run after the live copy, before the users are scaled to zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_scale_down: Option<MigrationHook>,
    /// Run once the users are at zero and no pod has the claim, before the final sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_final_sync: Option<MigrationHook>,
}

impl MigrationHooks {
    /// The hook at `point`, if one is set.
    pub fn at(&self, point: HookPoint) -> Option<&MigrationHook> {
        match point {
            HookPoint::BeforeScaleDown => self.before_scale_down.as_ref(),
            HookPoint::BeforeFinalSync => self.before_final_sync.as_ref(),
        }
    }

    fn is_empty(&self) -> bool {
        self.before_scale_down.is_none() && self.before_final_sync.is_none()
    }
}

/// Where to move a claim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationTarget {
    /// The StorageClass of the new volume (not the claim's own, unless `node` is given).
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("to.storageClassName names the class of the new volume"))]
    pub storage_class_name: String,
    /// The node to make the new volume on, for a class that waits for a first consumer
    /// (`volumeBindingMode: WaitForFirstConsumer`); without it such a volume is made where
    /// the copy's holder pod is scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("to.node is a node's name"))]
    pub node: Option<String>,
}

/// A claim moved to another StorageClass (or node), keeping its name: the users of the
/// claim (the Deployments and StatefulSets whose pods have it) keep running during a live
/// copy, are scaled to zero for a final sync and the swap, and come back on the new volume
/// under the same claim name. The old volume is kept (`Retain`) until the user deletes it.
/// Any failure before the swap leaves the users on the old claim.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "ClaimMigration",
    plural = "claimmigrations",
    shortname = "cmig",
    namespaced,
    status = "ClaimMigrationStatus",
    printcolumn = r#"{"name":"Claim","type":"string","jsonPath":".spec.claim"}"#,
    printcolumn = r#"{"name":"To","type":"string","jsonPath":".spec.to.storageClassName"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.step"}"#,
    printcolumn = r#"{"name":"Downtime","type":"number","jsonPath":".status.downtimeSeconds"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    // Its steps act on what it named when it began: a migration is made anew, not changed.
    validation = Rule::new("self.spec == oldSelf.spec").message("a ClaimMigration's spec cannot change once created: delete it and create another (deleted before its Swapping step, it scales the claim's users back on the old claim; from Swapping on, it finishes first)"),
    validation = Rule::new("self.metadata.name.size() <= 63").message("a ClaimMigration's name has at most 63 characters"),
)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMigrationSpec {
    /// The claim to move, in this namespace. It keeps its name.
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 253").message("claim names a PersistentVolumeClaim of this namespace"))]
    pub claim: String,
    /// Where to move it.
    pub to: MigrationTarget,
    /// How long the claim's users get to stop once scaled to zero (10 to 3600 seconds,
    /// default 300); past it the migration rolls back and scales them up again.
    #[serde(default = "quiesce_timeout")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 3600").message("quiesceTimeoutSeconds must be between 10 and 3600"))]
    pub quiesce_timeout_seconds: i32,
    /// Workers and agents of both copies.
    #[serde(default)]
    pub parallelism: Parallelism,
    /// Jobs of the user's to run before the users are scaled down, and before the final
    /// sync.
    #[serde(default, skip_serializing_if = "MigrationHooks::is_empty")]
    pub hooks: MigrationHooks,
}

fn quiesce_timeout() -> i32 {
    300
}

/// The kinds of user a migration scales.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, schemars::JsonSchema,
)]
pub enum UserKind {
    Deployment,
    StatefulSet,
}

/// A workload whose pods have the claim, and how many replicas it had.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationUser {
    pub kind: UserKind,
    pub name: String,
    /// Its `spec.replicas` when the migration began: what it is scaled back to.
    pub replicas: i32,
}

/// Observed state of a ClaimMigration, written by the operator only (tenants have no
/// grant on `claimmigrations/status`): the record its steps resume from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMigrationStatus {
    /// The step under way (or the last one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<MigrationStep>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<MigrationReason>,
    /// What happens next, or what to change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The claim's users, with their replica counts when it began.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<MigrationUser>,
    /// The uid of the claim being moved (the one of its name when the migration began).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_uid: Option<String>,
    /// The claim's labels when the migration began: the claim that takes its name gets
    /// them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claim_labels: BTreeMap<String, String>,
    /// The volume the claim had: kept, `Retain`, once the migration has swapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_volume: Option<String>,
    /// The volume the claim has after the swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_volume: Option<String>,
    /// When the migration began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the users were scaled to zero (the downtime's start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaled_down_at: Option<Time>,
    /// When the wait for the users to stop began (again, after a final sync that saw a
    /// pod come back): `quiesceTimeoutSeconds` counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiescing_since: Option<Time>,
    /// When they were scaled back (its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaled_up_at: Option<Time>,
    /// The hook that runs (step `RunningHook`), or ran last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<HookPoint>,
    /// When that hook was started: its `timeoutSeconds` counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_started_at: Option<Time>,
    /// The hooks that completed (each runs once, even if the final sync is run again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks_done: Vec<HookPoint>,
    /// The final sync's manifest, on the new volume (`.ferry/<uid>.xxh128`): what `kubectl
    /// ferry verify --migration NAME` checks the claim against, now and later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Seconds of the live copy (the users running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_seconds: Option<f64>,
    /// Seconds the users were at zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_seconds: Option<f64>,
}
