//! Claim migrations' grants: patch on the scale of every Deployment and StatefulSet, create
//! and delete on claims in every namespace, and patch on every PersistentVolume, narrowed
//! only by the chart's `-migrations` admission policy. A stolen operator token must not be
//! able to resize a running application, give any volume to any claim, provision a claim
//! that reaches existing data, or delete a claim that is not being moved; and no one but the
//! operator may take the names it follows (`ferry-migrate-*`). Here, on the operator's own
//! ServiceAccount token (and a tenant's, and an admin's) against the chart as rendered into
//! `deploy/`:
//!
//! - the new claim `migrate::decide::migration_claim` builds (with and without `to.node`)
//!   is admitted, and that claim with any one field added or changed is refused naming the
//!   field, but for what varies from migration to migration;
//! - the claim that takes the original name (`renamed_claim`) likewise;
//! - a tenant (and an admin) is refused those names on create, not on delete;
//! - the operator deletes its migrations' claims and a bound claim, and no other;
//! - the two volume changes it sends (`retain_patch`, `pre_bind_patch`) are admitted, and
//!   with anything else changed, or on a volume that is not the migration's, refused; the
//!   populator's rebind is still the `-populator` policy's;
//! - the operator scales an application only to zero, or back from zero; anyone else is
//!   not this policy's;
//! - the policy's validations type-check against the kinds it matches.
//!
//! The tables are checked against the objects first, as hostile/holder.rs's are: a field
//! added to `migration_claim`, `renamed_claim` or the patches without a row here fails.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use ferry_crds::{migration_claim_name, migration_copy_name, migration_sync_name, ClaimMigration};
use ferry_e2e::ControlPlane;
use ferry_operator::migrate::decide;
use serde_json::{json, Value};

use super::holder::{
    affinity, answered, apply, ask, ask_all, ask_delete, ask_patch, ask_rows, ask_until,
    check_coverage, csi_volume, install, row, set, type_checked, Answer, Row, BETA_ZONE, TEAM,
};

/// The ClaimMigration, and others.
pub(super) const MIG: &str = "6d7e8f90-1a2b-4c3d-9e4f-5a6b7c8d9e0f";
const OTHER: &str = "9a2b7c4d-1e3f-4a5b-8c6d-7e8f9a0b1c2d";
const THIRD: &str = "c3d4e5f6-a7b8-4c9d-8e0f-1a2b3c4d5e6f";
const FOURTH: &str = "0f1e2d3c-4b5a-4697-8877-665544332211";
const FIFTH: &str = "11223344-5566-4778-8899-aabbccddeeff";
/// The claim being moved, and the new claim (as bound by the PV controller).
const CLAIM_UID: &str = "2b3c4d5e-6f70-4a81-9b2c-3d4e5f607182";
const NEW_UID: &str = "7e8f9a0b-1c2d-4e3f-8a4b-5c6d7e8f9a0b";
/// The `-migrations` policy's refusal of a reserved name to anyone but the operator.
const RESERVED: &str = "is reserved for the Ferry operator's claim migrations";
/// Its refusal of a deletion.
const NOT_OURS: &str = "deletes only its migrations' claims";
/// Its refusal of a scale.
const SCALE: &str = "only to zero, or back from zero";
/// The `-snapshot-sources` policy's refusal of a claim that is not in its restored form.
const NOT_RESTORED: &str = "creates and deletes only its restored claims";
/// The `-populator` policy's refusal of a prime claim not in prime_claim's form.
const NOT_A_PRIME: &str = "a prime claim is named after the one claim";
/// The `-populator` policy's refusal of a volume change.
const NOT_A_REBIND: &str = "bound to its prime claim ferry-prime-<uid>";
/// The API server's refusal of a patch at an old resourceVersion.
const CONFLICT: &str = "the object has been modified";
/// The API server's refusal of another node affinity on a volume.
const IMMUTABLE: &str = "nodeAffinity: Invalid value";

/// Which object a row starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    /// The new claim of a migration to a class that binds at once (no node).
    New,
    /// The new claim of a migration with `to.node`: the selected-node annotation on it.
    NewOnNode,
    /// The claim that takes the original name after the swap.
    Renamed,
    /// A tenant's own claim, and its CopyJob.
    TenantClaim,
    TenantJob,
    /// `retain_patch` on the moved claim's volume (bound to `data`).
    Retain,
    /// On the new volume (bound to `ferry-migrate-<MIG>`).
    RetainNew,
    /// On a volume bound to no claim.
    RetainAvailable,
    /// On a prime claim's volume (the `-populator` policy's).
    RetainPrime,
    /// `pre_bind_patch` to `data` on the new volume (bound to `ferry-migrate-<MIG>`).
    PreBind,
    /// On the moved claim's volume (bound to `data` itself).
    PreBindOrdinary,
    /// On a volume bound to no claim.
    PreBindAvailable,
    /// On a prime claim's volume.
    PreBindPrime,
    /// The populator's own rebind, on the prime's volume.
    Rebind,
}

