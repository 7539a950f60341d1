//! Copies between nodes (issue 14) through the real kube-apiserver with the chart's manifests
//! and RBAC: the operator and two agents on their ServiceAccounts' tokens (each agent's bound
//! to its Node), the agents as processes with host roots of their own and transfer ports on
//! loopback addresses of their own (node-a on 127.0.0.2, node-b on 127.0.0.3). A CopyJob from
//! a root only node-a has to a root only node-b has is copied by node-b's agent, which fetches
//! the source from node-a's agent over mutual TLS with the shard's ticket.
//!
//! Where bytes on the wire are counted or connections cut, node-a advertises a proxy this
//! test runs (127.0.0.4), which forwards to its real port: the agents' TLS goes through it
//! untouched (each side checks the other's certificate, not its address).

#[path = "network/block.rs"]
mod block;
mod certs;
#[path = "../../engine/tests/common/mod.rs"]
mod tree;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{ControlPlane, Proc, Proxy};
use serde_json::Value;

const TEAM: &str = "team";
/// node-a's transfer port, and where this test's proxy listens for it.
const NODE_A: &str = "127.0.0.2";
const NODE_B: &str = "127.0.0.3";
const PROXY: &str = "127.0.0.4";

/// A control plane with the chart installed, the operator, and node-a and node-b with an
/// agent each; StorageRoot `vol-a` (`/srv/vol` on node-a) and `vol-b` (the same path on
/// node-b), both for namespace `team`.
struct Nodes {
    cp: ControlPlane,
    _operator: Proc,
    agents: BTreeMap<String, Proc>,
    hosts: PathBuf,
    /// Each node's transfer listen address (kept across restarts) and extra environment.
    env: BTreeMap<String, Vec<(String, String)>>,
}

impl Nodes {
    fn start(env: &[(&str, &[(&str, &str)])]) -> Result<Option<Self>> {
        let Some((cp, operator)) = certs::cluster()? else {
            return Ok(None);
        };
        cp.kubectl_ok(&["create", "namespace", TEAM])?;
        // The tree with everything cp -a keeps has a device node and setuid files: these
        // roots keep privileged files.
        for (root, node) in [("vol-a", "node-a"), ("vol-b", "node-b")] {
            cp.apply(&format!(
                "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {root}\nspec:\n  path: /srv/vol\n  nodeSelector: {{ferry.dev/node: {node}}}\n  namespaces: {{names: [{TEAM}]}}\n  allowPrivilegedFiles: true\n"
            ))?;
        }
        let hosts = cp.dir().join("hosts");
        let mut nodes = Self {
            cp,
            _operator: operator,
            agents: BTreeMap::new(),
            hosts,
            env: BTreeMap::new(),
        };
        for (node, ip) in [("node-a", NODE_A), ("node-b", NODE_B)] {
            let mut e = vec![(
                "FERRY_TRANSFER_LISTEN".to_string(),
                format!("{ip}:{}", ferry_e2e::free_port()?),
            )];
            for (n, extra) in env {
                if *n == node {
                    e.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
                }
            }
            nodes.env.insert(node.into(), e);
            nodes.start_agent(node)?;
            std::fs::create_dir_all(nodes.root(node))?;
        }
        Ok(Some(nodes))
    }

    /// `/srv/vol` of `node`, as this machine sees it.
    fn root(&self, node: &str) -> PathBuf {
        self.hosts.join(node).join("srv/vol")
    }

