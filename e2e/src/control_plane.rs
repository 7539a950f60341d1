//! The control plane itself: etcd and a kube-apiserver on free loopback ports, kubectl
//! against it, waiting on objects, and identities (ServiceAccount kubeconfigs, a
//! kube-controller-manager) for the RBAC tests. Torn down when dropped.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::process::Proc;
use crate::tools::{binaries, installed_or_skip, skip, tools_dir};
use crate::{free_port, http_get, repo_root, wait_for, Kubectl};

/// A running etcd + kube-apiserver with an admin kubeconfig.
#[derive(Debug)]
pub struct ControlPlane {
    dir: tempfile::TempDir,
    etcd: Child,
    apiserver: Child,
    kc: Kubectl,
}

/// kubectl against this control plane (and the tail of the processes' logs on failure).
impl std::ops::Deref for ControlPlane {
    type Target = Kubectl;
    fn deref(&self) -> &Kubectl {
        &self.kc
    }
}

impl ControlPlane {
    /// Start one, or `Ok(None)` with the reason printed when the binaries are not installed
    /// and this is not CI (CI installs them with `e2e/tools/install.sh`, so there a missing
    /// binary is a failure, not a skip).
    pub fn start_or_skip() -> Result<Option<Self>> {
        match binaries() {
            Ok((etcd, apiserver, kubectl)) => Self::start(&etcd, &apiserver, kubectl).map(Some),
            Err(why) => skip(format!("{why:#}")),
        }
    }

    /// Start one; missing binaries are an error saying how to install them.
    pub fn start_required() -> Result<Self> {
        let (etcd, apiserver, kubectl) = binaries()?;
        Self::start(&etcd, &apiserver, kubectl)
    }

