//! The real one-node tier (`e2e/kube/up.sh`): a kubelet, containerd and the rest in a
//! network namespace, with Ferry installed by its chart from `make image`. Brought up for a
//! test and removed (`e2e/kube/down.sh`) when the [`KubeTier`] is dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

use crate::kubectl::stdout_of;
use crate::tools::{skip, tools_dir};
use crate::{is_root, repo_root, Kubectl};

/// Where `e2e/kube/up.sh` keeps its state (its `FERRY_KUBE_DIR` default).
const STATE: &str = "/var/lib/ferry-kube";
/// The tier's network namespace and node (e2e/kube/common.sh).
pub const NETNS: &str = "ferry-kube";
pub const NODE: &str = "ferry-node";
/// The node's address, where the apiserver listens (6443); reachable from the host.
pub const NODE_IP: &str = "10.251.0.2";

/// A running one-node cluster with Ferry installed (release `ferry` in `ferry-system`).
#[derive(Debug)]
pub struct KubeTier {
    kc: Kubectl,
}

impl std::ops::Deref for KubeTier {
    type Target = Kubectl;
    fn deref(&self) -> &Kubectl {
        &self.kc
    }
}

fn run(script: &Path) -> Result<Output> {
    run_for(script, 1)
}

/// `script` for cluster `instance` of the tier (its `FERRY_KUBE_INSTANCE`).
fn run_for(script: &Path, instance: u8) -> Result<Output> {
    Command::new(script)
        .env("FERRY_KUBE_INSTANCE", instance.to_string())
        .current_dir(repo_root())
        .output()
        .with_context(|| format!("run {}", script.display()))
}

/// Where the second cluster (`FERRY_KUBE_INSTANCE=2`) keeps its state.
const SECOND_STATE: &str = "/var/lib/ferry-kube-2";
/// The second cluster's node and its address (e2e/kube/common.sh).
pub const SECOND_NODE: &str = "ferry-node-2";
pub const SECOND_NODE_IP: &str = "10.241.0.2";

/// A second cluster of the tier beside the first, in its own network namespace, the two
/// joined by one veth pair (`e2e/kube/link.sh`): what the tests between clusters copy
/// across. Removed when dropped (before the first, which puts back what both changed).
#[derive(Debug)]
pub struct SecondCluster {
    kc: Kubectl,
}

impl std::ops::Deref for SecondCluster {
    type Target = Kubectl;
    fn deref(&self) -> &Kubectl {
        &self.kc
    }
}