/// The claim being moved: bound, its volume larger than asked (the new claim asks for what
/// the volume holds), with labels (the renamed claim gets them) and annotations (no claim
/// the operator makes gets them).
fn user_claim() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": TEAM, "uid": CLAIM_UID,
            "labels": {"app": "db"},
            "annotations": {"example.com/owner": "team-a",
                "pv.kubernetes.io/bind-completed": "yes",
                "volume.kubernetes.io/selected-node": "node-a"},
            "finalizers": ["kubernetes.io/pvc-protection"]},
        "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem",
            "volumeName": "pv-old"},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "2Gi"}}
    })
}

/// The ClaimMigration with `uid` of claim `data` to class `fast` (on `node`), begun: its
/// status has the claim's labels.
fn migration(uid: &str, node: Option<&str>) -> Result<ClaimMigration> {
    let mut to = json!({"storageClassName": "fast"});
    if let Some(node) = node {
        to["node"] = json!(node);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "ClaimMigration",
        "metadata": {"name": "to-fast", "namespace": TEAM, "uid": uid},
        "spec": {"claim": "data", "to": to},
        "status": {"claimUid": CLAIM_UID, "claimLabels": {"app": "db"},
            "oldVolume": "pv-old"}
    }))?)
}

/// The new claim the code builds for migration `uid` of [`user_claim`].
pub(super) fn new_claim(uid: &str, node: Option<&str>) -> Result<Value> {
    let claim = serde_json::from_value(user_claim())?;
    Ok(serde_json::to_value(decide::migration_claim(
        &migration(uid, node)?,
        &claim,
    ))?)
}

/// The claim the code builds to take the name `data`, from the new claim as the API server
/// has it once bound (its volume, uid, finalizer and status).
fn renamed(uid: &str) -> Result<Value> {
    let mut bound = new_claim(uid, None)?;
    bound["metadata"]["uid"] = json!(NEW_UID);
    bound["metadata"]["finalizers"] = json!(["kubernetes.io/pvc-protection"]);
    bound["spec"]["volumeName"] = json!("pv-new");
    bound["status"] = json!({"phase": "Bound", "capacity": {"storage": "2Gi"}});
    let bound = serde_json::from_value(bound)?;
    Ok(serde_json::to_value(decide::renamed_claim(
        &migration(uid, None)?,
        &bound,
    ))?)
}

/// Rows of the spec both claims share: provisioned new, in the target class.
#[rustfmt::skip]
fn spec_rows(b: Base) -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    vec![
        // What varies from migration to migration.
        row(b, "another class", vec![set("/spec/storageClassName", json!("slow"))], Admitted),
        row(b, "another size", vec![set("/spec/resources/requests/storage", json!("5Gi"))], Admitted),
        row(b, "shared by many nodes", vec![set("/spec/accessModes/0", json!("ReadWriteMany"))], Admitted),
        row(b, "two access modes", vec![set("/spec/accessModes/1", json!("ReadOnlyMany"))], Admitted),
        row(b, "a block device", vec![set("/spec/volumeMode", json!("Block"))], Admitted),
        row(b, "the volume mode left to the API server", vec![("/spec/volumeMode", None)], Admitted),
        // Provisioned new: nothing that reaches existing data.
        row(b, "another tenant's released volume", vec![set("/spec/volumeName", json!("someone-elses"))], Refused("spec.volumeName")),
        row(b, "a clone of another claim", vec![set("/spec/dataSource", json!({"kind": "PersistentVolumeClaim", "name": "other"}))], Refused("spec.dataSource")),
        row(b, "a snapshot restored", vec![set("/spec/dataSource", json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "other"}))], Refused("spec.dataSource")),
        row(b, "populated", vec![set("/spec/dataSourceRef", json!({"apiGroup": "ferry.dev", "kind": "VolumeSource", "name": "golden"}))], Refused("spec.dataSourceRef")),
        row(b, "a volume selector", vec![set("/spec/selector", json!({"matchLabels": {"tenant": "team-b"}}))], Refused("spec.selector")),
        row(b, "a volume attributes class", vec![set("/spec/volumeAttributesClassName", json!("fast"))], Refused("spec.volumeAttributesClassName")),
        row(b, "no storage class (a pre-provisioned volume's)", vec![("/spec/storageClassName", None)], Refused("spec.storageClassName")),
        row(b, "the empty storage class", vec![set("/spec/storageClassName", json!(""))], Refused("spec.storageClassName")),
        row(b, "a storage limit", vec![set("/spec/resources/limits", json!({"storage": "5Gi"}))], Refused("spec.resources")),
        row(b, "another resource", vec![set("/spec/resources/requests/example.com~1iops", json!("1"))], Refused("spec.resources")),
        // The API server itself refuses these, before any policy.
        row(b, "no access mode", vec![("/spec/accessModes", None)], Refused("spec.accessModes")),
        row(b, "no size", vec![("/spec/resources/requests/storage", None)], Refused("spec.resources")),
        row(b, "a volume mode of no kind", vec![set("/spec/volumeMode", json!("Tape"))], Refused("spec.volumeMode")),
    ]
}

