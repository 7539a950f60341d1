//! Ferry's metrics, Grafana dashboards and alert rules against a real Prometheus (Debian's
//! `prometheus`), scraping the operator and the agents of a local control plane every
//! second with the chart's label convention (`job="ferry-operator"`, `job="ferry-agent"`)
//! and loading `charts/ferry/alerts/ferry.rules.yaml`.
//!
//! - The bytes Prometheus saw copied (the counters' increase, and the integral of the
//!   overview dashboard's throughput panel) agree with the tree's size within 5%.
//! - Every PromQL expression of every dashboard panel, with Grafana's variables set as
//!   "All", returns data over the test's window, and a non-zero value at some point
//!   (except the panels listed in `MAY_STAY_ZERO`, whose healthy value is 0); every
//!   template variable's `label_values` query finds values.
//! - A finished job's progress gauges keep their final values until the job is deleted,
//!   and then disappear (the agent's and the operator's per-job series alike).
//! - Every alert's condition is made true and its expression then returns the expected
//!   series (and none before): a job that fails on a checksum mismatch (FerryCopyJobFailed
//!   and FerryChecksumMismatch, also seen firing by Prometheus itself), a job whose agent
//!   commits nothing (FerryCopyJobStalled, its 15-minute window shortened to 10 s), a
//!   CopySchedule whose runs never finish (FerryScheduleLate, three intervals of a minute
//!   shortened to a tenth of one; its gauges gone once it is deleted), an agent and the
//!   operator killed (FerryAgentDown, FerryOperatorDown). Prometheus reports every rule
//!   healthy, and `promtool check rules` accepts the file.
//!
//! Every wait polls the API (or the job's status); none is a fixed sleep.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{free_port, http_get, repo_root, wait_for, ControlPlane, Proc, PACED};
use serde_json::Value;

const NODES: [&str; 2] = ["node-a", "node-b"];
/// Files of this name are corrupted after they are written (agents' test-only fault).
const CORRUPT: &str = "corrupt-me.bin";
/// What Grafana's `$__rate_interval` is for a 1 s scrape interval and a 1 s step: at least
/// four scrapes.
const RATE_INTERVAL: &str = "5s";
/// Panels whose value is 0 in a healthy run (no reconcile fails here), so only "returns
/// data" is required of them.
const MAY_STAY_ZERO: [&str; 3] = [
    "Reconcile errors per second, by kind",
    // No copy between nodes here (its agents would need transfer certificates, which the
    // signer issues only to the agents' node-bound tokens): e2e/tests/network.rs checks
    // these metrics on the agents that copy between nodes.
    "Open transfer connections by node",
    "Resends and redials per second by node",
];
/// Panels of series that only a copy between nodes creates (per job): no data here;
/// e2e/tests/network.rs checks them.
const BETWEEN_NODES: [&str; 1] = ["Network bytes per second by node and direction"];

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `prometheus` and `promtool` (`FERRY_PROMETHEUS`, `FERRY_PROMTOOL`, or from PATH), or
/// `None` with the reason printed when missing outside CI (`.ci/deps.sh` installs them).
fn prometheus_or_skip() -> Result<Option<(PathBuf, PathBuf)>> {
    let find = |var: &str, name: &str| -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(var) {
            return Some(PathBuf::from(p));
        }
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    };
    match (
        find("FERRY_PROMETHEUS", "prometheus"),
        find("FERRY_PROMTOOL", "promtool"),
    ) {
        (Some(p), Some(t)) => Ok(Some((p, t))),
        _ => {
            let why = "prometheus or promtool is not installed; run .ci/deps.sh (make deps)";
            if std::env::var_os("CI").is_some() {
                bail!(why);
            }
            eprintln!("skipped: {why}");
            Ok(None)
        }
    }
}

/// Percent-encoding for a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server on a loopback port, killed when dropped.
struct Prometheus {
    _proc: Proc,
    port: u16,
}

