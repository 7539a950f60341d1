//! Ferry on the process tier as its Helm chart runs it: `deploy/ferry.yaml` applied (the
//! chart's RBAC, its admission policies, the tickets namespace), the operator and one agent
//! per simulated node on their ServiceAccounts' tokens (each agent's bound to its Node, as
//! the kubelet's tokens for the DaemonSet's pods are), with the chart's environment
//! (`FERRY_NAMESPACE`, `FERRY_TICKET_NAMESPACE`), and each agent's transfer port on a
//! loopback address of its own (node i on 127.0.0.(i+2)), so that copies between nodes run.
//! As root, each agent holds only the capabilities the chart gives its container
//! ([`agent_capabilities`], under `setpriv`), as every test's agents do
//! ([`ControlPlane::spawn_agent_under`]).
//! `make dev-up`, `make demo` and `make bench-network` start Ferry this way;
//! `e2e/tests/network.rs` and `e2e/tests/transfer_certs.rs` do the same step by step.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{free_port, wait_for, ControlPlane, Proc};

/// The namespace `deploy/ferry.yaml` installs into (release `ferry`).
pub const CHART_NAMESPACE: &str = "ferry-system";
/// Where the chart keeps the tickets of copies between nodes (`<namespace>-tickets`): the
/// operator writes them there and the agents read them there, so both must be told.
pub const TICKET_NAMESPACE: &str = "ferry-system-tickets";
/// How long the processes' tokens last: nothing renews them (the kubelet would), and
/// `make dev-up` may be left running for days.
const TOKEN_DURATION: &str = "8760h";
/// How long an agent may take to start and publish its transfer address (a debug build of
/// the binary if stale, its certificate from the operator's signer).
pub const ADVERTISED_WITHIN: Duration = Duration::from_secs(120);

/// The agent container's securityContext in the chart's values (charts/ferry/values.yaml),
/// checked for what its capabilities mean only with (not privileged, drop ALL, no
/// escalation, root, the runtime's seccomp profile); the capabilities it adds.
pub fn agent_capabilities() -> Result<Vec<String>> {
    let path = crate::repo_root().join("charts/ferry/values.yaml");
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path)?).context("values.yaml")?;
    let agent = &values["agent"];
    let sc = &agent["securityContext"];
    anyhow::ensure!(
        agent["privileged"] == serde_yaml::Value::Bool(false),
        "agent.privileged is on by default"
    );
    for (key, want) in [
        ("privileged", "false"),
        ("allowPrivilegeEscalation", "false"),
        ("readOnlyRootFilesystem", "true"),
        ("runAsUser", "0"),
    ] {
        let got = serde_yaml::to_string(&sc[key])?;
        anyhow::ensure!(got.trim() == want, "agent securityContext.{key}: {got}");
    }
    anyhow::ensure!(
        sc["seccompProfile"]["type"].as_str() == Some("RuntimeDefault"),
        "agent seccompProfile: {:?}",
        sc["seccompProfile"]
    );
    let drop: Vec<&str> = sc["capabilities"]["drop"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    anyhow::ensure!(drop == ["ALL"], "capabilities.drop {drop:?}");
    let add: Vec<String> = sc["capabilities"]["add"]
        .as_sequence()
        .context("capabilities.add")?
        .iter()
        .map(|v| v.as_str().map(str::to_string).context("a capability name"))
        .collect::<Result<_>>()?;
    anyhow::ensure!(!add.is_empty(), "no capabilities added");
    Ok(add)
}

/// `setpriv` arguments that leave a root process (after exec) exactly `caps` (Kubernetes
/// names: CHOWN, ...) and no_new_privs, as a container's process with that securityContext:
/// root's capabilities after exec are its bounding set.
pub fn setpriv_holding(caps: &[&str]) -> Vec<String> {
    let bounding: Vec<String> = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{}", c.to_lowercase())))
        .collect();
    vec![
        "setpriv".into(),
        format!("--bounding-set={}", bounding.join(",")),
        "--inh-caps=-all".into(),
        "--no-new-privs".into(),
        "--".into(),
    ]
}

/// The loopback address of the `i`th node's transfer port: 127.0.0.2, 127.0.0.3, ...
pub fn transfer_ip(i: usize) -> String {
    format!("127.0.0.{}", i + 2)
}

