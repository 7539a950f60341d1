//! Endpoints to volumes: validation, then each endpoint (a PVC, or a StorageRoot this
//! namespace may use) resolved to a host path and the nodes that have it; label selector
//! matching; and the nodes with a live agent that have both volumes. Refusals come back as
//! [`Blocked`] values, API failures as errors.

use ferry_crds::{ConditionType, CopyJob, Endpoint, Reason, StorageRoot};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::{Api, Client, ResourceExt};

pub mod block;
mod export;
mod nodes;
mod pods;
pub mod snapshot;
pub mod validate;
pub mod volume;

pub use export::{export_reach, export_source};
pub use nodes::{eligible_nodes, selector_matches, Reachable};
use pods::{block_holder, holder_of, running_pods_with_claims};
pub use pods::{end, pods_with_claims, uses_claim, HOLDER_OF, HOLDS};
pub use snapshot::{from_snapshot, restore_claim, taken_snapshot, TAKEN_SNAPSHOT_PREFIX};
use volume::{Nodes, PvAccess, Volume};

/// Why a job cannot proceed, as a condition reason and a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub condition: ConditionType,
    pub reason: Reason,
    pub message: String,
}

/// Where a job's endpoints stand when a reconcile decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoints {
    /// Not looked at: the job finished before, and is history (a StorageRoot deleted or a
    /// pod unmounting a CSI volume afterwards does not turn it back to Pending).
    Finished,
    /// The job cannot go on.
    Blocked(Blocked),
    /// Both endpoints resolved.
    Resolved { source: Volume, destination: Volume },
}

/// How an endpoint is reached, from objects only admins (or Kubernetes) write: a host path
/// on the nodes that have it, or a CSI volume, reached through the kubelet's mount for a
/// pod that uses it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reach {
    Direct(Volume),
    Csi {
        /// Its volume; `None` for a claim of a `WaitForFirstConsumer` class not bound yet
        /// (a holder pod is the consumer it waits for; nothing can be copied before).
        pv_name: Option<String>,
        claim: String,
        /// A `ReadWriteOncePod` claim: only one pod may use it, so Ferry reaches it only
        /// through its own holder, never through a user's pod.
        exclusive: bool,
        /// A raw block claim (`volumeMode: Block`): reached only through the job's own
        /// holder, which hands over the device.
        block: bool,
        /// Its volume's capacity in bytes (the claim's request while it is unbound), when
        /// given in a form [`block::quantity_bytes`] reads.
        capacity: Option<u64>,
    },
}

impl Reach {
    /// What [`block::check_pair`] needs of an end.
    fn block_end(&self) -> block::End {
        match self {
            Reach::Csi {
                block, capacity, ..
            } => block.then_some(*capacity),
            Reach::Direct(_) => None,
        }
    }
}

/// Both ends filesystems, or both raw block claims a device copy fits ([`block::check_pair`]).
fn modes_agree(job: &CopyJob, src: &Reach, dst: &Reach) -> Result<(), Blocked> {
    if job.spec.check.is_some() && dst.block_end().is_some() {
        return Err(Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::NotForBlock,
            message: "spec.check reads files against a manifest, and spec.destination is a raw block claim (volumeMode: Block), which has no files: a copy between block claims checks every chunk by its hash on each re-run instead".into(),
        });
    }
    block::check_pair(job, src.block_end(), dst.block_end()).map_err(|r| Blocked {
        condition: ConditionType::Accepted,
        reason: r.reason,
        message: r.message,
    })
}

/// The claim's volume mode and requested size (for a claim not bound yet).
fn claim_shape(pvc: &PersistentVolumeClaim) -> (bool, Option<u64>) {
    let spec = pvc.spec.as_ref();
    let block = spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let request = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| block::quantity_bytes(&q.0));
    (block, request)
}

/// The job's destination as [`block::check_pair`] sees it before anything of the job is
/// made (a snapshot source checked before it is restored): a root or a filesystem claim is
/// `None`, a block claim its capacity (the bound volume's, else the request). `Ok(None)`
/// when the claim is not there: resolving it later says so.
pub async fn destination_end(
    client: &Client,
    ns: &str,
    job: &CopyJob,
) -> Result<Option<block::End>, kube::Error> {
    let Some(name) = &job.spec.destination.pvc else {
        return Ok(Some(None));
    };
    let Some(pvc) = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(claim_end(&pvc)))
}

