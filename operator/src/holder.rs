//! Holder pods: a CSI volume is reachable on a node only while a pod there mounts it (the
//! kubelet attaches and mounts it for a pod, and Ferry's agent copies through that pod's
//! volume directory). When no running pod mounts a claim a job needs, the operator starts
//! one: the Ferry image's do-nothing `pause`, nothing privileged (the `restricted` Pod
//! Security level), tiny requests, no ServiceAccount token, owned by the CopyJob, the claim
//! mounted read-only when it is the source. It is deleted when the job finishes or is
//! deleted.
//!
//! Placement: the destination's holder prefers the node where the source already is (a
//! user's pod that mounts it, or the source's holder), so that when the volumes' topology
//! allows, the copy is local (reflink, `copy_file_range`); when it does not, the scheduler
//! puts it where it can be mounted and the copy goes between nodes. A holder is made only
//! for a claim no running pod mounts: a claim in use is copied where it is, never mounted a
//! second time on another node.
//!
//! A raw block claim (`volumeMode: Block`) gets a holder of its own shape ([`pod`] with
//! `block`): the claim as `volumeDevices` at [`BLOCK_DEVICE_PATH`] and an `emptyDir`
//! ([`FD_VOLUME`]), running `ferry-agent hold-block`, which opens the device and hands its
//! descriptor to the agent over a socket there. The agent may not open a block device (its
//! device cgroup allows none); the kubelet lets this pod open its claim's, because it asked
//! for it. The holder runs as a non-root user, so the runtime must give it the device node
//! (containerd's `device_ownership_from_security_context = true`, see docs/install.md).
//! A block claim is always held by the job's own holder, never reached through a user's pod.
//!
//! A CopyExport of a CSI claim that no running pod mounts gets a holder too ([`export_pod`]):
//! the same pod, read-only, owned by the export, for as long as the export is served (it
//! is deleted when the export expires, and goes with the export). While it runs, an
//! application pod that needs the claim on another node (ReadWriteOnce), or at all
//! (ReadWriteOncePod), waits for the export to end: the docs say so.

use std::collections::BTreeMap;

use ferry_crds::{CopyExport, CopyJob};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EmptyDirVolumeSource, NodeAffinity, NodeSelectorRequirement,
    NodeSelectorTerm, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    PreferredSchedulingTerm, ResourceRequirements, SeccompProfile, SecurityContext, Volume,
    VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

use ferry_resolve::Unmounted;

/// The `emptyDir` a block claim's holder hands its device over in.
pub use ferry_resolve::block::FD_VOLUME;
/// The label naming the CopyJob (its uid) a holder pod is for.
pub use ferry_resolve::HOLDER_OF;
/// The label saying which endpoint it holds: `source` or `destination`.
pub use ferry_resolve::HOLDS;
/// The user the holder runs as (the image's, and not root).
const HOLDER_UID: i64 = 65532;
/// Where a block claim's holder has its device.
pub const BLOCK_DEVICE_PATH: &str = "/dev/ferry-block";
/// Where a block claim's holder has its [`FD_VOLUME`].
const FD_MOUNT: &str = "/ferry-fd";

use ferry_resolve::end;

/// The image of the holder pods (`FERRY_HOLDER_IMAGE`, the chart's own image); unset or
/// empty, none are made, and a job or export of a CSI claim no pod mounts waits for one.
pub fn image() -> Option<String> {
    std::env::var("FERRY_HOLDER_IMAGE")
        .ok()
        .filter(|i| !i.trim().is_empty())
}

