//! Between two real clusters: the tier's cluster (east, the source) and a second one beside
//! it (west, `FERRY_KUBE_INSTANCE=2`), each a kubelet with containerd and the CSI driver in
//! its own network namespace, the two joined by one veth pair and nothing else. Both charts
//! are upgraded to peering, the agents reached at their node's address (`peering.hostPort`,
//! the CNI's portmap) and the NetworkPolicies enforced (kube-router: `peering.from` lets the
//! other cluster in, `peering.egress` lets the reader out); the admins pair them with what
//! each publishes. A tenant of east exports a CSI claim no pod mounts (the operator's holder
//! pod mounts it, read-only), a tenant of west carries the Secret and copies it into a claim
//! of its own, verified by checksum: identical. Deleting the export lets its holder go (the
//! garbage collector, by its owner). The host forwards no packet of either.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::kube::{KubeTier, SecondCluster, NODE, NODE_IP, SECOND_NODE_IP};
use ferry_e2e::{assert_same_tree, wait_for, Kubectl};

use super::rich_tree;

const NS: &str = "shop";
const WITHIN: Duration = Duration::from_secs(120);
/// The link's addresses (e2e/kube/link.sh): what a connection from the other cluster
/// comes from, masqueraded as it leaves its pod network.
const LINK_CIDR: &str = "10.250.0.0/30";

/// Peering on, as an admin of each cluster turns it on: named `name`, reached at the node's
/// address, open to the other cluster's link and allowed to dial the other node's port.
fn peering_values(name: &str, other_node: &str) -> Vec<String> {
    vec![
        "upgrade".into(),
        "ferry".into(),
        "charts/ferry".into(),
        "-n".into(),
        "ferry-system".into(),
        "--reuse-values".into(),
        "--set".into(),
        "peering.enabled=true".into(),
        "--set".into(),
        format!("peering.installName={name}"),
        "--set".into(),
        "peering.hostPort=true".into(),
        "--set".into(),
        format!("peering.from[0].ipBlock.cidr={LINK_CIDR}"),
        "--set-json".into(),
        format!(
            r#"peering.egress=[{{"to":[{{"ipBlock":{{"cidr":"{other_node}/32"}}}}],"ports":[{{"port":7451,"protocol":"TCP"}}]}}]"#
        ),
        "--wait".into(),
        "--timeout=180s".into(),
    ]
}

/// What an install publishes for its peers (the ferry-peering ConfigMap's FerryPeer), once
/// it is there.
fn published(kc: &Kubectl) -> Result<String> {
    let mut peer = String::new();
    wait_for("the ferry-peering ConfigMap", WITHIN, || {
        peer = kc
            .get(
                "configmap/ferry-peering",
                "ferry-system",
                "{.data.ferrypeer\\.yaml}",
            )
            .unwrap_or_default();
        !peer.is_empty()
    })?;
    Ok(peer)
}

