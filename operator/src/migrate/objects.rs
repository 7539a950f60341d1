//! What a claim migration makes, built in one place so that the chart's `-migrations`
//! admission policy can be compared with it whole (e2e/tests/hostile/migrations.rs): the new
//! claim, the claim that takes the original name, the two CopyJobs, and the merge patches
//! of a volume (reclaim policy Retain; the pre-bind to the claim's name).

use std::collections::BTreeMap;

use ferry_crds::{
    migration_claim_name, migration_copy_name, migration_sync_name, ClaimMigration, Compare,
    CopyJob, CopyJobSpec, Endpoint, Overwrite, Verify, MIGRATION_LABEL, SELECTED_NODE_ANNOTATION,
};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::populator::decide::{rebind_patch, MANAGED_BY};

/// The reference that makes the migration the controller of what it makes (the new claim,
/// the CopyJobs), so that they go with it. The claim that takes the original name is not
/// owned: it is the user's.
pub fn owned_by(m: &ClaimMigration) -> OwnerReference {
    OwnerReference {
        api_version: ClaimMigration::api_version(&()).into(),
        kind: ClaimMigration::kind(&()).into(),
        name: m.name_any(),
        uid: m.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.into(), MANAGED_BY.1.into()),
        (MIGRATION_LABEL.into(), uid.into()),
    ])
}

/// The size a new volume for `claim` asks for: what its volume holds (its capacity, which
/// may exceed the request), else its request.
pub(crate) fn size_of(claim: &PersistentVolumeClaim) -> Option<Quantity> {
    let capacity = claim
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"));
    let request = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    capacity.or(request).cloned()
}

/// The spec a claim on the target class gets: `claim`'s access modes, size and volume mode,
/// in class `class`, provisioned new (no data source, no volumeName, no selector).
fn target_spec(claim: &PersistentVolumeClaim, class: &str) -> PersistentVolumeClaimSpec {
    let spec = claim.spec.clone().unwrap_or_default();
    PersistentVolumeClaimSpec {
        storage_class_name: Some(class.into()),
        access_modes: spec.access_modes,
        resources: Some(VolumeResourceRequirements {
            requests: size_of(claim).map(|q| BTreeMap::from([("storage".to_string(), q)])),
            limits: None,
        }),
        volume_mode: spec.volume_mode,
        ..Default::default()
    }
}

/// The new claim: provisioned like `claim` in the target class (on `to.node`, when given),
/// owned by the migration. The chart's `-migrations` policy admits exactly this shape.
pub fn migration_claim(m: &ClaimMigration, claim: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let uid = m.uid().unwrap_or_default();
    let annotations = m
        .spec
        .to
        .node
        .as_ref()
        .map(|node| BTreeMap::from([(SELECTED_NODE_ANNOTATION.to_string(), node.clone())]));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(migration_claim_name(&uid)),
            namespace: m.namespace(),
            labels: Some(labels(&uid)),
            annotations,
            owner_references: Some(vec![owned_by(m)]),
            ..Default::default()
        },
        spec: Some(target_spec(claim, &m.spec.to.storage_class_name)),
        status: None,
    }
}

/// The claim that takes the original name after the swap: the old claim's labels (and the
/// migration's), the new claim's spec, no volumeName (the new volume is pre-bound to this
/// name, and the PV controller binds a pre-bound volume before any provisioner is asked).
/// Not owned by the migration: it is the user's claim.
pub fn renamed_claim(
    m: &ClaimMigration,
    new_claim: &PersistentVolumeClaim,
) -> PersistentVolumeClaim {
    let uid = m.uid().unwrap_or_default();
    let mut labels = m
        .status
        .as_ref()
        .map(|s| s.claim_labels.clone())
        .unwrap_or_default();
    labels.insert(MIGRATION_LABEL.to_string(), uid);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(m.spec.claim.clone()),
            namespace: m.namespace(),
            labels: Some(labels),
            ..Default::default()
        },
        spec: new_claim.spec.clone().map(|s| PersistentVolumeClaimSpec {
            volume_name: None,
            ..s
        }),
        status: None,
    }
}

fn copy_spec(m: &ClaimMigration) -> CopyJobSpec {
    CopyJobSpec {
        source: Endpoint {
            pvc: Some(m.spec.claim.clone()),
            ..Default::default()
        },
        destination: Endpoint {
            pvc: Some(migration_claim_name(&m.uid().unwrap_or_default())),
            ..Default::default()
        },
        check: None,
        reflink: Default::default(),
        verify: Verify::Checksum,
        overwrite: Overwrite::Always,
        compare: Default::default(),
        preserve: Default::default(),
        include: Vec::new(),
        exclude: Vec::new(),
        delete_extraneous: false,
        delete_excluded: false,
        parallelism: m.spec.parallelism,
        suspend: false,
        ttl_seconds_after_finished: None,
        dry_run: false,
        transfer: Default::default(),
    }
}

fn job(m: &ClaimMigration, name: String, spec: CopyJobSpec) -> CopyJob {
    let mut job = CopyJob::new(&name, spec);
    job.metadata.namespace = m.namespace();
    job.metadata.labels = Some(labels(&m.uid().unwrap_or_default()));
    job.metadata.owner_references = Some(vec![owned_by(m)]);
    job
}

/// The live copy: the whole claim into the new one, while its users run.
pub fn copy_job(m: &ClaimMigration) -> CopyJob {
    job(
        m,
        migration_copy_name(&m.uid().unwrap_or_default()),
        copy_spec(m),
    )
}

/// The final sync, the users at zero: what differs by checksum is written again and what
/// the claim no longer has is deleted (a raw block claim has no files to delete: its
/// chunks that differ are written).
pub fn sync_job(m: &ClaimMigration, block: bool) -> CopyJob {
    let spec = CopyJobSpec {
        overwrite: Overwrite::IfChanged,
        compare: Compare::Checksum,
        delete_extraneous: !block,
        ..copy_spec(m)
    };
    job(m, migration_sync_name(&m.uid().unwrap_or_default()), spec)
}

/// The `claimRef` that reserves a volume for the claim named `name` in `ns`: no uid, so
/// the claim of that name made next is the one bound.
pub fn pre_bind_ref(ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// The merge patch of the pre-bind: the populator's rebind patch (the volume at
/// `resource_version`, its `claimRef` exactly the one given, nothing else) with
/// `claim_ref`'s uid dropped. The chart's `-migrations` policy admits this change and no
/// other.
pub fn pre_bind_patch(resource_version: &str, claim_ref: &ObjectReference) -> serde_json::Value {
    let by_name = ObjectReference {
        uid: None,
        ..claim_ref.clone()
    };
    rebind_patch(resource_version, &by_name)
}

/// The merge patch that keeps a volume when its claim goes.
pub fn retain_patch(resource_version: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"persistentVolumeReclaimPolicy": "Retain"},
    })
}
