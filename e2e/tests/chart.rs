//! The Helm chart, as rendered into `deploy/` by `make generate`, against the real
//! kube-apiserver: every object is accepted by a server-side apply; the monitoring objects by
//! the prometheus-operator CRDs, selecting the chart's Services and pods; the agent's pod
//! only in a namespace that allows privileged pods. The operator and two agents run on
//! ServiceAccount tokens, bound only by the chart's RBAC, through a copy, PVC and CSI
//! resolution, a refusal with its event, finalizer deletion and TTL deletion; the roles grant
//! exactly the API calls the code makes (listed here, so a new permission is a test diff);
//! kube-controller-manager's aggregation controller gives the built-in `edit` and `view`
//! roles their CopyJob access; the `charts/ferry/ci/` values sets render what they say.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{
    assert_same_tree, http_get, merge_patch, prometheus_operator_crds_or_skip, repo_root, wait_for,
    ControlPlane, Proc,
};
use serde_json::{json, Value};

const NS: &str = "ferry-system";
/// Where the chart puts the tickets of copies between nodes (`<namespace>-tickets`).
const TICKETS: &str = "ferry-system-tickets";
const NODES: [&str; 2] = ["node-a", "node-b"];

fn rendered(file: &str) -> PathBuf {
    repo_root().join("deploy").join(file)
}

/// The user a component's ServiceAccount token authenticates as.
fn service_account(sa: &str) -> String {
    format!("system:serviceaccount:{NS}:{sa}")
}

/// Every object of a rendered multi-document YAML file, as JSON.
fn documents(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut out = Vec::new();
    // helm separates documents with a "---" line; one never occurs inside a document.
    for doc in text.split("\n---\n") {
        let v: serde_yaml::Value = serde_yaml::from_str(doc)
            .with_context(|| format!("a document of {}", path.display()))?;
        if !v.is_null() {
            out.push(serde_json::to_value(v)?);
        }
    }
    Ok(out)
}

fn get_json(cp: &ControlPlane, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    Ok(serde_json::from_str(&cp.kubectl_ok(&all)?)?)
}

/// Every label of `selector` (a matchLabels map) is on `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// `kubectl auth can-i` as `who` (kubectl's --as/--as-group arguments).
fn can_i(cp: &ControlPlane, who: &[&str], question: &[&str]) -> Result<bool> {
    let mut args = vec!["auth", "can-i"];
    args.extend(question);
    args.extend(who);
    let out = cp.kubectl(&args)?;
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match answer.as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => bail!(
            "kubectl {}: {answer} {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Whether ServiceAccount `sa` (with its token's groups) may `verb` (approve, sign) for
/// `signer`, by a SubjectAccessReview: `kubectl auth can-i` cannot name a signer (it maps
/// `signers.certificates.k8s.io`, which discovery does not list, to no group).
fn may_for_signer(cp: &ControlPlane, sa: &str, verb: &str, signer: &str) -> Result<bool> {
    let review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": service_account(sa),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NS}"), "system:authenticated"],
            "resourceAttributes": {
                "group": "certificates.k8s.io",
                "resource": "signers",
                "verb": verb,
                "name": signer,
            },
        },
    });
    let out = cp.kubectl_stdin(&["create", "-f", "-", "-o", "json"], &review.to_string())?;
    ensure!(
        out.status.success(),
        "SubjectAccessReview: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout)?;
    Ok(answer["status"]["allowed"] == true)
}

/// kubectl's impersonation arguments for a component's ServiceAccount, with the groups its
/// token carries (so a grant to those groups would count too).
fn as_component(sa: &str) -> Vec<String> {
    vec![
        format!("--as={}", service_account(sa)),
        "--as-group=system:serviceaccounts".into(),
        format!("--as-group=system:serviceaccounts:{NS}"),
        "--as-group=system:authenticated".into(),
    ]
}

#[test]
fn rendered_chart_is_accepted_by_the_apiserver_and_the_agent_pod_needs_a_privileged_namespace(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_rendered(NS, "ferry.yaml")?;
    // Everything the file holds now exists (the apply reported no error, and nothing was
    // skipped).
    let mut expected = BTreeSet::new();
    for doc in documents(&rendered("ferry.yaml"))? {
        let kind = doc["kind"].as_str().unwrap_or_default().to_lowercase();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let ns = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or(NS)
            .to_string();
        expected.insert((format!("{kind}/{name}"), ns));
    }
    for (object, ns) in &expected {
        let out = cp.kubectl(&["get", object, "-n", ns, "-o", "name"])?;
        ensure!(
            out.status.success(),
            "{object} from deploy/ferry.yaml is not there: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for object in [
        "deployment/ferry-operator",
        "daemonset/ferry-agent",
        "serviceaccount/ferry-operator",
        "serviceaccount/ferry-agent",
        "service/ferry-operator",
        "service/ferry-agent",
        "configmap/ferry-dashboards",
        "poddisruptionbudget/ferry-operator",
    ] {
        ensure!(
            expected.contains(&(object.to_string(), NS.to_string())),
            "deploy/ferry.yaml lacks {object}: {expected:?}"
        );
    }
    // Monitoring objects are off by default.
    ensure!(
        !expected.iter().any(|(o, _)| o.starts_with("servicemonitor")
            || o.starts_with("podmonitor")
            || o.starts_with("prometheusrule")),
        "the default render has monitoring objects: {expected:?}"
    );

    // The DaemonSet as the agent needs it.
    let ds = get_json(&cp, &["get", "daemonset", "ferry-agent", "-n", NS])?;
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    // Not privileged: root with seven capabilities, the runtime's seccomp profile, no
    // escalation (e2e/tests/capabilities.rs shows each capability is needed).
    ensure!(
        c["securityContext"]
            == serde_json::json!({
                "privileged": false,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsUser": 0,
                "runAsGroup": 0,
                "seccompProfile": {"type": "RuntimeDefault"},
                "capabilities": {
                    "drop": ["ALL"],
                    "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "MKNOD", "SETFCAP", "SYS_ADMIN"]
                }
            }),
        "agent securityContext {}",
        c["securityContext"]
    );
    ensure!(
        c["args"]
            == serde_json::json!([
                "run",
                "--host-root",
                "/host",
                "--workers",
                "0",
                "--lease-seconds",
                "30",
                "--max-shards",
                "4"
            ]),
        "agent args {}",
        c["args"]
    );
    let env = |name: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or_default()
    };
    ensure!(
        env("NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName",
        "NODE_NAME is {}",
        env("NODE_NAME")
    );
    ensure!(
        env("POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace",
        "POD_NAMESPACE is {}",
        env("POD_NAMESPACE")
    );
    let mounts: BTreeSet<String> = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            format!(
                "{} {}",
                m["mountPath"].as_str().unwrap_or_default(),
                m["mountPropagation"].as_str().unwrap_or_default()
            )
        })
        .collect();
    ensure!(
        mounts
            == BTreeSet::from([
                "/host HostToContainer".to_string(),
                "/host/var/lib/kubelet HostToContainer".to_string(),
            ]),
        "agent mounts {mounts:?}"
    );
    ensure!(
        pod["tolerations"] == serde_json::json!([{"operator": "Exists"}]),
        "agent tolerations {}",
        pod["tolerations"]
    );
    ensure!(
        pod["priorityClassName"] == "system-node-critical",
        "agent priority {}",
        pod["priorityClassName"]
    );

    // Pod Security: the agent's pod (the DaemonSet's template on a node; no kubelet or
    // DaemonSet controller runs here, so the test submits it) is admitted in the labelled
    // namespace and refused in one that enforces `baseline`.
    let mut agent_pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ferry-agent-probe", "labels": ds["spec"]["template"]["metadata"]["labels"]},
        "spec": pod,
    });
    agent_pod["spec"]["nodeName"] = "node-a".into();
    let pod_json = agent_pod.to_string();
    let out = cp.kubectl_stdin(
        &["create", "--dry-run=server", "-n", NS, "-f", "-"],
        &pod_json,
    )?;
    ensure!(
        out.status.success(),
        "the agent's pod is refused in {NS}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    cp.kubectl_ok(&["create", "namespace", "baseline"])?;
    cp.kubectl_ok(&[
        "label",
        "namespace",
        "baseline",
        "pod-security.kubernetes.io/enforce=baseline",
    ])?;
    let out = cp.kubectl_stdin(
        &["create", "--dry-run=server", "-n", "baseline", "-f", "-"],
        &pod_json,
    )?;
    let err = String::from_utf8_lossy(&out.stderr);
    // For its hostPath volumes and SYS_ADMIN only: not as a privileged container.
    ensure!(
        !out.status.success()
            && err.contains("violates PodSecurity")
            && err.contains("hostPath volumes")
            && err.contains("\"SYS_ADMIN\"")
            && !err.contains("privileged (container"),
        "the agent's pod was not refused under enforce=baseline for hostPath and SYS_ADMIN alone: {err}"
    );

    // The operator: non-root, nothing writable, no capabilities, its leader-election
    // identity and namespace from the pod.
    let deploy = get_json(&cp, &["get", "deployment", "ferry-operator", "-n", NS])?;
    ensure!(
        deploy["spec"]["replicas"] == 2,
        "replicas {}",
        deploy["spec"]["replicas"]
    );
    let spec = &deploy["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    ensure!(
        spec["securityContext"]["runAsNonRoot"] == true
            && c["securityContext"]["allowPrivilegeEscalation"] == false
            && c["securityContext"]["readOnlyRootFilesystem"] == true
            && c["securityContext"]["capabilities"]["drop"] == serde_json::json!(["ALL"]),
        "operator security context: {} {}",
        spec["securityContext"],
        c["securityContext"]
    );
    let env: BTreeSet<String> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let from = &e["valueFrom"]["fieldRef"]["fieldPath"];
            format!(
                "{}={}",
                e["name"].as_str().unwrap_or_default(),
                from.as_str().map_or_else(
                    || e["value"].as_str().unwrap_or_default().to_string(),
                    |f| format!("<{f}>")
                )
            )
        })
        .collect();
    for want in [
        "POD_NAME=<metadata.name>",
        "FERRY_NAMESPACE=ferry-system",
        "FERRY_KUBELET_DIR=/var/lib/kubelet",
        "FERRY_LISTEN=0.0.0.0:9090",
    ] {
        ensure!(env.contains(want), "operator env lacks {want}: {env:?}");
    }
    // Each Service selects its own component's pods and not the other's.
    let ds_labels = &ds["spec"]["template"]["metadata"]["labels"];
    let op_labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (svc, own, other) in [
        ("ferry-operator", op_labels, ds_labels),
        ("ferry-agent", ds_labels, op_labels),
    ] {
        let s = get_json(&cp, &["get", "service", svc, "-n", NS])?;
        let sel = &s["spec"]["selector"];
        ensure!(
            selects(sel, own) && !selects(sel, other),
            "service {svc} selector {sel}"
        );
        ensure!(
            s["spec"]["ports"][0]["targetPort"] == "metrics",
            "service {svc} does not target the metrics port"
        );
    }
    // The dashboards, for the Grafana sidecar: one key per dashboards/*.json, valid JSON.
    let cm = get_json(&cp, &["get", "configmap", "ferry-dashboards", "-n", NS])?;
    ensure!(
        cm["metadata"]["labels"]["grafana_dashboard"] == "1",
        "dashboards ConfigMap labels {}",
        cm["metadata"]["labels"]
    );
    let dir = repo_root().join("charts/ferry/dashboards");
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            files.insert(name);
        }
    }
    let keys: BTreeSet<String> = cm["data"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    ensure!(
        !files.is_empty() && keys == files,
        "ConfigMap keys {keys:?}, dashboards {files:?}"
    );
    for name in &files {
        let shipped: Value = serde_json::from_str(cm["data"][name].as_str().unwrap_or_default())
            .with_context(|| format!("dashboard {name} in the ConfigMap is not JSON"))?;
        let source: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(name))?)?;
        ensure!(shipped == source, "dashboard {name} differs from its file");
    }
    Ok(())
}