impl SecondCluster {
    /// Bring it up (its image is the first's) and link it to the first.
    pub fn up() -> Result<Self> {
        let script = |name: &str| repo_root().join("e2e/kube").join(name);
        let _ = run_for(&script("down.sh"), 2);
        for (name, what) in [("up.sh", "up"), ("link.sh", "link")] {
            let out = run_for(&script(name), 2)?;
            if !out.status.success() {
                let _ = run_for(&script("down.sh"), 2);
                bail!(
                    "e2e/kube/{name} ({what} the second cluster) failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let kubectl = tools_dir().join("k8s/v1.35.4/bin/kubectl");
        let state = PathBuf::from(SECOND_STATE);
        Ok(Self {
            kc: Kubectl::new(kubectl, state.join("kubeconfig"), state.join("logs")),
        })
    }

    /// `helm ARGS` against this cluster; must succeed.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        helm(&PathBuf::from(SECOND_STATE).join("kubeconfig"), args)
    }

    /// Where its CSI driver keeps its volumes.
    pub fn csi_volumes(&self) -> PathBuf {
        PathBuf::from(SECOND_STATE).join("csi/volumes")
    }
}

impl Drop for SecondCluster {
    fn drop(&mut self) {
        take_down(2);
    }
}

/// Remove cluster `instance` of the tier (`e2e/kube/down.sh`), saying so when it fails (a
/// handle's drop has nothing to return it to).
fn take_down(instance: u8) {
    match run_for(&repo_root().join("e2e/kube/down.sh"), instance) {
        Ok(out) if out.status.success() => {}
        Ok(out) => eprintln!(
            "e2e/kube/down.sh (cluster {instance}) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("e2e/kube/down.sh (cluster {instance}): {e:#}"),
    }
}

/// `helm ARGS` with `kubeconfig` (the chart is `charts/ferry`); must succeed.
fn helm(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let helm = tools_dir().join("helm/v3.22.0/bin/helm");
    let out = Command::new(&helm)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .current_dir(repo_root())
        .output()
        .with_context(|| format!("run {}", helm.display()))?;
    stdout_of("helm", args, out)
}

impl KubeTier {
    /// Build the image (a no-op when it is fresh) and bring the tier up; `Ok(None)` with the
    /// reason printed when this is not root and not CI (CI runs as root: there a failure to
    /// start is an error).
    pub fn up_or_skip() -> Result<Option<Self>> {
        if !is_root() {
            return skip("the real one-node tier needs root (network namespace, mounts)".into());
        }
        let image = run(&repo_root().join("scripts/build-image.sh"))?;
        if !image.status.success() {
            bail!(
                "make image failed:\n{}",
                String::from_utf8_lossy(&image.stderr)
            );
        }
        // A tier left by an interrupted run is removed first: up.sh refuses to start over one.
        let _ = run(&repo_root().join("e2e/kube/down.sh"));
        let up = run(&repo_root().join("e2e/kube/up.sh"))?;
        if !up.status.success() {
            bail!(
                "e2e/kube/up.sh failed:\n{}",
                String::from_utf8_lossy(&up.stderr)
            );
        }
        let kubectl = tools_dir().join("k8s/v1.35.4/bin/kubectl");
        let state = PathBuf::from(STATE);
        Ok(Some(Self {
            kc: Kubectl::new(kubectl, state.join("kubeconfig"), state.join("logs")),
        }))
    }

    /// `helm ARGS` against this cluster (the chart is `charts/ferry`, the release `ferry` in
    /// `ferry-system`); must succeed.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        helm(&self.kubeconfig(), args)
    }

    /// The tier's kubeconfig (cluster-admin), for a client of its own (`kubectl ferry`).
    pub fn kubeconfig(&self) -> PathBuf {
        PathBuf::from(STATE).join("kubeconfig")
    }

    /// The kubelet's root directory (the chart's `kubeletDir` in this tier).
    pub fn kubelet_dir(&self) -> PathBuf {
        PathBuf::from(STATE).join("kubelet")
    }

    /// Where the tier's CSI driver keeps its volumes, one directory per volume handle
    /// (`e2e/csi`): a test writes a claim's data there, and reads it back.
    pub fn csi_volumes(&self) -> PathBuf {
        PathBuf::from(STATE).join("csi/volumes")
    }

    /// Where the tier's CSI driver keeps its snapshots, one directory per snapshot handle
    /// (a VolumeSnapshotContent's `status.snapshotHandle`).
    pub fn csi_snapshots(&self) -> PathBuf {
        PathBuf::from(STATE).join("csi/snapshots")
    }

    /// A command run inside the tier's network namespace (where pod and Service addresses
    /// are reachable).
    pub fn in_netns(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{NETNS}"))
            .arg("--")
            .arg(program);
        c
    }

    /// A command run in the network namespace of pod `ns/pod` (as the pod: its address, its
    /// NetworkPolicies), found through a process in the pod's cgroup.
    pub fn in_pod_netns(&self, ns: &str, pod: &str, program: &str) -> Result<Command> {
        let uid = self.get(&format!("pod/{pod}"), ns, "{.metadata.uid}")?;
        let needle = format!("/pod{uid}/");
        for entry in std::fs::read_dir("/proc")? {
            let path = entry?.path();
            let Ok(cgroups) = std::fs::read_to_string(path.join("cgroup")) else {
                continue;
            };
            if cgroups.contains(&needle) {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", path.join("ns/net").display()))
                    .arg("--")
                    .arg(program);
                return Ok(c);
            }
        }
        bail!("no process of pod {ns}/{pod} (uid {uid}) is running")
    }

    /// Packets the host dropped instead of forwarding them out of the namespace (the counter
    /// of up.sh's `FORWARD -i fkube0 -j DROP` rule): anything but zero means something in
    /// the tier tried to reach beyond this machine.
    pub fn packets_that_tried_to_leave(&self) -> Result<u64> {
        let out = Command::new("iptables")
            .args(["-L", "FORWARD", "-v", "-x", "-n"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.contains("ferry-kube: nothing leaves"))
            .context("the FORWARD rule of the tier is missing")?;
        line.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no packet count in {line:?}"))
    }
}

impl Drop for KubeTier {
    fn drop(&mut self) {
        take_down(1);
    }
}