impl Prometheus {
    /// Scrape the operator and the agents every second, with the rule file loaded; wait
    /// until it answers.
    fn start(cp: &ControlPlane, bin: &Path, operator: u16, agents: &[u16]) -> Result<Self> {
        let dir = cp.dir().join("prometheus");
        std::fs::create_dir_all(&dir)?;
        let rules = repo_root().join("charts/ferry/alerts/ferry.rules.yaml");
        let targets = |ports: &[u16]| {
            ports
                .iter()
                .map(|p| format!("\"127.0.0.1:{p}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules:?}\nscrape_configs:\n  - job_name: ferry-operator\n    static_configs:\n      - targets: [{}]\n  - job_name: ferry-agent\n    static_configs:\n      - targets: [{}]\n",
            targets(&[operator]),
            targets(agents),
        );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config)?;
        let port = free_port()?;
        let args = [
            format!("--config.file={}", config_file.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let proc = cp.spawn(bin, &args, &[], "prometheus.log")?;
        let prometheus = Self { _proc: proc, port };
        wait_for("Prometheus /-/ready", Duration::from_secs(60), || {
            // Go answers in the request's HTTP version (1.0 here).
            http_get(port, "/-/ready").is_some_and(|r| ferry_e2e::http_code(&r) == "200")
        })
        .with_context(|| cp.log_tail("prometheus.log", 20))?;
        Ok(prometheus)
    }

    /// GET an API path; the `data` of a successful answer.
    fn api(&self, path: &str) -> Result<Value> {
        let raw = http_get(self.port, path).context("Prometheus did not answer")?;
        let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: Value =
            serde_json::from_str(body).with_context(|| format!("GET {path}: not JSON: {raw}"))?;
        ensure!(v["status"] == "success", "GET {path}: {v}");
        Ok(v["data"].clone())
    }

    /// An instant query (at `time`, or now): the result's series.
    fn query(&self, expr: &str, time: Option<f64>) -> Result<Vec<Value>> {
        let time = time.map_or(String::new(), |t| format!("&time={t:.3}"));
        let data = self.api(&format!("/api/v1/query?query={}{time}", encode(expr)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// A range query with a 1 s step: the result's series.
    fn query_range(&self, expr: &str, start: f64, end: f64) -> Result<Vec<Value>> {
        let data = self.api(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            encode(expr)
        ))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The single value of an instant query that returns one series.
    fn scalar(&self, expr: &str, time: Option<f64>) -> Result<f64> {
        let result = self.query(expr, time)?;
        ensure!(
            result.len() == 1,
            "{expr}: expected one series, got {result:?}"
        );
        value(&result[0]["value"]).with_context(|| format!("{expr}: {result:?}"))
    }

    /// Alerts Prometheus itself evaluated from the rule file: (name, state, labels).
    fn alerts(&self) -> Result<Vec<(String, String, Value)>> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                    a["state"].as_str().unwrap_or("").to_string(),
                    a["labels"].clone(),
                )
            })
            .collect())
    }
}

/// A sample `[timestamp, "value"]` as a number (NaN and ±Inf included).
fn value(sample: &Value) -> Option<f64> {
    sample.get(1)?.as_str()?.parse().ok()
}

/// One PromQL expression of a dashboard, and where it comes from.
struct PanelQuery {
    dashboard: String,
    panel: String,
    expr: String,
}

/// A template variable's query (`label_values(<selector>, <label>)`), and its dashboard.
struct VariableQuery {
    dashboard: String,
    query: String,
}

/// Every panel target's `expr` and every template variable's query, of every dashboard.
fn dashboard_queries() -> Result<(Vec<PanelQuery>, Vec<VariableQuery>)> {
    let dir = repo_root().join("charts/ferry/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    ensure!(!files.is_empty(), "no dashboards in {}", dir.display());
    let (mut panels, mut variables) = (Vec::new(), Vec::new());
    for file in files {
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&file)?)
            .with_context(|| format!("{} is not JSON", file.display()))?;
        let name = d["title"].as_str().unwrap_or("?").to_string();
        // Panels, and the panels of collapsed rows.
        let mut stack: Vec<Value> = d["panels"].as_array().cloned().unwrap_or_default();
        let mut count = 0;
        while let Some(p) = stack.pop() {
            stack.extend(p["panels"].as_array().cloned().unwrap_or_default());
            for t in p["targets"].as_array().cloned().unwrap_or_default() {
                let expr = t["expr"].as_str().context("a target without expr")?;
                panels.push(PanelQuery {
                    dashboard: name.clone(),
                    panel: p["title"].as_str().unwrap_or("?").to_string(),
                    expr: expr.to_string(),
                });
                count += 1;
            }
        }
        ensure!(count > 0, "{name} has no queries");
        for v in d["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            if v["type"] == "query" {
                let q = v["query"]["query"].as_str().or(v["query"].as_str());
                variables.push(VariableQuery {
                    dashboard: name.clone(),
                    query: q.context("a variable without query")?.into(),
                });
            }
        }
    }
    Ok((panels, variables))
}