/// A claim as [`block::check_pair`] sees it: `None` for a filesystem claim, a block
/// claim's capacity (its bound volume's, as the claim's status says, else its request).
pub fn claim_end(pvc: &PersistentVolumeClaim) -> block::End {
    let (block, request) = claim_shape(pvc);
    let bound = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| block::quantity_bytes(&q.0));
    block.then_some(bound.or(request))
}

/// Why an endpoint does not resolve (yet): the job's `Resolved` condition.
fn unresolved(reason: Reason, message: String) -> Blocked {
    Blocked {
        condition: ConditionType::Resolved,
        reason,
        message,
    }
}

/// Check a PVC endpoint: a claim in the job's own namespace, bound to its volume, which is
/// a `local` or `hostPath` PersistentVolume (its node affinity says where it lives) or a
/// CSI volume.
async fn reach_pvc(
    client: &Client,
    ns: &str,
    field: &str,
    claim: &str,
    destination: bool,
) -> Result<Result<Reach, Blocked>, kube::Error> {
    let Some(pvc) = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(claim)
        .await?
    else {
        return Ok(Err(unresolved(Reason::PVCNotFound, format!("{field}.pvc: no PersistentVolumeClaim {claim:?} in namespace {ns:?} (claims of other namespaces cannot be used)"))));
    };
    if let Err(blocked) = claim_is_bound(field, ns, claim, &pvc) {
        // A claim of a WaitForFirstConsumer class is bound only once a pod that uses it is
        // scheduled: the operator's holder pod can be that pod, like any other CSI claim
        // that no pod mounts.
        if waits_for_first_consumer(client, &pvc).await? {
            let (block, capacity) = claim_shape(&pvc);
            return Ok(Ok(Reach::Csi {
                pv_name: None,
                claim: claim.to_string(),
                exclusive: exclusive(&pvc),
                block,
                capacity,
            }));
        }
        return Ok(Err(blocked));
    }
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let Some(pv) = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&pv_name)
        .await?
    else {
        return Ok(Err(unresolved(
            Reason::PVCNotBound,
            format!("{field}.pvc: claim {claim:?} names volume {pv_name:?}, which does not exist"),
        )));
    };
    if let Err(blocked) = volume_is_the_claims(field, ns, claim, &pvc, &pv) {
        return Ok(Err(blocked));
    }
    if destination {
        if let Err(blocked) = writable(field, claim, &pvc, &pv) {
            return Ok(Err(blocked));
        }
    }
    match volume::from_pv(&pv) {
        Ok(PvAccess::Direct(v)) => Ok(Ok(Reach::Direct(v))),
        Ok(PvAccess::Csi { block }) => Ok(Ok(Reach::Csi {
            pv_name: Some(pv_name),
            claim: claim.to_string(),
            exclusive: exclusive(&pvc),
            block,
            capacity: pv
                .spec
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .and_then(|q| block::quantity_bytes(&q.0)),
        })),
        Err(why) => Ok(Err(unresolved(
            Reason::VolumeNotSupported,
            format!("{field}.pvc: volume {pv_name:?}: {why}"),
        ))),
    }
}