pub fn export_of_a_csi_claim_copied_to_another_cluster(tier: &KubeTier, _: &Path) -> Result<()> {
    let west = SecondCluster::up()?;
    let (east, west_kc): (&Kubectl, &Kubectl) = (tier, &west);
    // The admins: peering on in both, each applying the FerryPeer the other publishes.
    let args = peering_values("east", SECOND_NODE_IP);
    tier.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    let args = peering_values("west", NODE_IP);
    west.helm(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    west_kc.apply(&published(east)?)?;
    east.apply(&published(west_kc)?)?;
    for (kc, peer) in [(east, "west"), (west_kc, "east")] {
        kc.wait_until(
            &format!("ferrypeer/{peer}"),
            "",
            "{.status.conditions[?(@.type==\"Valid\")].status}",
            WITHIN,
            |v| v == "True",
        )?;
    }

    // East's tenant: a claim of the CSI driver with data, no pod mounting it, exported.
    east.kubectl_ok(&["create", "namespace", NS])?;
    super::csi::claim(tier, NS, "db-data", "ferry-csi", "ReadWriteOnce")?;
    east.wait_claim_bound(NS, "db-data")?;
    let src = super::csi::volume_dir(tier, NS, "db-data")?.join("db");
    rich_tree(&src)?;
    east.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyExport\nmetadata: {{name: db, namespace: {NS}}}\nspec:\n  source: {{pvc: db-data, path: db}}\n  readers: [{{peer: west, namespace: {NS}}}]\n  ttl: 2h\n"
    ))?;
    let mut ready = String::new();
    wait_for("the export Ready", WITHIN, || {
        ready = east
            .get(
                "copyexport/db",
                NS,
                "{.status.conditions[?(@.type==\"Ready\")].reason} {.status.address} {.status.node}",
            )
            .unwrap_or_default();
        ready.starts_with("Ready ")
    })
    .with_context(|| ready.clone())?;
    // Served at the node's own address: the hostPort.
    ensure!(
        ready == format!("Ready {NODE_IP}:7451 {NODE}"),
        "the export: {ready}"
    );
    let uid = east.get("copyexport/db", NS, "{.metadata.uid}")?;
    let holder = format!("ferry-holder-{}-source", &uid.replace('-', "")[..8]);
    let held = east.get(
        &format!("pod/{holder}"),
        NS,
        "{.status.phase} {.metadata.ownerReferences[0].kind} {.spec.volumes[0].persistentVolumeClaim.readOnly}",
    )?;
    ensure!(
        held == "Running CopyExport true",
        "the export's holder: {held}"
    );

    // West's tenant: the Secret carried over, the operator let read it, a claim, the job.
    let secret = east.kubectl_ok(&["get", "secret", "db-ferry-export", "-n", NS, "-o", "json"])?;
    let secret: serde_json::Value = serde_json::from_str(&secret)?;
    west_kc.kubectl_ok(&["create", "namespace", NS])?;
    west_kc.apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db-ferry-export", "namespace": NS},
            "type": secret["type"], "data": secret["data"]})
        .to_string(),
    )?;
    for what in ["role", "rolebinding"] {
        let mut args = vec!["-n", NS, "create", what, "ferry-reads-db"];
        match what {
            "role" => args.extend([
                "--verb=get",
                "--resource=secrets",
                "--resource-name=db-ferry-export",
            ]),
            _ => args.extend([
                "--role=ferry-reads-db",
                "--serviceaccount=ferry-system:ferry-operator",
            ]),
        }
        west_kc.kubectl_ok(&args)?;
    }
    west_kc.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: db-data, namespace: {NS}}}\nspec:\n  storageClassName: ferry-csi\n  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: 1Gi}}}}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: from-east, namespace: {NS}}}\nspec:\n  source: {{export: db-ferry-export}}\n  destination: {{pvc: db-data, path: db}}\n  verify: Checksum\n"
    ))?;
    west_kc
        .wait_succeeded(NS, "from-east", 180)
        .with_context(|| {
            west_kc
                .get(
                    "copyjob/from-east",
                    NS,
                    "{range .status.conditions[*]}{.type}={.reason}: {.message} | {end}",
                )
                .unwrap_or_default()
        })?;
    let pv = west_kc.get("pvc/db-data", NS, "{.spec.volumeName}")?;
    let handle = west_kc.get(&format!("pv/{pv}"), "", "{.spec.csi.volumeHandle}")?;
    assert_same_tree(&src, &west.csi_volumes().join(handle).join("db"))?;
    let verified = west_kc.get(
        "copyjob/from-east",
        NS,
        "{.status.conditions[?(@.type==\"Complete\")].message}",
    )?;
    ensure!(verified.contains("verified by checksum"), "{verified}");

    // The export deleted: its holder goes with it (the garbage collector, by its owner).
    east.kubectl_ok(&["delete", "copyexport", "db", "-n", NS])?;
    let mut left = String::new();
    wait_for("the export's holder gone", WITHIN, || {
        left = east
            .kubectl_ok(&[
                "get",
                "pod",
                &holder,
                "-n",
                NS,
                "--ignore-not-found",
                "-o",
                "name",
            ])
            .unwrap_or_else(|e| e.to_string());
        left.trim().is_empty()
    })
    .with_context(|| left.clone())?;
    ensure!(
        tier.packets_that_tried_to_leave()? == 0,
        "the host dropped packets leaving the first cluster"
    );
    Ok(())
}
