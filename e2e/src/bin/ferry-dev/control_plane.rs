//! `ferry-dev bench`: the control-plane benchmark (`make bench-control-plane`): apply ->
//! Succeeded latency of one-file jobs, a burst of jobs at once, status writes per job,
//! the operator's peak RSS.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

use crate::bring_up;
use crate::machine::proc_status_kib;

/// The sum of the apiserver's `apiserver_request_total` series, in `metrics` (its
/// `/metrics` text), whose labels `which` accepts.
pub(crate) fn requests_in(metrics: &str, which: impl Fn(&str) -> bool) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && which(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `apiserver_request_total` for PATCHes of CopyJob status, from the apiserver's metrics.
fn status_patches(cp: &ControlPlane) -> Result<u64> {
    let metrics = cp.kubectl_ok(&["get", "--raw", "/metrics"])?;
    Ok(requests_in(&metrics, |l| {
        l.contains("resource=\"copyjobs\"")
            && l.contains("subresource=\"status\"")
            && (l.contains("verb=\"APPLY\"") || l.contains("verb=\"PATCH\""))
    }))
}

/// The control-plane benchmark of the operator issue: apply -> Succeeded latency of
/// one-file CopyJobs (one at a time), then `burst` jobs applied at once: time until all
/// have Succeeded, status writes per job, operator peak RSS. Prints a Markdown report.
pub fn bench(sequential: usize, burst: usize) -> Result<()> {
    let (cp, procs, hosts) = bring_up()?;
    std::fs::create_dir_all(hosts.join("node-a/srv/bench/src"))?;
    std::fs::write(hosts.join("node-a/srv/bench/src/one"), b"one file")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: bench\nspec:\n  path: /srv/bench\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    let job = |name: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: bench, path: src/one}}\n  destination: {{root: bench, path: out/{name}}}\n")
    };
    let patches_before = status_patches(&cp)?;
    let mut latencies = Vec::new();
    for i in 0..sequential {
        let name = format!("seq-{i}");
        let start = Instant::now();
        cp.apply(&job(&name))?;
        cp.wait_succeeded("default", &name, 60)?;
        latencies.push(start.elapsed().as_secs_f64());
    }
    let seq_patches = status_patches(&cp)? - patches_before;
    latencies.sort_by(f64::total_cmp);
    let median = latencies[latencies.len() / 2];
    let p90 = latencies[latencies.len() * 9 / 10];
    let all: String = (0..burst)
        .map(|i| job(&format!("burst-{i}")))
        .collect::<Vec<_>>()
        .join("---\n");
    let before = status_patches(&cp)?;
    let start = Instant::now();
    cp.apply(&all)?;
    loop {
        let phases = cp.kubectl_ok(&[
            "get",
            "copyjobs",
            "-n",
            "default",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ])?;
        let done = phases
            .split_whitespace()
            .filter(|p| *p == "Succeeded")
            .count();
        if done >= sequential + burst {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(600),
            "only {done} of {} jobs succeeded after 600 s",
            sequential + burst
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let burst_secs = start.elapsed().as_secs_f64();
    let burst_patches = status_patches(&cp)? - before;
    let rss = proc_status_kib(procs[0].id(), "VmHWM");
    println!("| measurement | value |\n|---|---|");
    println!("| one-file CopyJob, `kubectl apply` -> `Succeeded` (observed by `kubectl wait`), median of {sequential} | {median:.2} s (p90 {p90:.2} s) |");
    println!("| status writes per one-file job (apiserver_request_total, CopyJob status APPLY/PATCH) | {:.1} |", seq_patches as f64 / sequential as f64);
    println!("| {burst} CopyJobs applied at once, all `Succeeded` after | {burst_secs:.1} s |");
    println!(
        "| status writes per job in that burst | {:.1} |",
        burst_patches as f64 / burst as f64
    );
    println!(
        "| operator peak RSS (VmHWM) | {:.1} MiB |",
        rss as f64 / 1024.0
    );
    Ok(())
}
