//! Endpoints resolved to what an agent needs: the host directory of a StorageRoot or a
//! PersistentVolume, and which nodes have it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, Pod,
};

/// Which nodes have a volume.
#[derive(Debug, Clone, PartialEq)]
pub enum Nodes {
    /// Nodes whose labels include all of these (a StorageRoot's nodeSelector).
    Labels(BTreeMap<String, String>),
    /// A PersistentVolume's required node affinity: any term matches (terms are ORed).
    Terms(Vec<NodeSelectorTerm>),
    /// Every node (a shared StorageRoot without a selector).
    All,
    /// One node, by name (a CSI volume, reachable where a pod mounts it).
    Named(String),
}

/// A resolved endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// Absolute path on the host of the root or volume (the endpoint's `path` is inside it).
    pub host_path: String,
    pub nodes: Nodes,
    /// The same filesystem on every node it matches (a shared StorageRoot), so a job on it
    /// can be split across agents.
    pub shared: bool,
    /// A raw block claim: `host_path` is the directory where its holder pod hands over the
    /// device ([`crate::block::fd_dir`]), not a directory to copy.
    pub block: bool,
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

impl Nodes {
    /// Whether the node with this name and these labels has the volume.
    pub fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Nodes::All => true,
            Nodes::Named(node) => node == name,
            Nodes::Labels(sel) => sel.iter().all(|(k, v)| labels.get(k) == Some(v)),
            Nodes::Terms(terms) => terms.iter().any(|t| {
                let exprs = t
                    .match_expressions
                    .iter()
                    .flatten()
                    .all(|r| requirement_matches(r, labels.get(&r.key)));
                // The only field a node selector may name is metadata.name.
                let name = name.to_string();
                let fields = t
                    .match_fields
                    .iter()
                    .flatten()
                    .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&name)));
                exprs && fields
            }),
        }
    }
}

impl Volume {
    /// Where a CopyJob's source that is another install's export is: on no node of this
    /// cluster (that install's agents serve it; the operator reads its Secret and pairs a
    /// receiver, see the operator's `import`).
    pub fn elsewhere() -> Volume {
        Volume {
            host_path: String::new(),
            shared: false,
            block: false,
            nodes: Nodes::Terms(Vec::new()),
        }
    }
}

/// How a PersistentVolume is reached on a node.
#[derive(Debug, Clone, PartialEq)]
pub enum PvAccess {
    /// A `local` or `hostPath` volume: its own host path, on the nodes of its affinity.
    Direct(Volume),
    /// A CSI volume: only through the kubelet's mount for a pod that uses it
    /// ([`from_csi_mount`]), or, a raw block volume (`block`), through the device a holder
    /// pod of the job hands over.
    Csi { block: bool },
}

/// How a PersistentVolume can be reached: the host path and nodes of a `local` or
/// `hostPath` volume, a CSI volume's need for a mounting pod, or why it cannot be.
pub fn from_pv(pv: &PersistentVolume) -> Result<PvAccess, String> {
    let spec = pv.spec.as_ref().ok_or("the PersistentVolume has no spec")?;
    let block = spec.volume_mode.as_deref() == Some("Block");
    if spec.csi.is_some() {
        return Ok(PvAccess::Csi { block });
    }
    // A `local` Block volume's path is a device node on the host, which the agent may not
    // open (its device cgroup refuses every block device, and no hostPath trick should
    // let it): a block device is reached only as the kubelet gives it to a pod.
    if block {
        return Err("a raw block volume (volumeMode: Block) that is not a CSI volume: Ferry reaches a device only through a pod the kubelet gives it to, which needs a CSI volume; use a CSI StorageClass for the claim".into());
    }
    let host_path = match (&spec.local, &spec.host_path) {
        (Some(local), _) => local.path.clone(),
        (None, Some(hp)) => hp.path.clone(),
        (None, None) => {
            return Err("only local, hostPath and CSI volumes can be used through a claim (for NFS, ask an admin for a shared StorageRoot)".into())
        }
    };
    let terms = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    if terms.is_empty() {
        return Err(
            "the PersistentVolume has no required node affinity, so its node is unknown".into(),
        );
    }
    Ok(PvAccess::Direct(Volume {
        host_path,
        nodes: Nodes::Terms(terms),
        shared: false,
        block: false,
    }))
}

/// The kubelet's root directory when `FERRY_KUBELET_DIR` does not name another.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";

