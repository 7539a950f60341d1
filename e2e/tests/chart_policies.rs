//! The chart's hardening, judged from the rendered manifests: every port a Ferry pod serves
//! is open only to the peers values.yaml names, and its pods connect only to the API server
//! (the real-node tier, `kube.rs`, shows a network plugin enforcing the same policies); and
//! kube-score (`scripts/kube-score.sh`, run by `make test`) passes the chart but fails it for
//! an undocumented finding.

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use ferry_e2e::repo_root;
use serde_json::{json, Value};

/// `helm template` of the chart with the default values or a `ci/` set, plus `extra`; every
/// object as JSON.
fn render(helm: &Path, values: Option<&str>, extra: &[&str]) -> Result<Vec<Value>> {
    let mut cmd = Command::new(helm);
    cmd.current_dir(repo_root()).args([
        "template",
        "ferry",
        "charts/ferry",
        "--namespace",
        "ferry-system",
    ]);
    if let Some(v) = values {
        cmd.args(["-f", &format!("charts/ferry/ci/{v}")]);
    }
    let out = cmd.args(extra).output().context("run helm")?;
    ensure!(
        out.status.success(),
        "helm template {values:?} {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut docs = Vec::new();
    for doc in String::from_utf8(out.stdout)?.split("\n---\n") {
        let v: serde_yaml::Value = serde_yaml::from_str(doc)?;
        if !v.is_null() {
            docs.push(serde_json::to_value(v)?);
        }
    }
    Ok(docs)
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .is_some_and(|m| m.iter().all(|(k, v)| labels[k] == *v))
}

/// What each values set names as the peers of the metrics port and the API server's
/// addresses and ports.
fn expected(values: Option<&str>) -> (Value, Value, Value) {
    match values {
        Some("custom.yaml") => (
            json!([
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                 "podSelector": {"matchLabels": {"app": "vmagent"}}},
                {"ipBlock": {"cidr": "10.0.0.0/16"}}
            ]),
            json!([{"ipBlock": {"cidr": "10.0.0.1/32"}}, {"ipBlock": {"cidr": "10.0.0.2/32"}}]),
            json!([{"port": 6443, "protocol": "TCP"}]),
        ),
        _ => (
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]),
            Value::Null,
            json!([{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]),
        ),
    }
}