#[test]
fn monitoring_render_is_accepted_by_the_prometheus_operator_crds_and_scrapes_the_charts_pods(
) -> Result<()> {
    let Some(crds) = prometheus_operator_crds_or_skip()? else {
        return Ok(());
    };
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    // The CRDs of prometheus-operator (its own schemas validate the objects), then the
    // monitoring render.
    cp.kubectl_ok(&["apply", "--server-side", "-f", &crds.to_string_lossy()])?;
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/podmonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ])?;
    cp.install_rendered(NS, "ferry-monitoring.yaml")?;

    // The ServiceMonitor finds the operator's Service (and only it) and names its port.
    let sm = get_json(&cp, &["get", "servicemonitor", "ferry-operator", "-n", NS])?;
    let labels: Vec<String> = sm["spec"]["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    ensure!(
        !labels.is_empty(),
        "ServiceMonitor without a selector: {sm}"
    );
    let found = cp.kubectl_ok(&[
        "get",
        "services",
        "-n",
        NS,
        "-l",
        &labels.join(","),
        "-o",
        "name",
    ])?;
    ensure!(
        found.trim() == "service/ferry-operator",
        "the ServiceMonitor selects {found:?}"
    );
    let svc = get_json(&cp, &["get", "service", "ferry-operator", "-n", NS])?;
    ensure!(
        sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"],
        "ServiceMonitor port {} is not the Service's {}",
        sm["spec"]["endpoints"][0]["port"],
        svc["spec"]["ports"][0]["name"]
    );
    ensure!(
        sm["spec"]["namespaceSelector"]["matchNames"] == serde_json::json!([NS]),
        "ServiceMonitor namespaces {}",
        sm["spec"]["namespaceSelector"]
    );

    // The PodMonitor selects the agents' pods (not the operator's) on their metrics port.
    let pm = get_json(&cp, &["get", "podmonitor", "ferry-agent", "-n", NS])?;
    let ds = get_json(&cp, &["get", "daemonset", "ferry-agent", "-n", NS])?;
    let deploy = get_json(&cp, &["get", "deployment", "ferry-operator", "-n", NS])?;
    let sel = &pm["spec"]["selector"]["matchLabels"];
    ensure!(
        selects(sel, &ds["spec"]["template"]["metadata"]["labels"])
            && !selects(sel, &deploy["spec"]["template"]["metadata"]["labels"]),
        "PodMonitor selector {sel}"
    );
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    ensure!(
        endpoint["port"] == ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"],
        "PodMonitor port {}",
        endpoint["port"]
    );
    // Both scrape jobs are named as alerts/ferry.rules.yaml and the dashboards expect
    // (`job="ferry-agent"`, `job="ferry-operator"`), and no target label `node` shadows the
    // one the agents put on their series themselves.
    for (kind, relabelings, job) in [
        ("PodMonitor", &endpoint["relabelings"], "ferry-agent"),
        (
            "ServiceMonitor",
            &sm["spec"]["endpoints"][0]["relabelings"],
            "ferry-operator",
        ),
    ] {
        let relabelings = relabelings.as_array().cloned().unwrap_or_default();
        ensure!(
            relabelings
                .iter()
                .any(|r| r["targetLabel"] == "job" && r["replacement"] == job),
            "{kind} does not name its job {job}: {relabelings:?}"
        );
        ensure!(
            !relabelings.iter().any(|r| r["targetLabel"] == "node"),
            "{kind} sets a node target label: {relabelings:?}"
        );
    }
    let rules_text =
        std::fs::read_to_string(repo_root().join("charts/ferry/alerts/ferry.rules.yaml"))?;
    for job in ["ferry-agent", "ferry-operator"] {
        ensure!(
            rules_text.contains(&format!("job=\"{job}\"")),
            "the alerts no longer select job=\"{job}\"; align the monitors' job names"
        );
    }
    for (kind, name) in [
        ("servicemonitor", "ferry-operator"),
        ("podmonitor", "ferry-agent"),
        ("prometheusrule", "ferry"),
    ] {
        let labels = cp.get(&format!("{kind}/{name}"), NS, "{.metadata.labels.release}")?;
        ensure!(
            labels == "kube-prometheus-stack",
            "{kind} lacks the release label kube-prometheus-stack selects on"
        );
    }

    // The PrometheusRule carries alerts/ferry.rules.yaml's groups unchanged (as the
    // apiserver stored them), and that file is a rule file Prometheus accepts.
    let rules_file = repo_root().join("charts/ferry/alerts/ferry.rules.yaml");
    let file: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&rules_file)?)?;
    let file = serde_json::to_value(file)?;
    let rule = get_json(&cp, &["get", "prometheusrule", "ferry", "-n", NS])?;
    ensure!(
        rule["spec"]["groups"] == file["groups"]
            && file["groups"].as_array().is_some_and(|g| !g.is_empty()),
        "PrometheusRule groups differ from alerts/ferry.rules.yaml:\n{}\n{}",
        rule["spec"]["groups"],
        file["groups"]
    );
    let promtool =
        std::env::var_os("FERRY_PROMTOOL").map_or_else(|| PathBuf::from("promtool"), PathBuf::from);
    match std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules_file)
        .output()
    {
        Ok(out) => ensure!(
            out.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("skipped: promtool check rules ({e})"),
    }
    Ok(())
}

/// PATCH `patch` (a JSON patch) to the status of CopyJob `ns/name` with the token and server
/// of kubeconfig `kc`, as the agent sends its progress: the HTTP status code and body.
fn json_patch_status(kc: &Path, ns: &str, name: &str, patch: &str) -> Result<(String, String)> {
    let config = std::fs::read_to_string(kc)?;
    let field = |key: &str| {
        config
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(key))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    let (server, token) = (field("server:"), field("token:"));
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "-k",
            "-X",
            "PATCH",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Content-Type: application/json-patch+json"])
        .args(["--data-binary", patch])
        .arg(format!(
            "{server}/apis/ferry.dev/v1alpha1/namespaces/{ns}/copyjobs/{name}/status"
        ))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    Ok((code.to_string(), body.to_string()))
}