/// A raw block claim is reached only through the job's own holder pod, which hands its
/// device to the agent on the holder's node; never while a pod that is not Ferry's uses
/// it (a device read or written under another writer is torn: no filesystem keeps it
/// consistent).
async fn through_the_holder(
    client: &Client,
    ns: &str,
    field: &str,
    pv_name: Option<&str>,
    claim: &str,
    destination: bool,
    job_uid: &str,
) -> Result<Result<Volume, Blocked>, kube::Error> {
    let not_held = |message| unresolved(Reason::VolumeNotMounted, message);
    let Some(pv_name) = pv_name else {
        return Ok(Err(not_held(format!("{field}.pvc: raw block claim {claim:?} waits for its first consumer; Ferry's holder pod for it is that consumer, waiting to be scheduled"))));
    };
    let pods = running_pods_with_claims(client, ns).await?;
    let user = pods.iter().find(|p| {
        uses_claim(p, claim) && !holder_of(p, job_uid) && p.metadata.deletion_timestamp.is_none()
    });
    if let Some(user) = user {
        let or_snapshot = if destination {
            ""
        } else {
            ", or copy a snapshot of it (spec.source.copyMethod: Snapshot)"
        };
        return Ok(Err(unresolved(Reason::VolumeInUse, format!("{field}.pvc: raw block claim {claim:?} is used by pod {:?}, and a device copied while another pod uses it is torn (no filesystem keeps it consistent), so Ferry waits: stop that pod (scale its workload to zero){or_snapshot}", user.name_any()))));
    }
    let held = block_holder(&pods, claim, job_uid, destination).and_then(|pod| {
        let node = pod.spec.as_ref()?.node_name.clone()?;
        Some(Volume {
            host_path: block::fd_dir(&volume::kubelet_dir(), pod.metadata.uid.as_deref()?),
            nodes: Nodes::Named(node),
            shared: false,
            block: true,
        })
    });
    Ok(held.ok_or_else(|| not_held(format!("{field}.pvc: raw block claim {claim:?} (volume {pv_name:?}) is reached through a holder pod of Ferry's, which opens the device and hands it to the agent; waiting for it to run"))))
}

/// Whether a claim asks that only one pod at a time use its volume.
fn exclusive(pvc: &PersistentVolumeClaim) -> bool {
    pvc.spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
}

/// A CSI volume is reached through the kubelet's mount for a running pod of the claim's
/// namespace that uses it, on that pod's node. An exclusive claim only through the job's
/// own holder: a user's pod that has it is its one user, and Ferry does not share it.
#[allow(clippy::too_many_arguments)]
async fn through_a_pod(
    client: &Client,
    ns: &str,
    field: &str,
    pv_name: Option<&str>,
    claim: &str,
    exclusive: bool,
    job_uid: &str,
) -> Result<Result<Volume, Blocked>, kube::Error> {
    let not_mounted = |message| unresolved(Reason::VolumeNotMounted, message);
    // Not bound yet when the claim was read: the next look finds its volume.
    let Some(pv_name) = pv_name else {
        return Ok(Err(not_mounted(format!("{field}.pvc: claim {claim:?} waits for its first consumer (its StorageClass binds volumes only for a scheduled pod); start a pod in namespace {ns:?} that mounts it (a pause pod is enough) and Ferry will copy on that pod's node"))));
    };
    let pods = running_pods_with_claims(client, ns).await?;
    if exclusive {
        if let Some(user) = volume::mounting_pod(&pods, claim).filter(|p| !holder_of(p, job_uid)) {
            return Ok(Err(unresolved(Reason::VolumeInUse, format!("{field}.pvc: claim {claim:?} is ReadWriteOncePod and pod {:?} uses it; only one pod may, so Ferry waits: stop that pod (scale its workload to zero) and Ferry mounts the claim itself and copies", user.name_any()))));
        }
    }
    Ok(
        volume::from_csi_mount(&volume::kubelet_dir(), pv_name, claim, &pods).ok_or_else(
            || not_mounted(format!("{field}.pvc: CSI volume {pv_name:?} is only reachable while a pod mounts it; start a pod in namespace {ns:?} that mounts claim {claim:?} (a pause pod is enough) and Ferry will copy on that pod's node")),
        ),
    )
}

/// Whether an unbound claim waits for a pod to be scheduled before its volume is
/// provisioned or bound: its StorageClass's `volumeBindingMode` is `WaitForFirstConsumer`.
pub async fn waits_for_first_consumer(
    client: &Client,
    pvc: &PersistentVolumeClaim,
) -> Result<bool, kube::Error> {
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    let class = pvc
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref());
    let (Some("Pending"), Some(class)) = (phase, class) else {
        return Ok(false);
    };
    if class.is_empty() {
        return Ok(false);
    }
    Ok(Api::<StorageClass>::all(client.clone())
        .get_opt(class)
        .await?
        .and_then(|c| c.volume_binding_mode)
        .as_deref()
        == Some("WaitForFirstConsumer"))
}