/// The new claim's rows: one field added or changed each, and what varies from migration to
/// migration (the namespace, the ClaimMigration, the node).
#[rustfmt::skip]
fn new_claim_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{New as C, NewOnNode as N};
    let mut rows = vec![
        row(C, "another namespace", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        // The owner's name cannot be checked against its uid here; the garbage collector and
        // the operator's own reads go by uid.
        row(C, "an owner of another name", vec![set("/metadata/ownerReferences/0/name", json!("other"))], Admitted),
        row(C, "another migration", vec![
            set("/metadata/name", json!(migration_claim_name(OTHER))),
            set("/metadata/labels/ferry.dev~1migration", json!(OTHER)),
            set("/metadata/ownerReferences/0/name", json!("other")),
            set("/metadata/ownerReferences/0/uid", json!(OTHER)),
        ], Admitted),
        row(N, "another node", vec![set("/metadata/annotations/volume.kubernetes.io~1selected-node", json!("node-b"))], Admitted),
        // Metadata.
        row(C, "a name not made from the owner", vec![set("/metadata/name", json!("ferry-migrate-evil"))], Refused("metadata.name")),
        row(C, "an owner other than the name's", vec![set("/metadata/ownerReferences/0/uid", json!(OTHER))], Refused("metadata.name")),
        row(C, "labelled for another migration", vec![set("/metadata/labels/ferry.dev~1migration", json!(OTHER))], Refused("metadata.labels")),
        row(C, "managed by someone else", vec![set("/metadata/labels/app.kubernetes.io~1managed-by", json!("helm"))], Refused("metadata.labels")),
        row(C, "another label (the moved claim's)", vec![set("/metadata/labels/app", json!("db"))], Refused("metadata.labels")),
        row(C, "no labels", vec![("/metadata/labels", None)], Refused("metadata.labels")),
        row(C, "a provisioner's annotation", vec![set("/metadata/annotations", json!({"nfs.io/storage-path": "team-b/data"}))], Refused("metadata.annotations")),
        row(N, "a second annotation", vec![set("/metadata/annotations/nfs.io~1storage-path", json!("team-b/data"))], Refused("metadata.annotations")),
        row(N, "the selected node's annotation renamed", vec![
            ("/metadata/annotations/volume.kubernetes.io~1selected-node", None),
            set("/metadata/annotations/volume.beta.kubernetes.io~1storage-provisioner", json!("csi.example.com")),
        ], Refused("metadata.annotations")),
        row(C, "an owner of another API version", vec![set("/metadata/ownerReferences/0/apiVersion", json!("ferry.dev/v1"))], Refused("metadata.ownerReferences")),
        row(C, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopyJob"))], Refused("metadata.ownerReferences")),
        row(C, "the moved claim as its owner", vec![
            set("/metadata/ownerReferences/0/apiVersion", json!("v1")),
            set("/metadata/ownerReferences/0/kind", json!("PersistentVolumeClaim")),
        ], Refused("metadata.ownerReferences")),
        row(C, "an owner that is not the controller", vec![set("/metadata/ownerReferences/0/controller", json!(false))], Refused("metadata.ownerReferences")),
        row(C, "an owner blocking deletion", vec![set("/metadata/ownerReferences/0/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(C, "a second owner", vec![set("/metadata/ownerReferences/1", json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": CLAIM_UID}))], Refused("metadata.ownerReferences")),
        row(C, "no owner", vec![("/metadata/ownerReferences", None)], Refused("metadata.ownerReferences")),
        row(C, "a generated name", vec![set("/metadata/generateName", json!("ferry-migrate-"))], Refused("metadata.generateName")),
        row(C, "a finalizer", vec![set("/metadata/finalizers", json!(["example.com/never"]))], Refused("metadata.finalizers")),
    ];
    rows.extend(spec_rows(C));
    rows
}

/// The renamed claim's rows: what varies (its name, namespace, the moved claim's labels),
/// and one field added or changed each.
#[rustfmt::skip]
fn renamed_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::Renamed as R;
    let owner = json!([{"apiVersion": "ferry.dev/v1alpha1", "kind": "ClaimMigration", "name": "to-fast", "uid": MIG, "controller": true}]);
    let mut rows = vec![
        row(R, "another name", vec![set("/metadata/name", json!("db"))], Admitted),
        row(R, "another namespace", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        row(R, "the moved claim's label of another value", vec![set("/metadata/labels/app", json!("web"))], Admitted),
        row(R, "another of the moved claim's labels", vec![set("/metadata/labels/tier", json!("storage"))], Admitted),
        // The label's value cannot be checked against any ClaimMigration here.
        row(R, "labelled for another migration", vec![set("/metadata/labels/ferry.dev~1migration", json!(OTHER))], Admitted),
        row(R, "without the ferry.dev/migration label", vec![("/metadata/labels/ferry.dev~1migration", None)], Refused("metadata.labels")),
        row(R, "no labels", vec![("/metadata/labels", None)], Refused("metadata.labels")),
        row(R, "an annotation (the moved claim's node)", vec![set("/metadata/annotations", json!({"volume.kubernetes.io/selected-node": "node-a"}))], Refused("metadata.annotations")),
        row(R, "a provisioner's annotation", vec![set("/metadata/annotations", json!({"nfs.io/storage-path": "team-b/data"}))], Refused("metadata.annotations")),
        row(R, "an owner (the migration)", vec![set("/metadata/ownerReferences", owner)], Refused("metadata.ownerReferences")),
        row(R, "a generated name", vec![set("/metadata/generateName", json!("data-"))], Refused("metadata.generateName")),
        row(R, "a finalizer", vec![set("/metadata/finalizers", json!(["example.com/never"]))], Refused("metadata.finalizers")),
        // Names other shapes are held to: then those.
        row(R, "a migration's claim name", vec![set("/metadata/name", json!(migration_claim_name(MIG)))], Refused("metadata.ownerReferences")),
        row(R, "a restored claim's name", vec![set("/metadata/name", json!(format!("ferry-restore-{MIG}")))], Refused(NOT_RESTORED)),
        row(R, "a prime claim's name", vec![set("/metadata/name", json!(format!("ferry-prime-{MIG}")))], Refused(NOT_A_PRIME)),
    ];
    rows.extend(spec_rows(R));
    rows
}