/// The operator and one agent per node (made by `add_node`) as processes, each with a
/// kubeconfig holding its own ServiceAccount's token. Returns the processes and the endpoint
/// ports of the operator and of each agent.
fn start_with_tokens(cp: &ControlPlane) -> Result<(Vec<Proc>, Vec<u16>)> {
    let operator_kc = cp.service_account_kubeconfig(NS, "ferry-operator", None)?;
    // Each agent's token is bound to its node, as the kubelet's are (the chart's admission
    // policy lets an agent write only its own node's Lease).
    let mut agent_kcs = Vec::new();
    for node in NODES {
        agent_kcs.push(cp.service_account_kubeconfig(NS, "ferry-agent", Some(node))?);
    }
    // Each kubeconfig is the component's identity, not the admin's.
    let identities = std::iter::once((&operator_kc, "ferry-operator"))
        .chain(agent_kcs.iter().map(|kc| (kc, "ferry-agent")));
    for (kc, sa) in identities {
        let who = get_json(
            cp,
            &["--kubeconfig", &kc.to_string_lossy(), "auth", "whoami"],
        )?;
        ensure!(
            who["status"]["userInfo"]["username"] == service_account(sa).as_str(),
            "{} authenticates as {}",
            kc.display(),
            who["status"]["userInfo"]
        );
    }
    let operator_kc = operator_kc.to_string_lossy();
    // The holder pods' image, as the chart gives it to the operator (and to its policy).
    let image = ferry_e2e::holder_image()?;
    // The spawned process's KUBECONFIG replaces the admin's.
    let mut procs = vec![cp.spawn_operator(
        "operator",
        &[
            ("KUBECONFIG", &operator_kc),
            ("FERRY_NAMESPACE", NS),
            ("FERRY_TICKET_NAMESPACE", TICKETS),
            ("POD_NAME", "ferry-operator-0"),
            ("FERRY_HOLDER_IMAGE", &image),
        ],
    )?];
    let mut ports = vec![cp.operator_port()?];
    for (node, kc) in NODES.iter().zip(&agent_kcs) {
        procs.push(cp.spawn_agent(
            node,
            &[
                ("KUBECONFIG", &kc.to_string_lossy()),
                ("FERRY_TICKET_NAMESPACE", TICKETS),
            ],
        )?);
        ports.push(cp.agent_port(node)?);
    }
    Ok((procs, ports))
}