/// A reference that makes `job` the controller of what the operator makes for it (holder
/// pods, restored claims, snapshots), so that they go when it goes.
pub fn owned_by(job: &CopyJob) -> OwnerReference {
    OwnerReference {
        api_version: "ferry.dev/v1alpha1".into(),
        kind: "CopyJob".into(),
        name: job.name_any(),
        uid: job.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The holder pod's name: `ferry-holder-<first 8 of the job's uid>-<end>`, stable, so a
/// second reconcile finds the pod the first one made.
pub fn name(job: &CopyJob, destination: bool) -> String {
    named(&job.uid().unwrap_or_default(), destination)
}

/// A holder's name from its owner's uid.
fn named(uid: &str, destination: bool) -> String {
    let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    format!("ferry-holder-{short}-{}", end(destination))
}

/// The pod that holds `claim` mounted for `job` (its source's read-only), or, `block`, as
/// a device it hands over; preferring `prefer_node` when given. The chart's `-holder-pods`
/// admission policy admits exactly this pod, field by field, to the operator's token: a
/// field set here needs its value there, and a row in `e2e/tests/hostile/holder.rs`
/// (which fails until both are there).
pub fn pod(
    job: &CopyJob,
    destination: bool,
    claim: &str,
    image: &str,
    prefer_node: Option<&str>,
    block: bool,
) -> Pod {
    let owner = Owner {
        reference: owned_by(job),
        namespace: job.namespace(),
        annotation: "ferry.dev/copyjob",
    };
    held_for(&owner, destination, claim, image, prefer_node, block)
}

/// What a holder pod is for: its owner (a CopyJob, or a CopyExport), in whose namespace
/// it runs, and the annotation that names the owner.
struct Owner {
    reference: OwnerReference,
    namespace: Option<String>,
    annotation: &'static str,
}

/// The holder pod of export `export`, which mounts its `claim` (a CSI volume no running
/// pod mounts) read-only for as long as the export is served, so that the agent of that
/// pod's node can serve it: named as a job's source holder is, from the export's uid,
/// owned by the export, no node preferred. The `-holder-pods` policy admits it as it
/// admits a job's.
pub fn export_pod(export: &CopyExport, claim: &str, image: &str) -> Pod {
    let owner = Owner {
        reference: OwnerReference {
            api_version: "ferry.dev/v1alpha1".into(),
            kind: "CopyExport".into(),
            name: export.name_any(),
            uid: export.uid().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        },
        namespace: export.namespace(),
        annotation: "ferry.dev/copyexport",
    };
    held_for(&owner, false, claim, image, None, false)
}

fn held_for(
    owner: &Owner,
    destination: bool,
    claim: &str,
    image: &str,
    prefer_node: Option<&str>,
    block: bool,
) -> Pod {
    let read_only = !destination;
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "ferry-holder".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "ferry-operator".to_string(),
        ),
        (HOLDER_OF.to_string(), owner.reference.uid.clone()),
        (HOLDS.to_string(), end(destination).to_string()),
    ]);
    let affinity = prefer_node.map(|node| Affinity {
        node_affinity: Some(NodeAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                PreferredSchedulingTerm {
                    weight: 100,
                    preference: NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        match_fields: None,
                    },
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let quantity = |q: &str| Quantity(q.to_string());
    Pod {
        metadata: ObjectMeta {
            name: Some(named(&owner.reference.uid, destination)),
            namespace: owner.namespace.clone(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                owner.annotation.to_string(),
                owner.reference.name.clone(),
            )])),
            // No blockOwnerDeletion: that would need update on the owner's finalizers, and
            // the operator deletes its holders itself anyway.
            owner_references: Some(vec![owner.reference.clone()]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            // It talks to nothing: no token, no service variables.
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(1),
            affinity,
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(HOLDER_UID),
                run_as_group: Some(HOLDER_UID),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "hold".into(),
                image: Some(image.to_string()),
                args: Some(args(destination, block)),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), quantity("1m")),
                        ("memory".to_string(), quantity("8Mi")),
                    ])),
                    limits: Some(BTreeMap::from([("memory".to_string(), quantity("32Mi"))])),
                    ..Default::default()
                }),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    read_only_root_filesystem: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        add: None,
                    }),
                    ..Default::default()
                }),
                volume_mounts: Some(vec![match block {
                    false => VolumeMount {
                        name: "data".into(),
                        mount_path: "/data".into(),
                        read_only: Some(read_only),
                        ..Default::default()
                    },
                    true => VolumeMount {
                        name: FD_VOLUME.into(),
                        mount_path: FD_MOUNT.into(),
                        ..Default::default()
                    },
                }]),
                volume_devices: block.then(|| {
                    vec![VolumeDevice {
                        name: "data".into(),
                        device_path: BLOCK_DEVICE_PATH.into(),
                    }]
                }),
                ..Default::default()
            }],
            volumes: Some(volumes(claim, read_only, block)),
            ..Default::default()
        }),
        status: None,
    }
}

/// The holder's command: the image's `ferry-agent pause` (sleeps until it is stopped), or
/// for a block claim `hold-block`, which opens the device (read-write only for a
/// destination) and hands it over until it is stopped.
fn args(destination: bool, block: bool) -> Vec<String> {
    if !block {
        return vec!["pause".into()];
    }
    let mut args: Vec<String> = [
        "hold-block",
        "--device",
        BLOCK_DEVICE_PATH,
        "--dir",
        FD_MOUNT,
    ]
    .map(String::from)
    .into();
    if destination {
        args.push("--write".into());
    }
    args
}

/// The holder's volumes: the claim, and for a block claim the small `emptyDir` its socket
/// lives in. A block claim is never marked read-only, even as a source: CSI drivers
/// (ferry-csi among them) refuse to publish a block volume read-only; the holder opens a
/// source's device `O_RDONLY` itself, and the agent checks the access mode of what it gets.
fn volumes(claim: &str, read_only: bool, block: bool) -> Vec<Volume> {
    let data = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_string(),
            read_only: (!block).then_some(read_only),
        }),
        ..Default::default()
    };
    if !block {
        return vec![data];
    }
    let fd = Volume {
        name: FD_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: None,
            size_limit: Some(Quantity("1Mi".into())),
        }),
        ..Default::default()
    };
    vec![data, fd]
}

/// What a holder pod is doing, for the job's condition: started and waiting to run, or not
/// schedulable (the scheduler's reason).
fn state(pod: &Pod, claim: &str) -> String {
    let name = pod.name_any();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    let unschedulable = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    match (node, unschedulable) {
        (None, Some(c)) => format!(
            "holder pod {name:?} for claim {claim:?} cannot be scheduled ({}): {}",
            c.reason.as_deref().unwrap_or("Unschedulable"),
            c.message.as_deref().unwrap_or("no reason given")
        ),
        (None, None) => format!(
            "Ferry started holder pod {name:?} to mount claim {claim:?}; waiting for it to be scheduled"
        ),
        (Some(node), _) => format!(
            "Ferry started holder pod {name:?} on node {node:?} to mount claim {claim:?}; waiting for it to run"
        ),
    }
}

/// Make sure every claim in `unmounted` has its holder pod, and say what they are doing
/// (the job's condition message while it waits for them). The destination's holder is made
/// once the source's place is known (a node where it is mounted, or where its holder was
/// scheduled), so that it can prefer that node.
pub async fn hold(
    client: &Client,
    ns: &str,
    job: &CopyJob,
    unmounted: &[Unmounted],
    image: &str,
) -> Result<String, kube::Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let mut said = Vec::new();
    let mut source_node: Option<String> = None;
    // The source first: the destination's holder prefers its node.
    let mut ends: Vec<&Unmounted> = unmounted.iter().collect();
    ends.sort_by_key(|u| u.destination);
    for u in ends {
        let name = name(job, u.destination);
        let existing = pods.get_opt(&name).await?;
        let pod = match existing {
            Some(p) => p,
            None => {
                let prefer = match u.destination {
                    true => u.other_node.clone().or_else(|| source_node.clone()),
                    false => u.other_node.clone(),
                };
                let source_unplaced = unmounted.iter().any(|s| !s.destination);
                if u.destination && prefer.is_none() && source_unplaced {
                    said.push(
                        "the destination's holder pod waits for the source's to be scheduled"
                            .to_string(),
                    );
                    continue;
                }
                let made = pod(
                    job,
                    u.destination,
                    &u.claim,
                    image,
                    prefer.as_deref(),
                    u.block,
                );
                start(&pods, &made, &format!("job {}", job.name_any()), &u.claim).await?
            }
        };
        if !u.destination {
            source_node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        }
        said.push(state(&pod, &u.claim));
    }
    Ok(said.join("; "))
}

/// Make sure export `export`'s holder pod for `claim` exists, and say what it is doing
/// (the export's condition message while it waits for it to run).
pub async fn hold_export(
    client: &Client,
    ns: &str,
    export: &CopyExport,
    claim: &str,
    image: &str,
) -> Result<String, kube::Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let made = export_pod(export, claim, image);
    let name = made.name_any();
    let pod = match pods.get_opt(&name).await? {
        Some(p) => p,
        None => {
            start(
                &pods,
                &made,
                &format!("export {}", export.name_any()),
                claim,
            )
            .await?
        }
    };
    Ok(state(&pod, claim))
}

/// Create holder pod `made` (for `owner`, holding `claim`); one made meanwhile under its
/// name (a second reconcile) is the one returned.
async fn start(pods: &Api<Pod>, made: &Pod, owner: &str, claim: &str) -> Result<Pod, kube::Error> {
    let name = made.name_any();
    match pods.create(&PostParams::default(), made).await {
        Ok(p) => {
            tracing::info!(%owner, pod = %name, %claim, "started a holder pod");
            Ok(p)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => pods.get(&name).await,
        Err(e) => Err(e),
    }
}

/// Delete the job's holder pods (when it finished, or is being deleted).
pub async fn release(client: &Client, ns: &str, job: &CopyJob) -> Result<(), kube::Error> {
    release_of(client, ns, job.uid(), &job.name_any()).await
}

/// Delete export `export`'s holder pod (it expired, or its source no longer needs one).
pub async fn release_export(
    client: &Client,
    ns: &str,
    export: &CopyExport,
) -> Result<(), kube::Error> {
    release_of(client, ns, export.uid(), &export.name_any()).await
}

/// Delete the holder pods of the owner whose uid is `uid` (named `owner`, for the log).
async fn release_of(
    client: &Client,
    ns: &str,
    uid: Option<String>,
    owner: &str,
) -> Result<(), kube::Error> {
    let Some(uid) = uid else {
        return Ok(());
    };
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let held = pods
        .list(&ListParams::default().labels(&format!("{HOLDER_OF}={uid}")))
        .await?;
    for p in held.items {
        match pods.delete(&p.name_any(), &Default::default()).await {
            Ok(_) => {
                tracing::info!(%owner, pod = %p.name_any(), "deleted a holder pod")
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> CopyJob {
        let mut job: CopyJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "CopyJob",
            "metadata": {"name": "move", "namespace": "team-a", "uid": "0b5e2c1e-6a4c-4a5e-9d51-1f0e7c9c2d10"},
            "spec": {"source": {"pvc": "data"}, "destination": {"pvc": "copy"}}
        }))
        .expect("a job");
        job.metadata.resource_version = Some("1".into());
        job
    }

    #[test]
    fn a_source_holder_is_restricted_read_only_and_owned_by_its_job() {
        let p = pod(&job(), false, "data", "ferry:1", None, false);
        assert_eq!(p.name_any(), "ferry-holder-0b5e2c1e-source");
        assert_eq!(p.namespace().as_deref(), Some("team-a"));
        let owner = &p.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("CopyJob", "move")
        );
        assert_eq!(owner.uid, "0b5e2c1e-6a4c-4a5e-9d51-1f0e7c9c2d10");
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(spec.automount_service_account_token, Some(false));
        let psc = spec.security_context.as_ref().expect("pod security");
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().expect("container security");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
        assert!(
            sc.privileged.is_none()
                && sc
                    .capabilities
                    .as_ref()
                    .and_then(|c| c.add.clone())
                    .is_none()
        );
        let vol = spec.volumes.as_ref().expect("volumes")[0]
            .persistent_volume_claim
            .clone()
            .expect("a claim");
        assert_eq!(
            (vol.claim_name.as_str(), vol.read_only),
            ("data", Some(true))
        );
        assert_eq!(
            c.volume_mounts.as_ref().expect("mounts")[0].read_only,
            Some(true)
        );
        assert!(spec.affinity.is_none());
    }

    #[test]
    fn a_block_holder_has_its_claim_as_a_device_and_hands_it_over_in_a_small_empty_dir() {
        for destination in [false, true] {
            let p = pod(&job(), destination, "disk", "ferry:1", None, true);
            let spec = p.spec.as_ref().expect("spec");
            let c = &spec.containers[0];
            let mut want = vec![
                "hold-block",
                "--device",
                "/dev/ferry-block",
                "--dir",
                "/ferry-fd",
            ];
            if destination {
                want.push("--write");
            }
            assert_eq!(
                c.args.as_deref(),
                Some(&want.iter().map(|a| a.to_string()).collect::<Vec<_>>()[..])
            );
            let devices = c.volume_devices.as_ref().expect("a device");
            assert_eq!((devices.len(), devices[0].name.as_str()), (1, "data"));
            assert_eq!(devices[0].device_path, BLOCK_DEVICE_PATH);
            let mounts = c.volume_mounts.as_ref().expect("the fd dir");
            assert_eq!(mounts.len(), 1);
            assert_eq!(
                (mounts[0].name.as_str(), mounts[0].mount_path.as_str()),
                ("ferry-fd", "/ferry-fd")
            );
            let vols = spec.volumes.as_ref().expect("volumes");
            assert_eq!(vols.len(), 2);
            let claim = vols[0].persistent_volume_claim.as_ref().expect("the claim");
            // Never marked read-only: drivers refuse read-only block publishing; the
            // holder opens a source's device read-only itself.
            assert_eq!((claim.claim_name.as_str(), claim.read_only), ("disk", None));
            let fd = vols[1].empty_dir.as_ref().expect("an emptyDir");
            assert_eq!(fd.size_limit, Some(Quantity("1Mi".into())));
            assert_eq!(fd.medium, None);
            // Otherwise the filesystem holder: restricted, the same name, owner and labels.
            let plain = pod(&job(), destination, "disk", "ferry:1", None, false);
            assert_eq!(p.metadata, plain.metadata);
            let plain_spec = plain.spec.as_ref().expect("spec");
            assert_eq!(spec.security_context, plain_spec.security_context);
            assert_eq!(
                c.security_context,
                plain_spec.containers[0].security_context
            );
            assert_eq!(c.resources, plain_spec.containers[0].resources);
        }
    }

    #[test]
    fn a_destination_holder_is_writable_and_prefers_the_sources_node() {
        let p = pod(&job(), true, "copy", "ferry:1", Some("node-b"), false);
        assert_eq!(p.name_any(), "ferry-holder-0b5e2c1e-destination");
        let spec = p.spec.as_ref().expect("spec");
        let vol = spec.volumes.as_ref().expect("volumes")[0]
            .persistent_volume_claim
            .clone()
            .expect("a claim");
        assert_eq!(vol.read_only, Some(false));
        let preferred = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .expect("a preference");
        let req = &preferred[0]
            .preference
            .match_expressions
            .as_ref()
            .expect("expr")[0];
        assert_eq!(req.key, "kubernetes.io/hostname");
        assert_eq!(req.values.as_deref(), Some(&["node-b".to_string()][..]));
        // Preferred, not required: a volume that cannot be mounted there goes elsewhere
        // and the copy goes between nodes.
        assert!(spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| n
                .required_during_scheduling_ignored_during_execution
                .as_ref())
            .is_none());
    }
}