/// A tenant's rows: the names the operator follows are refused, every other name is the
/// tenant's.
#[rustfmt::skip]
fn tenant_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{TenantClaim as C, TenantJob as J};
    vec![
        row(C, "a claim of its own name", vec![], Admitted),
        row(C, "a name like a migration's", vec![set("/metadata/name", json!("ferry-migratex"))], Admitted),
        row(C, "a name ending like a migration's", vec![set("/metadata/name", json!("my-ferry-migrate-x"))], Admitted),
        row(C, "a migration claim's name", vec![set("/metadata/name", json!("ferry-migrate-x"))], Refused(RESERVED)),
        row(C, "the new claim's name of a migration", vec![set("/metadata/name", json!(migration_claim_name(MIG)))], Refused(RESERVED)),
        row(C, "a migration claim's generated name", vec![("/metadata/name", None), set("/metadata/generateName", json!("ferry-migrate-"))], Refused(RESERVED)),
        row(C, "the new claim exactly as the operator makes it", vec![
            set("/metadata/name", json!(migration_claim_name(MIG))),
            set("/metadata/labels", json!({"app.kubernetes.io/managed-by": "ferry-operator", "ferry.dev/migration": MIG})),
            set("/metadata/ownerReferences", json!([{"apiVersion": "ferry.dev/v1alpha1", "kind": "ClaimMigration", "name": "to-fast", "uid": MIG, "controller": true}])),
        ], Refused(RESERVED)),
        row(J, "a CopyJob of its own name", vec![], Admitted),
        row(J, "a name like a migration's job", vec![set("/metadata/name", json!("migrate-x"))], Admitted),
        row(J, "a migration job's name", vec![set("/metadata/name", json!("ferry-migrate-x"))], Refused(RESERVED)),
        row(J, "the live copy's name of a migration", vec![set("/metadata/name", json!(migration_copy_name(MIG)))], Refused(RESERVED)),
        row(J, "the final sync's name of a migration", vec![set("/metadata/name", json!(migration_sync_name(MIG)))], Refused(RESERVED)),
        row(J, "a migration job's generated name", vec![("/metadata/name", None), set("/metadata/generateName", json!("ferry-migrate-"))], Refused(RESERVED)),
    ]
}

