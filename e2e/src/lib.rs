//! A real control plane on this machine for end-to-end tests: Debian's etcd and a
//! kube-apiserver built from the `k8s.io/kubernetes` Go module (see `e2e/tools/`), on free
//! loopback ports, torn down when the [`ControlPlane`] is dropped, even if a test panics.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// Where `e2e/tools/install.sh` caches the binaries (its `FERRY_TOOLS`).
fn tools_dir() -> PathBuf {
    std::env::var_os("FERRY_TOOLS")
        .map_or_else(|| PathBuf::from("/var/cache/ferry-tools"), PathBuf::from)
}

/// A binary from the environment (`FERRY_KUBE_APISERVER`, ...) or its cached default.
fn tool(var: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(var).map_or(default, PathBuf::from)
}

/// etcd, kube-apiserver and kubectl, or an error naming the missing one and the fix.
fn binaries() -> Result<(PathBuf, PathBuf, PathBuf)> {
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

/// The repository root (for the chart's CRDs and examples).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The raw HTTP response (status line, headers, body) to a GET on the loopback.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// Poll `ready` until it answers true or `timeout` passes.
pub fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// A running etcd + kube-apiserver with an admin kubeconfig.
#[derive(Debug)]
pub struct ControlPlane {
    dir: tempfile::TempDir,
    etcd: Child,
    apiserver: Child,
    kubectl: PathBuf,
    pub kubeconfig: PathBuf,
}

impl ControlPlane {
    /// Start one, or `Ok(None)` with the reason printed when the binaries are not installed
    /// and this is not CI (CI installs them with `e2e/tools/install.sh`, so there a missing
    /// binary is a failure, not a skip).
    pub fn start_or_skip() -> Result<Option<Self>> {
        match binaries() {
            Ok((etcd, apiserver, kubectl)) => Self::start(&etcd, &apiserver, kubectl).map(Some),
            Err(why) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: {why}");
                Ok(None)
            }
            Err(why) => Err(why),
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
            kubeconfig: d.join("kubeconfig"),
            etcd,
            apiserver: Command::new("true").spawn()?,
            kubectl,
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

    /// Run kubectl against this control plane.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .context("run kubectl")
    }

    /// Run kubectl with `input` on stdin (e.g. `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Result<Output> {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl")?;
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(input.as_bytes())?;
        Ok(child.wait_with_output()?)
    }

    /// kubectl that must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args)?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Wait (on the phase, never a fixed sleep) until CopyJob `ns/name` has Succeeded. The
    /// error carries kubectl's answer, the job's status and the tail of every process log.
    pub fn wait_succeeded(&self, ns: &str, name: &str, timeout_secs: u32) -> Result<()> {
        let job = format!("copyjob/{name}");
        let timeout = format!("--timeout={timeout_secs}s");
        let out = self.kubectl(&[
            "wait",
            "--for=jsonpath={.status.phase}=Succeeded",
            &timeout,
            &job,
            "-n",
            ns,
        ])?;
        if out.status.success() {
            return Ok(());
        }
        let status = self
            .kubectl_ok(&["get", &job, "-n", ns, "-o", "jsonpath={.status}"])
            .unwrap_or_default();
        let mut logs: Vec<String> = std::fs::read_dir(self.dir())?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log"))
            .collect();
        logs.sort();
        let tails: Vec<String> = logs
            .iter()
            .map(|l| format!("{l}:\n{}", self.log_tail(l, 5)))
            .collect();
        bail!(
            "{ns}/{name} did not succeed: {}\nstatus: {status}\n{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            tails.join("\n")
        )
    }

    /// The loopback port of a simulated node's agent endpoints (/metrics, /healthz, /readyz).
    pub fn agent_port(&self, node: &str) -> Result<u16> {
        self.recorded_port(&format!("agent-{node}"))
    }

    /// The loopback port of the operator's endpoints (/metrics, /healthz, /readyz), as
    /// [`Self::start_ferry`] started it.
    pub fn operator_port(&self) -> Result<u16> {
        self.recorded_port("operator")
    }

    /// The port a process started here recorded in `<dir>/<name>.port`.
    pub fn recorded_port(&self, name: &str) -> Result<u16> {
        let f = self.dir().join(format!("{name}.port"));
        Ok(std::fs::read_to_string(&f)
            .with_context(|| format!("read {}", f.display()))?
            .trim()
            .parse()?)
    }

    /// A free loopback address for a process's endpoints, recorded in `<dir>/<name>.port`.
    fn listen_address(&self, name: &str) -> Result<String> {
        let port = free_port()?;
        std::fs::write(self.dir().join(format!("{name}.port")), port.to_string())?;
        Ok(format!("127.0.0.1:{port}"))
    }

    /// Start a `ferry-operator` replica with its endpoints on a free loopback port
    /// (recorded for [`Self::recorded_port`] under `name`), logging to `<dir>/<name>.log`.
    pub fn spawn_operator(&self, name: &str, envs: &[(&str, &str)]) -> Result<Proc> {
        let operator = workspace_bin("ferry-operator", "ferry-operator")?;
        let listen = self.listen_address(name)?;
        self.spawn(
            &operator,
            &["--listen", &listen],
            envs,
            &format!("{name}.log"),
        )
    }

    /// A jsonpath of one object, as kubectl prints it ("" when the object is gone).
    pub fn get(&self, kind_name: &str, ns: &str, jsonpath: &str) -> Result<String> {
        let out = self.kubectl(&[
            "get",
            kind_name,
            "-n",
            ns,
            "--ignore-not-found",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])?;
        if !out.status.success() {
            bail!(
                "kubectl get {kind_name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Poll `jsonpath` of `kind_name` until `ready` accepts it; the error shows the last
    /// value and the agents' logs.
    pub fn wait_until(
        &self,
        kind_name: &str,
        ns: &str,
        jsonpath: &str,
        timeout: Duration,
        mut ready: impl FnMut(&str) -> bool,
    ) -> Result<String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            last = self.get(kind_name, ns, jsonpath)?;
            if ready(&last) {
                return Ok(last);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "{kind_name} {jsonpath}: still {last:?} after {timeout:?}\nstatus: {}\noperator:\n{}",
            self.get(kind_name, ns, "{.status}").unwrap_or_default(),
            self.log_tail("operator.log", 10)
        )
    }

    /// `kubectl apply -f -` that must succeed.
    pub fn apply(&self, yaml: &str) -> Result<()> {
        let out = self.kubectl_stdin(&["apply", "-f", "-"], yaml)?;
        if !out.status.success() {
            bail!("apply refused: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// Simulated nodes (Node objects labelled `ferry.dev/node=<name>`, each with a host-root
    /// directory under `<dir>/hosts/<name>`), the operator and one agent per node. Returns
    /// the processes (stopped when dropped) and the hosts directory.
    pub fn start_ferry(&self, nodes: &[&str]) -> Result<(Vec<Proc>, PathBuf)> {
        self.start_ferry_with(nodes, &[])
    }

    /// [`Self::start_ferry`] with extra environment for the agents (e.g. the test-only
    /// `FERRY_FAULT_FILE_DELAY_MS`, which makes copies slow enough to act on mid-way).
    pub fn start_ferry_with(
        &self,
        nodes: &[&str],
        agent_env: &[(&str, &str)],
    ) -> Result<(Vec<Proc>, PathBuf)> {
        self.kubectl_ok(&["create", "namespace", "ferry-system"])?;
        for node in nodes {
            self.add_node(node)?;
        }
        // The operator's and each agent's endpoints on their own loopback ports, recorded
        // for operator_port() and agent_port().
        let mut procs = vec![self.spawn_operator("operator", &[])?];
        for node in nodes {
            procs.push(self.spawn_agent(node, agent_env)?);
        }
        Ok((procs, self.dir().join("hosts")))
    }

    /// A simulated node: a Node object labelled `ferry.dev/node=<node>` and its host-root
    /// directory `<dir>/hosts/<node>`, which it returns.
    pub fn add_node(&self, node: &str) -> Result<PathBuf> {
        self.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    ferry.dev/node: {node}\n"
        ))?;
        let root = self.dir().join("hosts").join(node);
        std::fs::create_dir_all(&root)?;
        Ok(root)
    }

    /// Start the agent of a node made by [`Self::add_node`], with extra environment (for
    /// a node whose agent differs from the others'), its endpoints on a free loopback port
    /// ([`Self::agent_port`]), logging to `<dir>/agent-<node>.log`.
    pub fn spawn_agent(&self, node: &str, envs: &[(&str, &str)]) -> Result<Proc> {
        self.spawn_agent_under(node, envs, &[])
    }

    /// [`Self::spawn_agent`] run under a wrapper command (e.g. `setpriv` dropping
    /// capabilities), whose arguments come before the agent's path.
    pub fn spawn_agent_under(
        &self,
        node: &str,
        envs: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Result<Proc> {
        let agent = workspace_bin("ferry-agent", "ferry-agent")?;
        let root = self.dir().join("hosts").join(node);
        let root = root.to_string_lossy();
        let listen = self.listen_address(&format!("agent-{node}"))?;
        let args = [
            "run",
            "--node",
            node,
            "--host-root",
            &root,
            "--namespace",
            "ferry-system",
            "--listen",
            &listen,
        ];
        let log = format!("agent-{node}.log");
        match wrapper.split_first() {
            None => self.spawn(&agent, &args, envs, &log),
            Some((cmd, rest)) => {
                let agent = agent.to_string_lossy();
                let all: Vec<&str> = rest
                    .iter()
                    .copied()
                    .chain(std::iter::once(agent.as_ref()))
                    .chain(args)
                    .collect();
                self.spawn(Path::new(cmd), &all, envs, &log)
            }
        }
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
        for crd in ["crd/copyjobs.ferry.dev", "crd/storageroots.ferry.dev"] {
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
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A process started by a test, killed when dropped.
#[derive(Debug)]
pub struct Proc(Child);

impl Proc {
    /// The process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Send a signal (`STOP`, `CONT`, `KILL`, ...) by name.
    pub fn signal(&self, sig: &str) -> Result<()> {
        let status = Command::new("kill")
            .args(["-s", sig, &self.0.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -s {sig} {} failed", self.0.id());
        }
        Ok(())
    }

    /// Kill the process (SIGKILL: no chance to clean up) and reap it.
    pub fn kill(&mut self) -> Result<()> {
        self.0.kill()?;
        self.0.wait()?;
        Ok(())
    }

    /// Leave the process running; returns its pid.
    pub fn detach(self) -> u32 {
        let this = std::mem::ManuallyDrop::new(self);
        this.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The arguments of `kubectl patch OBJ -n NS --type=merge -p PATCH`, of the status
/// subresource when `status`: for `kubectl` (may be refused) or `kubectl_ok`.
pub fn merge_patch<'a>(obj: &'a str, ns: &'a str, status: bool, patch: &'a str) -> Vec<&'a str> {
    let mut args = vec!["patch", obj, "-n", ns];
    if status {
        args.push("--subresource=status");
    }
    args.extend(["--type=merge", "-p", patch]);
    args
}

/// Build (a no-op when fresh) one of the workspace's binaries and return its path: a debug
/// build, or a release build when `FERRY_E2E_RELEASE=1` (for benchmarks).
pub fn workspace_bin(package: &str, bin: &str) -> Result<PathBuf> {
    let release = std::env::var_os("FERRY_E2E_RELEASE").is_some_and(|v| v == "1");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-q", "-p", package, "--bin", bin])
        .args(release.then_some("--release"))
        .current_dir(repo_root())
        .status()?;
    if !status.success() {
        bail!("building {bin} failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| repo_root().join("target"), PathBuf::from);
    Ok(target
        .join(if release { "release" } else { "debug" })
        .join(bin))
}

impl ControlPlane {
    /// Start a workspace binary against this control plane, logging to `<dir>/<log>`.
    pub fn spawn(
        &self,
        bin: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
        log: &str,
    ) -> Result<Proc> {
        // Appended: a process restarted by a test keeps its earlier incarnations' lines.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir().join(log))?;
        let child = Command::new(bin)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .envs(envs.iter().copied())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        Ok(Proc(child))
    }

    /// The last lines of a log in the control plane's directory (for failure messages).
    pub fn log_tail(&self, log: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir().join(log)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// The value of the series `name` that has (at least) `labels`, from /metrics text.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        let have: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
        let all = labels
            .iter()
            .all(|(k, v)| have.contains(&format!("{k}=\"{v}\"").as_str()));
        (n == name && all).then(|| value.parse().ok()).flatten()
    })
}

/// Every path under `root` whose name starts with `.ferry-` (staging names): none may be
/// left once a job has finished.
pub fn staging_leftovers(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with(".ferry-") {
                out.push(e.path());
            }
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(out)
}

/// The reasons of the events about one object, oldest first.
impl ControlPlane {
    pub fn event_reasons(&self, ns: &str, name: &str) -> Result<String> {
        self.kubectl_ok(&[
            "get",
            "events.events.k8s.io",
            "-n",
            ns,
            "--field-selector",
            &format!("regarding.name={name}"),
            "-o",
            "jsonpath={.items[*].reason}",
        ])
    }
}

/// A bind mount, undone when dropped: one filesystem seen under several simulated nodes'
/// host roots, as NFS is on real nodes (needs root).
#[derive(Debug)]
pub struct BindMount(PathBuf);

impl BindMount {
    pub fn new(from: &Path, to: &Path) -> Result<Self> {
        std::fs::create_dir_all(to)?;
        let status = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(to)
            .status()
            .context("run mount")?;
        if !status.success() {
            bail!("mount --bind {} {} failed", from.display(), to.display());
        }
        Ok(Self(to.to_path_buf()))
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Every entry under `root` (relative path → what a user would compare: type, mode,
/// owner, size, mtime, symlink target), walked without following links.
pub fn tree_meta(root: &Path) -> Result<std::collections::BTreeMap<PathBuf, String>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let m =
            std::fs::symlink_metadata(&path).with_context(|| format!("stat {}", path.display()))?;
        let target = if m.file_type().is_symlink() {
            std::fs::read_link(&path)?.display().to_string()
        } else {
            String::new()
        };
        let size = if m.is_dir() { 0 } else { m.len() };
        out.insert(
            rel.clone(),
            format!(
                "mode {:o} owner {}:{} size {size} mtime {}.{:09} nlink-group {} {target}",
                m.mode(),
                m.uid(),
                m.gid(),
                m.mtime(),
                m.mtime_nsec(),
                if m.is_dir() { 1 } else { m.nlink() },
            ),
        );
        if m.is_dir() {
            for e in std::fs::read_dir(&path)? {
                stack.push(rel.join(e?.file_name()));
            }
        }
    }
    Ok(out)
}

/// `diff -r --no-dereference a b` finds nothing: the same names, symlink targets and
/// bytes (metadata is `assert_same_tree`'s job); the error carries diff's report.
pub fn assert_same_contents(a: &Path, b: &Path) -> Result<()> {
    let diff = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .context("run diff")?;
    ensure!(
        diff.status.success(),
        "{} differs from {}: {}{}",
        b.display(),
        a.display(),
        String::from_utf8_lossy(&diff.stdout),
        String::from_utf8_lossy(&diff.stderr)
    );
    Ok(())
}

/// The destination equals the source: same entries with the same metadata (the top
/// directory's own metadata too) and the same bytes in every file.
pub fn assert_same_tree(src: &Path, dst: &Path) -> Result<()> {
    let (a, b) = (tree_meta(src)?, tree_meta(dst)?);
    let mut diffs = Vec::new();
    for (p, m) in &a {
        match b.get(p) {
            None => diffs.push(format!("missing {}", p.display())),
            Some(n) if n != m => diffs.push(format!("{}: source {m}, copy {n}", p.display())),
            Some(_) => {
                let sp = src.join(p);
                if std::fs::symlink_metadata(&sp)?.is_file()
                    && std::fs::read(&sp)? != std::fs::read(dst.join(p))?
                {
                    diffs.push(format!("{}: contents differ", p.display()));
                }
            }
        }
    }
    for p in b.keys().filter(|p| !a.contains_key(*p)) {
        diffs.push(format!("extra {}", p.display()));
    }
    if !diffs.is_empty() {
        diffs.truncate(20);
        bail!("copy differs from the source:\n  {}", diffs.join("\n  "));
    }
    Ok(())
}

/// Components running under their own identity (the chart's RBAC tests).
impl ControlPlane {
    /// A kubeconfig for this apiserver, with the admin kubeconfig's server and TLS settings,
    /// that authenticates as ServiceAccount `ns/name` with a token from the TokenRequest API:
    /// a process using it can do only what RBAC grants that account. Written to
    /// `<dir>/<name>.kubeconfig`.
    pub fn service_account_kubeconfig(&self, ns: &str, name: &str) -> Result<PathBuf> {
        let token = self.kubectl_ok(&["create", "token", name, "-n", ns, "--duration=2h"])?;
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
        let path = self.dir().join(format!("{name}.kubeconfig"));
        std::fs::write(&path, text.join("\n") + "\n")?;
        Ok(path)
    }

    /// kube-controller-manager (built by `e2e/tools/install.sh`) running only `controllers`
    /// with the admin kubeconfig, logging to `<dir>/kube-controller-manager.log`; `Ok(None)`
    /// with the reason printed when it is not installed and this is not CI.
    pub fn start_controller_manager_or_skip(&self, controllers: &[&str]) -> Result<Option<Proc>> {
        let bin = tool(
            "FERRY_KUBE_CONTROLLER_MANAGER",
            tools_dir().join("k8s/v1.35.4/bin/kube-controller-manager"),
        );
        if !bin.exists() {
            let why = format!(
                "{} is not installed; run e2e/tools/install.sh (make deps)",
                bin.display()
            );
            if std::env::var_os("CI").is_some() {
                bail!(why);
            }
            eprintln!("skipped: {why}");
            return Ok(None);
        }
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
    let why = format!(
        "prometheus-operator CRDs are not in {}; run e2e/tools/install.sh (make deps)",
        dir.display()
    );
    if std::env::var_os("CI").is_some() {
        bail!(why);
    }
    eprintln!("skipped: {why}");
    Ok(None)
}

/// helm (built by `e2e/tools/install.sh`); `Ok(None)` with the reason printed when it is not
/// installed and this is not CI.
pub fn helm_or_skip() -> Result<Option<PathBuf>> {
    let helm = tool("FERRY_HELM", tools_dir().join("helm/v3.22.0/bin/helm"));
    if helm.exists() {
        return Ok(Some(helm));
    }
    let why = format!(
        "{} is not installed; run e2e/tools/install.sh (make deps)",
        helm.display()
    );
    if std::env::var_os("CI").is_some() {
        bail!(why);
    }
    eprintln!("skipped: {why}");
    Ok(None)
}