#[test]
fn operator_and_agents_on_tokens_bound_only_by_the_charts_rbac_copy_resolve_refuse_and_delete(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_rendered(NS, "ferry.yaml")?;
    for node in NODES {
        cp.add_node(node)?;
    }
    let hosts = cp.dir().join("hosts");
    let (_procs, ports) = start_with_tokens(&cp)?;

    // Each agent is ready: its CopyJob watch is synced (list, watch) and its heartbeat Lease
    // was written (a server-side apply that created it: create, patch). The operator is
    // ready once it leads and its CopyJob watch has listed the jobs.
    let logs = ["operator.log", "agent-node-a.log", "agent-node-b.log"];
    for (log, port) in logs.iter().zip(&ports) {
        let ready = wait_for(
            &format!("/readyz of {log}"),
            Duration::from_secs(60),
            || http_get(*port, "/readyz").is_some_and(|r| ferry_e2e::http_code(&r) == "200"),
        );
        if let Err(e) = ready {
            bail!(
                "{e}: {}\n{}",
                http_get(*port, "/readyz").unwrap_or_default(),
                cp.log_tail(log, 10)
            );
        }
    }
    // The operator leads (get, create on its Lease).
    cp.wait_until(
        "lease/ferry-operator",
        NS,
        "{.spec.holderIdentity}",
        Duration::from_secs(60),
        |h| h == "ferry-operator-0",
    )?;
    // An agent's token cannot take the operator's Lease or renew another node's heartbeat
    // (RBAC allows both: the chart's admission policy refuses them), nor write a Lease with
    // a token bound to no node.
    let node_a = cp.dir().join("ferry-agent-node-a.kubeconfig");
    let unbound = cp.service_account_kubeconfig(NS, "ferry-agent", None)?;
    let lease = |name: &str| {
        format!("{{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"{NS}\"}},\"spec\":{{\"holderIdentity\":\"thief\",\"leaseDurationSeconds\":100000}}}}")
    };
    for (kc, name, says) in [
        (
            &node_a,
            "ferry-operator",
            "may write only its own heartbeat Lease ferry-agent-node-a",
        ),
        (
            &node_a,
            "ferry-agent-node-b",
            "may write only its own heartbeat Lease ferry-agent-node-a",
        ),
        (&unbound, "ferry-agent-node-a", "bound to its node"),
    ] {
        let out = cp.kubectl_stdin(
            &[
                "--kubeconfig",
                &kc.to_string_lossy(),
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=thief",
                "-f",
                "-",
            ],
            &lease(name),
        )?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains(says),
            "{}: writing Lease {name}: {err}",
            kc.display()
        );
    }
    ensure!(
        cp.get("lease/ferry-operator", NS, "{.spec.holderIdentity}")? == "ferry-operator-0",
        "the operator's Lease changed hands"
    );

    // A tenant namespace that a StorageRoot admits by label (the operator reads the
    // namespace), and a tree on node-b.
    cp.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n  labels: {ferry.dev/tenant: a}\n")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: team-data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-b}\n  namespaces:\n    selector:\n      matchLabels: {ferry.dev/tenant: a}\n")?;
    let tree = hosts.join("node-b/srv/data/src");
    for d in 0..5 {
        std::fs::create_dir_all(tree.join(format!("d{d}")))?;
        for f in 0..20 {
            let body: Vec<u8> = (0..(d * 311 + f * 97))
                .map(|i| (i * 13 + f) as u8)
                .collect();
            std::fs::write(tree.join(format!("d{d}/f{f}")), body)?;
        }
    }

    // A CopySchedule, every minute, keeping no succeeded run: its first run is created
    // (create), reported (its status, by server-side apply; events) and deleted as history
    // (delete) while the steps below run.
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopySchedule\nmetadata:\n  name: every\n  namespace: team-a\nspec:\n  schedule: '* * * * *'\n  successfulJobsHistoryLimit: 0\n  jobTemplate:\n    spec:\n      source: {root: team-data, path: src}\n      destination: {root: team-data, path: scheduled}\n")?;

    // A copy between roots: nodes, StorageRoots, the namespace, the shard written into the
    // status (operator) and its progress (agent).
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: roots\n  namespace: team-a\nspec:\n  source: {root: team-data, path: src}\n  destination: {root: team-data, path: copy}\n")?;
    cp.wait_succeeded("team-a", "roots", 120)?;
    assert_same_tree(&tree, &hosts.join("node-b/srv/data/copy"))?;
    // An agent's token may write only its own node's shards, only their progress: the
    // chart's admission policy refuses the rest, which RBAC allows (the status is where
    // the operator tells agents what to copy, and users read what happened).
    let node_b = cp.dir().join("ferry-agent-node-b.kubeconfig");
    ensure!(
        cp.get("copyjob/roots", "team-a", "{.status.shards[0].node}")? == "node-b",
        "the roots job's shard is on node-b"
    );
    let shard = "/status/shards/0";
    for (kc, patch, says) in [
        (
            &node_a,
            format!(r#"[{{"op":"replace","path":"{shard}/filesDone","value":1}}]"#),
            "may write only the progress of shards assigned to node node-a",
        ),
        (
            &node_b,
            format!(r#"[{{"op":"replace","path":"{shard}/sourceRoot","value":"/"}}]"#),
            "not their assignment",
        ),
        (
            &node_b,
            format!(r#"[{{"op":"replace","path":"{shard}/node","value":"node-a"}}]"#),
            "not their assignment",
        ),
        (
            &node_b,
            r#"[{"op":"replace","path":"/status/phase","value":"Failed"}]"#.to_string(),
            "not the job's phase",
        ),
        (
            &unbound,
            format!(r#"[{{"op":"replace","path":"{shard}/filesDone","value":1}}]"#),
            "bound to its node",
        ),
    ] {
        // As the agent sends it: a JSON patch, with no read first (which RBAC denies it).
        let (code, body) = json_patch_status(kc, "team-a", "roots", &patch)?;
        ensure!(
            code == "403" && body.contains(says),
            "{}: {patch}: {code} {body}",
            kc.display()
        );
    }
    let finalizers = cp.get("copyjob/roots", "team-a", "{.metadata.finalizers}")?;
    ensure!(
        finalizers.contains("ferry.dev/cleanup"),
        "the operator did not add its finalizer: {finalizers}"
    );

    // A claim on a local PV on node-b: the claim and its volume are read.
    let pv_tree = hosts.join("node-b/mnt/disks/pv1/src");
    std::fs::create_dir_all(&pv_tree)?;
    for f in 0..10u64 {
        std::fs::write(
            pv_tree.join(format!("f{f}")),
            vec![f as u8; (f * 500) as usize],
        )?;
    }
    // Claims bind as in a cluster (the PV controller); Ferry uses a claim only once Bound.
    let _binder = cp.start_volume_binder()?;
    cp.apply("apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv1\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  local: {path: /mnt/disks/pv1}\n  claimRef: {namespace: team-a, name: data}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {key: ferry.dev/node, operator: In, values: [node-b]}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\n  namespace: team-a\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  volumeName: pv1\n  resources: {requests: {storage: 1Gi}}\n")?;
    cp.wait_claim_bound("team-a", "data")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-pvc\n  namespace: team-a\nspec:\n  source: {pvc: data, path: src}\n  destination: {root: team-data, path: from-pvc}\n")?;
    cp.wait_succeeded("team-a", "from-pvc", 120)?;
    assert_same_tree(&pv_tree, &hosts.join("node-b/srv/data/from-pvc"))?;

    // A claim on a CSI volume that no pod mounts: the operator lists the namespace's pods,
    // finds none, and starts a holder pod for it (through the chart's admission policy).
    cp.apply("apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv-csi\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  csi: {driver: fake.csi.ferry.dev, volumeHandle: vol-1}\n  claimRef: {namespace: team-a, name: csi-data}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: csi-data\n  namespace: team-a\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  volumeName: pv-csi\n  resources: {requests: {storage: 1Gi}}\n")?;
    cp.wait_claim_bound("team-a", "csi-data")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-csi\n  namespace: team-a\nspec:\n  source: {pvc: csi-data, path: src}\n  destination: {root: team-data, path: from-csi}\n")?;
    cp.wait_until(
        "copyjob/from-csi",
        "team-a",
        "{.status.conditions[?(@.type==\"Resolved\")].reason}",
        Duration::from_secs(60),
        |r| r == "VolumeNotMounted",
    )?;
    held_claim_is_copied_and_its_holder_deleted(&cp, &hosts)?;

    // A refusal is a condition and an event (events.k8s.io, created by the operator).
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: no-root\n  namespace: team-a\nspec:\n  source: {root: missing, path: src}\n  destination: {root: team-data, path: x}\n")?;
    cp.wait_until(
        "copyjob/no-root",
        "team-a",
        "{.status.conditions[?(@.type==\"Resolved\")].reason}",
        Duration::from_secs(60),
        |r| r == "RootNotFound",
    )?;
    wait_for("the RootNotFound event", Duration::from_secs(30), || {
        cp.kubectl_ok(&[
            "get",
            "events.events.k8s.io",
            "-n",
            "team-a",
            "-o",
            "jsonpath={range .items[*]}{.reason} {.regarding.name}{\"\\n\"}{end}",
        ])
        .is_ok_and(|e| e.lines().any(|l| l == "RootNotFound no-root"))
    })?;

    // Deleting jobs: the finalizer comes off (patch) once nothing runs for them; the
    // finished copy, the waiting one and the refused one.
    for job in ["roots", "from-csi", "no-root"] {
        let out = cp.kubectl(&[
            "delete",
            "copyjob",
            job,
            "-n",
            "team-a",
            "--wait=true",
            "--timeout=60s",
        ])?;
        ensure!(
            out.status.success(),
            "deleting {job}: {}\noperator:\n{}",
            String::from_utf8_lossy(&out.stderr),
            cp.log_tail("operator.log", 10)
        );
    }
    // A finished job past its TTL is deleted by the operator (delete), then its finalizer
    // removed; its copy stays.
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: short-lived\n  namespace: team-a\nspec:\n  source: {root: team-data, path: src}\n  destination: {root: team-data, path: short-lived}\n  ttlSecondsAfterFinished: 0\n")?;
    cp.wait_until(
        "copyjob/short-lived",
        "team-a",
        "{.metadata.name}",
        Duration::from_secs(120),
        str::is_empty,
    )?;
    assert_same_tree(&tree, &hosts.join("node-b/srv/data/short-lived"))?;

    // The schedule's first run succeeded and, beyond its history limit of 0, was deleted.
    cp.wait_until(
        "copyschedule/every",
        "team-a",
        "{.status.lastSuccessfulTime}",
        Duration::from_secs(120),
        // An unset time is written as null.
        |t| !t.is_empty() && t != "null",
    )?;
    assert_same_tree(&tree, &hosts.join("node-b/srv/data/scheduled"))?;
    wait_for(
        "the schedule's Deleted event",
        Duration::from_secs(60),
        || {
            cp.event_reasons("team-a", "every")
                .is_ok_and(|r| r.contains("Created") && r.contains("Deleted"))
        },
    )
    .with_context(|| format!("events: {:?}", cp.event_reasons("team-a", "every")))?;

    // Leader election renewed its Lease (update) while all this ran.
    cp.wait_until(
        "lease/ferry-operator",
        NS,
        "{.spec.acquireTime} {.spec.renewTime}",
        Duration::from_secs(30),
        |t| t.split_once(' ').is_some_and(|(a, r)| a != r),
    )?;

    // No call was refused on the way (a refusal the code retries would not fail a step).
    for log in logs {
        let text = std::fs::read_to_string(cp.dir().join(log))?;
        let refused: Vec<&str> = text
            .lines()
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .collect();
        ensure!(
            refused.is_empty(),
            "{log} has refused API calls:\n{}",
            refused.join("\n")
        );
    }
    Ok(())
}

/// Job `from-csi` of the test above waits for claim `csi-data` (CSI volume `pv-csi`), which
/// no pod mounts: the operator has started a holder pod (the restricted shape its admission
/// policy allows) and says so. No scheduler or kubelet runs here: the test binds the pod to
/// node-b, makes the kubelet's mount directory and reports the pod Running, as they would;
/// the copy then runs on node-b, and the holder is deleted when the job has succeeded. The
/// operator's token cannot create any other pod.
fn held_claim_is_copied_and_its_holder_deleted(cp: &ControlPlane, hosts: &Path) -> Result<()> {
    let uid = cp.get("copyjob/from-csi", "team-a", "{.metadata.uid}")?;
    // The job's Resolved condition, once `says` holds for its message.
    let resolved_says = |says: &dyn Fn(&str) -> bool| {
        cp.wait_until(
            "copyjob/from-csi",
            "team-a",
            "{.status.conditions[?(@.type==\"Resolved\")].message}",
            Duration::from_secs(60),
            says,
        )
    };
    let holder = format!(
        "ferry-holder-{}-source",
        uid.replace('-', "").get(..8).unwrap_or_default()
    );
    resolved_says(&|m: &str| {
        m.contains(&format!(
            "Ferry started holder pod {holder:?} to mount claim \"csi-data\""
        ))
    })?;
    let pod = get_json(cp, &["get", "pod", &holder, "-n", "team-a", "-o", "json"])?;
    let labels = &pod["metadata"]["labels"];
    ensure!(
        labels["ferry.dev/holder-of"] == uid.as_str() && labels["ferry.dev/holds"] == "source",
        "holder labels {labels}"
    );
    let owner = &pod["metadata"]["ownerReferences"][0];
    ensure!(
        owner["kind"] == "CopyJob" && owner["name"] == "from-csi" && owner["uid"] == uid.as_str(),
        "holder owner {owner}"
    );
    let spec = &pod["spec"];
    ensure!(
        spec["volumes"][0]["persistentVolumeClaim"]
            == json!({"claimName": "csi-data", "readOnly": true}),
        "the source's holder does not mount it read-only: {}",
        spec["volumes"]
    );
    ensure!(
        spec["automountServiceAccountToken"] == false
            && spec["securityContext"]["runAsNonRoot"] == true
            && spec["containers"][0]["securityContext"]["capabilities"]["drop"] == json!(["ALL"])
            && spec["containers"][0]["args"] == json!(["pause"]),
        "holder spec {spec}"
    );
    // A scheduler that cannot place it says why on the pod; the job says it too.
    cp.kubectl_ok(&merge_patch(
        &format!("pod/{holder}"),
        "team-a",
        true,
        r#"{"status":{"conditions":[{"type":"PodScheduled","status":"False","reason":"Unschedulable","message":"0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: storage}."}]}}"#,
    ))?;
    resolved_says(&|m: &str| {
        m.contains(&format!("holder pod {holder:?} for claim \"csi-data\" cannot be scheduled (Unschedulable): 0/2 nodes are available: 2 node(s) had untolerated taint"))
    })?;
    // The scheduler's part: bind it to node-b (where the destination root is).
    cp.kubectl_stdin(
        &["create", "-f", "-"],
        &format!("apiVersion: v1\nkind: Binding\nmetadata: {{name: {holder}, namespace: team-a}}\ntarget: {{apiVersion: v1, kind: Node, name: node-b}}\n"),
    )
    .and_then(|out| {
        ensure!(out.status.success(), "binding the holder: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    })?;
    resolved_says(&|m: &str| {
        m.contains("on node \"node-b\"") && m.contains("waiting for it to run")
    })?;
    // The kubelet's part: the volume mounted for the pod, then the pod Running.
    let pod_uid = cp.get(&format!("pod/{holder}"), "team-a", "{.metadata.uid}")?;
    let tree = hosts
        .join("node-b/var/lib/kubelet/pods")
        .join(&pod_uid)
        .join("volumes/kubernetes.io~csi/pv-csi/mount/src");
    std::fs::create_dir_all(tree.join("deeper"))?;
    for f in 0..8u64 {
        std::fs::write(
            tree.join(format!("deeper/f{f}")),
            vec![f as u8 + 1; (f * 733) as usize],
        )?;
    }
    cp.kubectl_ok(&merge_patch(
        &format!("pod/{holder}"),
        "team-a",
        true,
        r#"{"status":{"phase":"Running"}}"#,
    ))?;
    cp.wait_succeeded("team-a", "from-csi", 120)?;
    assert_same_tree(&tree, &hosts.join("node-b/srv/data/from-csi"))?;
    // Finished: the holder is deleted (with no kubelet here to see its container stop, a
    // pod bound to a node stays, terminating: the deletion is what the operator did).
    cp.wait_until(
        &format!("pods/{holder}"),
        "team-a",
        "{.metadata.deletionTimestamp}",
        Duration::from_secs(60),
        |t| !t.is_empty(),
    )?;
    // The operator's token may create pods (RBAC cannot narrow that), but the chart's policy
    // lets it create only a holder: not a privileged pod dressed as one, nor any other.
    let image = ferry_e2e::holder_image()?;
    let op = as_component("ferry-operator");
    let mut args: Vec<&str> = op.iter().map(String::as_str).collect();
    args.extend(["create", "-f", "-"]);
    for (pod, why) in [
        (
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: sneaky, namespace: team-a}}\nspec: {{containers: [{{name: c, image: {image}}}]}}\n"),
            "creates and deletes only its holder pods",
        ),
        (
            format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: ferry-holder-evil\n  namespace: team-a\n  labels: {{app.kubernetes.io/name: ferry-holder}}\n  ownerReferences: [{{apiVersion: ferry.dev/v1alpha1, kind: CopyJob, name: from-csi, uid: {uid}}}]\nspec:\n  automountServiceAccountToken: false\n  securityContext: {{runAsNonRoot: true}}\n  containers: [{{name: hold, image: {image}, args: [pause], securityContext: {{privileged: true, capabilities: {{drop: [ALL]}}}}, volumeMounts: [{{name: host, mountPath: /host}}]}}]\n  volumes: [{{name: host, hostPath: {{path: /}}}}]\n"),
            "a holder pod is this chart's image running pause",
        ),
    ] {
        let out = cp.kubectl_stdin(&args, &pod)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains(why),
            "the operator's token created a pod that is not a holder ({why}): {err}"
        );
    }
    // Nor may it make claims other than a restored one (as operator/src/snapshot.rs makes it
    // for this job) or a migration's: not one bound to a volume it names (another tenant's),
    // nor a "restored" one that also names a volume.
    let restored = |extra: &str| {
        format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: ferry-restore-{uid}\n  namespace: team-a\n  labels: {{app.kubernetes.io/managed-by: ferry-operator, ferry.dev/snapshot-of: {uid}}}\n  annotations: {{ferry.dev/copyjob: from-csi}}\n  ownerReferences: [{{apiVersion: ferry.dev/v1alpha1, kind: CopyJob, name: from-csi, uid: {uid}, controller: true}}]\nspec:\n  storageClassName: csi\n  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: 1Gi}}}}\n  dataSource: {{apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: s}}\n{extra}")
    };
    for (claim, why) in [
        (
            // Shaped as a migration's claim under a user's name (-migrations): still no
            // volume it names.
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: grab, namespace: team-a, labels: {ferry.dev/migration: x}}\nspec: {storageClassName: csi, accessModes: [ReadWriteOnce], volumeName: someone-elses, resources: {requests: {storage: 1Gi}}}\n".to_string(),
            "this one differs in spec.volumeName",
        ),
        (
            restored("  volumeName: someone-elses\n"),
            "provisioned new from a VolumeSnapshot",
        ),
    ] {
        let out = cp.kubectl_stdin(&args, &claim)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains(why),
            "the operator's token created a claim that is not a restored one ({why}): {err}"
        );
    }
    let out = cp.kubectl_stdin(&args, &restored(""))?;
    ensure!(
        out.status.success(),
        "the operator's token could not create a restored claim: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored_name = format!("ferry-restore-{uid}");
    let mut delete: Vec<&str> = op.iter().map(String::as_str).collect();
    delete.extend([
        "delete",
        "pvc",
        &restored_name,
        "-n",
        "team-a",
        "--wait=false",
    ]);
    cp.kubectl_ok(&delete)?;
    Ok(())
}