/// The rows of the two volume changes: each patch with one field added or changed, and on
/// volumes it is not for.
#[rustfmt::skip]
fn volume_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{
        PreBind as B, PreBindAvailable as BA, PreBindOrdinary as BO, PreBindPrime as BP,
        Rebind, Retain as R, RetainAvailable as RA, RetainNew as RN, RetainPrime as RP,
    };
    let owner = json!([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": CLAIM_UID}]);
    vec![
        // Retain: on any volume not a prime's (no policy can see which volume a migration
        // moves), nothing else changed.
        row(RN, "Retain on the new volume", vec![], Admitted),
        row(RA, "Retain on a volume bound to no claim", vec![], Admitted),
        row(RP, "Retain on a prime claim's volume", vec![], Refused(NOT_A_REBIND)),
        row(R, "at an old resourceVersion", vec![set("/metadata/resourceVersion", json!("1"))], Refused(CONFLICT)),
        row(R, "Recycle instead", vec![set("/spec/persistentVolumeReclaimPolicy", json!("Recycle"))], Refused("spec.persistentVolumeReclaimPolicy")),
        row(R, "and a larger capacity", vec![set("/spec/capacity", json!({"storage": "1Ti"}))], Refused("spec.capacity")),
        row(R, "and another storage class", vec![set("/spec/storageClassName", json!("slow"))], Refused("spec.storageClassName")),
        row(R, "and mount options", vec![set("/spec/mountOptions", json!(["nosuid"]))], Refused("spec.mountOptions")),
        row(R, "and another access mode", vec![set("/spec/accessModes", json!(["ReadWriteMany"]))], Refused("spec.accessModes")),
        row(R, "and its zone's beta label made GA", vec![set("/spec/nodeAffinity", affinity("node-a", "topology.kubernetes.io/zone"))], Refused("spec.nodeAffinity")),
        row(R, "and the claim's uid dropped", vec![set("/spec/claimRef", json!({"uid": null}))], Refused("spec.claimRef.name")),
        row(R, "and given to another claim", vec![set("/spec/claimRef", json!({"name": "other", "uid": null, "resourceVersion": null}))], Refused("spec.claimRef.name")),
        row(R, "and a label", vec![set("/metadata/labels", json!({"tenant": "team-b"}))], Refused("metadata.labels")),
        row(R, "and an annotation", vec![set("/metadata/annotations/example.com~1note", json!("x"))], Refused("metadata.annotations")),
        row(R, "and its protection finalizer removed", vec![set("/metadata/finalizers", Value::Null)], Refused("metadata.finalizers")),
        row(R, "and an owner", vec![set("/metadata/ownerReferences", owner.clone())], Refused("metadata.ownerReferences")),
        // The pre-bind: from ferry-migrate-<uid> to a claim name of the same namespace, no uid.
        row(B, "to another claim name", vec![set("/spec/claimRef/name", json!("other"))], Admitted),
        row(B, "to a name with ferry- inside", vec![set("/spec/claimRef/name", json!("my-ferry-data"))], Admitted),
        row(B, "keeping the new claim's uid", vec![set("/spec/claimRef/uid", json!(NEW_UID))], Refused("spec.claimRef.uid")),
        row(B, "to the moved claim's uid", vec![set("/spec/claimRef/uid", json!(CLAIM_UID))], Refused("spec.claimRef.uid")),
        row(B, "keeping a resourceVersion", vec![set("/spec/claimRef/resourceVersion", json!("1"))], Refused("spec.claimRef.resourceVersion")),
        row(B, "a reference with a fieldPath", vec![set("/spec/claimRef/fieldPath", json!("spec"))], Refused("spec.claimRef.fieldPath")),
        row(B, "to another namespace", vec![set("/spec/claimRef/namespace", json!("team-b"))], Refused("spec.claimRef.namespace")),
        row(B, "to a restored claim's name", vec![set("/spec/claimRef/name", json!("ferry-restore-x"))], Refused("spec.claimRef.name")),
        row(B, "to another migration's claim", vec![set("/spec/claimRef/name", json!(migration_claim_name(OTHER)))], Refused("spec.claimRef.name")),
        row(B, "to a prime claim's name", vec![set("/spec/claimRef/name", json!(format!("ferry-prime-{CLAIM_UID}")))], Refused("spec.claimRef.name")),
        // Any name of Ferry's, a user's too: a migration of a claim named ferry-* cannot swap.
        row(B, "to a user's claim named ferry-*", vec![set("/spec/claimRef/name", json!("ferry-cache"))], Refused("spec.claimRef.name")),
        row(B, "to no claim (any claim may then bind it)", vec![set("/spec/claimRef", Value::Null)], Refused("spec.claimRef.name")),
        row(B, "to a reference of another kind", vec![set("/spec/claimRef/kind", json!("Pod"))], Refused("spec.claimRef.kind")),
        row(B, "to a reference of another API version", vec![set("/spec/claimRef/apiVersion", json!("v2"))], Refused("spec.claimRef.apiVersion")),
        row(B, "at an old resourceVersion", vec![set("/metadata/resourceVersion", json!("1"))], Refused(CONFLICT)),
        row(B, "and a larger capacity", vec![set("/spec/capacity", json!({"storage": "1Ti"}))], Refused("spec.capacity")),
        row(B, "and Retain", vec![set("/spec/persistentVolumeReclaimPolicy", json!("Retain"))], Refused("spec.persistentVolumeReclaimPolicy")),
        row(B, "and another storage class", vec![set("/spec/storageClassName", json!("slow"))], Refused("spec.storageClassName")),
        row(B, "and its zone's beta label made GA", vec![set("/spec/nodeAffinity", affinity("node-a", "topology.kubernetes.io/zone"))], Refused("spec.nodeAffinity")),
        row(B, "and a label", vec![set("/metadata/labels", json!({"tenant": "team-b"}))], Refused("metadata.labels")),
        row(B, "and an annotation", vec![set("/metadata/annotations/example.com~1note", json!("x"))], Refused("metadata.annotations")),
        row(B, "and its protection finalizer removed", vec![set("/metadata/finalizers", Value::Null)], Refused("metadata.finalizers")),
        row(B, "and an owner", vec![set("/metadata/ownerReferences", owner)], Refused("metadata.ownerReferences")),
        // The API server itself refuses these.
        row(B, "and another node", vec![set("/spec/nodeAffinity", affinity("node-b", BETA_ZONE))], Refused(IMMUTABLE)),
        row(B, "and another volume", vec![set("/spec/csi", json!({"driver": "csi.example.com", "volumeHandle": "someone-elses"}))], Refused("spec.persistentvolumesource")),
        // Only a migration's new volume is pre-bound.
        row(BO, "the moved claim's own volume", vec![], Refused("spec.claimRef.name")),
        row(BA, "a volume bound to no claim", vec![], Refused("spec.claimRef.name")),
        row(BP, "a prime claim's volume", vec![], Refused(NOT_A_REBIND)),
        // And the populator's rebind is the -populator policy's still.
        row(Rebind, "the populator's rebind", vec![], Admitted),
    ]
}

/// A PersistentVolume as a CSI driver provisions it, of the migration's target class.
fn volume(name: &str, claim: Option<(&str, &str)>) -> Value {
    csi_volume(name, claim, "2Gi", "fast")
}

/// Scale `kind` `name` of `TEAM` to `replicas` on `kc` with the merge patch the operator
/// sends through the scale subresource (a dry run); `Err` when not `answer`.
fn ask_scale(
    cp: &ControlPlane,
    kc: &Path,
    kind: &str,
    name: &str,
    replicas: i32,
    answer: Answer,
) -> Result<()> {
    let kc = kc.to_string_lossy();
    let patch = json!({"spec": {"replicas": replicas}}).to_string();
    let out = cp.kubectl(&[
        "--kubeconfig",
        &kc,
        "patch",
        kind,
        name,
        "-n",
        TEAM,
        "--subresource=scale",
        "--type=merge",
        "--dry-run=server",
        "-p",
        &patch,
    ])?;
    answered(&out, answer)
}

/// A Deployment or StatefulSet `name` of `TEAM` at `replicas` (no controller runs here: it
/// stays as stored, and its scale subresource is the API server's alone).
fn workload(kind: &str, name: &str, replicas: i32) -> Value {
    let mut w = json!({
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}}}
    });
    if kind == "StatefulSet" {
        w["spec"]["serviceName"] = json!(name);
    }
    w
}