/// A claim is the tenant's way to a volume only once Kubernetes has bound it: its phase is
/// `Bound` and it names its volume. `spec.volumeName` alone is what the tenant asked for,
/// not what the PV controller granted.
fn claim_is_bound(
    field: &str,
    ns: &str,
    claim: &str,
    pvc: &PersistentVolumeClaim,
) -> Result<(), Blocked> {
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    let named = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    match (phase, named) {
        (Some("Bound"), Some(v)) if !v.is_empty() => Ok(()),
        _ => Err(unresolved(
            Reason::PVCNotBound,
            format!(
                "{field}.pvc: claim {claim:?} in namespace {ns:?} is not bound to a volume yet (phase {}); Ferry copies once Kubernetes has bound it",
                phase.unwrap_or("unknown")
            ),
        )),
    }
}

/// The volume must be bound to this very claim: its `claimRef` names the claim's namespace,
/// name and uid (a claim deleted and re-created under the same name has a new uid, and a
/// volume pre-bound to a name only is not bound until the PV controller sets the uid).
fn volume_is_the_claims(
    field: &str,
    ns: &str,
    claim: &str,
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Result<(), Blocked> {
    let pv_name = pv.name_any();
    let cr = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let uid = pvc.metadata.uid.as_deref();
    let mine = cr.is_some_and(|cr| {
        cr.namespace.as_deref() == Some(ns)
            && cr.name.as_deref() == Some(claim)
            && uid.is_some()
            && cr.uid.as_deref() == uid
    });
    if mine {
        return Ok(());
    }
    Err(Blocked {
        condition: ConditionType::Accepted,
        reason: Reason::CrossNamespace,
        message: format!("{field}.pvc: volume {pv_name:?} is not bound to claim {claim:?} of namespace {ns:?} (its claimRef names another claim, or none); use a claim Kubernetes has bound to its volume"),
    })
}

/// A claim is a destination only if nothing about it says read-only: a claim or a volume
/// whose access modes are all `ReadOnlyMany`, or a CSI volume published read-only. (A pod
/// could not write there either; the agent, privileged, could, so it must not.)
fn writable(
    field: &str,
    claim: &str,
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
) -> Result<(), Blocked> {
    let read_only_modes = |modes: Option<&Vec<String>>| {
        modes.is_some_and(|m| !m.is_empty() && m.iter().all(|m| m == "ReadOnlyMany"))
    };
    let why = if read_only_modes(pvc.spec.as_ref().and_then(|s| s.access_modes.as_ref())) {
        Some("the claim's access modes are ReadOnlyMany only")
    } else if read_only_modes(pv.spec.as_ref().and_then(|s| s.access_modes.as_ref())) {
        Some("its volume's access modes are ReadOnlyMany only")
    } else if pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .and_then(|c| c.read_only)
        == Some(true)
    {
        Some("its CSI volume is published read-only")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::ReadOnlyRoot,
            message: format!("{field}.pvc: claim {claim:?} is read-only ({why}) and cannot be a destination; use a writable claim"),
        }),
    }
}

/// Check one endpoint of the job whose uid is `job_uid` and say how it is reached. A
/// snapshot source is reached as the claim it is restored to.
pub(crate) async fn reach(
    client: &Client,
    ns: &str,
    field: &str,
    e: &Endpoint,
    destination: bool,
    job_uid: &str,
) -> Result<Result<Reach, Blocked>, kube::Error> {
    if !destination && from_snapshot(e) {
        return reach_pvc(client, ns, field, &restore_claim(job_uid), false).await;
    }
    if e.export.is_some() {
        return Ok(Ok(Reach::Direct(Volume::elsewhere())));
    }
    if let Some(claim) = &e.pvc {
        return reach_pvc(client, ns, field, claim, destination).await;
    }
    Ok(resolve_root(client, ns, field, e, destination)
        .await?
        .map(|root| {
            Reach::Direct(Volume {
                host_path: root.spec.path.clone(),
                shared: root.spec.shared,
                block: false,
                nodes: match (&root.spec.node_selector, root.spec.shared) {
                    (Some(sel), _) => Nodes::Labels(sel.clone()),
                    (None, true) => Nodes::All,
                    // Admission refuses this; no node has it.
                    (None, false) => Nodes::Terms(Vec::new()),
                },
            })
        }))
}