/// The permissions RBAC objects in `docs` give ServiceAccount `sa` of the release namespace,
/// one line per (scope, group/resource, verb[, resource name]).
fn granted(docs: &[Value], sa: &str) -> BTreeSet<String> {
    let role = |kind: &str, name: &str, ns: Option<&str>| {
        docs.iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && (ns.is_none() || d["metadata"]["namespace"].as_str() == ns)
            })
            .cloned()
    };
    let mut out = BTreeSet::new();
    for b in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        let bound = b["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == NS);
        if !bound {
            continue;
        }
        let scope = match b["metadata"]["namespace"].as_str() {
            Some(ns) => ns.to_string(),
            None => "cluster".to_string(),
        };
        let ref_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
        let ref_name = b["roleRef"]["name"].as_str().unwrap_or_default();
        let ns = (ref_kind == "Role").then_some(scope.as_str());
        let Some(r) = role(ref_kind, ref_name, ns) else {
            out.insert(format!("{scope} MISSING {ref_kind}/{ref_name}"));
            continue;
        };
        for rule in r["rules"].as_array().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| v.as_str().unwrap_or_default().to_string())
                    .collect()
            };
            let names = list("resourceNames");
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        let g = if group.is_empty() { "core" } else { &group };
                        if names.is_empty() {
                            out.insert(format!("{scope} {g}/{resource} {verb}"));
                        }
                        for n in &names {
                            out.insert(format!("{scope} {g}/{resource} {verb} {n}"));
                        }
                    }
                }
            }
        }
    }
    out
}

fn set(lines: &[&str]) -> BTreeSet<String> {
    lines.iter().map(|s| (*s).to_string()).collect()
}

/// Every permission the operator's ServiceAccount has, each a call in operator/src.
fn operator_permissions() -> BTreeSet<String> {
    set(&[
        "cluster ferry.dev/copyjobs list", // Controller watch; schedules' reflector
        "cluster ferry.dev/copyjobs watch", // Controller watch; schedules' reflector
        "cluster ferry.dev/copyjobs patch", // finalizer add/remove
        "cluster ferry.dev/copyjobs delete", // ttlSecondsAfterFinished; schedule history, Replace
        "cluster ferry.dev/copyjobs create", // a CopySchedule's run
        "cluster ferry.dev/copyjobs get",  // a run's name taken: is it the schedule's own?
        "cluster ferry.dev/copyjobs/status patch", // status by server-side apply
        "cluster ferry.dev/copyschedules list", // schedule Controller watch
        "cluster ferry.dev/copyschedules watch", // schedule Controller watch
        "cluster ferry.dev/copyschedules/status patch", // schedule status by server-side apply
        "cluster ferry.dev/copyschedules/finalizers update", // blockOwnerDeletion on a run's job
        "cluster ferry.dev/storageroots get", // resolve_root
        "cluster core/namespaces get",     // StorageRoot namespace selector
        "cluster core/nodes list",         // eligible_nodes
        "cluster core/persistentvolumeclaims get", // reach_pvc
        "cluster core/persistentvolumes get", // reach_pvc
        "cluster storage.k8s.io/storageclasses get", // waits_for_first_consumer
        "cluster core/pods list",          // CSI: a pod that mounts the claim
        "cluster core/pods get",           // holder::hold: the job's holder pod
        "cluster core/pods create",        // holder::hold (narrowed by the -holder-pods policy)
        "cluster core/pods delete",        // holder::release
        "cluster snapshot.storage.k8s.io/volumesnapshots get", // snapshot::prepare
        "cluster snapshot.storage.k8s.io/volumesnapshots create", // snapshot::prepare: copyMethod Snapshot
        "cluster snapshot.storage.k8s.io/volumesnapshots delete", // snapshot::release
        "cluster snapshot.storage.k8s.io/volumesnapshotcontents get", // snapshot::prepare: bound back
        "cluster core/persistentvolumeclaims create", // snapshot::prepare: the restored claim
        "cluster core/persistentvolumeclaims delete", // snapshot::release
        "cluster storage.k8s.io/storageclasses list", // snapshot::restore_class
        "cluster core/persistentvolumeclaims list",   // populator: the claims' Controller watch
        "cluster core/persistentvolumeclaims watch",  // populator: the claims' Controller watch
        "cluster ferry.dev/volumesources get",        // populator::gather
        "cluster ferry.dev/volumesources list",       // populator: the watches of VolumeSources
        "cluster ferry.dev/volumesources watch",      // populator: the watches of VolumeSources
        "cluster ferry.dev/volumesources/status patch", // populator: status by server-side apply
        "cluster core/persistentvolumes patch", // populator: the rebind (narrowed by -populator)
        "cluster ferry.dev/claimmigrations list", // migrate: the Controller's watch; others of a claim
        "cluster ferry.dev/claimmigrations watch", // migrate: the Controller's watch
        "cluster ferry.dev/claimmigrations patch", // migrate: its finalizer
        "cluster ferry.dev/claimmigrations/status patch", // migrate: status by server-side apply
        "cluster ferry.dev/copyexports list",     // export: the Controller's watch
        "cluster ferry.dev/copyexports watch",    // export: the Controller's watch
        "cluster ferry.dev/copyexports/status patch", // export: status by server-side apply
        "cluster apps/replicasets get",           // migrate::user_of: a pod's ReplicaSet
        "cluster apps/deployments get",           // migrate::user_of: its Deployment
        "cluster apps/statefulsets get", // migrate::user_of: a StatefulSet's retention policy
        "cluster apps/deployments/scale get", // migrate::replicas_of
        "cluster apps/deployments/scale patch", // migrate: to zero and back (-migrations)
        "cluster apps/statefulsets/scale get", // migrate::replicas_of
        "cluster apps/statefulsets/scale patch", // migrate: to zero and back (-migrations)
        "cluster batch/jobs get",        // migrate: a hook's Job, read
        "cluster batch/jobs patch",      // migrate: a hook's spec.suspend (-migrations)
        "cluster batch/jobs delete", // migrate: a completed hook mounting the claim (-migrations)
        "cluster events.k8s.io/events create", // Recorder::publish
        "cluster events.k8s.io/events patch", // Recorder::publish, a repeat
        "ferry-system coordination.k8s.io/leases list", // heartbeats reflector
        "ferry-system coordination.k8s.io/leases watch", // heartbeats reflector
        "ferry-system coordination.k8s.io/leases create", // leader: first claim
        "ferry-system coordination.k8s.io/leases get ferry-operator", // leader
        "ferry-system coordination.k8s.io/leases update ferry-operator", // leader: renew
        "cluster certificates.k8s.io/certificatesigningrequests list", // signer's Controller
        "cluster certificates.k8s.io/certificatesigningrequests watch", // signer's Controller
        "cluster certificates.k8s.io/certificatesigningrequests delete", // signer: cleanup
        "cluster certificates.k8s.io/certificatesigningrequests/approval update", // approve, deny
        "cluster certificates.k8s.io/certificatesigningrequests/status update", // the certificate
        "cluster certificates.k8s.io/signers approve ferry.dev/transfer", // checked on approval
        "cluster certificates.k8s.io/signers sign ferry.dev/transfer", // checked on the certificate
        "ferry-system core/configmaps create", // signer: the first trust bundle
        "ferry-system core/configmaps get ferry-transfer-trust", // signer: publish
        "ferry-system core/configmaps update ferry-transfer-trust", // signer: publish
        "ferry-system-tickets core/secrets create", // ticket::issue (apply, first time)
        "ferry-system-tickets core/secrets patch", // ticket::issue (apply)
        "ferry-system-tickets core/secrets delete", // ticket::revoke
    ])
}

