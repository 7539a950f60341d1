//! Ferry's processes against a control plane: the operator and one agent per simulated
//! node (a host-root directory each), their ports, logs, and the binaries they run from.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::process::Proc;
use crate::{free_port, repo_root, ControlPlane};

/// Agent environment that pins a shard's workers at 2. A test that slows a copy with the
/// per-file `FERRY_FAULT_FILE_DELAY_MS` to act on it mid-way sizes its tree for this many
/// files in flight; at the agent's default (16 workers) the same copy ends 8x sooner.
pub const PACED: (&str, &str) = ("FERRY_WORKERS", "2");

impl ControlPlane {
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

    /// [`Self::spawn_agent`] run under a wrapper command (e.g. `setpriv` holding fewer
    /// capabilities), whose arguments come before the agent's path. Without one, as root,
    /// the agent holds only the capabilities the chart gives its container
    /// ([`crate::agent_capabilities`]): every test's agents run with what a real node's
    /// have. (A wrapper replaces that: a `setpriv` inside it could not drop more without
    /// CAP_SETPCAP.)
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
        let confined = if crate::is_root() && wrapper.is_empty() {
            let caps = crate::agent_capabilities()?;
            let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
            crate::setpriv_holding(&caps)
        } else {
            Vec::new()
        };
        let wrapper: Vec<&str> = confined
            .iter()
            .map(String::as_str)
            .chain(wrapper.iter().copied())
            .collect();
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
            .env(
                "RUST_LOG",
                std::env::var("FERRY_E2E_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(envs.iter().copied())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        Ok(Proc(child))
    }
}