/// One endpoint of the job whose uid is `job_uid`, as reached ([`reach`]), to a host
/// path and the nodes that have it.
async fn resolve(
    client: &Client,
    ns: &str,
    field: &str,
    reached: Reach,
    destination: bool,
    job_uid: &str,
) -> Result<Result<Volume, Blocked>, kube::Error> {
    match reached {
        Reach::Direct(v) => Ok(Ok(v)),
        Reach::Csi {
            pv_name,
            claim,
            block: true,
            ..
        } => {
            through_the_holder(
                client,
                ns,
                field,
                pv_name.as_deref(),
                &claim,
                destination,
                job_uid,
            )
            .await
        }
        Reach::Csi {
            pv_name,
            claim,
            exclusive,
            ..
        } => {
            through_a_pod(
                client,
                ns,
                field,
                pv_name.as_deref(),
                &claim,
                exclusive,
                job_uid,
            )
            .await
        }
    }
}

/// A CSI claim of a job that no running pod mounts: Ferry reaches it only through a pod
/// that does, so the operator may start one (a holder) for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmounted {
    /// Whether it is the job's destination (else its source: held read-only).
    pub destination: bool,
    pub claim: String,
    /// The node where the job's other endpoint is already reachable (a pod mounts it), if
    /// it is a claim: a holder goes there when it can, and the copy is then local.
    pub other_node: Option<String>,
    /// A raw block claim (`volumeMode: Block`): held as a device (`volumeDevices`) by a
    /// holder that hands its descriptor to the agent (`ferry-agent hold-block`).
    pub block: bool,
}

/// The job's CSI claims that no running pod of its namespace mounts. Endpoints that do not
/// resolve for another reason are left out (the job is refused for that reason anyway).
pub async fn unmounted_claims(
    client: &Client,
    ns: &str,
    job: &CopyJob,
) -> Result<Vec<Unmounted>, kube::Error> {
    let mut csi = Vec::new();
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    for (field, e, destination) in ends(job) {
        if e.pvc.is_none() && e.snapshot.is_none() {
            continue;
        }
        if let Ok(Reach::Csi { claim, block, .. }) =
            reach(client, ns, field, e, destination, uid).await?
        {
            csi.push((destination, claim, block));
        }
    }
    // A check job's one claim is both of its ends: held once.
    csi.dedup();
    if csi.is_empty() {
        return Ok(Vec::new());
    }
    let pods = running_pods_with_claims(client, ns).await?;
    // Where an end is reachable now: a raw block claim only through the job's own holder.
    let node_of = |destination: bool, claim: &str, block: bool| {
        let pod = match block {
            true => block_holder(&pods, claim, uid, destination),
            false => volume::mounting_pod(&pods, claim),
        };
        pod.and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone())
    };
    Ok(csi
        .iter()
        .filter(|(destination, claim, block)| node_of(*destination, claim, *block).is_none())
        .map(|(destination, claim, block)| Unmounted {
            destination: *destination,
            claim: claim.clone(),
            other_node: csi
                .iter()
                .find(|(d, _, _)| d != destination)
                .and_then(|(d, other, b)| node_of(*d, other, *b)),
            block: *block,
        })
        .collect())
}

/// Resolve one `root` endpoint: the StorageRoot exists, this namespace may use it, and a
/// destination is not read-only.
async fn resolve_root(
    client: &Client,
    ns: &str,
    field: &str,
    e: &Endpoint,
    destination: bool,
) -> Result<Result<StorageRoot, Blocked>, kube::Error> {
    let name = e.root.as_deref().unwrap_or_default();
    let roots = Api::<StorageRoot>::all(client.clone());
    let Some(root) = roots.get_opt(name).await? else {
        return Ok(Err(unresolved(Reason::RootNotFound, format!("{field}.root: StorageRoot {name:?} does not exist; ask an admin to create it or name another"))));
    };
    let access = &root.spec.namespaces;
    let mut allowed = access.names.iter().any(|n| n == ns);
    if !allowed {
        if let Some(selector) = &access.selector {
            let namespace = Api::<Namespace>::all(client.clone()).get(ns).await?;
            allowed = selector_matches(selector, namespace.labels());
        }
    }
    if !allowed {
        return Ok(Err(Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::RootNotAllowed,
            message: format!(
                "{field}.root: namespace {ns:?} may not use StorageRoot {name:?}; ask an admin to add it to spec.namespaces"
            ),
        }));
    }
    if destination && root.spec.read_only {
        return Ok(Err(Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::ReadOnlyRoot,
            message: format!(
                "{field}.root: StorageRoot {name:?} is read-only and cannot be a destination"
            ),
        }));
    }
    Ok(Ok(root))
}

