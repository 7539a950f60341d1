//! Between clusters, under faults: a tenant of west copies a tenant of east's export (600
//! files, about 120 MB) while the connection between the clusters is cut and the agents on
//! either side are killed, a dozen times at random moments once the copy has moved on.
//! East's agent advertises a proxy this test runs, which forwards to its real peering
//! port, counts what east sends (TLS and framing included) and cuts the connections. Then
//! the copy must equal the source byte for byte, with no staging names left, and east must
//! have sent at most 1.10 times the tree: what was in flight at each fault again, nothing
//! that west had committed. Then a CopySchedule of west replicates the export every minute,
//! each run sending only what changed since the last.

#[path = "../../engine/tests/common/mod.rs"]
mod tree;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{wait_for, ControlPlane, Proc, Proxy};

use ferry_e2e::peering::{carried_secret, let_the_operator_read, paired, WITHIN};

/// The source's namespace on east, and the reader's on west.
const NS: &str = "shop";
const READER_NS: &str = "shop-dr";
const FAULTS: usize = 12;

/// A node's agent as the chart runs it, restarted with the same environment.
struct Agent<'a> {
    cp: &'a ControlPlane,
    node: &'static str,
    ip: String,
    env: Vec<(&'static str, String)>,
    proc: Option<Proc>,
}

impl<'a> Agent<'a> {
    fn start(
        cp: &'a ControlPlane,
        node: &'static str,
        ip: String,
        env: Vec<(&'static str, String)>,
    ) -> Result<Self> {
        let mut a = Self {
            cp,
            node,
            ip,
            env,
            proc: None,
        };
        a.spawn()?;
        Ok(a)
    }

    fn spawn(&mut self) -> Result<()> {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.proc = Some(self.cp.spawn_chart_agent(self.node, &self.ip, &env)?);
        Ok(())
    }

    /// SIGKILL it, and start it again after `down`.
    fn kill_and_restart(&mut self, down: Duration) -> Result<()> {
        if let Some(mut p) = self.proc.take() {
            p.kill()?;
        }
        std::thread::sleep(down);
        self.spawn()
    }
}

#[test]
fn cut_connections_and_killed_agents_on_either_side_resume_to_an_identical_copy_sending_little_twice(
) -> Result<()> {
    let Some(helm) = ferry_e2e::helm_or_skip()? else {
        return Ok(());
    };
    let Some((east, west, east_name)) = paired(&helm)? else {
        return Ok(());
    };
    let (east, west) = (&east.cp, &west.cp);

    // East: the tree on a root of its own, its agent's peering port behind the proxy.
    let east_root = east.add_node("east-1")?;
    let src = east_root.join("srv/shared/db");
    let mut next = tree::xorshift(0x9e37_79b9_7f4a_7c15);
    tree::write_varied_tree(&src, &mut next)?;
    let real = format!("127.0.0.1:{}", ferry_e2e::free_port()?);
    let proxied = format!("127.0.0.5:{}", ferry_e2e::free_port()?);
    let proxy = Proxy::start(&proxied, real.clone())?;
    let mut east_agent = Agent::start(
        east,
        "east-1",
        ferry_e2e::transfer_ip(0),
        vec![
            ("FERRY_PEERING_LISTEN", real.clone()),
            ("FERRY_PEERING_ADDRESS", proxied.clone()),
        ],
    )?;
    east.kubectl_ok(&["create", "namespace", NS])?;
    east.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: shared\nspec:\n  path: /srv/shared\n  shared: true\n  namespaces: {{names: [{NS}]}}\n"
    ))?;
    east.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyExport\nmetadata:\n  name: db\n  namespace: {NS}\nspec:\n  source: {{root: shared, path: db}}\n  readers: [{{peer: west, namespace: {READER_NS}}}]\n  ttl: 2h\n"
    ))?;
    let mut address = String::new();
    wait_for("the export Ready at the proxy's address", WITHIN, || {
        address = east
            .get(
                "copyexport/db",
                NS,
                "{.status.conditions[?(@.type==\"Ready\")].status} {.status.address}",
            )
            .unwrap_or_default();
        address == format!("True {proxied}")
    })
    .with_context(|| format!("{address}\n{}", east.log_tail("operator.log", 20)))?;

    // West: a root for the copy, its agent slowed (each file waits 15 ms) so that the
    // faults land mid-copy, and the export's Secret carried over.
    let west_root = west.add_node("west-1")?;
    std::fs::create_dir_all(west_root.join("srv/dr"))?;
    let mut west_agent = Agent::start(
        west,
        "west-1",
        ferry_e2e::transfer_ip(1),
        vec![
            (
                "FERRY_PEERING_LISTEN",
                format!("127.0.0.1:{}", ferry_e2e::free_port()?),
            ),
            ("FERRY_FAULT_FILE_DELAY_MS", "15".into()),
        ],
    )?;
    west.kubectl_ok(&["create", "namespace", READER_NS])?;
    west.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: dr\nspec:\n  path: /srv/dr\n  shared: true\n  namespaces: {{names: [{READER_NS}]}}\n"
    ))?;
    west.apply(&carried_secret(east, NS, "db-ferry-export", READER_NS)?.to_string())?;
    let_the_operator_read(west, READER_NS, "db-ferry-export")?;
    // Counted first: listing a directory moves its atime, which the copy then keeps.
    let bytes = ferry_e2e::tree_bytes(&src)?;
    let before = tree::snapshot(&src)?;
    west.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-east\n  namespace: {READER_NS}\nspec:\n  source: {{export: db-ferry-export}}\n  destination: {{root: dr, path: db}}\n  verify: Checksum\n  parallelism: {{workersPerAgent: 2}}\n"
    ))?;

    // Faults, each once the copy has moved on since the last one: the connection between
    // the clusters cut, east's agent killed, west's agent killed (each back after 300 ms).
    // Each kind four times, in a random order.
    let mut plan = ["cut", "east", "west"].repeat(FAULTS / 3);
    for i in (1..plan.len()).rev() {
        plan.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    let mut faults = Vec::new();
    let mut last = 0;
    let began = std::time::Instant::now();
    while faults.len() < FAULTS {
        let phase = west.get("copyjob/from-east", READER_NS, "{.status.phase}")?;
        ensure!(
            phase != "Succeeded" && phase != "Failed",
            "the copy finished ({phase}) after only {} faults ({faults:?}): {}",
            faults.len(),
            west.get("copyjob/from-east", READER_NS, "{.status.conditions}")?
        );
        ensure!(
            began.elapsed() < Duration::from_secs(600),
            "the copy did not move on after {faults:?}: {} bytes sent\n{}\n{}",
            proxy.bytes(),
            west.log_tail("agent-west-1.log", 20),
            east.log_tail("agent-east-1.log", 20)
        );
        let moved = proxy.bytes().saturating_sub(last);
        if moved < (1 << 20) + next() % (3 << 20) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        last = proxy.bytes();
        let fault = plan[faults.len()];
        match fault {
            "cut" => proxy.cut(),
            "east" => east_agent.kill_and_restart(Duration::from_millis(300))?,
            _ => west_agent.kill_and_restart(Duration::from_millis(300))?,
        }
        faults.push(fault);
    }
    west.wait_succeeded(READER_NS, "from-east", 300)
        .with_context(|| west.log_tail("agent-west-1.log", 30))?;
    let dst = west_root.join("srv/dr/db");
    tree::compare(&before, &dst, tree::Check::default())?;
    let left = tree::staging_leftovers(&dst)?;
    ensure!(left.is_empty(), "staging left: {left:?}");
    let ratio = proxy.bytes() as f64 / bytes as f64;
    eprintln!(
        "between clusters, faults {faults:?}: {} bytes for a {bytes}-byte tree ({ratio:.3}); east is {east_name}",
        proxy.bytes()
    );
    ensure!(
        ratio <= 1.10,
        "{ratio:.3} of the tree's bytes sent over {faults:?}"
    );
    replicated_every_minute_sending_only_what_changed(west, &src, &dst, &proxy)?;
    west.kubectl_ok(&["delete", "copyschedule", "replica", "-n", READER_NS])?;
    limited_by_the_reader_and_by_the_export(east, west, &src, &proxy)
}