/// Every permission the agents' ServiceAccount has, each a call in agent/src.
fn agent_permissions() -> BTreeSet<String> {
    set(&[
        "cluster ferry.dev/copyjobs list",                // watcher
        "cluster ferry.dev/copyjobs watch",               // watcher
        "cluster ferry.dev/copyjobs/status patch",        // shard progress
        "cluster ferry.dev/storageroots get",             // own_roots: reach_both
        "cluster core/namespaces get",                    // own_roots: namespace selector
        "cluster core/persistentvolumeclaims get",        // own_roots: reach_both
        "cluster core/persistentvolumes get",             // own_roots: reach_both
        "cluster core/nodes get",                         // own_roots: its Node's labels
        "ferry-system coordination.k8s.io/leases create", // heartbeat apply, first time
        "ferry-system coordination.k8s.io/leases patch",  // heartbeat apply
        "ferry-system coordination.k8s.io/leases get",    // a sender's transfer address
        "ferry-system-tickets core/secrets get",          // a shard's ticket, by name
        // Its transfer certificate (issue 14): requested, then read until issued.
        "cluster certificates.k8s.io/certificatesigningrequests create",
        "cluster certificates.k8s.io/certificatesigningrequests get",
        "cluster certificates.k8s.io/certificatesigningrequests list",
        "cluster certificates.k8s.io/certificatesigningrequests watch",
        // The trust bundle, by name.
        "ferry-system core/configmaps get ferry-transfer-trust",
        "ferry-system core/configmaps list ferry-transfer-trust",
        "ferry-system core/configmaps watch ferry-transfer-trust",
    ])
}

/// With `changedBlockTracking.enabled`, the operator also lists VolumeSnapshots: the older
/// bases of a destination claim, deleted once a newer one is kept (snapshot::prune_bases).
fn operator_permissions_with_changed_blocks() -> BTreeSet<String> {
    let mut all = operator_permissions();
    all.insert("cluster snapshot.storage.k8s.io/volumesnapshots list".into());
    all
}

/// With `changedBlockTracking.enabled`, the agent (its ServiceAccount `account`) also calls
/// these (agent/src/daemon/shard/delta.rs, cbt/src/lib.rs).
fn agent_permissions_with_changed_blocks(account: &str) -> BTreeSet<String> {
    let mut all = agent_permissions();
    all.extend(set(&[
        "cluster snapshot.storage.k8s.io/volumesnapshots get", // delta::source
        "cluster snapshot.storage.k8s.io/volumesnapshotcontents get", // delta::source
        "cluster cbt.storage.k8s.io/snapshotmetadataservices get", // Service::of_driver
    ]));
    // ferry_cbt::token, for its own account only.
    all.insert(format!(
        "ferry-system core/serviceaccounts/token create {account}"
    ));
    all
}