/// The job's spec checked and how each endpoint is reached, without looking at pods: what
/// an agent decides with, so that the host paths it opens follow from the job and from
/// objects only admins write, never from the job's status (which an agent token can write).
pub async fn reach_both(
    client: &Client,
    ns: &str,
    job: &CopyJob,
) -> Result<Result<(Reach, Reach), Blocked>, kube::Error> {
    if let Some(b) = refused(job) {
        return Ok(Err(b));
    }
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let [(sf, src, sd), (df, dst, dd)] = ends(job);
    let source = match reach(client, ns, sf, src, sd, uid).await? {
        Err(b) => return Ok(Err(b)),
        Ok(src) => src,
    };
    let destination = match reach(client, ns, df, dst, dd, uid).await? {
        Err(b) => return Ok(Err(b)),
        Ok(dst) => dst,
    };
    Ok(modes_agree(job, &source, &destination).map(|()| (source, destination)))
}

/// The job's spec refused by validation, as a `Blocked`.
fn refused(job: &CopyJob) -> Option<Blocked> {
    let generation = job.metadata.generation;
    validate::validate_memo(job.metadata.uid.as_deref(), generation, &job.spec)
        .err()
        .map(|refusal| Blocked {
            condition: ConditionType::Accepted,
            reason: refusal.reason,
            message: refusal.message,
        })
}