/// A dashboard expression as Grafana sends it with every variable at "All" and a time
/// range of `range_secs`.
fn expand(expr: &str, range_secs: u64) -> Result<String> {
    let out = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__range", &format!("{range_secs}s"))
        .replace("$__interval", "1s")
        .replace("$copyjob_namespace", ".*")
        .replace("$copyjob", ".*")
        .replace("$node", ".*");
    ensure!(!out.contains('$'), "unknown variable left in {out}");
    Ok(out)
}

/// The alerting rules of the rule file: name → expr.
fn alert_rules() -> Result<BTreeMap<String, String>> {
    let path = repo_root().join("charts/ferry/alerts/ferry.rules.yaml");
    let doc: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    let mut rules = BTreeMap::new();
    for group in doc["groups"].as_sequence().context("no groups")? {
        for rule in group["rules"]
            .as_sequence()
            .context("a group without rules")?
        {
            if let (Some(name), Some(expr)) = (rule["alert"].as_str(), rule["expr"].as_str()) {
                rules.insert(name.to_string(), expr.trim().to_string());
            }
        }
    }
    Ok(rules)
}

/// The value of `label` in each series of a result.
fn label_values(result: &[Value], label: &str) -> BTreeSet<String> {
    result
        .iter()
        .filter_map(|s| s["metric"][label].as_str().map(str::to_string))
        .collect()
}

/// 30 directories of 100 files of up to 32 KiB. Returns (files, bytes).
fn make_tree(root: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for d in 0..30u64 {
        let dir = root.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..100u64 {
            let len = (d * 7919 + f * 104_729) % 32_768;
            let body: Vec<u8> = (0..len).map(|i| (i ^ (d * 31 + f)) as u8).collect();
            std::fs::write(dir.join(format!("f{f:03}.bin")), body)?;
            files += 1;
            bytes += len;
        }
    }
    Ok((files, bytes))
}

fn job(name: &str, root: &str, src: &str, dst: &str) -> String {
    format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: {root}, path: {src}}}\n  destination: {{root: {root}, path: {dst}}}\n")
}

fn root(name: &str, path: &str, node: &str) -> String {
    format!("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {name}\nspec:\n  path: {path}\n  nodeSelector: {{ferry.dev/node: {node}}}\n  namespaces: {{names: [default]}}\n")
}