#[test]
fn every_port_a_ferry_pod_serves_is_open_only_to_named_peers_and_pods_reach_only_the_apiserver(
) -> Result<()> {
    let Some(helm) = ferry_e2e::helm_or_skip()? else {
        return Ok(());
    };
    let mut sets: Vec<Option<String>> = vec![None];
    for e in std::fs::read_dir(repo_root().join("charts/ferry/ci"))? {
        sets.push(Some(e?.file_name().to_string_lossy().into_owned()));
    }
    for set in &sets {
        let docs = render(&helm, set.as_deref(), &[])?;
        let (peers, api_to, api_ports) = expected(set.as_deref());
        let policies: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "NetworkPolicy")
            .collect();
        let workloads: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
            .collect();
        ensure!(
            workloads.len() == 2,
            "{set:?}: workloads {}",
            workloads.len()
        );
        for w in workloads {
            let what = format!("{set:?} {}", w["metadata"]["name"]);
            let labels = &w["spec"]["template"]["metadata"]["labels"];
            let mine: Vec<&&Value> = policies
                .iter()
                .filter(|p| selects(&p["spec"]["podSelector"], labels))
                .collect();
            ensure!(mine.len() == 1, "{what}: {} policies select it", mine.len());
            let spec = &mine[0]["spec"];
            ensure!(
                spec["policyTypes"] == json!(["Ingress", "Egress"]),
                "{what}: policyTypes {}",
                spec["policyTypes"]
            );
            // Ingress: each rule names its peers and its ports (a rule without either admits
            // everyone or every port), and each declared port has a rule.
            let ingress = spec["ingress"].as_array().context("ingress")?;
            // The agents' transfer port: only from the agents of this install (their own
            // selector), on that port alone; the other agents' the only other egress.
            let agents = json!([{"podSelector": w["spec"]["selector"]}]);
            let is_agent = w["kind"] == "DaemonSet";
            let transfer_port = w["spec"]["template"]["spec"]["containers"][0]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == "transfer")
                .map(|p| p["containerPort"].clone());
            ensure!(
                is_agent == transfer_port.is_some(),
                "{what}: transfer port {transfer_port:?}"
            );
            for rule in ingress {
                // The peering port: only from where peering.from says the other installs'
                // agents are (peering-on.yaml).
                if rule["ports"] == json!([{"port": "peering", "protocol": "TCP"}]) {
                    ensure!(
                        is_agent && set.as_deref() == Some("peering-on.yaml"),
                        "{what}: a peering rule"
                    );
                    ensure!(
                        rule["from"] == json!([{"ipBlock": {"cidr": "192.0.2.0/24"}}]),
                        "{what}: peering port open to {}",
                        rule["from"]
                    );
                    continue;
                }
                if rule["ports"] == json!([{"port": "transfer", "protocol": "TCP"}]) {
                    ensure!(is_agent, "{what}: a transfer rule on the operator");
                    ensure!(
                        rule["from"] == agents,
                        "{what}: transfer port open to {}",
                        rule["from"]
                    );
                    continue;
                }
                ensure!(
                    rule["from"] == peers,
                    "{what}: ingress from {}",
                    rule["from"]
                );
                ensure!(
                    rule["ports"].is_array(),
                    "{what}: ingress rule without ports"
                );
            }
            for c in w["spec"]["template"]["spec"]["containers"]
                .as_array()
                .context("containers")?
            {
                for port in c["ports"].as_array().into_iter().flatten() {
                    let covered = ingress.iter().any(|r| {
                        r["ports"].as_array().into_iter().flatten().any(|p| {
                            p["port"] == port["name"] || p["port"] == port["containerPort"]
                        })
                    });
                    ensure!(covered, "{what}: port {port} has no ingress rule");
                }
            }
            // Egress: the API server only, on its ports (and addresses where named); an
            // agent also to the other agents' transfer port, with peering (peering-on.yaml)
            // to the other installs' agents, and with changed-block tracking (custom.yaml)
            // to where its values say the sidecars are.
            let egress = spec["egress"].as_array().context("egress")?;
            let peer_agents = transfer_port
                .map(|port| json!({"to": agents, "ports": [{"port": port, "protocol": "TCP"}]}));
            let sidecars = match (set.as_deref(), is_agent) {
                (Some("custom.yaml"), true) => vec![json!({
                    "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "csi-driver"}}}],
                    "ports": [{"port": 50051, "protocol": "TCP"}]
                })],
                _ => vec![],
            };
            // With peering (peering-on.yaml), to where peering.egress says the other
            // installs' agents are.
            let peers_abroad = match (set.as_deref(), is_agent) {
                (Some("peering-on.yaml"), true) => vec![json!({
                    "to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}],
                    "ports": [{"port": 7451, "protocol": "TCP"}]
                })],
                _ => vec![],
            };
            let extra: Vec<Value> = peer_agents
                .into_iter()
                .chain(peers_abroad)
                .chain(sidecars)
                .collect();
            ensure!(
                egress.len() == 1 + extra.len() && egress[1..] == extra[..],
                "{what}: egress rules {egress:?}, expected the API server's then {extra:?}"
            );
            ensure!(
                egress[0]["ports"] == api_ports,
                "{what}: egress ports {}",
                egress[0]["ports"]
            );
            ensure!(
                egress[0]["to"] == api_to,
                "{what}: egress to {}",
                egress[0]["to"]
            );
        }
    }

    // Peers `[]`: a policy that admits nobody on any port (the node still reaches its pods).
    let docs = render(
        &helm,
        None,
        &[
            "--set",
            "networkPolicy.metricsFrom=null",
            "--set",
            "networkPolicy.kubeletFrom=null",
        ],
    )?;
    for p in docs.iter().filter(|d| d["kind"] == "NetworkPolicy") {
        let from: Vec<&Value> = p["spec"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| &r["from"][0])
            .collect();
        let only_agents = from.iter().all(|f| {
            f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "agent"
                && f.get("namespaceSelector").is_none()
        });
        ensure!(
            only_agents,
            "no peers named, yet ingress {}",
            p["spec"]["ingress"]
        );
    }
    // No transfer port: no rule for it, and no port.
    let docs = render(
        &helm,
        None,
        &[
            "--set",
            "agent.transferPort=0",
            "--set",
            "networkPolicy.metricsFrom=null",
        ],
    )?;
    for d in &docs {
        let text = d.to_string();
        let served = match d["kind"].as_str() {
            Some("DaemonSet") => {
                text.contains("FERRY_TRANSFER_LISTEN") || text.contains("\"transfer\"")
            }
            Some("NetworkPolicy") => text.contains("\"transfer\"") || text.contains("7450"),
            _ => false,
        };
        ensure!(!served, "agent.transferPort=0, yet {text}");
    }
    // Off: no policy at all; no API server port: refused, since it would open every port.
    let docs = render(&helm, None, &["--set", "networkPolicy.enabled=false"])?;
    ensure!(!docs.iter().any(|d| d["kind"] == "NetworkPolicy"));
    let err = render(
        &helm,
        None,
        &["--set", "networkPolicy.apiServer.ports=null"],
    )
    .expect_err("an egress rule without ports was rendered");
    ensure!(
        format!("{err:#}").contains("networkPolicy.apiServer.ports is empty"),
        "{err:#}"
    );
    // Changed-block tracking without saying where the sidecars are: refused, not an agent
    // that cannot reach them.
    let err = render(&helm, None, &["--set", "changedBlockTracking.enabled=true"])
        .expect_err("changed-block tracking rendered without its egress");
    ensure!(
        format!("{err:#}").contains("changedBlockTracking.egress is empty"),
        "{err:#}"
    );
    // Peering without saying where the other installs' agents are: refused, not a port
    // open to everyone or closed to them.
    let err = render(&helm, None, &["--set", "peering.enabled=true"])
        .expect_err("peering rendered without peering.from");
    ensure!(
        format!("{err:#}").contains("peering.from is empty"),
        "{err:#}"
    );
    // Without NetworkPolicies there is nothing to say.
    render(
        &helm,
        None,
        &[
            "--set",
            "peering.enabled=true",
            "--set",
            "networkPolicy.enabled=false",
        ],
    )?;
    Ok(())
}