/// The kubelet's root directory on the nodes: `FERRY_KUBELET_DIR` or the default.
pub fn kubelet_dir() -> String {
    std::env::var("FERRY_KUBELET_DIR")
        .ok()
        .filter(|d| d.starts_with('/'))
        .unwrap_or_else(|| DEFAULT_KUBELET_DIR.into())
}

/// Where the kubelet mounts CSI volume `pv_name` for the pod with uid `pod_uid`.
pub fn csi_mount_path(kubelet_dir: &str, pod_uid: &str, pv_name: &str) -> String {
    format!(
        "{}/pods/{pod_uid}/volumes/kubernetes.io~csi/{pv_name}/mount",
        kubelet_dir.trim_end_matches('/')
    )
}

/// The pod through which a claim's CSI volume is reached: one that mounts the claim, is
/// scheduled to a node and has not finished. Running pods come first (their volumes are
/// mounted), then writable mounts, then names in order, so the choice is stable.
pub fn mounting_pod<'a>(pods: &'a [Pod], claim: &str) -> Option<&'a Pod> {
    pods.iter()
        .filter_map(|pod| {
            let spec = pod.spec.as_ref()?;
            spec.node_name.as_deref().filter(|n| !n.is_empty())?;
            pod.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
            // Running: the kubelet has mounted its volumes (it starts containers only
            // after). Before that the mount directory is an empty directory on the node's
            // own disk, and writing there would hide data under the mount.
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase != Some("Running") {
                return None;
            }
            if pod.metadata.deletion_timestamp.is_some() {
                return None;
            }
            let read_only = spec
                .volumes
                .iter()
                .flatten()
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .filter(|c| c.claim_name == claim)
                .map(|c| c.read_only.unwrap_or(false))
                .min()?;
            let key = (read_only, pod.metadata.name.as_deref().unwrap_or_default());
            Some((key, pod))
        })
        .min_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, pod)| pod)
}