#[test]
fn dashboards_and_alerts_work_against_a_real_prometheus_and_its_throughput_matches_the_copy(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let Some((prometheus, promtool)) = prometheus_or_skip()? else {
        return Ok(());
    };
    let rules_file = repo_root().join("charts/ferry/alerts/ferry.rules.yaml");
    let out = Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(&rules_file)
        .output()
        .context("run promtool")?;
    ensure!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = alert_rules()?;
    let (panels, variables) = dashboard_queries()?;

    cp.install_crds()?;
    // Slow enough for a dozen scrapes of a 3,000-file copy.
    let (mut ferry, hosts) = cp.start_ferry_with(
        &NODES,
        &[
            ("FERRY_FAULT_FILE_DELAY_MS", "6"),
            PACED,
            ("FERRY_FAULT_CORRUPT_FILE", CORRUPT),
        ],
    )?;
    // node-c's agent waits 10 minutes before each file: its job runs and never progresses.
    cp.add_node("node-c")?;
    let _stuck_agent = cp.spawn_agent("node-c", &[("FERRY_FAULT_FILE_DELAY_MS", "600000")])?;
    let agent_ports = [
        cp.agent_port("node-a")?,
        cp.agent_port("node-b")?,
        cp.agent_port("node-c")?,
    ];
    let prom = Prometheus::start(&cp, &prometheus, cp.operator_port()?, &agent_ports)?;
    wait_for("every target up", Duration::from_secs(60), || {
        prom.scalar("count(up == 1)", None).is_ok_and(|n| n == 4.0)
    })
    .with_context(|| format!("targets: {:?}", prom.api("/api/v1/targets")))?;
    // The agents are ready once their watch and heartbeat are up (Prometheus sees it).
    wait_for("every agent ready", Duration::from_secs(60), || {
        prom.scalar("sum(ferry_agent_ready)", None)
            .is_ok_and(|n| n == 3.0)
    })?;

    // While all is well, no alert condition holds.
    let stall_probe = rules
        .get("FerryCopyJobStalled")
        .context("no FerryCopyJobStalled")?;
    ensure!(
        stall_probe.contains("[15m]"),
        "the stall window changed: {stall_probe}"
    );
    // The same expression over 10 s instead of 15 minutes, so the test can wait for it.
    let stall_probe = stall_probe.replace("[15m]", "[10s]");
    let late_probe = rules
        .get("FerryScheduleLate")
        .context("no FerryScheduleLate")?;
    ensure!(
        late_probe.contains("> 3 * ferry_operator_schedule_interval_seconds"),
        "the lateness threshold changed: {late_probe}"
    );
    // Late after a tenth of an interval (6 s of a minute) instead of three.
    let late_probe = late_probe.replace("> 3 *", "> 0.1 *");
    for (name, expr) in &rules {
        let expr = match name.as_str() {
            "FerryCopyJobStalled" => &stall_probe,
            "FerryScheduleLate" => &late_probe,
            _ => expr,
        };
        let r = prom.query(expr, None)?;
        ensure!(r.is_empty(), "{name} holds on a healthy cluster: {r:?}");
    }

    // 1. A copy of 3,000 files; Prometheus's bytes against the tree's.
    let src = hosts.join("node-a/srv/data/src");
    let (files, bytes) = make_tree(&src)?;
    cp.apply(&root("data", "/srv/data", "node-a"))?;
    let started = now();
    cp.apply(&job("bulk", "data", "src", "copy"))?;
    cp.wait_succeeded("default", "bulk", 300)?;
    // The last scrape after the copy, with every file counted.
    wait_for(
        "Prometheus to scrape the finished copy",
        Duration::from_secs(30),
        || {
            prom.scalar(r#"sum(ferry_agent_files_total{result="copied"})"#, None)
                .is_ok_and(|n| n == files as f64)
        },
    )?;
    let last_scrape = prom.scalar(
        r#"max(timestamp(ferry_agent_bytes_copied_total{node="node-a"}))"#,
        None,
    )?;
    let copy_secs = last_scrape - started;
    eprintln!("copy of {files} files, {bytes} bytes: {copy_secs:.1} s of scrapes");
    // (a) The counters' increase over a window that starts before the copy, at the
    // last scrape (so nothing is extrapolated past it).
    let window = (last_scrape - started).ceil() as u64 + 5;
    let increase = prom.scalar(
        &format!("sum(increase(ferry_agent_bytes_copied_total[{window}s]))"),
        Some(last_scrape),
    )?;
    // (b) What the overview dashboard's throughput panel shows, integrated over the copy.
    let throughput = panels
        .iter()
        .find(|p| p.panel == "Cluster throughput")
        .context("no Cluster throughput panel")?;
    let series = prom.query_range(
        &expand(&throughput.expr, window)?,
        started - 5.0,
        last_scrape + 5.0,
    )?;
    ensure!(series.len() == 1, "throughput: {series:?}");
    let integral: f64 = series[0]["values"]
        .as_array()
        .context("no values")?
        .iter()
        .filter_map(value)
        .filter(|v| v.is_finite())
        .sum();
    let verified = prom.scalar("sum(ferry_agent_bytes_verified_total)", None)?;
    let tree = bytes as f64;
    eprintln!(
        "bytes copied: tree {bytes}; Prometheus increase {increase:.0} ({:+.2}%); throughput panel integral {integral:.0} ({:+.2}%); verified {verified:.0}",
        (increase / tree - 1.0) * 100.0,
        (integral / tree - 1.0) * 100.0
    );
    ensure!(
        (increase / tree - 1.0).abs() <= 0.05,
        "increase {increase} vs tree {bytes}"
    );
    ensure!(
        (integral / tree - 1.0).abs() <= 0.05,
        "throughput integral {integral} vs tree {bytes}"
    );
    ensure!(
        verified == tree,
        "verified {verified} bytes of {bytes} (the job verifies checksums)"
    );

    // 2. A job that fails on a checksum mismatch: FerryCopyJobFailed, FerryChecksumMismatch.
    let bad = hosts.join("node-a/srv/data/bad");
    std::fs::create_dir_all(&bad)?;
    for i in 0..5 {
        std::fs::write(bad.join(format!("ok{i}.bin")), vec![i as u8; 5000])?;
    }
    std::fs::write(bad.join(CORRUPT), vec![42u8; 5000])?;
    cp.apply(&job("bad", "data", "bad", "bad-copy"))?;
    cp.wait_until(
        "copyjob/bad",
        "default",
        "{.status.phase}",
        Duration::from_secs(120),
        |p| p == "Failed",
    )?;
    let failed_expr = &rules["FerryCopyJobFailed"];
    let mismatch_expr = &rules["FerryChecksumMismatch"];
    wait_for(
        "Prometheus to fire FerryCopyJobFailed and FerryChecksumMismatch",
        Duration::from_secs(30),
        || {
            prom.alerts().is_ok_and(|alerts| {
                let firing = |name: &str, label: &str, value: &str| {
                    alerts
                        .iter()
                        .any(|(n, s, l)| n == name && s == "firing" && l[label] == value)
                };
                firing("FerryCopyJobFailed", "copyjob", "bad")
                    && firing("FerryChecksumMismatch", "node", "node-a")
            })
        },
    )
    .with_context(|| format!("alerts: {:?}", prom.alerts()))?;
    let r = prom.query(failed_expr, None)?;
    ensure!(
        label_values(&r, "copyjob") == BTreeSet::from(["bad".to_string()]),
        "{failed_expr}: {r:?}"
    );
    let r = prom.query(mismatch_expr, None)?;
    ensure!(
        label_values(&r, "node") == BTreeSet::from(["node-a".to_string()]),
        "{mismatch_expr}: {r:?}"
    );

    // 3. A job whose agent commits nothing: FerryCopyJobStalled (over 10 s, not 15 min).
    let slow = hosts.join("node-c/srv/slow/src");
    std::fs::create_dir_all(&slow)?;
    std::fs::write(slow.join("never"), b"copied only after 10 minutes")?;
    cp.apply(&root("slow", "/srv/slow", "node-c"))?;
    cp.apply(&job("stuck", "slow", "src", "copy"))?;
    cp.wait_until(
        "copyjob/stuck",
        "default",
        "{.status.phase}",
        Duration::from_secs(60),
        |p| p == "Running",
    )?;
    wait_for(
        "the stall condition to hold for the stuck job only",
        Duration::from_secs(60),
        || {
            prom.query(&stall_probe, None)
                .is_ok_and(|r| label_values(&r, "copyjob") == BTreeSet::from(["stuck".to_string()]))
        },
    )
    .with_context(|| format!("{stall_probe}: {:?}", prom.query(&stall_probe, None)))?;

    // 3b. A CopySchedule whose runs (on node-c) never finish: FerryScheduleLate, which
    // counts from its creation while it has never succeeded. The real threshold (three
    // minutes) does not hold yet; the shortened one holds for it alone.
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopySchedule\nmetadata:\n  name: late\n  namespace: default\nspec:\n  schedule: '* * * * *'\n  jobTemplate:\n    spec:\n      source: {root: slow, path: src}\n      destination: {root: slow, path: late}\n"
    )?;
    let late = r#"{copyschedule_namespace="default", copyschedule="late"}"#;
    wait_for(
        "the late schedule's interval and creation in Prometheus",
        Duration::from_secs(30),
        || {
            prom.scalar(
                &format!("ferry_operator_schedule_interval_seconds{late}"),
                None,
            )
            .is_ok_and(|v| v == 60.0)
                && prom
                    .scalar(
                        &format!("ferry_operator_schedule_created_timestamp_seconds{late}"),
                        None,
                    )
                    .is_ok_and(|v| (now() - v).abs() < 60.0)
        },
    )?;
    let late_expr = &rules["FerryScheduleLate"];
    let r = prom.query(late_expr, None)?;
    ensure!(r.is_empty(), "{late_expr} holds for a new schedule: {r:?}");
    wait_for(
        "the lateness condition to hold for the late schedule only",
        Duration::from_secs(30),
        || {
            prom.query(&late_probe, None).is_ok_and(|r| {
                label_values(&r, "copyschedule") == BTreeSet::from(["late".to_string()])
            })
        },
    )
    .with_context(|| format!("{late_probe}: {:?}", prom.query(&late_probe, None)))?;
    ensure!(
        prom.query(
            &format!("ferry_operator_schedule_last_success_timestamp_seconds{late}"),
            None
        )?
        .is_empty(),
        "a schedule that never succeeded has a last success"
    );
    cp.kubectl_ok(&["delete", "copyschedule", "late", "-n", "default"])?;
    let late_series = r#"{__name__=~"ferry_operator_schedule_.*", copyschedule="late"}"#;
    wait_for(
        "the deleted schedule's series to go",
        Duration::from_secs(30),
        || prom.query(late_series, None).is_ok_and(|r| r.is_empty()),
    )
    .with_context(|| format!("{:?}", prom.query(late_series, None)))?;

    // 4. Every dashboard query over the whole run: data, and a non-zero value somewhere.
    let end = now();
    let start = started - 5.0;
    let range = (end - start).ceil() as u64;
    let mut problems = Vec::new();
    for p in &panels {
        let expr = expand(&p.expr, range)?;
        let result = prom.query_range(&expr, start, end)?;
        let values: Vec<f64> = result
            .iter()
            .flat_map(|s| s["values"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| value(&v))
            .collect();
        let moved = values.iter().any(|v| v.is_finite() && *v != 0.0);
        if values.is_empty() && BETWEEN_NODES.contains(&p.panel.as_str()) {
            continue;
        }
        if values.is_empty() {
            problems.push(format!("{} / {}: no data for {expr}", p.dashboard, p.panel));
        } else if !moved && !MAY_STAY_ZERO.contains(&p.panel.as_str()) {
            problems.push(format!(
                "{} / {}: only zeros for {expr}",
                p.dashboard, p.panel
            ));
        }
    }
    for VariableQuery {
        dashboard,
        query: q,
    } in &variables
    {
        // label_values(<selector>, <label>)
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .with_context(|| format!("{dashboard}: variable query {q}"))?;
        let (selector, label) = inner
            .rsplit_once(',')
            .with_context(|| format!("{dashboard}: variable query {q}"))?;
        let selector = expand(selector.trim(), range)?;
        let values = prom.api(&format!(
            "/api/v1/label/{}/values?match[]={}&start={start:.3}&end={end:.3}",
            label.trim(),
            encode(&selector)
        ))?;
        if values.as_array().is_none_or(|v| v.is_empty()) {
            problems.push(format!("{dashboard}: variable {q} finds no values"));
        }
    }
    ensure!(
        problems.is_empty(),
        "dashboard queries:\n  {}",
        problems.join("\n  ")
    );
    eprintln!(
        "{} dashboard queries and {} variables return data",
        panels.len(),
        variables.len()
    );

    // 5. A finished job's progress gauges keep their final values while the job exists,
    // and go (Prometheus marks them stale) when it is deleted.
    let bulk = r#"{copyjob_namespace="default", copyjob="bulk"}"#;
    for gauge in ["ferry_agent_job_bytes_done", "ferry_agent_job_bytes_total"] {
        let v = prom.scalar(&format!("{gauge}{bulk}"), None)?;
        ensure!(
            v == tree,
            "{gauge} of the finished job: {v}, the tree has {bytes}"
        );
    }
    let files_done = prom.scalar(&format!("ferry_agent_job_files_done{bulk}"), None)?;
    ensure!(
        files_done == files as f64,
        "files done {files_done} of {files}"
    );
    cp.kubectl_ok(&["delete", "copyjob", "bulk", "-n", "default", "--wait=true"])?;
    // The agent's gauges and the operator's job_phase series alike.
    let bulk_series = r#"{__name__=~"ferry_.*", copyjob="bulk"}"#;
    wait_for(
        "the deleted job's series to go",
        Duration::from_secs(30),
        || prom.query(bulk_series, None).is_ok_and(|r| r.is_empty()),
    )
    .with_context(|| format!("{:?}", prom.query(bulk_series, None)))?;

    // 6. An agent, then the operator, killed: FerryAgentDown, FerryOperatorDown.
    let node_b = format!("127.0.0.1:{}", cp.agent_port("node-b")?);
    drop(ferry.remove(2)); // [operator, agent node-a, agent node-b]
    let down_expr = &rules["FerryAgentDown"];
    wait_for(
        "FerryAgentDown's condition",
        Duration::from_secs(30),
        || {
            prom.query(down_expr, None)
                .is_ok_and(|r| label_values(&r, "instance") == BTreeSet::from([node_b.clone()]))
        },
    )?;
    drop(ferry.remove(0));
    let operator_expr = &rules["FerryOperatorDown"];
    wait_for(
        "FerryOperatorDown's condition",
        Duration::from_secs(30),
        || prom.query(operator_expr, None).is_ok_and(|r| r.len() == 1),
    )?;
    // Both wait out their `for:` as pending alerts.
    wait_for(
        "FerryAgentDown and FerryOperatorDown pending",
        Duration::from_secs(30),
        || {
            prom.alerts().is_ok_and(|alerts| {
                ["FerryAgentDown", "FerryOperatorDown"]
                    .iter()
                    .all(|name| alerts.iter().any(|(n, s, _)| n == name && s == "pending"))
            })
        },
    )
    .with_context(|| format!("alerts: {:?}", prom.alerts()))?;

    // Every alert was made to hold above; a new one needs its own case here.
    let checked = BTreeSet::from([
        "FerryAgentDown",
        "FerryChecksumMismatch",
        "FerryCopyJobFailed",
        "FerryCopyJobStalled",
        "FerryOperatorDown",
        "FerryScheduleLate",
    ]);
    let in_file: BTreeSet<&str> = rules.keys().map(String::as_str).collect();
    ensure!(
        in_file == checked,
        "alerts in the rule file {in_file:?}, checked here {checked:?}"
    );
    // Prometheus evaluated every rule of the file without an error.
    let groups = prom.api("/api/v1/rules")?;
    let mut evaluated = 0;
    for g in groups["groups"].as_array().cloned().unwrap_or_default() {
        for r in g["rules"].as_array().cloned().unwrap_or_default() {
            ensure!(
                r["health"] == "ok",
                "rule {} unhealthy: {}",
                r["name"],
                r["lastError"]
            );
            evaluated += 1;
        }
    }
    ensure!(
        evaluated == rules.len(),
        "Prometheus loaded {evaluated} rules"
    );
    Ok(())
}
