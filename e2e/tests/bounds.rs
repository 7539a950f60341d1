//! What one agent holds at once is bounded, whatever tenants ask for: shards beyond
//! `--max-shards` wait (Pending) for a slot instead of all running at once, and a job
//! cannot ask for more than 64 workers (each holds a 1 MiB buffer).

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use ferry_e2e::{ControlPlane, PACED};

#[test]
fn an_agent_runs_at_most_max_shards_at_once_and_the_rest_wait_their_turn() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    // Slow enough to watch: 20 files, 100 ms each.
    let env = [
        ("FERRY_MAX_SHARDS", "1"),
        ("FERRY_FAULT_FILE_DELAY_MS", "100"),
        PACED,
    ];
    let (_ferry, hosts) = cp.start_ferry_with(&["node-a"], &env)?;
    let src = hosts.join("node-a/srv/data/src");
    std::fs::create_dir_all(&src)?;
    for i in 0..20 {
        std::fs::write(src.join(format!("f{i}")), format!("file {i}"))?;
    }
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    let job = |name: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: data, path: src}}\n  destination: {{root: data, path: {name}}}\n  parallelism: {{workersPerAgent: 1}}\n")
    };
    cp.apply(&format!(
        "{}---\n{}---\n{}",
        job("one"),
        job("two"),
        job("three")
    ))?;
    // Sample the three shards' states until all are done: never two Running at once. One
    // list a sample, so the three states are of one moment (the agent frees a slot only
    // after the shard's last state is written); three gets in a row, under load, once saw
    // the first job still Running and the second already Running a moment later.
    let start = Instant::now();
    let mut most = 0;
    let mut order = Vec::new();
    loop {
        let listed = cp.get(
            "copyjobs",
            "default",
            r#"{range .items[*]}{.metadata.name}={.status.shards[0].state}{"\n"}{end}"#,
        )?;
        let states: Vec<String> = ["one", "two", "three"]
            .iter()
            .map(|j| {
                listed
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{j}=")))
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        let running = states.iter().filter(|s| *s == "Running").count();
        most = most.max(running);
        for (j, s) in ["one", "two", "three"].iter().zip(&states) {
            if s == "Running" && !order.contains(j) {
                order.push(*j);
            }
        }
        if states.iter().all(|s| s == "Succeeded") {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "not all done after 120 s: {states:?}\n{}",
            cp.log_tail("agent-node-a.log", 20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        most == 1,
        "{most} shards ran at once on an agent with --max-shards 1"
    );
    ensure!(
        order.len() == 3,
        "each job was seen running in turn: {order:?}"
    );
    for j in ["one", "two", "three"] {
        let n = std::fs::read_dir(hosts.join("node-a/srv/data").join(j))?.count();
        ensure!(n == 20, "{j}: {n} files");
    }

    // A job cannot ask for more workers than a shard may hold.
    let many = job("many").replace("workersPerAgent: 1", "workersPerAgent: 256");
    let err = cp.apply(&many).err();
    ensure!(
        err.as_ref().is_some_and(|e| e
            .to_string()
            .contains("workersPerAgent must be between 0 and 64")),
        "workersPerAgent 256 was not refused at admission: {err:?}"
    );
    Ok(())
}