#[test]
fn each_component_is_granted_exactly_the_calls_its_code_makes_and_edit_and_view_get_copyjobs_and_copyschedules(
) -> Result<()> {
    // The rendered roles, read from the file: every permission is listed here, so a new
    // one shows up as a diff of this test. Each line is a call in operator/src or agent/src.
    let docs = documents(&rendered("ferry.yaml"))?;
    let (operator, agent) = (operator_permissions(), agent_permissions());
    for (sa, want) in [("ferry-operator", &operator), ("ferry-agent", &agent)] {
        let got = granted(&docs, sa);
        let extra: Vec<&String> = got.difference(want).collect();
        let missing: Vec<&String> = want.difference(&got).collect();
        ensure!(
            extra.is_empty() && missing.is_empty(),
            "{sa}: granted but not expected {extra:?}; expected but not granted {missing:?}"
        );
    }
    // The aggregated roles for namespace users.
    for (name, labels, verbs) in [
        (
            "ferry-copyjobs-edit",
            vec!["aggregate-to-admin", "aggregate-to-edit"],
            "get list watch create update patch delete deletecollection",
        ),
        (
            "ferry-copyjobs-view",
            vec!["aggregate-to-view"],
            "get list watch",
        ),
    ] {
        let role = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
            .with_context(|| format!("deploy/ferry.yaml has no ClusterRole {name}"))?;
        let aggregate: BTreeSet<String> = role["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| {
                k.starts_with("rbac.authorization.k8s.io/aggregate-to-") && *v == "true"
            })
            .map(|(k, _)| {
                k.trim_start_matches("rbac.authorization.k8s.io/")
                    .to_string()
            })
            .collect();
        ensure!(
            aggregate == labels.iter().map(|s| (*s).to_string()).collect(),
            "{name} aggregates to {aggregate:?}"
        );
        let rules = serde_json::json!([{
            "apiGroups": ["ferry.dev"],
            "resources": ["copyjobs", "copyschedules", "volumesources", "claimmigrations", "copyexports"],
            "verbs": verbs.split(' ').collect::<Vec<_>>(),
        }]);
        ensure!(role["rules"] == rules, "{name} rules {}", role["rules"]);
    }

    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_rendered(NS, "ferry.yaml")?;
    cp.kubectl_ok(&["create", "namespace", "team"])?;
    // The apiserver agrees with the list above, and denies the rest.
    let operator_as = as_component("ferry-operator");
    let agent_as = as_component("ferry-agent");
    let op: Vec<&str> = operator_as.iter().map(String::as_str).collect();
    let ag: Vec<&str> = agent_as.iter().map(String::as_str).collect();
    let (op, ag) = (op.as_slice(), ag.as_slice());
    let checks: Vec<(&[&str], &[&str], bool)> = vec![
        (op, &["list", "copyjobs.ferry.dev", "-A"], true),
        (
            op,
            &[
                "patch",
                "copyjobs.ferry.dev",
                "--subresource=status",
                "-n",
                "team",
            ],
            true,
        ),
        (op, &["update", "leases/ferry-operator", "-n", NS], true),
        (op, &["get", "secrets", "-n", NS], false),
        (op, &["list", "secrets", "-A"], false),
        // Holder pods: RBAC allows any pod; the chart's admission policy narrows it (tested
        // with the operator's own token in the test above).
        (op, &["create", "pods", "-n", "team"], true),
        // A CopySchedule's runs: the operator creates CopyJobs (in the schedule's own
        // namespace, from its template), but never CopySchedules, nor changes their spec.
        (op, &["create", "copyjobs.ferry.dev", "-n", "team"], true),
        (
            op,
            &["create", "copyschedules.ferry.dev", "-n", "team"],
            false,
        ),
        (
            op,
            &["patch", "copyschedules.ferry.dev", "-n", "team"],
            false,
        ),
        (
            op,
            &["delete", "copyschedules.ferry.dev", "-n", "team"],
            false,
        ),
        (
            op,
            &[
                "patch",
                "copyschedules.ferry.dev",
                "--subresource=status",
                "-n",
                "team",
            ],
            true,
        ),
        (ag, &["list", "copyschedules.ferry.dev", "-A"], false),
        (op, &["update", "storageroots.ferry.dev"], false),
        (
            op,
            &["update", "leases/ferry-agent-node-a", "-n", NS],
            false,
        ),
        (op, &["delete", "leases/ferry-operator", "-n", NS], false),
        (op, &["list", "leases", "-n", "kube-system"], false),
        (ag, &["watch", "copyjobs.ferry.dev", "-A"], true),
        (
            ag,
            &[
                "patch",
                "copyjobs.ferry.dev",
                "--subresource=status",
                "-n",
                "team",
            ],
            true,
        ),
        (ag, &["patch", "leases/ferry-agent-node-a", "-n", NS], true),
        (ag, &["create", "pods", "-n", "team"], false),
        (ag, &["create", "pods", "-n", NS], false),
        // A shard's ticket, by name, in the tickets' namespace only (nothing else of Ferry's
        // namespace, Helm's release Secrets among them); never a list.
        (ag, &["get", "secrets", "-n", TICKETS], true),
        (ag, &["get", "secrets", "-n", NS], false),
        (ag, &["list", "secrets", "-n", TICKETS], false),
        (op, &["get", "secrets", "-n", TICKETS], false),
        (ag, &["get", "secrets", "-n", "team"], false),
        (ag, &["list", "secrets", "-n", NS], false),
        (ag, &["list", "secrets", "-A"], false),
        (ag, &["patch", "copyjobs.ferry.dev", "-n", "team"], false),
        (ag, &["delete", "copyjobs.ferry.dev", "-n", "team"], false),
        // It resolves a shard's endpoints itself: reads, never writes.
        (ag, &["get", "storageroots.ferry.dev"], true),
        (ag, &["get", "persistentvolumeclaims", "-n", "team"], true),
        (ag, &["get", "persistentvolumes"], true),
        (ag, &["get", "nodes"], true),
        (ag, &["get", "namespaces"], true),
        (ag, &["update", "storageroots.ferry.dev"], false),
        (ag, &["list", "pods", "-A"], false),
        (ag, &["patch", "nodes"], false),
        (ag, &["patch", "leases", "-n", "kube-system"], false),
        // The transfer certificates: the operator decides on requests; agents make them
        // (signers, below).
        (
            op,
            &[
                "update",
                "certificatesigningrequests.certificates.k8s.io",
                "--subresource=approval",
            ],
            true,
        ),
        (
            op,
            &["create", "certificatesigningrequests.certificates.k8s.io"],
            false,
        ),
        (
            op,
            &["update", "configmaps/ferry-transfer-trust", "-n", NS],
            true,
        ),
        (
            op,
            &["update", "configmaps/ferry-dashboards", "-n", NS],
            false,
        ),
        (op, &["get", "configmaps", "-n", "team"], false),
        (
            ag,
            &["create", "certificatesigningrequests.certificates.k8s.io"],
            true,
        ),
        (
            ag,
            &[
                "update",
                "certificatesigningrequests.certificates.k8s.io",
                "--subresource=approval",
            ],
            false,
        ),
        (
            ag,
            &[
                "update",
                "certificatesigningrequests.certificates.k8s.io",
                "--subresource=status",
            ],
            false,
        ),
        (
            ag,
            &["get", "configmaps/ferry-transfer-trust", "-n", NS],
            true,
        ),
        (
            ag,
            &["update", "configmaps/ferry-transfer-trust", "-n", NS],
            false,
        ),
        (ag, &["get", "configmaps/ferry-dashboards", "-n", NS], false),
    ];
    let mut wrong = Vec::new();
    for (who, question, want) in checks {
        let got = can_i(&cp, who, question)?;
        if got != want {
            wrong.push(format!(
                "{}: can-i {} is {got}, expected {want}",
                who[0],
                question.join(" ")
            ));
        }
    }
    // Signers, which `kubectl auth can-i` cannot ask about (their names hold a '/'): the
    // operator approves and signs for Ferry's signer only, never for Kubernetes' own (a
    // kubelet's or an API client's certificate); agents do neither.
    for (sa, verb, signer, want) in [
        ("ferry-operator", "approve", "ferry.dev/transfer", true),
        ("ferry-operator", "sign", "ferry.dev/transfer", true),
        ("ferry-operator", "approve", "ferry.dev/other", false),
        (
            "ferry-operator",
            "approve",
            "kubernetes.io/kube-apiserver-client",
            false,
        ),
        (
            "ferry-operator",
            "sign",
            "kubernetes.io/kubelet-serving",
            false,
        ),
        ("ferry-agent", "approve", "ferry.dev/transfer", false),
        ("ferry-agent", "sign", "ferry.dev/transfer", false),
    ] {
        let got = may_for_signer(&cp, sa, verb, signer)?;
        if got != want {
            wrong.push(format!(
                "{sa}: {verb} signer {signer} is {got}, expected {want}"
            ));
        }
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));

    // The built-in roles select the chart's roles by their labels (the apiserver serves
    // `admin`, `edit` and `view` with empty rules and these selectors) ...
    for (builtin, role) in [
        ("admin", "ferry-copyjobs-edit"),
        ("edit", "ferry-copyjobs-edit"),
        ("view", "ferry-copyjobs-view"),
    ] {
        let selector = cp.kubectl_ok(&[
            "get",
            "clusterrole",
            builtin,
            "-o",
            "jsonpath={.aggregationRule.clusterRoleSelectors[0].matchLabels}",
        ])?;
        let selector: Value = serde_json::from_str(&selector)
            .with_context(|| format!("clusterrole {builtin} has no aggregation selector"))?;
        let labels = get_json(&cp, &["get", "clusterrole", role])?;
        ensure!(
            selects(&selector, &labels["metadata"]["labels"]),
            "{builtin}'s selector {selector} does not pick {role}"
        );
    }
    // ... and kube-controller-manager's aggregation controller (only it; no other controller
    // runs here) fills them: a user bound to `edit` in a namespace can create CopyJobs there,
    // one bound to `view` only read them.
    let Some(_kcm) = cp.start_controller_manager_or_skip(&["clusterrole-aggregation"])? else {
        return Ok(());
    };
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "alice-edit",
        "--clusterrole=edit",
        "--user=alice",
        "-n",
        "team",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "bob-view",
        "--clusterrole=view",
        "--user=bob",
        "-n",
        "team",
    ])?;
    let alice: &[&str] = &["--as=alice"];
    let bob: &[&str] = &["--as=bob"];
    let aggregated = wait_for(
        "edit and view to aggregate CopyJobs",
        Duration::from_secs(60),
        || {
            can_i(&cp, alice, &["create", "copyjobs.ferry.dev", "-n", "team"]).unwrap_or(false)
                && can_i(&cp, bob, &["list", "copyjobs.ferry.dev", "-n", "team"]).unwrap_or(false)
                && can_i(
                    &cp,
                    alice,
                    &["create", "copyschedules.ferry.dev", "-n", "team"],
                )
                .unwrap_or(false)
                && can_i(&cp, bob, &["list", "copyschedules.ferry.dev", "-n", "team"])
                    .unwrap_or(false)
        },
    );
    if let Err(e) = aggregated {
        bail!(
            "{e}\nkube-controller-manager:\n{}",
            cp.log_tail("kube-controller-manager.log", 10)
        );
    }
    let job = "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: by-alice\n  namespace: team\nspec:\n  source: {root: r, path: a}\n  destination: {root: r, path: b}\n";
    let out = cp.kubectl_stdin(&["--as=alice", "create", "-f", "-"], job)?;
    ensure!(
        out.status.success(),
        "alice (edit) cannot create a CopyJob: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = cp.kubectl_ok(&["--as=bob", "get", "copyjobs", "-n", "team", "-o", "name"])?;
    ensure!(
        seen.trim() == "copyjob.ferry.dev/by-alice",
        "bob (view) sees {seen:?}"
    );
    let out = cp.kubectl(&[
        "--as=bob",
        "delete",
        "copyjob",
        "by-alice",
        "-n",
        "team",
        "--wait=false",
    ])?;
    ensure!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("forbidden"),
        "bob (view) could delete a CopyJob: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cp.kubectl_stdin(
        &["--as=bob", "create", "-f", "-"],
        &job.replace("by-alice", "by-bob"),
    )?;
    ensure!(!out.status.success(), "bob (view) could create a CopyJob");
    let mut wrong = Vec::new();
    for (who, question, want) in [
        (
            alice,
            &["delete", "copyjobs.ferry.dev", "-n", "team"][..],
            true,
        ),
        (
            alice,
            &["create", "copyjobs.ferry.dev", "-n", "default"][..],
            false,
        ),
        (alice, &["create", "storageroots.ferry.dev"][..], false),
        (
            bob,
            &["watch", "copyjobs.ferry.dev", "-n", "team"][..],
            true,
        ),
        (
            bob,
            &["patch", "copyjobs.ferry.dev", "-n", "team"][..],
            false,
        ),
        (
            alice,
            &["delete", "copyschedules.ferry.dev", "-n", "team"][..],
            true,
        ),
        (
            alice,
            &[
                "patch",
                "copyschedules.ferry.dev",
                "--subresource=status",
                "-n",
                "team",
            ][..],
            false,
        ),
        (
            bob,
            &["watch", "copyschedules.ferry.dev", "-n", "team"][..],
            true,
        ),
        (
            bob,
            &["create", "copyschedules.ferry.dev", "-n", "team"][..],
            false,
        ),
    ] {
        if can_i(&cp, who, question)? != want {
            wrong.push(format!(
                "{}: can-i {} should be {want}",
                who[0],
                question.join(" ")
            ));
        }
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}

