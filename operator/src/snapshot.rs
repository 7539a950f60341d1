//! Snapshot sources: `spec.source.snapshot` (a VolumeSnapshot of the job's namespace) or
//! `spec.source.copyMethod: Snapshot` (the operator takes one of the claim first). Either
//! way the snapshot is restored to a claim of the job's own (`ferry-restore-<job uid>`,
//! owned by the job), and the copy reads that claim, so it is one point in time whatever
//! writes to the source meanwhile. The restored claim and a snapshot the operator took are
//! deleted when the job finishes or is deleted; a snapshot the user named is theirs.
//!
//! One exception: with changed-block tracking on (`FERRY_SNAPSHOT_BASES`), a snapshot taken
//! of a raw block claim for a copy onto a claim is kept after a successful copy, as the
//! base the next copy onto that claim asks the driver's changes against (the agent's record
//! of the destination names it). It is owned by the destination claim too (deleted with
//! it), labelled [`BASE_FOR`] its uid, and deleted once a later base of that claim is kept.
//!
//! What a tenant controls here is the job's spec and the objects of its own namespace; the
//! operator follows a snapshot only if the snapshot controller bound it to a content that
//! names it back (a content is cluster-scoped: only admins or the controller write one),
//! and makes the restored claim itself, with no `volumeName` or selector (it can only be
//! provisioned new, from that snapshot). The chart's `-snapshot-sources` admission policy
//! holds the operator's account to exactly these objects.

use std::collections::BTreeMap;

use ferry_crds::{ConditionType, CopyJob, Reason};
use ferry_resolve::Blocked;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedLocalObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{json, Value};

/// The label naming the CopyJob (its uid) a restored claim or a taken snapshot is for.
pub const SNAPSHOT_OF: &str = "ferry.dev/snapshot-of";
/// The label of a taken snapshot kept as the base of the next copy onto a claim: that
/// claim's uid (it is also one of the snapshot's owners).
pub const BASE_FOR: &str = "ferry.dev/base-for";
const GROUP: &str = "snapshot.storage.k8s.io";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural)
}

fn snapshots(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("VolumeSnapshot", "volumesnapshots"),
    )
}

fn contents(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    )
}

fn blocked(reason: Reason, message: String) -> Blocked {
    Blocked {
        condition: ConditionType::Resolved,
        reason,
        message,
    }
}

/// A job whose source is a snapshot, checked before the snapshot is taken or restored: a
/// block snapshot restores as a raw block claim, so the job gets the refusals a copy
/// between block claims gets (`ferry_resolve::block::check_pair`), and a filesystem one
/// those of a filesystem source, now rather than once a restored claim exists. `src`: the
/// snapshot as an end (a block one with its size in bytes, when known).
async fn fits(
    client: &Client,
    ns: &str,
    job: &CopyJob,
    src: ferry_resolve::block::End,
) -> Result<Option<Blocked>, kube::Error> {
    let Some(dst) = ferry_resolve::destination_end(client, ns, job).await? else {
        return Ok(None);
    };
    Ok(ferry_resolve::block::check_pair(job, src, dst)
        .err()
        .map(|r| Blocked {
            condition: ConditionType::Accepted,
            reason: r.reason,
            message: format!(
                "{} (the source is a snapshot, restored as a {} claim)",
                r.message,
                if src.is_some() {
                    "raw block"
                } else {
                    "filesystem"
                }
            ),
        }))
}

fn made_for(meta: &ObjectMeta, job: &CopyJob) -> bool {
    let uid = job.uid();
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "CopyJob" && Some(&o.uid) == uid.as_ref())
}

fn labels(job: &CopyJob) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_string(),
            "ferry-operator".to_string(),
        ),
        (SNAPSHOT_OF.to_string(), job.uid().unwrap_or_default()),
    ])
}