/// `scripts/kube-score.sh EXTRA...`: (exit success, stdout + stderr).
fn kube_score(extra: &[&str]) -> Result<(bool, String)> {
    let out = Command::new(repo_root().join("scripts/kube-score.sh"))
        .args(extra)
        .output()
        .context("run scripts/kube-score.sh")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

#[test]
fn kube_score_passes_the_chart_and_fails_a_finding_that_is_not_a_documented_exception() -> Result<()>
{
    if ferry_e2e::helm_or_skip()?.is_none() || ferry_e2e::kube_score_or_skip()?.is_none() {
        return Ok(());
    }
    let (ok, text) = kube_score(&[])?;
    ensure!(ok, "kube-score fails the chart:\n{text}");
    ensure!(text.contains("no CRITICAL finding"), "{text}");

    for (extra, finding) in [
        // No NetworkPolicy: a real finding.
        (
            &["--set", "networkPolicy.enabled=false"][..],
            "pod-networkpolicy: The pod does not have a matching NetworkPolicy (not an exception",
        ),
        // No ephemeral-storage limit on the agent: its container-resources exception would
        // hide this inside kube-score, so the script scores with the annotations off.
        (
            &["--set", "agent.resources.limits.ephemeral-storage=null"][..],
            "ferry-agent: container-ephemeral-storage-request-and-limit: Ephemeral Storage limit is not set (not an exception",
        ),
        // No CPU request on the agent: the same check as its exception, not what it excuses.
        (
            &["--set", "agent.resources.requests.cpu=null"][..],
            "ferry-agent: container-resources: CPU limit is not set; Memory limit is not set; CPU request is not set (the exception excuses only",
        ),
        // An exception the chart would annotate but the README does not document.
        (
            &["--set", "operator.resources.limits.cpu=null"][..],
            "container-resources: CPU limit is not set (annotated kube-score/ignore but not documented for 'operator'",
        ),
        // The operator made to run as root: annotated (the chart annotates what the values
        // cause) but documented for the agent only.
        (
            &["--set", "operator.podSecurityContext.runAsUser=0"][..],
            "ferry-operator: container-security-context-user-group-id: The container is running with a low user ID (annotated kube-score/ignore but not documented for 'operator'",
        ),
    ] {
        let (ok, text) = kube_score(extra)?;
        ensure!(!ok, "kube-score passed with {extra:?}:\n{text}");
        ensure!(
            text.contains(finding),
            "with {extra:?}, no {finding:?} in:\n{text}"
        );
    }
    // Pull policy Always: the finding is gone, and so is its exception (a stale one fails).
    let (ok, text) = kube_score(&["--set", "image.pullPolicy=Always"])?;
    ensure!(ok && text.contains("no CRITICAL finding"), "{text}");
    Ok(())
}