    fn start(etcd_bin: &Path, apiserver_bin: &Path, kubectl: PathBuf) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("ferry-e2e-").tempdir()?;
        let d = dir.path().to_path_buf();
        let (client, peer, secure) = (free_port()?, free_port()?, free_port()?);
        let log = |name: &str| -> Result<Stdio> { Ok(std::fs::File::create(d.join(name))?.into()) };
        let etcd = Command::new(etcd_bin)
            .args([
                "--name=ferry-e2e".to_string(),
                format!("--data-dir={}", d.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster=ferry-e2e=http://127.0.0.1:{peer}"),
                "--initial-cluster-state=new".into(),
                "--logger=zap".into(),
                "--log-outputs=stderr".into(),
                "--log-level=warn".into(),
            ])
            .stdout(log("etcd.log")?)
            .stderr(log("etcd.err")?)
            .spawn()
            .context("start etcd")?;
        // Fill the struct early so Drop cleans up whatever fails next.
        let mut cp = ControlPlane {
            kc: Kubectl::new(kubectl, d.join("kubeconfig"), d.clone()),
            etcd,
            apiserver: Command::new("true").spawn()?,
            dir,
        };
        wait_for("etcd /health", Duration::from_secs(30), || {
            http_get(client, "/health").is_some_and(|b| b.contains("\"health\":\"true\""))
        })?;
        let ok = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(d.join("sa.key"))
            .arg("2048")
            .stderr(Stdio::null())
            .status()?;
        let ok2 = Command::new("openssl")
            .args(["rsa", "-pubout", "-in"])
            .arg(d.join("sa.key"))
            .arg("-out")
            .arg(d.join("sa.pub"))
            .stderr(Stdio::null())
            .status()?;
        if !ok.success() || !ok2.success() {
            bail!("openssl could not make the service-account key");
        }
        let mut raw = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(
            d.join("tokens.csv"),
            format!("{token},ferry-admin,ferry-admin,\"system:masters\"\n"),
        )?;
        cp.apiserver = Command::new(apiserver_bin)
            .args([
                format!("--etcd-servers=http://127.0.0.1:{client}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={secure}"),
                format!("--cert-dir={}", d.join("pki").display()),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", d.join("sa.pub").display()),
                format!(
                    "--service-account-signing-key-file={}",
                    d.join("sa.key").display()
                ),
                "--authorization-mode=RBAC".into(),
                format!("--token-auth-file={}", d.join("tokens.csv").display()),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--allow-privileged=true".into(),
                "--endpoint-reconciler-type=none".into(),
                "--disable-admission-plugins=ServiceAccount".into(),
                "--profiling=false".into(),
            ])
            .stdout(log("apiserver.log")?)
            .stderr(log("apiserver.err")?)
            .spawn()
            .context("start kube-apiserver")?;
        std::fs::write(
            &cp.kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://127.0.0.1:{secure}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: admin\ncurrent-context: e2e\n"
            ),
        )?;
        let ready = wait_for("kube-apiserver /readyz", Duration::from_secs(90), || {
            cp.kubectl(&["get", "--raw", "/readyz"])
                .is_ok_and(|o| o.status.success())
        });
        if let Err(e) = ready {
            let tail = std::fs::read_to_string(d.join("apiserver.err")).unwrap_or_default();
            let tail: String = tail
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            bail!("{e}\nkube-apiserver log tail:\n{tail}");
        }
        Ok(cp)
    }

    /// Where the control plane's logs and state live (kept until drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What an operator does before `kubectl apply` of a rendered chart: namespace `ns`,
    /// labelled for the privileged agent; then `deploy/<file>` server-side, and its CRDs
    /// served.
    pub fn install_rendered(&self, ns: &str, file: &str) -> Result<()> {
        self.install_manifest(ns, &repo_root().join("deploy").join(file))
    }

    /// [`Self::install_rendered`] of a manifest at `path` (a render of the chart with other
    /// values).
    pub fn install_manifest(&self, ns: &str, path: &Path) -> Result<()> {
        self.kubectl_ok(&["create", "namespace", ns])?;
        self.kubectl_ok(&[
            "label",
            "namespace",
            ns,
            "pod-security.kubernetes.io/enforce=privileged",
        ])?;
        let out = self.kubectl(&["apply", "--server-side", "-f", &path.to_string_lossy()])?;
        if !out.status.success() {
            bail!(
                "the apiserver refused {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/copyjobs.ferry.dev",
            "crd/storageroots.ferry.dev",
            "crd/copyschedules.ferry.dev",
        ])?;
        Ok(())
    }

    /// Apply the chart's generated CRDs and wait until they are served.
    pub fn install_crds(&self) -> Result<()> {
        let crds = repo_root().join("charts/ferry/crds");
        let out = self.kubectl(&["apply", "--server-side", "-f", &crds.to_string_lossy()])?;
        if !out.status.success() {
            bail!(
                "CRDs refused by the apiserver: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for crd in [
            "crd/copyjobs.ferry.dev",
            "crd/storageroots.ferry.dev",
            "crd/copyschedules.ferry.dev",
        ] {
            let out =
                self.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", crd])?;
            if !out.status.success() {
                bail!(
                    "{crd} not established: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        Ok(())
    }
}

impl ControlPlane {
    /// Leave etcd and the apiserver running after this value is gone (for `make dev-up`);
    /// returns their pids for `make dev-down`.
    pub fn detach(self) -> (PathBuf, Vec<u32>) {
        let this = std::mem::ManuallyDrop::new(self);
        let pids = vec![this.etcd.id(), this.apiserver.id()];
        // The TempDir is leaked on purpose: the state must outlive this process.
        let dir = this.dir.path().to_path_buf();
        (dir, pids)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // FERRY_E2E_KEEP=1 keeps the logs and state for a look after the run.
        if std::env::var_os("FERRY_E2E_KEEP").is_some_and(|v| v == "1") {
            self.dir.disable_cleanup(true);
            eprintln!("kept {} (FERRY_E2E_KEEP=1)", self.dir.path().display());
        }
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Components running under their own identity (the chart's RBAC tests).
impl ControlPlane {
    /// A kubeconfig for this apiserver, with the admin kubeconfig's server and TLS settings,
    /// that authenticates as ServiceAccount `ns/name` with a token from the TokenRequest API:
    /// a process using it can do only what RBAC grants that account. With `node`, the token
    /// is bound to that Node object, as the kubelet's tokens for pods are: the API server
    /// then knows the node the caller runs on. Written to `<dir>/<name>[-<node>].kubeconfig`.
    pub fn service_account_kubeconfig(
        &self,
        ns: &str,
        name: &str,
        node: Option<&str>,
    ) -> Result<PathBuf> {
        self.service_account_kubeconfig_lasting(ns, name, node, "2h")
    }

    /// [`Self::service_account_kubeconfig`] with a token valid for `duration` (kubectl's
    /// spelling, e.g. `2h`, `8760h`): for processes left running longer than a test
    /// (`make dev-up`), whose token nothing renews.
    pub fn service_account_kubeconfig_lasting(
        &self,
        ns: &str,
        name: &str,
        node: Option<&str>,
        duration: &str,
    ) -> Result<PathBuf> {
        let duration = format!("--duration={duration}");
        let mut args = vec!["create", "token", name, "-n", ns, &duration];
        if let Some(node) = node {
            args.extend(["--bound-object-kind", "Node", "--bound-object-name", node]);
        }
        let token = self.kubectl_ok(&args)?;
        let token = token.trim();
        let admin = std::fs::read_to_string(&self.kubeconfig)?;
        let mut replaced = 0;
        let text: Vec<String> = admin
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("token: ") {
                    replaced += 1;
                    format!("    token: {token}")
                } else {
                    l.to_string()
                }
            })
            .collect();
        if replaced != 1 {
            bail!("the admin kubeconfig has {replaced} token lines, expected 1");
        }
        let file = match node {
            Some(node) => format!("{name}-{node}.kubeconfig"),
            None => format!("{name}.kubeconfig"),
        };
        let path = self.dir().join(file);
        std::fs::write(&path, text.join("\n") + "\n")?;
        Ok(path)
    }

    /// kube-controller-manager (built by `e2e/tools/install.sh`) running only `controllers`
    /// with the admin kubeconfig, logging to `<dir>/kube-controller-manager.log`; `Ok(None)`
    /// with the reason printed when it is not installed and this is not CI.
    pub fn start_controller_manager_or_skip(&self, controllers: &[&str]) -> Result<Option<Proc>> {
        let Some(bin) = installed_or_skip(
            "FERRY_KUBE_CONTROLLER_MANAGER",
            tools_dir().join("k8s/v1.35.4/bin/kube-controller-manager"),
        )?
        else {
            return Ok(None);
        };
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig.display());
        let controllers = format!("--controllers={}", controllers.join(","));
        let args = [
            kubeconfig.as_str(),
            controllers.as_str(),
            "--leader-elect=false",
            // No HTTPS endpoint: nothing here probes it, and parallel tests would share a port.
            "--secure-port=0",
        ];
        self.spawn(&bin, &args, &[], "kube-controller-manager.log")
            .map(Some)
    }

    /// The PV controller (kube-controller-manager's `persistentvolume-binder`), so claims
    /// bind as they do in a cluster: the claim `Bound`, its volume's `claimRef` carrying the
    /// claim's uid. Ferry uses a claim only then.
    pub fn start_volume_binder(&self) -> Result<Proc> {
        let binder = self.start_controller_manager_or_skip(&["persistentvolume-binder"])?;
        binder.context("kube-controller-manager is not installed (make deps builds it); claims cannot bind without it")
    }
}
