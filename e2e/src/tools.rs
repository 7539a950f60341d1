//! The binaries the tests run (installed by `e2e/tools/install.sh` into `FERRY_TOOLS`), and
//! skipping a test, outside CI, when one is missing.

use std::path::PathBuf;

use anyhow::{bail, Result};

/// Where `e2e/tools/install.sh` caches the binaries (its `FERRY_TOOLS`).
pub(crate) fn tools_dir() -> PathBuf {
    std::env::var_os("FERRY_TOOLS")
        .map_or_else(|| PathBuf::from("/var/cache/ferry-tools"), PathBuf::from)
}

/// A binary from the environment (`FERRY_KUBE_APISERVER`, ...) or its cached default.
pub(crate) fn tool(var: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(var).map_or(default, PathBuf::from)
}

/// etcd, kube-apiserver and kubectl, or an error naming the missing one and the fix.
pub(crate) fn binaries() -> Result<(PathBuf, PathBuf, PathBuf)> {
    let k8s = tools_dir().join("k8s/v1.35.4/bin");
    let etcd = tool("FERRY_ETCD", PathBuf::from("/usr/bin/etcd"));
    let apiserver = tool("FERRY_KUBE_APISERVER", k8s.join("kube-apiserver"));
    let kubectl = tool("FERRY_KUBECTL", k8s.join("kubectl"));
    for bin in [&etcd, &apiserver, &kubectl] {
        if !bin.exists() {
            bail!(
                "{} is not installed; run e2e/tools/install.sh (make deps)",
                bin.display()
            );
        }
    }
    Ok((etcd, apiserver, kubectl))
}

/// Whether etcd, kube-apiserver and kubectl are installed, for a test whose control plane
/// another process starts (`ferry-dev demo`); `Ok(false)` with the reason printed when they
/// are not and this is not CI (where that is an error).
pub fn control_plane_installed_or_skip() -> Result<bool> {
    match binaries() {
        Ok(_) => Ok(true),
        Err(why) => skip::<()>(format!("{why:#}")).map(|_| false),
    }
}

/// The directory of prometheus-operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule)
/// that `e2e/tools/install.sh` copies from the Go module; `Ok(None)` with the reason printed
/// when they are not installed and this is not CI.
pub fn prometheus_operator_crds_or_skip() -> Result<Option<PathBuf>> {
    let dir = tool(
        "FERRY_PROMETHEUS_OPERATOR_CRDS",
        tools_dir().join("prometheus-operator/v0.85.0/crds"),
    );
    if dir
        .join("monitoring.coreos.com_prometheusrules.yaml")
        .exists()
    {
        return Ok(Some(dir));
    }
    skip(format!(
        "prometheus-operator CRDs are not in {}; run e2e/tools/install.sh (make deps)",
        dir.display()
    ))
}

/// helm (built by `e2e/tools/install.sh`); `Ok(None)` with the reason printed when it is not
/// installed and this is not CI.
pub fn helm_or_skip() -> Result<Option<PathBuf>> {
    installed_or_skip("FERRY_HELM", tools_dir().join("helm/v3.22.0/bin/helm"))
}

/// kube-score, built from its Go module by `e2e/tools/install.sh`; `Ok(None)` with the reason
/// printed when it is not installed and this is not CI.
pub fn kube_score_or_skip() -> Result<Option<PathBuf>> {
    installed_or_skip(
        "FERRY_KUBE_SCORE",
        tools_dir().join("kube-score/v1.19.0/bin/kube-score"),
    )
}

/// Prometheus with Kubernetes service discovery, built from its Go module by
/// `e2e/tools/install.sh` (Debian's is built without it); `Ok(None)` with the reason printed
/// when it is not installed and this is not CI.
pub fn prometheus_k8s_or_skip() -> Result<Option<PathBuf>> {
    installed_or_skip(
        "FERRY_PROMETHEUS_K8S",
        tools_dir().join("prometheus/v0.316.0/bin/prometheus"),
    )
}

/// The binary `tool(var, default)` names if it is installed, else [`skip`] saying how to
/// install it.
pub(crate) fn installed_or_skip(var: &str, default: PathBuf) -> Result<Option<PathBuf>> {
    let bin = tool(var, default);
    if bin.exists() {
        return Ok(Some(bin));
    }
    skip(format!(
        "{} is not installed; run e2e/tools/install.sh (make deps)",
        bin.display()
    ))
}

/// A test cannot run here because of `why`: `Ok(None)` with the reason printed, except in CI,
/// which installs everything, so that there a missing piece is an error, not a skip.
pub(crate) fn skip<T>(why: String) -> Result<Option<T>> {
    if std::env::var_os("CI").is_some() {
        bail!(why);
    }
    eprintln!("skipped: {why}");
    Ok(None)
}