    fn start_agent(&mut self, node: &str) -> Result<()> {
        let kc = certs::agent(&self.cp, node)?;
        let kc = kc.to_string_lossy().into_owned();
        let mut env: Vec<(&str, &str)> = vec![
            ("KUBECONFIG", &kc),
            ("FERRY_TICKET_NAMESPACE", certs::TICKETS),
        ];
        env.extend(self.env[node].iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let agent = self.cp.spawn_agent(node, &env)?;
        self.agents.insert(node.into(), agent);
        Ok(())
    }

    /// SIGKILL `node`'s agent (as a node crash or an OOM kill would), then start it again.
    fn kill_and_restart(&mut self, node: &str, down: Duration) -> Result<()> {
        if let Some(mut a) = self.agents.remove(node) {
            a.kill()?;
        }
        std::thread::sleep(down);
        self.start_agent(node)
    }

    /// Apply CopyJob `name` from `vol-a:src` to `vol-b:<name>`, with `extra` spec lines.
    fn job(&self, name: &str, extra: &str) -> Result<()> {
        self.cp.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {TEAM}\nspec:\n  source: {{root: vol-a, path: src}}\n  destination: {{root: vol-b, path: {name}}}\n{extra}"
        ))
    }

    fn status(&self, name: &str) -> Result<Value> {
        let out = self
            .cp
            .kubectl_ok(&["get", "copyjob", name, "-n", TEAM, "-o", "json"])?;
        Ok(serde_json::from_str::<Value>(&out)?["status"].clone())
    }

    /// Wait for job `name` to finish; its status.
    fn finished(&self, name: &str, within: Duration) -> Result<Value> {
        let start = Instant::now();
        loop {
            let s = self.status(name)?;
            if s["phase"] == "Succeeded" || s["phase"] == "Failed" {
                return Ok(s);
            }
            if start.elapsed() > within {
                bail!(
                    "{name} did not finish within {within:?}: {s}\nnode-b:\n{}\nnode-a:\n{}",
                    self.cp.log_tail("agent-node-b.log", 20),
                    self.cp.log_tail("agent-node-a.log", 10)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn succeeded(&self, name: &str, within: Duration) -> Result<Value> {
        let s = self.finished(name, within)?;
        ensure!(
            s["phase"] == "Succeeded",
            "{name}: {s}\nnode-b:\n{}",
            self.cp.log_tail("agent-node-b.log", 20)
        );
        Ok(s)
    }

    /// A metric of `node`'s agent.
    fn metric(&self, node: &str, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let port = self.cp.agent_port(node)?;
        let text = ferry_e2e::http_get(port, "/metrics").context("scrape the agent")?;
        Ok(ferry_e2e::metric(&text, name, labels).unwrap_or(0.0))
    }

    /// The transfer address `node`'s agent publishes in its heartbeat Lease.
    fn advertised(&self, node: &str) -> Result<String> {
        self.cp
            .advertised_transfer_address(node, certs::STARTED_WITHIN)
    }
}

/// `xxh128sum -c` of the job's manifest on node-b, in its destination.
fn manifest_checks(nodes: &Nodes, name: &str, status: &Value) -> Result<()> {
    let manifest = status["manifest"].as_str().context("status.manifest")?;
    let root = nodes.root("node-b");
    tree::xxh128sum_check(&root.join(name), &root.join(manifest))
        .with_context(|| format!("{name}'s manifest"))
}

#[test]
fn a_tree_with_everything_cp_a_keeps_is_copied_between_nodes_identical_verified_and_planned(
) -> Result<()> {
    let Some(nodes) = Nodes::start(&[])? else {
        return Ok(());
    };
    let src = nodes.root("node-a").join("src");
    tree::adversarial_tree(&src)?;
    // Bulk beside it: inline-sized files, chunked ones, and one across several credits.
    for (i, len) in [0u64, 100, 70_000, 1 << 20, 9 << 20]
        .into_iter()
        .enumerate()
    {
        tree::write_pattern_file(&src.join(format!("bulk{i}")), len)?;
    }
    // Counted first: listing a directory moves its atime, which the copy then keeps.
    let bytes = ferry_e2e::tree_bytes(&src)?;
    let before = tree::snapshot(&src)?;

    // A dry run says how, where and how much.
    nodes.job("plan", "  dryRun: true\n")?;
    let s = nodes.succeeded("plan", Duration::from_secs(120))?;
    let plan = &s["plan"];
    ensure!(plan["mode"] == "Network", "{plan}");
    ensure!(
        plan["nodes"] == serde_json::json!(["node-a", "node-b"]),
        "{plan}"
    );
    ensure!(plan["bytes"] == bytes, "plan {plan} against {bytes} bytes");
    ensure!(
        !nodes.root("node-b").join("plan").exists(),
        "a dry run wrote"
    );

    nodes.job("across", "  verify: Checksum\n")?;
    let s = nodes.succeeded("across", Duration::from_secs(120))?;
    ensure!(s["mode"] == "Network", "mode {}", s["mode"]);
    let shard = &s["shards"][0];
    ensure!(
        shard["sender"] == "node-a" && shard["node"] == "node-b",
        "{shard}"
    );
    let scheduled = s["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Scheduled")
        .context("Scheduled")?;
    ensure!(
        scheduled["message"]
            .as_str()
            .is_some_and(|m| m.contains("node node-a serves the source to node node-b")),
        "{scheduled}"
    );
    tree::compare(
        &before,
        &nodes.root("node-b").join("across"),
        tree::Check::default(),
    )?;
    manifest_checks(&nodes, "across", &s)?;
    ensure!(
        !nodes.root("node-a").join("across").exists(),
        "node-a wrote a destination"
    );

    // What crossed the network, counted on both sides (holes are not sent: the 8 MiB
    // sparse file carries 72 KiB of data).
    let labels = [("copyjob_namespace", TEAM), ("copyjob", "across")];
    let received = nodes.metric(
        "node-b",
        "ferry_agent_network_bytes_total",
        &[labels[0], labels[1], ("direction", "received")],
    )?;
    // (The sender counts once a second and at the connection's end, just after the
    // receiver's last status.)
    let start = Instant::now();
    let sent = loop {
        let sent = nodes.metric(
            "node-a",
            "ferry_agent_network_bytes_total",
            &[labels[0], labels[1], ("direction", "sent")],
        )?;
        if sent >= received || start.elapsed() > Duration::from_secs(10) {
            break sent;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let data = bytes - (8 << 20) + 4096 + 65536 + 4096;
    ensure!(
        received as u64 >= data && received as u64 <= bytes,
        "received {received}, data {data}"
    );
    ensure!(sent == received, "sent {sent}, received {received}");

    // The job's connection is closed with it, on both sides (no thread, socket or buffer
    // of a finished copy stays).
    let start = Instant::now();
    loop {
        let open = nodes.metric(
            "node-a",
            "ferry_agent_network_connections",
            &[("role", "sender")],
        )? + nodes.metric(
            "node-b",
            "ferry_agent_network_connections",
            &[("role", "receiver")],
        )?;
        if open == 0.0 {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "{open} transfer connections still open after the job"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Every metric the dashboard's panels of copies between nodes query is exported by the
    // agents that made one (the Prometheus test, without such a copy, cannot see them).
    let dashboard = std::fs::read_to_string(
        ferry_e2e::repo_root().join("charts/ferry/dashboards/ferry-nodes.json"),
    )?;
    let scraped = [
        ferry_e2e::http_get(nodes.cp.agent_port("node-a")?, "/metrics").unwrap_or_default(),
        ferry_e2e::http_get(nodes.cp.agent_port("node-b")?, "/metrics").unwrap_or_default(),
    ]
    .concat();
    let queried: std::collections::BTreeSet<&str> = dashboard
        .match_indices("ferry_agent_network_")
        .map(|(i, _)| {
            let rest = &dashboard[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    ensure!(queried.len() >= 4, "{queried:?}");
    for m in &queried {
        ensure!(
            scraped
                .lines()
                .any(|l| l.starts_with(&format!("{m}{{")) || l.starts_with(&format!("{m} "))),
            "the dashboard queries {m}, which no agent exports"
        );
    }

    // Its ticket goes with it.
    let uid = nodes.cp.get("copyjob/across", TEAM, "{.metadata.uid}")?;
    let start = Instant::now();
    while nodes
        .cp
        .kubectl(&[
            "get",
            "secret",
            &format!("ferry-ticket-{uid}"),
            "-n",
            certs::TICKETS,
        ])?
        .status
        .success()
    {
        ensure!(
            start.elapsed() < Duration::from_secs(15),
            "the ticket outlived its finished job"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    certs::nothing_forbidden(&nodes.cp)
}

/// node-a and node-b, node-a's transfer port reached through a [`Proxy`]; `env` for the
/// agents as in [`Nodes::start`].
fn behind_proxy(env: &[(&str, &[(&str, &str)])]) -> Result<Option<(Nodes, Proxy)>> {
    let proxy_addr = format!("{PROXY}:{}", ferry_e2e::free_port()?);
    let real = format!("{NODE_A}:{}", ferry_e2e::free_port()?);
    let mut all: Vec<(&str, Vec<(&str, &str)>)> = vec![(
        "node-a",
        vec![
            ("FERRY_TRANSFER_ADDRESS", proxy_addr.as_str()),
            ("FERRY_TRANSFER_LISTEN", real.as_str()),
        ],
    )];
    for (node, extra) in env {
        match all.iter_mut().find(|(n, _)| n == node) {
            Some((_, e)) => e.extend_from_slice(extra),
            None => all.push((node, extra.to_vec())),
        }
    }
    let all: Vec<(&str, &[(&str, &str)])> = all.iter().map(|(n, e)| (*n, e.as_slice())).collect();
    let Some(nodes) = Nodes::start(&all)? else {
        return Ok(None);
    };
    let proxy = Proxy::start(&proxy_addr, real)?;
    ensure!(nodes.advertised("node-a")? == proxy_addr);
    Ok(Some((nodes, proxy)))
}

#[test]
fn killed_agents_and_cut_connections_resume_to_an_identical_copy_sending_little_twice() -> Result<()>
{
    // Slowed on the receiver (each file waits 15 ms) so that a dozen faults land mid-copy.
    let slow: &[(&str, &str)] = &[("FERRY_FAULT_FILE_DELAY_MS", "15")];
    let Some((mut nodes, proxy)) = behind_proxy(&[("node-b", slow)])? else {
        return Ok(());
    };
    let src = nodes.root("node-a").join("src");
    let mut next = tree::xorshift(0x2545_f491_4f6c_dd1d);
    tree::write_varied_tree(&src, &mut next)?;
    // Counted first: listing a directory moves its atime, which the copy then keeps.
    let bytes = ferry_e2e::tree_bytes(&src)?;
    let before = tree::snapshot(&src)?;
    nodes.job("chaos", "  parallelism: {workersPerAgent: 2}\n")?;
    // Faults, each once the copy has moved on since the last one: the connection cut, the
    // sender's agent killed, the receiver's agent killed (each back after 300 ms).
    let mut faults = Vec::new();
    let mut last = 0;
    while faults.len() < 12 {
        let s = nodes.status("chaos")?;
        ensure!(
            s["phase"] != "Succeeded" && s["phase"] != "Failed",
            "the copy finished after only {} faults ({faults:?}): {s}",
            faults.len()
        );
        let moved = proxy.bytes().saturating_sub(last);
        if moved < (1 << 20) + next() % (3 << 20) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        last = proxy.bytes();
        let fault = ["cut", "sender", "receiver"][(next() % 3) as usize];
        match fault {
            "cut" => proxy.cut(),
            "sender" => nodes.kill_and_restart("node-a", Duration::from_millis(300))?,
            _ => nodes.kill_and_restart("node-b", Duration::from_millis(300))?,
        }
        faults.push(fault);
    }
    let s = nodes.succeeded("chaos", Duration::from_secs(300))?;
    let dst = nodes.root("node-b").join("chaos");
    tree::compare(&before, &dst, tree::Check::default())?;
    let left = tree::staging_leftovers(&dst)?;
    ensure!(left.is_empty(), "staging left: {left:?}");
    manifest_checks(&nodes, "chaos", &s)?;
    // What went over the wire, TLS and framing included, against the tree: what was in
    // flight at each fault is sent again, nothing that was committed.
    let ratio = proxy.bytes() as f64 / bytes as f64;
    eprintln!(
        "faults {faults:?}: {} bytes for a {bytes}-byte tree ({ratio:.3})",
        proxy.bytes()
    );
    ensure!(
        ratio <= 1.10,
        "{ratio:.3} of the tree's bytes sent over {faults:?}"
    );
    Ok(())
}

/// A disk image copied to node-b, then changed in two places on node-a and copied again
/// by checksum into the same destination (a nightly re-run): identical, listed in its
/// manifest, the file mended from node-b's copy with only the changed chunks crossing
/// the wire (TLS and all, counted by the proxy), and the job saying so.
#[test]
fn a_large_file_changed_in_a_few_places_is_mended_sending_only_its_changed_chunks() -> Result<()> {
    let Some((nodes, proxy)) = behind_proxy(&[])? else {
        return Ok(());
    };
    let src = nodes.root("node-a").join("src");
    std::fs::create_dir_all(&src)?;
    let image = src.join("disk.img");
    let size = 96u64 << 20;
    tree::write_pattern_file(&image, size)?;
    nodes.job("image", "  verify: Checksum\n")?;
    nodes.succeeded("image", Duration::from_secs(300))?;
    let first = proxy.bytes();
    ensure!(first >= size, "the first copy sent {first} bytes");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&image)?;
        f.write_all_at(b"a database page", 7 << 20)?;
        f.write_all_at(b"and a block", size - 11)?;
    }
    let before = tree::snapshot(&src)?;
    nodes.cp.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: image-again\n  namespace: {TEAM}\nspec:\n  source: {{root: vol-a, path: src}}\n  destination: {{root: vol-b, path: image}}\n  overwrite: IfChanged\n  compare: Checksum\n  verify: Checksum\n"
    ))?;
    let s = nodes.succeeded("image-again", Duration::from_secs(300))?;
    let again = proxy.bytes() - first;
    let dst = nodes.root("node-b").join("image");
    tree::compare(&before, &dst, tree::Check::default())?;
    manifest_checks(&nodes, "image", &s)?;
    ensure!(
        s["progress"]["patched"] == 1 && s["progress"]["filesDone"] == 1,
        "progress: {}",
        s["progress"]
    );
    let complete = s["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Complete"))
        .map(|c| c["message"].to_string())
        .unwrap_or_default();
    ensure!(
        complete.contains("1 of them mended from the destination's copy"),
        "{complete}"
    );
    // Two chunks of 64 KiB and the file's chunk hashes (16 bytes a chunk), plus the
    // listing and TLS: under 1% of the file.
    eprintln!(
        "first copy: {first} bytes on the wire; the re-run after two small changes: {again} ({:.3}%)",
        again as f64 * 100.0 / size as f64
    );
    ensure!(
        (again as f64) < 0.01 * size as f64,
        "the re-run sent {again} bytes of a {size}-byte file"
    );
    Ok(())
}

#[test]
fn a_bandwidth_limit_holds_and_bytes_changed_in_flight_are_caught() -> Result<()> {
    // node-a changes one byte of what it sends of `bad`, on every attempt (twice per
    // connection, more than the one resend a mismatch gets).
    let corrupt: &[(&str, &str)] = &[("FERRY_FAULT_CORRUPT_IN_FLIGHT", "bad#2")];
    let Some((nodes, proxy)) = behind_proxy(&[("node-a", corrupt)])? else {
        return Ok(());
    };
    let src = nodes.root("node-a").join("src");
    std::fs::create_dir_all(&src)?;
    for i in 0..5 {
        tree::write_pattern_file(&src.join(format!("big{i}")), 8 << 20)?;
    }
    tree::write_pattern_file(&src.join("bad"), 300_000)?;
    let bytes = ferry_e2e::tree_bytes(&src)?;
    nodes.job(
        "paced",
        "  verify: Checksum\n  transfer: {bandwidthLimit: 10Mi, compression: Zstd}\n",
    )?;
    let s = nodes.finished("paced", Duration::from_secs(120))?;
    // The file changed on the wire was caught, sent again, caught again: reported, not
    // committed; everything else is there and identical.
    let failures = s["failures"].to_string();
    ensure!(
        s["phase"] == "Failed" && failures.contains("ChecksumMismatch") && failures.contains("bad"),
        "{s}"
    );
    let dst = nodes.root("node-b").join("paced");
    ensure!(!dst.join("bad").exists(), "a corrupted file was committed");
    let resends = nodes.metric("node-b", "ferry_agent_network_resends_total", &[])?;
    ensure!(resends == 1.0, "resends {resends}");
    for i in 0..5 {
        let name = format!("big{i}");
        ensure!(
            std::fs::read(src.join(&name))? == std::fs::read(dst.join(&name))?,
            "{name} differs"
        );
    }
    // 10 MiB/s held within 10% (measured at the receiver's side of the wire, first byte to
    // last; zstd does not help a pattern that does not compress).
    let (first, last) = proxy.span().context("no bytes")?;
    let rate = bytes as f64 / (last - first).as_secs_f64();
    let limit = 10.0 * (1 << 20) as f64;
    eprintln!("{bytes} bytes at {:.2} MiB/s", rate / (1 << 20) as f64);
    ensure!(
        (0.9 * limit..=1.1 * limit).contains(&rate),
        "{:.2} MiB/s against a limit of 10 MiB/s",
        rate / (1 << 20) as f64
    );
    Ok(())
}

#[test]
fn only_the_paired_receiver_with_its_shards_ticket_is_served() -> Result<()> {
    // The copy is slowed on the receiver, so the shard is running while this test knocks.
    let slow: &[(&str, &str)] = &[("FERRY_FAULT_FILE_DELAY_MS", "200")];
    let Some(nodes) = Nodes::start(&[("node-b", slow)])? else {
        return Ok(());
    };
    let src = nodes.root("node-a").join("src");
    std::fs::create_dir_all(&src)?;
    for i in 0..40 {
        std::fs::write(src.join(format!("f{i}")), format!("file {i}"))?;
    }
    let one_worker = "  parallelism: {workersPerAgent: 1}\n";
    nodes.job("guarded", one_worker)?;
    nodes.job("other", one_worker)?;
    let (uid, other_uid) = (
        nodes.cp.get("copyjob/guarded", TEAM, "{.metadata.uid}")?,
        nodes.cp.get("copyjob/other", TEAM, "{.metadata.uid}")?,
    );
    let ticket_of = |uid: &str| -> Result<(u64, [u8; 32])> {
        let start = Instant::now();
        loop {
            let out = nodes.cp.kubectl(&[
                "get",
                "secret",
                &format!("ferry-ticket-{uid}"),
                "-n",
                certs::TICKETS,
                "-o",
                "jsonpath={.data.0}",
            ])?;
            if out.status.success() && !out.stdout.is_empty() {
                use base64::Engine as _;
                let json =
                    base64::engine::general_purpose::STANDARD.decode(out.stdout.trim_ascii())?;
                let t: Value = serde_json::from_slice(&json)?;
                let hex = t["ticket"].as_str().context("ticket")?;
                let mut b = [0u8; 32];
                for (i, o) in b.iter_mut().enumerate() {
                    *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
                }
                return Ok((t["epoch"].as_u64().context("epoch")?, b));
            }
            ensure!(
                start.elapsed() < Duration::from_secs(30),
                "no ticket for {uid}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let (epoch, ticket) = ticket_of(&uid)?;
    let (_, other_ticket) = ticket_of(&other_uid)?;
    let addr = nodes.advertised("node-a")?;
    let trust: Vec<String> = certs::bundle_of(&nodes.cp, 1)?.into_values().collect();
    let trust = trust.join("\n");
    let b = certs::issued(&nodes.cp, "test-b", "node-b")?;
    nodes.cp.add_node("node-c")?;
    let c = certs::issued(&nodes.cp, "test-c", "node-c")?;
    // Connections node-a served for the shard: the receiver's own, once it has dialled.
    let served = || -> Result<usize> {
        let log = std::fs::read_to_string(nodes.cp.dir().join("agent-node-a.log"))?;
        Ok(log
            .lines()
            .filter(|l| l.contains("serving a shard's source") && l.contains(&uid))
            .count())
    };
    // Every connection of the receiver: it opens two a shard (the agent's default
    // `FERRY_TRANSFER_STREAMS`), the second a moment after the first, and that one must
    // not be taken for a refused peer served.
    const STREAMS: usize = 2;
    let start = Instant::now();
    while served()? < STREAMS {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "node-b dialled {} of its {STREAMS} streams",
            served()?
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = served()?;

    // Without a certificate: the handshake fails; nothing is answered.
    {
        use rustls::pki_types::pem::PemObject;
        let mut store = rustls::RootCertStore::empty();
        for der in rustls::pki_types::CertificateDer::pem_slice_iter(trust.as_bytes()) {
            store.add(der?)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(store)
        .with_no_client_auth();
        let tcp = TcpStream::connect(&addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let conn = rustls::ClientConnection::new(Arc::new(config), ferry_link::server_name())?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let hello = ferry_transfer::frame::Frame::Hello {
            version: ferry_transfer::frame::VERSION,
            job: uid.as_bytes().to_vec(),
            shard: 0,
            epoch,
            ticket,
        };
        let sent = ferry_transfer::stream::write_frame(&mut tls, &hello, &mut Vec::new())
            .and_then(|()| tls.flush());
        let answer = sent.and_then(|()| {
            ferry_transfer::stream::read_frame(&mut tls, &mut Vec::new())
                .map_err(std::io::Error::other)
        });
        ensure!(
            answer.is_err(),
            "a client without a certificate got {answer:?}"
        );
    }
    // A certificate from another CA, for the right node, with the right ticket.
    let other_ca = ferry_link::Ca::generate("not this install")?;
    let key = ferry_link::NodeKey::generate("node-b")?;
    let forged = certs::NodeIdentity {
        cert_pem: other_ca.sign_node(&key.csr_pem, "node-b", Duration::from_secs(3600))?,
        key_pem: key.key_pem,
    };
    let r = certs::hello_for(&addr, &forged, &trust, "node-a", (&uid, 0, epoch, ticket));
    ensure!(r.is_err(), "another CA's certificate got {r:?}");
    // This install's certificates, with a ticket or a pairing that is not this shard's.
    for (who, hello, says) in [
        (
            &b,
            (uid.as_str(), 0, epoch, other_ticket),
            "the ticket is not shard 0's",
        ),
        (&b, (uid.as_str(), 0, epoch + 1, ticket), "is at epoch"),
        (&b, (uid.as_str(), 1, epoch, ticket), "no entry for shard 1"),
        (
            &c,
            (uid.as_str(), 0, epoch, ticket),
            "not node node-c's to receive",
        ),
    ] {
        let reason = certs::hello_for(&addr, who, &trust, "node-a", hello)?;
        ensure!(reason.contains(says), "{hello:?}: {reason}");
    }
    ensure!(served()? == before, "a refused peer was served");
    // The paired receiver goes on undisturbed.
    let s = nodes.succeeded("guarded", Duration::from_secs(120))?;
    ensure!(s["mode"] == "Network");
    ferry_e2e::assert_same_contents(&src, &nodes.root("node-b").join("guarded"))?;
    Ok(())
}

/// A new operator leader makes a new CA and adds it to the trust bundle; an agent that
/// starts after that holds a certificate of the new CA at once, while an agent that read
/// the bundle before does not trust it yet. Its failed handshake makes it read the bundle
/// again within seconds (not at its next turn, minutes later), so a copy between the two
/// goes through while the receiver is still dialling.
#[test]
fn an_agent_that_read_the_bundle_before_a_new_leaders_ca_trusts_it_after_one_failed_handshake(
) -> Result<()> {
    let Some(mut nodes) = Nodes::start(&[])? else {
        return Ok(());
    };
    // Both agents have certificates of the first CA and have read the bundle (their
    // transfer ports are advertised only after).
    nodes.advertised("node-a")?;
    nodes.advertised("node-b")?;
    certs::bundle_of(&nodes.cp, 1)?;
    if let Some(mut b) = nodes.agents.remove("node-b") {
        b.kill()?;
    }
    // The new CA's key is its second: not the first's.
    std::thread::sleep(Duration::from_millis(1100));
    nodes._operator.kill()?;
    let kc = nodes
        .cp
        .service_account_kubeconfig(certs::NS, "ferry-operator", None)?;
    nodes._operator = certs::start_operator(&nodes.cp, &kc)?;
    certs::bundle_of(&nodes.cp, 2)?;
    // node-b starts again: a new key, a certificate of the new CA, both CAs trusted.
    let log = nodes.cp.dir().join("agent-node-b.log");
    let _ = std::fs::remove_file(&log);
    nodes.start_agent("node-b")?;
    ferry_e2e::wait_for(
        "node-b's certificate from the new leader",
        Duration::from_secs(60),
        || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("transfer certificate issued")),
    )?;
    let src = nodes.root("node-a").join("src");
    std::fs::create_dir_all(&src)?;
    tree::write_pattern_file(&src.join("data"), 3 << 20)?;
    nodes.job("after-failover", "")?;
    let s = nodes.succeeded("after-failover", Duration::from_secs(90))?;
    ensure!(s["mode"] == "Network", "mode {}", s["mode"]);
    assert_same_file(
        &src.join("data"),
        &nodes.root("node-b").join("after-failover/data"),
    )
}

fn assert_same_file(a: &Path, b: &Path) -> Result<()> {
    ensure!(
        std::fs::read(a)? == std::fs::read(b)?,
        "{} and {} differ",
        a.display(),
        b.display()
    );
    Ok(())
}