/// Bandwidth between clusters: a reading job's `transfer.bandwidthLimit` holds (east sends
/// no faster), and so does the export's own `bandwidthLimit`, the lower of the two.
fn limited_by_the_reader_and_by_the_export(
    east: &ControlPlane,
    west: &ControlPlane,
    src: &std::path::Path,
    proxy: &Proxy,
) -> Result<()> {
    // The schedule's last run holds the export's one reader slot until it ends.
    wait_for(
        "the schedule's runs to end",
        Duration::from_secs(120),
        || {
            west.get(
            "copyjobs",
            READER_NS,
            "{.items[?(@.status.phase==\"Running\")].metadata.name}{.items[?(@.status.phase==\"Pending\")].metadata.name}",
        )
        .is_ok_and(|s| s.trim().is_empty())
        },
    )?;
    // 16 MiB that does not compress, beside the tree.
    let dir = src.join("limited");
    std::fs::create_dir_all(&dir)?;
    let size = 16u64 << 20;
    tree::write_pattern_file(&dir.join("blob"), size)?;
    let rate_of = |name: &str| -> Result<f64> {
        proxy.restart_span();
        let before = proxy.bytes();
        west.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {READER_NS}\nspec:\n  source: {{export: db-ferry-export, path: limited}}\n  destination: {{root: dr, path: {name}}}\n  transfer: {{bandwidthLimit: 4Mi}}\n"
        ))?;
        west.wait_succeeded(READER_NS, name, 120)?;
        let (first, last) = proxy.span().context("no bytes")?;
        let sent = proxy.bytes() - before;
        ensure!(sent >= size, "{name}: {sent} bytes sent");
        Ok(sent as f64 / (last - first).as_secs_f64())
    };
    let mib = f64::from(1 << 20);
    let reader = rate_of("limited-by-reader")?;
    east.kubectl_ok(&[
        "patch",
        "copyexport",
        "db",
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"spec":{"bandwidthLimit":"2Mi"}}"#,
    ])?;
    wait_for("the export Ready at its new generation", WITHIN, || {
        east.get(
            "copyexport/db",
            NS,
            "{.metadata.generation} {.status.observedGeneration} {.status.conditions[?(@.type==\"Ready\")].status}",
        )
        .is_ok_and(|s| {
            let f: Vec<&str> = s.split(' ').collect();
            f.len() == 3 && f[0] == f[1] && f[2] == "True"
        })
    })?;
    let export = rate_of("limited-by-export")?;
    eprintln!(
        "between clusters: the reader's 4 MiB/s limit, {:.2} MiB/s; the export's 2 MiB/s under it, {:.2} MiB/s",
        reader / mib,
        export / mib
    );
    // Never faster than the limit; slower only as much as a loaded machine makes it (the
    // export's 2 MiB/s is under what the reader's run got by itself).
    for (rate, limit) in [(reader, 4.0 * mib), (export, 2.0 * mib)] {
        ensure!(
            (0.5 * limit..=1.1 * limit).contains(&rate),
            "{:.2} MiB/s against a limit of {:.0} MiB/s",
            rate / mib,
            limit / mib
        );
    }
    Ok(())
}

