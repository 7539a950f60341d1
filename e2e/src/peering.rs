//! Two installs on this machine, each on its own control plane with the chart rendered
//! with peering on and its operator on the chart's token ([`install`]), and what each
//! publishes for the other ([`published`], [`valid`]); a tenant's part of reading an
//! export ([`carried_secret`], [`let_the_operator_read`]). Used by the peering tests
//! (`peering.rs`), the faults between clusters (`peering_faults.rs`) and the benchmark
//! between clusters (`ferry-dev bench-clusters`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::{repo_root, wait_for, ControlPlane, CHART_NAMESPACE};
use anyhow::{ensure, Context, Result};

pub const WITHIN: Duration = Duration::from_secs(60);

/// The chart rendered with peering on (and `extra` values) into `cp`'s directory.
pub fn render_with_peering(cp: &ControlPlane, helm: &PathBuf, extra: &[&str]) -> Result<PathBuf> {
    let out = Command::new(helm)
        .current_dir(repo_root())
        .args([
            "template",
            "ferry",
            "charts/ferry",
            "--namespace",
            CHART_NAMESPACE,
        ])
        .args(["--include-crds", "--set", "peering.enabled=true"])
        // The other install's agents connect from loopback addresses here.
        .args(["--set", "peering.from[0].ipBlock.cidr=127.0.0.0/8"])
        .args(extra)
        .output()
        .context("run helm")?;
    ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = cp.dir().join("ferry-peering.yaml");
    std::fs::write(&path, out.stdout)?;
    Ok(path)
}

/// One install: a control plane with the chart (peering on) and its operator running as
/// the chart runs it, with the environment the rendered Deployment sets for peering.
#[derive(Debug)]
pub struct Install {
    pub cp: ControlPlane,
    pub operator: Option<crate::Proc>,
}

pub fn install(helm: &PathBuf, install_name: Option<&str>) -> Result<Option<Install>> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(None);
    };
    install_on(cp, helm, install_name).map(Some)
}

/// [`install`] on a control plane already started.
pub fn install_on(cp: ControlPlane, helm: &PathBuf, install_name: Option<&str>) -> Result<Install> {
    let set = install_name.map(|n| format!("peering.installName={n}"));
    let extra: Vec<&str> = set.iter().flat_map(|s| ["--set", s.as_str()]).collect();
    let manifest = render_with_peering(&cp, helm, &extra)?;
    // The environment the rendered Deployment gives the operator for peering.
    let rendered = std::fs::read_to_string(&manifest)?;
    ensure!(
        rendered.contains("name: FERRY_PEERING\n              value: \"true\""),
        "the chart with peering.enabled does not turn it on in the operator"
    );
    cp.install_manifest(CHART_NAMESPACE, &manifest)?;
    let operator = spawn_operator(&cp, install_name)?;
    Ok(Install {
        cp,
        operator: Some(operator),
    })
}

pub fn spawn_operator(cp: &ControlPlane, install_name: Option<&str>) -> Result<crate::Proc> {
    let kc =
        cp.service_account_kubeconfig_lasting(CHART_NAMESPACE, "ferry-operator", None, "8760h")?;
    let mut envs = vec![("FERRY_PEERING", "true")];
    if let Some(n) = install_name {
        envs.push(("FERRY_PEERING_INSTALL", n));
    }
    cp.spawn_chart_operator_with(&kc, &envs)
}

/// A key of the published ConfigMap, once it is there.
pub fn published(cp: &ControlPlane, key: &str) -> Result<String> {
    let path = format!("{{.data.{}}}", key.replace('.', "\\."));
    let mut value = String::new();
    wait_for("the ferry-peering ConfigMap", WITHIN, || {
        value = cp
            .get("configmap/ferry-peering", CHART_NAMESPACE, &path)
            .unwrap_or_default();
        !value.is_empty()
    })
    .with_context(|| cp.log_tail("operator.log", 20))?;
    Ok(value)
}

/// A FerryPeer's Valid condition as `reason status message`, once it has one for its
/// current generation.
pub fn valid(cp: &ControlPlane, peer: &str) -> Result<String> {
    let mut seen = String::new();
    wait_for(&format!("FerryPeer {peer}'s status"), WITHIN, || {
        let generation = cp.get(&format!("ferrypeer/{peer}"), "", "{.metadata.generation}");
        let observed = cp.get(
            &format!("ferrypeer/{peer}"),
            "",
            "{.status.observedGeneration}",
        );
        seen = cp
            .get(
                &format!("ferrypeer/{peer}"),
                "",
                "{.status.conditions[?(@.type==\"Valid\")].reason} {.status.conditions[?(@.type==\"Valid\")].status} {.status.conditions[?(@.type==\"Valid\")].message}",
            )
            .unwrap_or_default();
        matches!((generation, observed), (Ok(g), Ok(o)) if g == o) && !seen.trim().is_empty()
    })
    .with_context(|| format!("{seen}\n{}", cp.log_tail("operator.log", 20)))?;
    Ok(seen)
}

/// Export Secret `name` of namespace `from` in `east`, as a tenant carries it into namespace
/// `to` of the other cluster: its type and data, nothing of east's metadata.
pub fn carried_secret(
    east: &ControlPlane,
    from: &str,
    name: &str,
    to: &str,
) -> Result<serde_json::Value> {
    let carried = east.kubectl_ok(&["get", "secret", name, "-n", from, "-o", "json"])?;
    let carried: serde_json::Value = serde_json::from_str(&carried)?;
    Ok(serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": to},
        "type": carried["type"], "data": carried["data"]}))
}

/// What a job's `ExportNotFound` tells the tenant to run in namespace `ns`: a Role that gets
/// Secret `secret` only, bound to the chart's operator.
pub fn let_the_operator_read(cp: &ControlPlane, ns: &str, secret: &str) -> Result<()> {
    let role = format!("ferry-reads-{secret}");
    cp.kubectl_ok(&[
        "-n",
        ns,
        "create",
        "role",
        &role,
        "--verb=get",
        "--resource=secrets",
        &format!("--resource-name={secret}"),
    ])?;
    cp.kubectl_ok(&[
        "-n",
        ns,
        "create",
        "rolebinding",
        &role,
        &format!("--role={role}"),
        &format!("--serviceaccount={CHART_NAMESPACE}:ferry-operator"),
    ])?;
    Ok(())
}

/// East (its name made by its operator) and west, each trusting the other: each admin
/// applied the FerryPeer the other publishes, and both are Valid. East's install name.
pub fn paired(helm: &PathBuf) -> Result<Option<(Install, Install, String)>> {
    let Some(east) = install(helm, None)? else {
        return Ok(None);
    };
    let Some(west) = install(helm, Some("west"))? else {
        return Ok(None);
    };
    let east_name = pair(&east, &west)?;
    Ok(Some((east, west, east_name)))
}

/// Each admin applies the FerryPeer the other install publishes; both become Valid. East's
/// install name (west's is `west`).
pub fn pair(east: &Install, west: &Install) -> Result<String> {
    let east_name = published(&east.cp, "install")?;
    west.cp.apply(&published(&east.cp, "ferrypeer.yaml")?)?;
    east.cp.apply(&published(&west.cp, "ferrypeer.yaml")?)?;
    for (cp, peer) in [(&west.cp, east_name.as_str()), (&east.cp, "west")] {
        let v = valid(cp, peer)?;
        ensure!(v.starts_with("Valid True"), "{peer}: {v}");
    }
    Ok(east_name)
}