/// Create `obj` for real on `kc`.
fn create(cp: &ControlPlane, kc: &Path, obj: &Value) -> Result<()> {
    let kc = kc.to_string_lossy();
    let out = cp.kubectl_stdin(
        &["--kubeconfig", &kc, "create", "-f", "-"],
        &obj.to_string(),
    )?;
    ensure!(
        out.status.success(),
        "creating {}: {}",
        obj["metadata"]["name"],
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn migrations_policy_admits_exactly_the_claims_volume_changes_and_scales_the_operator_makes(
) -> Result<()> {
    let bases = [
        (Base::New, new_claim(MIG, None)?),
        (Base::NewOnNode, new_claim(MIG, Some("node-a"))?),
    ];
    let rows = new_claim_rows();
    check_coverage(&bases, &rows, &[])?;
    let renamed_bases = [(Base::Renamed, renamed(MIG)?)];
    let renamed_rows = renamed_rows();
    check_coverage(&renamed_bases, &renamed_rows, &[])?;
    // The volume patches, checked against their rows as objects ("whole": every field of a
    // reference is set, to a value or to null).
    let pre_bind_ref = decide::pre_bind_ref(TEAM, "data");
    check_coverage(
        &[
            (Base::Retain, decide::retain_patch("1")),
            (Base::PreBind, decide::pre_bind_patch("1", &pre_bind_ref)),
        ],
        &volume_rows(),
        &["/spec/claimRef"],
    )?;

    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let mut labelled = bases[0].1.clone();
    apply(&mut labelled, &set("/metadata/labels/app", json!("db")))?;
    // The controller that type-checks policies and says so in their status.
    let checker =
        cp.start_controller_manager_or_skip(&["validatingadmissionpolicy-status-controller"])?;
    let kc = install(&cp, &labelled, "metadata.labels")?;
    if checker.is_some() {
        type_checked(&cp, "ferry-migrations")?;
    }

    // 1, 2: the claims the code builds, and each changed.
    for (_, exact) in bases.iter().chain(&renamed_bases) {
        ask(&cp, &kc, exact, Answer::Admitted)
            .with_context(|| format!("the claim the code builds: {exact}"))?;
    }
    ask(
        &cp,
        &kc,
        &user_claim(),
        Answer::Refused("metadata.annotations"),
    )
    .context("the moved claim itself, by the operator")?;
    // The CopyJobs it makes take its reserved names.
    let m = migration(MIG, None)?;
    for job in [decide::copy_job(&m), decide::sync_job(&m, false)] {
        ask(&cp, &kc, &serde_json::to_value(&job)?, Answer::Admitted).with_context(|| {
            format!(
                "the CopyJob the code builds: {}",
                job.metadata.name.as_deref().unwrap_or_default()
            )
        })?;
    }
    ask_all(&cp, &kc, &bases, &rows)?;
    ask_all(&cp, &kc, &renamed_bases, &renamed_rows)?;

    // 3: a tenant: create and delete on claims and CopyJobs of its namespace, and the scale
    // of its applications.
    cp.kubectl_ok(&["create", "serviceaccount", "tenant", "-n", TEAM])?;
    cp.kubectl_ok(&[
        "create",
        "role",
        "tenant",
        "-n",
        TEAM,
        "--verb=create,delete",
        "--resource=persistentvolumeclaims,copyjobs.ferry.dev",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "role",
        "tenant-scale",
        "-n",
        TEAM,
        "--verb=get,patch",
        "--resource=deployments.apps/scale,statefulsets.apps/scale",
    ])?;
    for role in ["tenant", "tenant-scale"] {
        cp.kubectl_ok(&[
            "create",
            "rolebinding",
            role,
            "-n",
            TEAM,
            &format!("--role={role}"),
            &format!("--serviceaccount={TEAM}:tenant"),
        ])?;
    }
    let tenant = cp.service_account_kubeconfig(TEAM, "tenant", None)?;
    let tenant_bases = [
        (
            Base::TenantClaim,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "mine", "namespace": TEAM},
                "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}),
        ),
        (
            Base::TenantJob,
            json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob",
                "metadata": {"name": "copy", "namespace": TEAM},
                "spec": {"source": {"pvc": "mine"}, "destination": {"pvc": "copy"}}}),
        ),
    ];
    // The role is in force a moment after it is stored.
    ask_until(&cp, &tenant, &tenant_bases[0].1, Answer::Admitted).context("the tenant's role")?;
    ask_all(&cp, &tenant, &tenant_bases, &tenant_rows())?;
    // Nor an admin (the names are the operator's alone).
    let admin = cp.kubeconfig.clone();
    for (_, base) in &tenant_bases {
        let mut reserved = base.clone();
        apply(
            &mut reserved,
            &set("/metadata/name", json!("ferry-migrate-x")),
        )?;
        ask(&cp, &admin, &reserved, Answer::Refused(RESERVED))
            .with_context(|| format!("a migration's name, by an admin: {reserved}"))?;
    }

    // 4: deleting. The operator's new claims, made on its token (one then relabelled by an
    // admin for another migration, one given a second owner, one an owner of another kind,
    // one no owner); a bound claim and a pending one; the operator's CopyJob.
    for uid in [MIG, OTHER, THIRD, FOURTH, FIFTH] {
        create(&cp, &kc, &new_claim(uid, None)?)?;
    }
    create(&cp, &kc, &serde_json::to_value(decide::copy_job(&m))?)?;
    let (exact, relabelled, two_owners, other_kind, no_owner) = (
        migration_claim_name(MIG),
        migration_claim_name(OTHER),
        migration_claim_name(THIRD),
        migration_claim_name(FOURTH),
        migration_claim_name(FIFTH),
    );
    cp.kubectl_ok(&[
        "label",
        "pvc",
        &relabelled,
        "-n",
        TEAM,
        &format!("ferry.dev/migration={MIG}"),
        "--overwrite",
    ])?;
    let owner = |uid: &str, kind: &str| json!({"apiVersion": "ferry.dev/v1alpha1", "kind": kind, "name": "to-fast", "uid": uid, "controller": true});
    let second = json!({"metadata": {"ownerReferences": [owner(THIRD, "ClaimMigration"),
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": CLAIM_UID}]}});
    let kind = json!({"metadata": {"ownerReferences": [owner(FOURTH, "CopyJob")]}});
    let none = json!({"metadata": {"ownerReferences": null}});
    for (claim, patch) in [
        (&two_owners, second),
        (&other_kind, kind),
        (&no_owner, none),
    ] {
        cp.kubectl_ok(&ferry_e2e::merge_patch(
            &format!("pvc/{claim}"),
            TEAM,
            false,
            &patch.to_string(),
        ))?;
    }
    for (name, phase) in [
        ("bound", Some("Bound")),
        ("pending", None),
        ("lost", Some("Lost")),
    ] {
        let mut claim = tenant_bases[0].1.clone();
        apply(&mut claim, &set("/metadata/name", json!(name)))?;
        cp.apply(&claim.to_string())?;
        if let Some(phase) = phase {
            cp.kubectl_ok(&ferry_e2e::merge_patch(
                &format!("pvc/{name}"),
                TEAM,
                true,
                &json!({"status": {"phase": phase}}).to_string(),
            ))?;
        }
    }
    let pvc = "pvc";
    let deletes: [(&Path, &str, &str, Answer, &str); 11] = [
        (&kc, pvc, &exact, Answer::Admitted, "its new claim"),
        (
            &kc,
            pvc,
            &relabelled,
            Answer::Refused(NOT_OURS),
            "a new claim labelled for another migration",
        ),
        (
            &kc,
            pvc,
            &two_owners,
            Answer::Refused(NOT_OURS),
            "a new claim of two owners",
        ),
        (
            &kc,
            pvc,
            &other_kind,
            Answer::Refused(NOT_OURS),
            "a new claim owned by a CopyJob",
        ),
        (
            &kc,
            pvc,
            &no_owner,
            Answer::Refused(NOT_OURS),
            "a new claim of no owner",
        ),
        (&kc, pvc, "bound", Answer::Admitted, "a bound claim"),
        (
            &kc,
            pvc,
            "pending",
            Answer::Refused(NOT_OURS),
            "a pending claim",
        ),
        (&kc, pvc, "lost", Answer::Refused(NOT_OURS), "a lost claim"),
        // Anyone else's deletes are not this policy's (the garbage collector's, a tenant's).
        (
            &admin,
            pvc,
            &relabelled,
            Answer::Admitted,
            "a new claim, by an admin",
        ),
        (
            &tenant,
            pvc,
            &exact,
            Answer::Admitted,
            "a new claim, by a tenant",
        ),
        (
            &tenant,
            "copyjob.ferry.dev",
            &migration_copy_name(MIG),
            Answer::Admitted,
            "a migration's CopyJob, by a tenant",
        ),
    ];
    let mut failed = Vec::new();
    for (who, kind, name, answer, what) in deletes {
        if let Err(e) = ask_delete(&cp, who, kind, name, answer) {
            failed.push(format!("deleting {what}: {e:#}"));
        }
    }
    ensure!(
        failed.is_empty(),
        "{} of {} deletes answered otherwise:\n{}",
        failed.len(),
        deletes.len(),
        failed.join("\n")
    );

    // 5: the volume changes: volumes made by an admin (as a provisioner and the PV
    // controller would leave them), patched by the operator.
    let new_name = migration_claim_name(MIG);
    let prime_name = format!("ferry-prime-{CLAIM_UID}");
    let volumes = [
        ("pv-old", Some(("data", CLAIM_UID))),
        ("pv-new", Some((new_name.as_str(), NEW_UID))),
        ("pv-available", None),
        ("pv-prime", Some((prime_name.as_str(), NEW_UID))),
    ];
    let mut versions = std::collections::BTreeMap::new();
    for (name, bound) in volumes {
        cp.apply(&volume(name, bound).to_string())?;
        let rv = cp.kubectl_ok(&[
            "get",
            "pv",
            name,
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])?;
        versions.insert(name, rv.trim().to_string());
    }
    let user = serde_json::from_value(user_claim())?;
    let rebind_ref = ferry_operator::populator::decide::claim_ref(&user);
    let patch_of = |base: Base| -> Result<(&'static str, Value)> {
        let (pv, retain) = match base {
            Base::Retain => ("pv-old", true),
            Base::RetainNew => ("pv-new", true),
            Base::RetainAvailable => ("pv-available", true),
            Base::RetainPrime => ("pv-prime", true),
            Base::PreBind => ("pv-new", false),
            Base::PreBindOrdinary => ("pv-old", false),
            Base::PreBindAvailable => ("pv-available", false),
            Base::PreBindPrime | Base::Rebind => ("pv-prime", false),
            _ => anyhow::bail!("{base:?} is not a volume's"),
        };
        let rv = versions.get(pv).context("a volume's resourceVersion")?;
        let patch = if base == Base::Rebind {
            ferry_operator::populator::decide::rebind_patch(rv, &rebind_ref)
        } else if retain {
            decide::retain_patch(rv)
        } else {
            decide::pre_bind_patch(rv, &pre_bind_ref)
        };
        Ok((pv, patch))
    };
    for base in [Base::Retain, Base::PreBind] {
        let (pv, exact) = patch_of(base)?;
        ask_patch(&cp, &kc, pv, &exact, Answer::Admitted)
            .with_context(|| format!("the patch the code sends: {exact}"))?;
    }
    ask_rows(
        "volume rows",
        &volume_rows(),
        patch_of,
        |pv, patch, answer| ask_patch(&cp, &kc, pv, patch, answer),
    )?;

    // 6: scaling, through the scale subresource.
    for kind in ["Deployment", "StatefulSet"] {
        for (name, replicas) in [("two", 2), ("zero", 0), ("three", 3)] {
            cp.apply(&workload(kind, name, replicas).to_string())?;
        }
    }
    let scales: [(&Path, &str, i32, Answer, &str); 8] = [
        (&kc, "two", 0, Answer::Admitted, "2 to 0, by the operator"),
        (&kc, "three", 0, Answer::Admitted, "3 to 0, by the operator"),
        (&kc, "zero", 3, Answer::Admitted, "0 to 3, by the operator"),
        (
            &kc,
            "two",
            3,
            Answer::Refused(SCALE),
            "2 to 3, by the operator",
        ),
        (
            &kc,
            "three",
            1,
            Answer::Refused(SCALE),
            "3 to 1, by the operator",
        ),
        (&tenant, "two", 3, Answer::Admitted, "2 to 3, by a tenant"),
        (&tenant, "three", 1, Answer::Admitted, "3 to 1, by a tenant"),
        (&admin, "three", 1, Answer::Admitted, "3 to 1, by an admin"),
    ];
    let mut failed = Vec::new();
    for kind in ["deployment", "statefulset"] {
        for (who, name, replicas, answer, what) in scales {
            if let Err(e) = ask_scale(&cp, who, kind, name, replicas, answer) {
                failed.push(format!("{kind} {what}: {e:#}"));
            }
        }
    }
    ensure!(
        failed.is_empty(),
        "{} of {} scales answered otherwise:\n{}",
        failed.len(),
        2 * scales.len(),
        failed.join("\n")
    );

    // And for real: the operator deletes its new claim and the bound claim.
    let kcs = kc.to_string_lossy();
    for name in [exact.as_str(), "bound"] {
        cp.kubectl_ok(&[
            "--kubeconfig",
            &kcs,
            "delete",
            "pvc",
            name,
            "-n",
            TEAM,
            "--wait=false",
        ])?;
    }
    Ok(())
}