/// A claim's CSI volume `pv_name` as reached through one of `pods` (those of the claim's
/// namespace): the kubelet's mount directory for it, on that pod's node. `None` when no pod
/// mounts it.
pub fn from_csi_mount(
    kubelet_dir: &str,
    pv_name: &str,
    claim: &str,
    pods: &[Pod],
) -> Option<Volume> {
    let pod = mounting_pod(pods, claim)?;
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let uid = pod.metadata.uid.as_deref()?;
    Some(Volume {
        host_path: csi_mount_path(kubelet_dir, uid, pv_name),
        nodes: Nodes::Named(node),
        shared: false,
        block: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(key: &str, op: &str, values: &[&str]) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            match_fields: None,
        }
    }

    #[test]
    fn node_affinity_terms_are_ored_and_expressions_anded() {
        let labels: BTreeMap<String, String> =
            [("kubernetes.io/hostname".to_string(), "node-b".to_string())].into();
        let nodes = Nodes::Terms(vec![
            term("kubernetes.io/hostname", "In", &["node-a"]),
            term("kubernetes.io/hostname", "In", &["node-b"]),
        ]);
        assert!(nodes.matches("node-b", &labels));
        let nodes = Nodes::Terms(vec![term("kubernetes.io/hostname", "In", &["node-a"])]);
        assert!(!nodes.matches("node-b", &labels));
        assert!(!Nodes::Terms(vec![]).matches("node-b", &labels));
    }

    /// A pod named `name` (uid `uid-<name>`) that mounts `claims`, on `node`, in `phase`.
    fn pod(name: &str, node: Option<&str>, phase: Option<&str>, claims: &[(&str, bool)]) -> Pod {
        use k8s_openapi::api::core::v1::{
            PersistentVolumeClaimVolumeSource, PodSpec, PodStatus, Volume as PodVolume,
        };
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                volumes: Some(
                    claims
                        .iter()
                        .enumerate()
                        .map(|(i, (claim, read_only))| PodVolume {
                            name: format!("v{i}"),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: claim.to_string(),
                                read_only: Some(*read_only),
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: phase.map(|p| PodStatus {
                phase: Some(p.into()),
                ..Default::default()
            }),
        }
    }

    fn chosen<'a>(pods: &'a [Pod], claim: &str) -> Option<&'a str> {
        mounting_pod(pods, claim).and_then(|p| p.metadata.name.as_deref())
    }

    #[test]
    fn csi_mount_path_is_the_kubelet_pod_volume_directory() {
        assert_eq!(
            csi_mount_path("/var/lib/kubelet/", "1234-abcd", "pvc-9"),
            "/var/lib/kubelet/pods/1234-abcd/volumes/kubernetes.io~csi/pvc-9/mount"
        );
    }

    #[test]
    fn a_scheduled_pod_that_mounts_the_claim_is_chosen_and_pins_the_volume_to_its_node() {
        let pods = [
            pod(
                "other-claim",
                Some("node-a"),
                Some("Running"),
                &[("logs", false)],
            ),
            pod(
                "web-1",
                Some("node-b"),
                Some("Running"),
                &[("cache", false), ("data", false)],
            ),
            pod("web-0", Some("node-b"), Some("Running"), &[("data", false)]),
        ];
        // Otherwise equal, names decide: web-0 before web-1.
        assert_eq!(chosen(&pods, "data"), Some("web-0"));
        let v = from_csi_mount("/var/lib/kubelet", "pv-data", "data", &pods)
            .expect("web-0 mounts the claim");
        assert_eq!(
            v.host_path,
            "/var/lib/kubelet/pods/uid-web-0/volumes/kubernetes.io~csi/pv-data/mount"
        );
        assert_eq!(v.nodes, Nodes::Named("node-b".into()));
        assert!(v.nodes.matches("node-b", &BTreeMap::new()));
        assert!(!v.nodes.matches("node-a", &BTreeMap::new()));
    }

    #[test]
    fn only_running_pods_count_and_writable_mounts_are_preferred() {
        let pods = [
            pod("a", Some("node-a"), Some("Pending"), &[("data", false)]),
            pod("b", Some("node-b"), Some("Running"), &[("data", true)]),
            pod("c", Some("node-a"), Some("Running"), &[("data", false)]),
        ];
        assert_eq!(chosen(&pods, "data"), Some("c"));
        assert_eq!(chosen(&pods[..2], "data"), Some("b"));
        // Pending: its volume may not be mounted yet.
        assert_eq!(chosen(&pods[..1], "data"), None);
        let no_status = pod("e", Some("node-a"), None, &[("data", false)]);
        assert_eq!(chosen(&[no_status], "data"), None);
    }

    #[test]
    fn finished_terminating_and_unscheduled_pods_are_ignored() {
        let mut terminating = pod("d", Some("node-a"), Some("Running"), &[("data", false)]);
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let pods = [
            pod("a", Some("node-a"), Some("Succeeded"), &[("data", false)]),
            pod("b", Some("node-a"), Some("Failed"), &[("data", false)]),
            pod("c", None, Some("Pending"), &[("data", false)]),
            terminating,
            pod("z", Some("node-b"), Some("Running"), &[("data", false)]),
        ];
        assert_eq!(chosen(&pods, "data"), Some("z"));
        assert_eq!(chosen(&pods[..4], "data"), None);
    }

    #[test]
    fn no_pod_mounting_the_claim_means_no_volume() {
        let pods = [pod(
            "a",
            Some("node-a"),
            Some("Running"),
            &[("other", false)],
        )];
        assert_eq!(chosen(&pods, "data"), None);
        assert_eq!(
            from_csi_mount("/var/lib/kubelet", "pv", "data", &pods),
            None
        );
        assert_eq!(from_csi_mount("/var/lib/kubelet", "pv", "data", &[]), None);
    }

    #[test]
    fn csi_pvs_are_reached_through_pods_block_ones_as_devices() {
        use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};
        let mut pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: "fake.csi.ferry.dev".into(),
                    volume_handle: "h".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(from_pv(&pv), Ok(PvAccess::Csi { block: false }));
        if let Some(spec) = pv.spec.as_mut() {
            spec.volume_mode = Some("Block".into());
        }
        assert_eq!(from_pv(&pv), Ok(PvAccess::Csi { block: true }));
    }

    #[test]
    fn a_local_block_volume_is_refused_by_name_not_opened_as_a_directory() {
        use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolumeSpec};
        let pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                local: Some(LocalVolumeSource {
                    path: "/dev/sdb".into(),
                    ..Default::default()
                }),
                volume_mode: Some("Block".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            matches!(from_pv(&pv), Err(why) if why.contains("volumeMode: Block") && why.contains("CSI"))
        );
    }
}