/// The nightly replication, every minute: a CopySchedule of west copies the export into
/// the same destination again (`overwrite: IfChanged`). Its first run finds everything
/// there and sends little more than the listing; after six files changed at the source,
/// the next run sends those six and little else, and leaves the destination identical.
fn replicated_every_minute_sending_only_what_changed(
    west: &ControlPlane,
    src: &std::path::Path,
    dst: &std::path::Path,
    proxy: &Proxy,
) -> Result<()> {
    west.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopySchedule\nmetadata:\n  name: replica\n  namespace: {READER_NS}\nspec:\n  schedule: \"* * * * *\"\n  successfulJobsHistoryLimit: 5\n  jobTemplate:\n    spec:\n      source: {{export: db-ferry-export}}\n      destination: {{root: dr, path: db}}\n      overwrite: IfChanged\n      verify: Checksum\n"
    ))?;
    // The newest succeeded run after `after`: its name, files written and entries kept.
    let run_after = |after: &str| -> Result<(String, String)> {
        let mut seen = (String::new(), String::new());
        wait_for(
            "the schedule's next run to succeed",
            Duration::from_secs(150),
            || {
                let t = west
                    .get(
                        "copyschedule/replica",
                        READER_NS,
                        "{.status.lastSuccessfulTime}",
                    )
                    .unwrap_or_default();
                seen.0 = t;
                // The operator's status writes an unset time as null.
                !seen.0.is_empty() && seen.0 != "null" && seen.0 != after
            },
        )
        .with_context(|| {
            format!(
                "{}\n{}",
                west.kubectl_ok(&["get", "copyjobs", "-n", READER_NS])
                    .unwrap_or_default(),
                west.log_tail("operator.log", 20)
            )
        })?;
        let jobs = west.kubectl_ok(&[
            "get",
            "copyjobs",
            "-n",
            READER_NS,
            "-l",
            ferry_crds::SCHEDULE_LABEL,
            "-o",
            "json",
        ])?;
        let jobs: serde_json::Value = serde_json::from_str(&jobs)?;
        let newest = jobs["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j["status"]["phase"] == "Succeeded")
            .max_by_key(|j| {
                j["status"]["finishedAt"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .with_context(|| {
                format!("no succeeded run (lastSuccessfulTime {:?}): {jobs}", seen.0)
            })?;
        let p = &newest["status"]["progress"];
        seen.1 = format!(
            "{} {} {}",
            newest["metadata"]["name"].as_str().unwrap_or_default(),
            p["filesDone"],
            p["skipped"]
        );
        Ok(seen)
    };
    let before = proxy.bytes();
    let (first, run) = run_after("")?;
    let unchanged = proxy.bytes() - before;
    ensure!(
        run.ends_with(" 0 600"),
        "the first run (nothing changed) wrote or kept: {run}"
    );
    // Six files changed at the source, between runs.
    let mut changed = 0;
    for d in 0..6 {
        let f = src.join(format!("d{d}/f{d}"));
        let len = 100_000 + d * 10_000;
        tree::write_pattern_file(&f, len)?;
        changed += len;
    }
    let snapshot = tree::snapshot(src)?;
    let before = proxy.bytes();
    let (_, run) = run_after(&first)?;
    let sent = proxy.bytes() - before;
    tree::compare(&snapshot, dst, tree::Check::default())?;
    ensure!(
        run.ends_with(" 6 594"),
        "the run after 6 changes wrote, kept: {run}"
    );
    eprintln!(
        "scheduled runs: nothing changed, {unchanged} bytes sent; 6 files ({changed} bytes) changed, {sent} bytes sent"
    );
    // The listing of 600 entries and TLS on top of what changed, no more.
    ensure!(
        unchanged < 256 << 10,
        "a run with nothing changed sent {unchanged} bytes"
    );
    ensure!(
        sent < changed + (256 << 10),
        "a run after {changed} bytes changed sent {sent}"
    );
    Ok(())
}