/// `helm template` of the chart with a values set from `charts/ferry/ci/` (and `extra`
/// arguments), written into the control plane's directory.
fn render_ci(helm: &Path, dir: &Path, values: &str, extra: &[&str]) -> Result<PathBuf> {
    let chart = repo_root().join("charts/ferry");
    let out = std::process::Command::new(helm)
        .args(["template", "ferry"])
        .arg(&chart)
        .args(["--namespace", NS, "-f"])
        .arg(chart.join("ci").join(values))
        .args(extra)
        .output()?;
    ensure!(
        out.status.success(),
        "helm template -f ci/{values}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(values);
    std::fs::write(&path, &out.stdout)?;
    Ok(path)
}

#[test]
fn ci_values_sets_render_what_they_say_and_are_accepted_by_the_apiserver() -> Result<()> {
    let Some(helm) = ferry_e2e::helm_or_skip()? else {
        return Ok(());
    };
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    // namespace.create: the chart brings its namespace, labelled for the privileged agent,
    // so the render applies to a cluster where it does not exist yet.
    let path = render_ci(
        &helm,
        cp.dir(),
        "namespace-create.yaml",
        &["--include-crds"],
    )?;
    let docs = documents(&path)?;
    let ns = docs
        .iter()
        .find(|d| d["kind"] == "Namespace")
        .context("no Namespace rendered with namespace.create")?;
    ensure!(
        ns["metadata"]["name"] == NS
            && ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged",
        "rendered namespace {ns}"
    );
    let out = cp.kubectl(&["apply", "--server-side", "-f", &path.to_string_lossy()])?;
    ensure!(
        out.status.success(),
        "namespace-create render refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let label = cp.get(
        &format!("namespace/{NS}"),
        "",
        "{.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
    )?;
    ensure!(label == "privileged", "namespace label {label:?}");

    // Everything moved off its default.
    let path = render_ci(&helm, cp.dir(), "custom.yaml", &[])?;
    let docs = documents(&path)?;
    let names: BTreeSet<String> = docs
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let expected = set(&[
        "ClusterRole/copier-agent",
        "ClusterRole/copier-operator",
        "ClusterRoleBinding/copier-agent",
        "ClusterRoleBinding/copier-operator",
        "DaemonSet/copier-agent",
        "Deployment/copier-operator",
        "NetworkPolicy/copier-agent",
        "NetworkPolicy/copier-operator",
        "Namespace/ferry-system-tickets",
        "Role/copier-agent",
        "Role/copier-agent-tickets",
        "Role/copier-operator",
        "Role/copier-operator-tickets",
        "RoleBinding/copier-agent",
        "RoleBinding/copier-agent-tickets",
        "RoleBinding/copier-operator",
        "RoleBinding/copier-operator-tickets",
        "Service/copier-operator",
        "ServiceAccount/copier-agent",
        "ServiceAccount/copier-operator",
        "ValidatingAdmissionPolicy/copier-agent-leases",
        "ValidatingAdmissionPolicyBinding/copier-agent-leases",
        "ValidatingAdmissionPolicy/copier-agent-shards",
        "ValidatingAdmissionPolicyBinding/copier-agent-shards",
        "ValidatingAdmissionPolicy/copier-holder-pods",
        "ValidatingAdmissionPolicyBinding/copier-holder-pods",
        "ValidatingAdmissionPolicy/copier-snapshot-sources",
        "ValidatingAdmissionPolicyBinding/copier-snapshot-sources",
        "ValidatingAdmissionPolicy/copier-node-labels",
        "ValidatingAdmissionPolicyBinding/copier-node-labels",
        "ValidatingAdmissionPolicy/copier-populator",
        "ValidatingAdmissionPolicyBinding/copier-populator",
        "ValidatingAdmissionPolicy/copier-migrations",
        "ValidatingAdmissionPolicyBinding/copier-migrations",
        "ValidatingAdmissionPolicy/copier-exports",
        "ValidatingAdmissionPolicyBinding/copier-exports",
    ]);
    ensure!(names == expected, "custom render has {names:?}");
    // The policies are about the renamed accounts: the agents', and the operator's for its
    // holder pods. (The populator's and the migrations' apply to everyone, for the names
    // they reserve, and say who the operator is in their variable `operator`.)
    for policy in docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
    {
        let operator_variable = policy["spec"]["variables"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "operator"));
        let matches = match (&policy["spec"]["matchConditions"][0], operator_variable) {
            (Value::Null, Some(v)) => &v["expression"],
            (m, _) => &m["expression"],
        }
        .as_str()
        .unwrap_or_default();
        let account = match policy["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("copier-agent"))
        {
            true => "copier-agent",
            false => "copier-operator",
        };
        ensure!(
            matches.contains(&format!("system:serviceaccount:{NS}:{account}\"")),
            "{} matches {matches:?}",
            policy["metadata"]["name"]
        );
    }
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .cloned()
            .unwrap_or_default()
    };
    let (deploy, ds) = (find("Deployment"), find("DaemonSet"));
    let operator = &deploy["spec"]["template"]["spec"]["containers"][0];
    let env = |c: &Value, name: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
            .unwrap_or_default()
    };
    ensure!(
        env(operator, "FERRY_KUBELET_DIR") == "/var/lib/k0s/kubelet"
            && env(operator, "FERRY_LISTEN") == "[::]:9090",
        "operator env {}",
        operator["env"]
    );
    ensure!(
        operator["image"]
            == "ghcr.io/ferry-dev/ferry@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        "image {}",
        operator["image"]
    );
    let pod = &ds["spec"]["template"]["spec"];
    let agent = &pod["containers"][0];
    ensure!(
        agent["volumeMounts"][1]["mountPath"] == "/host/var/lib/k0s/kubelet"
            && pod["volumes"][1]["hostPath"]["path"] == "/var/lib/k0s/kubelet",
        "kubelet dir mount {} {}",
        agent["volumeMounts"],
        pod["volumes"]
    );
    ensure!(
        agent["args"]
            == serde_json::json!([
                "run",
                "--host-root",
                "/host",
                "--workers",
                "8",
                "--lease-seconds",
                "30",
                "--max-shards",
                "4"
            ])
            && env(agent, "FERRY_LISTEN") == "[::]:9090"
            && pod.get("priorityClassName").is_none()
            && pod.get("tolerations").is_none()
            && pod["nodeSelector"]["ferry.dev/storage"] == "true",
        "agent pod {pod}"
    );
    ensure!(
        granted(&docs, "copier-operator") == operator_permissions_with_changed_blocks()
            && granted(&docs, "copier-agent")
                == agent_permissions_with_changed_blocks("copier-agent"),
        "renamed accounts are bound to other permissions: {:?} {:?}",
        granted(&docs, "copier-operator"),
        granted(&docs, "copier-agent")
    );
    let out = cp.kubectl(&["apply", "--server-side", "-f", &path.to_string_lossy()])?;
    ensure!(
        out.status.success(),
        "custom render refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Peering reached at each node's address (peering-on.yaml: hostPort): the port taken on
    // the node, and the agent told to advertise the node's address, which Kubernetes
    // expands from a variable set before it; or the admin's address, as given.
    let agent_of = |docs: &[Value]| -> Result<Value> {
        Ok(docs
            .iter()
            .find(|d| d["kind"] == "DaemonSet")
            .context("no DaemonSet")?["spec"]["template"]["spec"]["containers"][0]
            .clone())
    };
    let env_of = |c: &Value| -> Vec<(String, Value)> {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["name"].as_str().unwrap_or_default().to_string(),
                    e.clone(),
                )
            })
            .collect()
    };
    let path = render_ci(&helm, cp.dir(), "peering-on.yaml", &[])?;
    let agent = agent_of(&documents(&path)?)?;
    let port = agent["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "peering")
        .context("no peering port")?;
    ensure!(
        port["containerPort"] == 7451 && port["hostPort"] == 7451,
        "peering port {port}"
    );
    let env = env_of(&agent);
    let at = |name: &str| env.iter().position(|(n, _)| n == name);
    let (Some(node_ip), Some(address)) = (at("NODE_IP"), at("FERRY_PEERING_ADDRESS")) else {
        bail!("hostPort without NODE_IP and FERRY_PEERING_ADDRESS: {env:?}");
    };
    ensure!(
        node_ip < address
            && env[node_ip].1["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
            && env[address].1["value"] == "$(NODE_IP):7451",
        "advertised address {:?} from {:?}",
        env[address].1,
        env[node_ip].1
    );
    let out = cp.kubectl(&["apply", "--server-side", "-f", &path.to_string_lossy()])?;
    ensure!(
        out.status.success(),
        "peering-on render refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = render_ci(
        &helm,
        cp.dir(),
        "peering-on.yaml",
        &[
            "--set",
            "peering.hostPort=false",
            "--set",
            "peering.address=$(NODE_IP):30451",
        ],
    )?;
    let agent = agent_of(&documents(&path)?)?;
    let env = env_of(&agent);
    ensure!(
        env.iter()
            .any(|(n, e)| n == "FERRY_PEERING_ADDRESS" && e["value"] == "$(NODE_IP):30451"),
        "the admin's address: {env:?}"
    );
    ensure!(
        agent["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|p| p.get("hostPort").is_none()),
        "a hostPort without peering.hostPort: {}",
        agent["ports"]
    );

    // A relative kubeletDir is refused at render time, with the value's name.
    let chart = repo_root().join("charts/ferry");
    let out = std::process::Command::new(&helm)
        .args(["template", "ferry"])
        .arg(&chart)
        .args(["--set", "kubeletDir=var/lib/kubelet"])
        .output()?;
    ensure!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("kubeletDir must be an absolute path"),
        "a relative kubeletDir rendered: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn helm_installs_upgrades_and_uninstalls_the_chart_against_the_apiserver() -> Result<()> {
    let Some(helm) = ferry_e2e::helm_or_skip()? else {
        return Ok(());
    };
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let helm = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new(&helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(&cp.kubeconfig)
            .output()?;
        ensure!(
            out.status.success(),
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let chart = repo_root().join("charts/ferry");
    let chart = chart.to_string_lossy();
    // docs/install.md's install: the namespace first, labelled (helm stores its release record
    // there before anything else, so the chart cannot bring it) ...
    let out = cp.kubectl(&["get", "namespace", NS])?;
    ensure!(!out.status.success(), "{NS} exists before the install");
    let refused = helm(&[
        "install",
        "ferry",
        &chart,
        "-n",
        NS,
        "--set",
        "namespace.create=true",
    ]);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("not found")),
        "helm install into a missing namespace: {refused:?}"
    );
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&[
        "label",
        "namespace",
        NS,
        "pod-security.kubernetes.io/enforce=privileged",
    ])?;
    // ... then the chart with its defaults.
    helm(&["install", "ferry", &chart, "-n", NS])?;
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/copyjobs.ferry.dev",
    ])?;
    let replicas = cp.get("deployment/ferry-operator", NS, "{.spec.replicas}")?;
    ensure!(replicas == "2", "replicas {replicas}");
    // An upgrade that changes a value, then an uninstall that leaves the CRDs (and so
    // every CopyJob) alone, as Helm does with crds/.
    helm(&[
        "upgrade",
        "ferry",
        &chart,
        "-n",
        NS,
        "--reuse-values",
        "--set",
        "operator.replicas=1",
    ])?;
    let replicas = cp.get("deployment/ferry-operator", NS, "{.spec.replicas}")?;
    ensure!(replicas == "1", "replicas after upgrade {replicas}");
    let pdb = cp.get("poddisruptionbudget/ferry-operator", NS, "{.metadata.name}")?;
    ensure!(pdb.is_empty(), "a PodDisruptionBudget for one replica");
    helm(&["uninstall", "ferry", "-n", NS, "--wait=false"])?;
    for object in [
        "deployment/ferry-operator",
        "daemonset/ferry-agent",
        "clusterrole/ferry-operator",
    ] {
        let left = cp.get(object, NS, "{.metadata.name}")?;
        ensure!(left.is_empty(), "{object} left after uninstall");
    }
    let crd = cp.get("crd/copyjobs.ferry.dev", "", "{.metadata.name}")?;
    ensure!(!crd.is_empty(), "uninstall removed the CopyJob CRD");
    Ok(())
}