/// A loopback port free on 127.0.0.1 (see [`free_port`]) and on `ip` too.
fn free_port_on(ip: &str) -> Result<u16> {
    for _ in 0..100 {
        let port = free_port()?;
        if TcpListener::bind((ip, port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port on {ip}")
}

impl ControlPlane {
    /// Apply `deploy/ferry.yaml` (namespace `ferry-system` made and labelled first, as its
    /// header says) and return once its admission policies are in force: the API server
    /// applies a new ValidatingAdmissionPolicy a moment after it is stored, so until a
    /// server-side dry run that a policy refuses is refused, the cluster is not yet the
    /// chart's. Checked: node-labels (no one but the operator labels a CopyJob for a node)
    /// and agent-leases (an agent writes only its own node's Lease, asked as `node`'s agent,
    /// a Node made by [`Self::add_node`]).
    pub fn install_chart(&self, node: &str) -> Result<()> {
        self.install_rendered(CHART_NAMESPACE, "ferry.yaml")?;
        let labelled = format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: policy-probe\n  namespace: {CHART_NAMESPACE}\n  labels: {{node.ferry.dev/{node}: ''}}\nspec:\n  source: {{root: probe, path: a}}\n  destination: {{root: probe, path: b}}\n"
        );
        let agent = self.agent_kubeconfig(node)?;
        let agent = agent.to_string_lossy();
        let foreign_lease = format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: ferry-agent-not-{node}\n  namespace: {CHART_NAMESPACE}\n"
        );
        wait_for(
            "the chart's admission policies in force",
            Duration::from_secs(60),
            || {
                self.dry_run_refused(&[], &labelled, "set by Ferry's operator alone")
                    && self.dry_run_refused(
                        &["--kubeconfig", &agent],
                        &foreign_lease,
                        "may write only its own heartbeat Lease",
                    )
            },
        )
    }

    /// Whether creating `obj` (with kubectl's extra arguments `args`, e.g. another
    /// `--kubeconfig`) is refused with a message holding `why`, asked as a server-side dry
    /// run: it passes admission and stores nothing. What tells that an admission policy
    /// is in force: the API server applies one a moment after it is stored.
    pub fn dry_run_refused(&self, args: &[&str], obj: &str, why: &str) -> bool {
        let args: Vec<&str> = args
            .iter()
            .copied()
            .chain(["create", "--dry-run=server", "-f", "-"])
            .collect();
        self.kubectl_stdin(&args, obj)
            .is_ok_and(|o| !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(why))
    }

    /// The operator as the chart runs it: on its ServiceAccount's token, with the chart's
    /// namespaces, its endpoints on a free loopback port ([`Self::operator_port`]), logging
    /// to `<dir>/operator.log`.
    pub fn spawn_chart_operator(&self) -> Result<Proc> {
        let kc = self.service_account_kubeconfig_lasting(
            CHART_NAMESPACE,
            "ferry-operator",
            None,
            TOKEN_DURATION,
        )?;
        self.spawn_chart_operator_on(&kc)
    }

    /// The operator with the chart's environment on the token in `kubeconfig`, logging to
    /// `<dir>/operator.log` (appended to across restarts).
    pub fn spawn_chart_operator_on(&self, kubeconfig: &Path) -> Result<Proc> {
        self.spawn_chart_operator_with(kubeconfig, &[])
    }

    /// [`Self::spawn_chart_operator_on`] with the environment a chart value adds (`envs`,
    /// e.g. `FERRY_PEERING` for `peering.enabled`).
    pub fn spawn_chart_operator_with(
        &self,
        kubeconfig: &Path,
        envs: &[(&str, &str)],
    ) -> Result<Proc> {
        let (kc, image) = (kubeconfig.to_string_lossy(), holder_image()?);
        let mut env = vec![
            ("KUBECONFIG", kc.as_ref()),
            ("FERRY_NAMESPACE", CHART_NAMESPACE),
            ("FERRY_TICKET_NAMESPACE", TICKET_NAMESPACE),
            ("POD_NAME", "ferry-operator-0"),
            // As the chart sets it: the image its holder-pods policy admits.
            ("FERRY_HOLDER_IMAGE", &image),
        ];
        env.extend(envs.iter().copied());
        self.spawn_operator("operator", &env)
    }

    /// A kubeconfig with the agents' ServiceAccount token bound to Node `node`.
    fn agent_kubeconfig(&self, node: &str) -> Result<PathBuf> {
        self.service_account_kubeconfig_lasting(
            CHART_NAMESPACE,
            "ferry-agent",
            Some(node),
            TOKEN_DURATION,
        )
    }

    /// `node`'s agent (a node made by [`Self::add_node`]) as the chart runs it: on the
    /// agents' token bound to its Node, told the tickets namespace, its transfer port on
    /// `ip` (a free port), with extra environment `envs`; its endpoints on a free port of
    /// 127.0.0.1 ([`Self::agent_port`]), logging to `<dir>/agent-<node>.log`.
    pub fn spawn_chart_agent(&self, node: &str, ip: &str, envs: &[(&str, &str)]) -> Result<Proc> {
        let kc = self.agent_kubeconfig(node)?;
        let listen = format!("{ip}:{}", free_port_on(ip)?);
        let mut env = vec![
            (
                "KUBECONFIG",
                kc.to_str().context("a kubeconfig path that is UTF-8")?,
            ),
            ("FERRY_TICKET_NAMESPACE", TICKET_NAMESPACE),
            ("FERRY_TRANSFER_LISTEN", &listen),
        ];
        env.extend(envs.iter().copied());
        self.spawn_agent(node, &env)
    }

    /// Wait (at most `within`) until `node`'s agent publishes its transfer address in its
    /// heartbeat Lease (it does once its certificate is issued: from then on it can be
    /// paired); that address.
    pub fn advertised_transfer_address(&self, node: &str, within: Duration) -> Result<String> {
        let start = Instant::now();
        loop {
            let a = self.get(
                &format!("lease/ferry-agent-{node}"),
                CHART_NAMESPACE,
                "{.metadata.annotations.ferry\\.dev/transfer-address}",
            );
            match a {
                Ok(a) if !a.is_empty() => return Ok(a),
                _ if start.elapsed() > within => bail!(
                    "{node}'s Lease has no transfer address after {within:?}: {a:?}\n{}",
                    self.log_tail(&format!("agent-{node}.log"), 15)
                ),
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// [`Self::start_ferry`] as the chart runs Ferry: the chart installed with its policies
    /// in force ([`Self::install_chart`]), the simulated nodes, the operator
    /// ([`Self::spawn_chart_operator`]) and one agent per node, the `i`th with its transfer
    /// port on [`transfer_ip`]`(i)` ([`Self::spawn_chart_agent`]); returns once every agent
    /// publishes its transfer address. The processes (the operator first, then the agents in
    /// `nodes`' order; stopped when dropped) and the hosts directory.
    pub fn start_ferry_as_chart(&self, nodes: &[&str]) -> Result<(Vec<Proc>, PathBuf)> {
        let first = nodes.first().context("no nodes")?;
        for node in nodes {
            self.add_node(node)?;
        }
        self.install_chart(first)?;
        let mut procs = vec![self.spawn_chart_operator()?];
        for (i, node) in nodes.iter().enumerate() {
            procs.push(self.spawn_chart_agent(node, &transfer_ip(i), &[])?);
        }
        for node in nodes {
            self.advertised_transfer_address(node, ADVERTISED_WITHIN)?;
        }
        Ok((procs, self.dir().join("hosts")))
    }
}

/// The image the rendered chart (`deploy/ferry.yaml`) gives the operator for its holder
/// pods (`FERRY_HOLDER_IMAGE`): what the chart's holder-pods admission policy admits.
pub fn holder_image() -> Result<String> {
    let path = crate::repo_root().join("deploy/ferry.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    for doc in text.split("\n---\n") {
        let v: serde_yaml::Value = serde_yaml::from_str(doc)?;
        let v = serde_json::to_value(v)?;
        if v["kind"] != "Deployment" {
            continue;
        }
        let env = v["spec"]["template"]["spec"]["containers"][0]["env"].as_array();
        if let Some(e) = env
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "FERRY_HOLDER_IMAGE")
        {
            return e["value"]
                .as_str()
                .map(str::to_string)
                .context("FERRY_HOLDER_IMAGE has no value");
        }
    }
    bail!("deploy/ferry.yaml gives the operator no FERRY_HOLDER_IMAGE")
}