/// The job's endpoints: field name, endpoint, whether it is the destination. A check job
/// (`spec.check`) only reads its destination: it is both ends, as a source is (a read-only
/// root or claim will do, and a holder mounts it read-only), so it resolves to one
/// volume and one node, where the check runs as a copy on one node would.
fn ends(job: &CopyJob) -> [(&'static str, &Endpoint, bool); 2] {
    let dst = &job.spec.destination;
    match job.spec.check {
        Some(_) => [
            ("spec.destination", dst, false),
            ("spec.destination", dst, false),
        ],
        None => [
            ("spec.source", &job.spec.source, false),
            ("spec.destination", dst, true),
        ],
    }
}

/// Validate the spec and resolve both endpoints: [`Endpoints::Resolved`], or
/// [`Endpoints::Blocked`] with why it cannot go on.
pub async fn check(client: &Client, ns: &str, job: &CopyJob) -> Result<Endpoints, kube::Error> {
    if let Some(b) = refused(job) {
        return Ok(Endpoints::Blocked(b));
    }
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let [(sf, src, sd), (df, dst, dd)] = ends(job);
    let source = match reach(client, ns, sf, src, sd, uid).await? {
        Err(b) => return Ok(Endpoints::Blocked(b)),
        Ok(src) => src,
    };
    let destination = match reach(client, ns, df, dst, dd, uid).await? {
        Err(b) => return Ok(Endpoints::Blocked(b)),
        Ok(dst) => dst,
    };
    if let Err(b) = modes_agree(job, &source, &destination) {
        return Ok(Endpoints::Blocked(b));
    }
    let source = match resolve(client, ns, sf, source, sd, uid).await? {
        Err(b) => return Ok(Endpoints::Blocked(b)),
        Ok(src) => src,
    };
    let destination = match resolve(client, ns, df, destination, dd, uid).await? {
        Err(b) => return Ok(Endpoints::Blocked(b)),
        Ok(dst) => dst,
    };
    Ok(Endpoints::Resolved {
        source,
        destination,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim and a volume as JSON (what `kubectl get -o json` shows).
    fn pair(pvc: &str, pv: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        (
            serde_json::from_str(pvc).expect("claim json"),
            serde_json::from_str(pv).expect("volume json"),
        )
    }

    const CLAIM: &str = r#"{"metadata": {"name": "data", "namespace": "team", "uid": "u-1"}, "spec": {"volumeName": "pv1"}, "status": {"phase": "Bound"}}"#;
    const VOLUME: &str = r#"{"metadata": {"name": "pv1"}, "spec": {"hostPath": {"path": "/"}, "claimRef": {"namespace": "team", "name": "data", "uid": "u-1"}}}"#;

    #[test]
    fn a_claim_bound_by_kubernetes_to_a_volume_bound_back_to_it_by_uid_resolves() {
        let (pvc, pv) = pair(CLAIM, VOLUME);
        assert_eq!(claim_is_bound("spec.source", "team", "data", &pvc), Ok(()));
        assert_eq!(
            volume_is_the_claims("spec.source", "team", "data", &pvc, &pv),
            Ok(())
        );
    }

    #[test]
    fn a_claim_that_only_names_a_volume_is_not_bound() {
        for claim in [
            CLAIM.replace(r#""phase": "Bound""#, r#""phase": "Pending""#),
            CLAIM.replace(r#", "status": {"phase": "Bound"}"#, ""),
            CLAIM.replace(r#""volumeName": "pv1""#, ""),
        ] {
            let (pvc, _) = pair(&claim, VOLUME);
            let blocked = claim_is_bound("spec.source", "team", "data", &pvc)
                .expect_err("an unbound claim resolved");
            assert_eq!(blocked.reason, Reason::PVCNotBound);
            assert!(blocked.message.contains("not bound"), "{}", blocked.message);
        }
    }

    #[test]
    fn a_volume_is_only_reached_through_the_claim_its_claim_ref_names_with_its_uid() {
        for volume in [
            // Available: no claimRef at all (a hostPath: / an admin left unclaimed).
            VOLUME.replace(
                r#", "claimRef": {"namespace": "team", "name": "data", "uid": "u-1"}"#,
                "",
            ),
            // Pre-bound by name only: not bound until the PV controller sets the uid.
            VOLUME.replace(r#", "uid": "u-1""#, ""),
            // Bound to an earlier claim of the same name, since deleted.
            VOLUME.replace("u-1", "u-0"),
            VOLUME.replace(r#""namespace": "team""#, r#""namespace": "other""#),
            VOLUME.replace(r#""name": "data""#, r#""name": "theirs""#),
        ] {
            assert_ne!(volume, VOLUME, "the case changes nothing");
            let (pvc, pv) = pair(CLAIM, &volume);
            let blocked = volume_is_the_claims("spec.source", "team", "data", &pvc, &pv)
                .expect_err("a volume not bound to the claim resolved");
            assert_eq!(blocked.reason, Reason::CrossNamespace, "{volume}");
        }
    }

    #[test]
    fn a_read_only_claim_or_volume_is_no_destination() {
        let (pvc, pv) = pair(CLAIM, VOLUME);
        assert_eq!(writable("spec.destination", "data", &pvc, &pv), Ok(()));
        let ro_claim = CLAIM.replace(
            r#""volumeName": "pv1""#,
            r#""volumeName": "pv1", "accessModes": ["ReadOnlyMany"]"#,
        );
        let ro_volume = VOLUME.replace(
            r#""hostPath""#,
            r#""accessModes": ["ReadOnlyMany"], "hostPath""#,
        );
        let ro_csi = VOLUME.replace(
            r#""hostPath": {"path": "/"}"#,
            r#""csi": {"driver": "d", "volumeHandle": "h", "readOnly": true}"#,
        );
        for (claim, volume) in [
            (ro_claim.as_str(), VOLUME),
            (CLAIM, &ro_volume),
            (CLAIM, &ro_csi),
        ] {
            let (pvc, pv) = pair(claim, volume);
            let blocked = writable("spec.destination", "data", &pvc, &pv)
                .expect_err("a read-only claim was accepted as a destination");
            assert_eq!(blocked.reason, Reason::ReadOnlyRoot);
            assert!(blocked.message.contains("read-only"), "{}", blocked.message);
        }
        // ReadWriteOnce next to ReadOnlyMany is writable.
        let rw = CLAIM.replace(
            r#""volumeName": "pv1""#,
            r#""volumeName": "pv1", "accessModes": ["ReadOnlyMany", "ReadWriteOnce"]"#,
        );
        let (pvc, pv) = pair(&rw, VOLUME);
        assert_eq!(writable("spec.destination", "data", &pvc, &pv), Ok(()));
    }
}