/// The VolumeSnapshot the operator takes of a `copyMethod: Snapshot` source. It and
/// [`claim_for`]'s claim are what the chart's `-snapshot-sources` admission policy admits,
/// field by field (`e2e/tests/hostile/holder.rs` tries both). `base_for`: the destination
/// claim it is to stay for as a base after the copy (see the module's comment).
pub fn snapshot_of_claim(
    job: &CopyJob,
    claim: &str,
    base_for: Option<&PersistentVolumeClaim>,
) -> DynamicObject {
    let mut spec = json!({"source": {"persistentVolumeClaimName": claim}});
    if let Some(class) = &job.spec.source.volume_snapshot_class_name {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    let mut obj = DynamicObject::new(
        &ferry_resolve::taken_snapshot(&job.uid().unwrap_or_default()),
        &resource("VolumeSnapshot", "volumesnapshots"),
    );
    obj.metadata.namespace = job.namespace();
    let mut labels = labels(job);
    let mut owners = vec![crate::holder::owned_by(job)];
    if let Some(dest) = base_for {
        let uid = dest.uid().unwrap_or_default();
        labels.insert(BASE_FOR.to_string(), uid.clone());
        // Not the controller, not blocking: the snapshot goes when the claim goes (once
        // the job, its controller, is gone too).
        owners.push(OwnerReference {
            api_version: "v1".into(),
            kind: "PersistentVolumeClaim".into(),
            name: dest.name_any(),
            uid,
            controller: None,
            block_owner_deletion: None,
        });
    }
    obj.metadata.labels = Some(labels);
    obj.metadata.owner_references = Some(owners);
    obj.data = json!({ "spec": spec });
    obj
}

/// The claim a snapshot is restored to: new, from the snapshot only (no `volumeName`, no
/// selector), of `class` and `size`, read-write by one node (the widest mode drivers
/// support; the holder mounts it read-only, or opens its device read-only), and a raw
/// block claim when `block` (the snapshot is of one).
pub fn claim_for(
    job: &CopyJob,
    snapshot: &str,
    class: &str,
    size: &str,
    block: bool,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(ferry_resolve::restore_claim(&job.uid().unwrap_or_default())),
            namespace: job.namespace(),
            labels: Some(labels(job)),
            annotations: Some(BTreeMap::from([(
                "ferry.dev/copyjob".to_string(),
                job.name_any(),
            )])),
            owner_references: Some(vec![crate::holder::owned_by(job)]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(class.to_string()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.to_string()),
                )])),
                ..Default::default()
            }),
            data_source: Some(TypedLocalObjectReference {
                api_group: Some(GROUP.into()),
                kind: "VolumeSnapshot".into(),
                name: snapshot.to_string(),
            }),
            volume_mode: block.then(|| "Block".to_string()),
            ..Default::default()
        }),
        status: None,
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// For a job whose source is a snapshot: take the snapshot (copyMethod Snapshot), wait for
/// it to be ready, check it, and restore it to the job's claim. `Some(blocked)` while that
/// is not done (the job waits, and says on what); `None` when the restored claim is there
/// and bound (or waits for a first consumer: a holder), and for any other job.
/// `keep_bases`: whether a block snapshot taken for a copy onto a claim is to be kept as
/// that claim's base afterwards (changed-block tracking is on).
pub async fn prepare(
    client: &Client,
    ns: &str,
    job: &CopyJob,
    keep_bases: bool,
) -> Result<Option<Blocked>, kube::Error> {
    let src = &job.spec.source;
    if !ferry_resolve::from_snapshot(src) || job.meta().deletion_timestamp.is_some() {
        return Ok(None);
    }
    let uid = job.uid().unwrap_or_default();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let restore = ferry_resolve::restore_claim(&uid);
    // Restored already: the snapshot was checked before the claim was made.
    if let Some(claim) = claims.get_opt(&restore).await? {
        return restored(client, job, &claim, &restore).await;
    }
    // Which snapshot, and (for a taken one) of which claim.
    let (name, source_claim) = match (&src.snapshot, &src.pvc) {
        (Some(name), _) => (name.clone(), None),
        (None, Some(pvc)) => {
            let Some(claim) = claims.get_opt(pvc).await? else {
                return Ok(Some(blocked(
                    Reason::PVCNotFound,
                    format!("spec.source.pvc: no PersistentVolumeClaim {pvc:?} in namespace {ns:?} to snapshot (claims of other namespaces cannot be used)"),
                )));
            };
            if let Some(refused) = fits(client, ns, job, ferry_resolve::claim_end(&claim)).await? {
                return Ok(Some(refused));
            }
            (ferry_resolve::taken_snapshot(&uid), Some(claim))
        }
        (None, None) => return Ok(None),
    };
    let api = snapshots(client, ns);
    let snapshot = match (api.get_opt(&name).await, &source_claim) {
        (Ok(Some(s)), _) => s,
        (Ok(None), Some(claim)) => {
            // A base for the next copy only where one can use it: a raw block source
            // copied onto a claim.
            let base_for = match &job.spec.destination.pvc {
                Some(dest) if keep_bases && ferry_resolve::claim_end(claim).is_some() => {
                    claims.get_opt(dest).await?
                }
                _ => None,
            };
            let made = snapshot_of_claim(job, &claim.name_any(), base_for.as_ref());
            match api.create(&PostParams::default(), &made).await {
                Ok(s) => {
                    tracing::info!(job = %job.name_any(), snapshot = %name, claim = %claim.name_any(), "took a snapshot");
                    s
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    return Ok(Some(blocked(Reason::SnapshotNotFound, format!("spec.source.copyMethod Snapshot: this cluster has no VolumeSnapshot API ({GROUP}/v1); install the CSI external-snapshotter's CRDs and controller, or copy the live claim (copyMethod Direct)"))));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => api.get(&name).await?,
                Err(e) => return Err(e),
            }
        }
        (Ok(None), None) => {
            return Ok(Some(blocked(
                Reason::SnapshotNotFound,
                format!("spec.source.snapshot: no VolumeSnapshot {name:?} in namespace {ns:?} (snapshots of other namespaces cannot be used)"),
            )));
        }
        (Err(e), _) => return Err(e),
    };
    if source_claim.is_some() && !made_for(&snapshot.metadata, job) {
        return Ok(Some(blocked(Reason::SnapshotNotReady, format!("VolumeSnapshot {name:?} exists but was not made by Ferry for this job; delete it, or name it in spec.source.snapshot"))));
    }
    let status = snapshot.data.get("status").unwrap_or(&Value::Null);
    if status.get("readyToUse").and_then(Value::as_bool) != Some(true) {
        let why = str_at(status, &["error", "message"])
            .map(|m| format!("its error: {m}"))
            .unwrap_or_else(|| "waiting for the snapshot controller and the CSI driver".into());
        return Ok(Some(blocked(
            Reason::SnapshotNotReady,
            format!("VolumeSnapshot {name:?} is not ready to use yet ({why})"),
        )));
    }
    // Bound both ways: its content names this very snapshot (ferry_resolve::snapshot).
    let content = match ferry_resolve::snapshot::bound_content(&snapshot.data) {
        Some(n) => contents(client).get_opt(n).await?,
        None => None,
    };
    let Some(content) = content else {
        return Ok(Some(blocked(
            Reason::SnapshotNotReady,
            format!("VolumeSnapshot {name:?} is bound to no VolumeSnapshotContent yet"),
        )));
    };
    let uid = snapshot.metadata.uid.as_deref();
    if !ferry_resolve::snapshot::names_snapshot(&content.data, ns, &name, uid) {
        return Ok(Some(Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::CrossNamespace,
            message: format!("spec.source.snapshot: VolumeSnapshotContent {:?} is not bound to VolumeSnapshot {name:?} of namespace {ns:?}; use a snapshot the snapshot controller bound to its content", content.name_any()),
        }));
    }
    // A snapshot of a raw block volume restores as one (the content says which the
    // snapshot controller took; a claim Ferry snapshotted says it too).
    let block = str_at(&content.data, &["spec", "sourceVolumeMode"]) == Some("Block")
        || source_claim
            .as_ref()
            .is_some_and(|c| ferry_resolve::claim_end(c).is_some());
    let driver = str_at(&content.data, &["spec", "driver"]).unwrap_or_default();
    let Some(size) = str_at(status, &["restoreSize"])
        .map(String::from)
        .or_else(|| {
            source_claim.as_ref().and_then(|c| {
                c.spec
                    .as_ref()?
                    .resources
                    .as_ref()?
                    .requests
                    .as_ref()?
                    .get("storage")
                    .map(|q| q.0.clone())
            })
        })
    else {
        return Ok(Some(blocked(
            Reason::SnapshotNotReady,
            format!("VolumeSnapshot {name:?} has no restoreSize yet"),
        )));
    };
    let end = block.then(|| ferry_resolve::block::quantity_bytes(&size));
    if let Some(refused) = fits(client, ns, job, end).await? {
        return Ok(Some(refused));
    }
    let Some(class) = restore_class(client, ns, &snapshot, source_claim.as_ref(), driver).await?
    else {
        return Ok(Some(blocked(Reason::SnapshotNotFound, format!("no StorageClass provisions volumes of CSI driver {driver:?}, which VolumeSnapshot {name:?} was taken with; ask an admin for one"))));
    };
    let made = claim_for(job, &name, &class, &size, block);
    match claims.create(&PostParams::default(), &made).await {
        Ok(_) => {
            tracing::info!(job = %job.name_any(), snapshot = %name, claim = %restore, class = %class, "restoring a snapshot");
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    Ok(Some(blocked(
        Reason::SnapshotNotReady,
        format!("restoring VolumeSnapshot {name:?} to claim {restore:?}"),
    )))
}

/// The restored claim is there: it must be the one this job made, and bound (or waiting for
/// the holder, its first consumer) before the copy resolves it.
async fn restored(
    client: &Client,
    job: &CopyJob,
    claim: &PersistentVolumeClaim,
    name: &str,
) -> Result<Option<Blocked>, kube::Error> {
    let spec = claim.spec.as_ref();
    let from_snapshot = spec
        .and_then(|s| s.data_source.as_ref())
        .is_some_and(|d| d.kind == "VolumeSnapshot" && d.api_group.as_deref() == Some(GROUP));
    if !made_for(&claim.metadata, job) || !from_snapshot {
        return Ok(Some(blocked(Reason::SnapshotNotReady, format!("claim {name:?} exists but was not made by Ferry for this job; delete it and Ferry restores the snapshot there"))));
    }
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Bound") || ferry_resolve::waits_for_first_consumer(client, claim).await? {
        return Ok(None);
    }
    Ok(Some(blocked(
        Reason::SnapshotNotReady,
        format!(
            "restoring the snapshot to claim {name:?} (phase {})",
            phase.unwrap_or("unknown")
        ),
    )))
}

/// The StorageClass to restore into: the snapshotted claim's (taken by Ferry, or the
/// claim a named snapshot was taken of, if it is still there); else the cluster's default
/// class for the snapshot's driver, else its only class.
async fn restore_class(
    client: &Client,
    ns: &str,
    snapshot: &DynamicObject,
    source_claim: Option<&PersistentVolumeClaim>,
    driver: &str,
) -> Result<Option<String>, kube::Error> {
    let class_of = |c: &PersistentVolumeClaim| c.spec.as_ref()?.storage_class_name.clone();
    if let Some(class) = source_claim.and_then(class_of) {
        return Ok(Some(class));
    }
    if let Some(pvc) = str_at(
        &snapshot.data,
        &["spec", "source", "persistentVolumeClaimName"],
    ) {
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
        if let Some(class) = claims.get_opt(pvc).await?.as_ref().and_then(class_of) {
            return Ok(Some(class));
        }
    }
    let classes = Api::<StorageClass>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let mut of_driver: Vec<&StorageClass> = classes
        .items
        .iter()
        .filter(|c| c.provisioner == driver)
        .collect();
    of_driver.sort_by_key(|c| {
        let default = c
            .annotations()
            .get("storageclass.kubernetes.io/is-default-class")
            .is_some_and(|v| v == "true");
        (!default, c.name_any())
    });
    Ok(of_driver.first().map(|c| c.name_any()))
}

/// Delete the job's restored claim and the snapshot it took (when it finished, or is being
/// deleted); only objects it owns, never a snapshot the user named. After a copy that
/// `succeeded`, a taken snapshot labelled [`BASE_FOR`] a claim stays, and the older bases
/// of that claim go.
pub async fn release(
    client: &Client,
    ns: &str,
    job: &CopyJob,
    succeeded: bool,
) -> Result<(), kube::Error> {
    if !ferry_resolve::from_snapshot(&job.spec.source) {
        return Ok(());
    }
    let Some(uid) = job.uid() else {
        return Ok(());
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let restore = ferry_resolve::restore_claim(&uid);
    if let Some(c) = claims.get_opt(&restore).await? {
        if made_for(&c.metadata, job) {
            gone(claims.delete(&restore, &Default::default()).await.map(drop))?;
            tracing::info!(job = %job.name_any(), claim = %restore, "deleted the restored claim");
        }
    }
    if job.spec.source.snapshot.is_none() {
        let api = snapshots(client, ns);
        let taken = ferry_resolve::taken_snapshot(&uid);
        if let Some(s) = api.get_opt(&taken).await? {
            match base_for(&s.metadata) {
                Some(claim) if succeeded => prune_bases(&api, &s, claim).await?,
                _ if made_for(&s.metadata, job) => {
                    gone(api.delete(&taken, &Default::default()).await.map(drop))?;
                    tracing::info!(job = %job.name_any(), snapshot = %taken, "deleted the snapshot it took");
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The claim uid a snapshot is a base for: a snapshot the operator took (its name, its
/// labels) that is labelled [`BASE_FOR`] a claim which owns it.
fn base_for(meta: &ObjectMeta) -> Option<&str> {
    let labels = meta.labels.as_ref()?;
    let claim = labels.get(BASE_FOR)?;
    let ours = meta
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with(ferry_resolve::TAKEN_SNAPSHOT_PREFIX))
        && labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("ferry-operator");
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "PersistentVolumeClaim" && &o.uid == claim);
    (ours && owned).then_some(claim.as_str())
}

/// `kept` stays as the base of claim `claim`: the bases of that claim taken before it go
/// (only the newest is what the destination may hold; an older one only costs the driver
/// space). Compared by creation time, so a later release of an older job deletes nothing
/// newer.
async fn prune_bases(
    api: &Api<DynamicObject>,
    kept: &DynamicObject,
    claim: &str,
) -> Result<(), kube::Error> {
    let Some(born) = kept.metadata.creation_timestamp.as_ref() else {
        return Ok(());
    };
    let list = api
        .list(&ListParams::default().labels(&format!("{BASE_FOR}={claim}")))
        .await?;
    for old in list.items {
        let older = old
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| t.0 < born.0);
        if older && base_for(&old.metadata) == Some(claim) {
            let name = old.name_any();
            gone(api.delete(&name, &Default::default()).await.map(drop))?;
            tracing::info!(snapshot = %name, kept = %kept.name_any(), "deleted an older base of the claim");
        }
    }
    Ok(())
}

/// A 404 (the object, or the whole snapshot API, is not there) is no error here.
fn gone<T>(r: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(source: ferry_crds::Endpoint) -> CopyJob {
        let mut job = CopyJob::new(
            "nightly",
            ferry_crds::CopyJobSpec {
                source,
                destination: ferry_crds::Endpoint {
                    pvc: Some("backup".into()),
                    ..Default::default()
                },
                ..serde_json::from_value(json!({"source": {}, "destination": {}})).expect("a spec")
            },
        );
        job.metadata.namespace = Some("team".into());
        job.metadata.uid = Some("0f1e2d3c-aaaa-bbbb-cccc-000000000001".into());
        job
    }

    #[test]
    fn a_restored_claim_is_new_from_the_snapshot_and_owned_by_the_job() {
        let j = job(ferry_crds::Endpoint {
            snapshot: Some("s".into()),
            ..Default::default()
        });
        let c = claim_for(&j, "s", "fast", "2Gi", false);
        assert_eq!(
            c.metadata.name.as_deref(),
            Some("ferry-restore-0f1e2d3c-aaaa-bbbb-cccc-000000000001")
        );
        assert!(made_for(&c.metadata, &j));
        let spec = c.spec.expect("a spec");
        // Provisioned new: never bound to a volume it names, nor one a selector finds.
        assert_eq!(spec.volume_name, None);
        assert_eq!(spec.selector, None);
        let source = spec.data_source.expect("a data source");
        assert_eq!(
            (
                source.api_group.as_deref(),
                source.kind.as_str(),
                source.name.as_str()
            ),
            (Some(GROUP), "VolumeSnapshot", "s")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec.resources.and_then(|r| r.requests).expect("requests")["storage"],
            Quantity("2Gi".into())
        );
        // A filesystem claim says nothing of its mode; a block snapshot's claim says Block.
        assert_eq!(spec.volume_mode, None);
        let block = claim_for(&j, "s", "fast", "2Gi", true)
            .spec
            .expect("a spec");
        assert_eq!(block.volume_mode.as_deref(), Some("Block"));
    }

    #[test]
    fn a_taken_snapshot_is_of_the_claim_with_the_class_asked_for() {
        let j = job(ferry_crds::Endpoint {
            pvc: Some("db".into()),
            copy_method: Some(ferry_crds::CopyMethod::Snapshot),
            volume_snapshot_class_name: Some("csi-fast".into()),
            ..Default::default()
        });
        let s = snapshot_of_claim(&j, "db", None);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("ferry-snapshot-0f1e2d3c-aaaa-bbbb-cccc-000000000001")
        );
        assert!(made_for(&s.metadata, &j));
        assert_eq!(
            s.data["spec"],
            json!({"source": {"persistentVolumeClaimName": "db"}, "volumeSnapshotClassName": "csi-fast"})
        );
        // Another job's objects are not this one's.
        let mut other = j.clone();
        other.metadata.uid = Some("another".into());
        assert!(!made_for(&s.metadata, &other));
    }

    #[test]
    fn a_snapshot_kept_as_a_base_is_owned_by_the_destination_claim_too() {
        let j = job(ferry_crds::Endpoint {
            pvc: Some("vm-disk".into()),
            copy_method: Some(ferry_crds::CopyMethod::Snapshot),
            ..Default::default()
        });
        let mut dest = PersistentVolumeClaim::default();
        dest.metadata.name = Some("backup".into());
        dest.metadata.uid = Some("99999999-aaaa-bbbb-cccc-000000000002".into());
        let s = snapshot_of_claim(&j, "vm-disk", Some(&dest));
        // Still the job's (deleted by it if the copy fails), and the claim's.
        assert!(made_for(&s.metadata, &j));
        assert_eq!(
            base_for(&s.metadata),
            Some("99999999-aaaa-bbbb-cccc-000000000002")
        );
        let owners = s.metadata.owner_references.clone().expect("owners");
        assert_eq!(owners.len(), 2);
        assert_eq!(
            (
                owners[1].kind.as_str(),
                owners[1].name.as_str(),
                owners[1].controller
            ),
            ("PersistentVolumeClaim", "backup", None)
        );
        // Without a destination to keep it for, no base.
        assert_eq!(
            base_for(&snapshot_of_claim(&j, "vm-disk", None).metadata),
            None
        );
        // A label alone makes no base: the claim must own it, and the name be the operator's.
        let mut forged = s.clone();
        forged.metadata.owner_references = Some(vec![owners[0].clone()]);
        assert_eq!(base_for(&forged.metadata), None);
        let mut renamed = s.clone();
        renamed.metadata.name = Some("nightly".into());
        assert_eq!(base_for(&renamed.metadata), None);
    }
}
