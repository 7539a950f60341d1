//! Chaos: a few thousand files copied between shared roots by two agents under two
//! operator replicas, while agents, the leading operator or both are SIGKILLed at random
//! moments, at least 20 times, and restarted at random delays (some long enough for the
//! agent's work to move to the other node). Then the copy must equal the source byte for
//! byte, with no staging names left, a manifest that lists every file once, and the bytes
//! the agents wrote in all (read from the kernel's per-process I/O accounting, so nothing
//! a killed process did is missed) must show that finished files were not copied again.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ferry_e2e::{assert_same_tree, staging_leftovers, BindMount, ControlPlane, Proc, PACED};

const NODES: [&str; 2] = ["node-a", "node-b"];
const FILES: usize = 3000;
const KILLS: usize = 24;

/// xorshift64*: reproducible from the seed the test prints.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// Bytes a process has written (`wchar` in /proc/<pid>/io: write(2), copy_file_range and
/// the like, on any file).
fn written(pid: u32) -> Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .context("no wchar in /proc/<pid>/io")?
        .trim()
        .parse()
        .context("wchar")
}

/// Stop the process, take its write count, then kill it: the count is final.
fn kill_counted(p: &mut Proc) -> Result<u64> {
    p.signal("STOP")?;
    let n = written(p.id())?;
    p.kill()?;
    Ok(n)
}

/// What is running, and what the dead incarnations wrote.
struct Cluster<'a> {
    cp: &'a ControlPlane,
    agents: Vec<Option<Proc>>,
    /// When a killed agent comes back.
    agent_back: Vec<Option<Instant>>,
    operators: Vec<Option<Proc>>,
    operator_back: Vec<Option<Instant>>,
    written: u64,
}

const AGENT_ENV: [(&str, &str); 3] = [
    ("FERRY_LEASE_SECONDS", "3"),
    ("FERRY_FAULT_FILE_DELAY_MS", "15"),
    PACED,
];

impl Cluster<'_> {
    fn operator(&self, i: usize) -> Result<Proc> {
        let name = format!("op-{i}");
        self.cp
            .spawn_operator(&format!("operator-{i}"), &[("POD_NAME", name.as_str())])
    }

    /// Restart what is due.
    fn revive(&mut self) -> Result<()> {
        let now = Instant::now();
        for (i, node) in NODES.iter().enumerate() {
            if self.agent_back[i].is_some_and(|t| t <= now) {
                self.agents[i] = Some(self.cp.spawn_agent(node, &AGENT_ENV)?);
                self.agent_back[i] = None;
            }
        }
        for i in 0..self.operators.len() {
            if self.operator_back[i].is_some_and(|t| t <= now) {
                self.operators[i] = Some(self.operator(i)?);
                self.operator_back[i] = None;
            }
        }
        Ok(())
    }

    fn kill_agent(&mut self, i: usize, down: Duration) -> Result<bool> {
        let Some(mut p) = self.agents[i].take() else {
            return Ok(false);
        };
        self.written += kill_counted(&mut p)?;
        self.agent_back[i] = Some(Instant::now() + down);
        Ok(true)
    }

    /// Kill the replica holding the leader Lease (or any live one if none holds it).
    fn kill_leader(&mut self, down: Duration) -> Result<bool> {
        let holder = self.cp.get(
            "lease/ferry-operator",
            "ferry-system",
            "{.spec.holderIdentity}",
        )?;
        // A leader that is already down (its lease not yet taken) is not killed again,
        // nor is its standby in its place: that one is about to take over.
        let i = match holder
            .strip_prefix("op-")
            .and_then(|i| i.parse::<usize>().ok())
        {
            Some(i) => i,
            None => match self.operators.iter().position(Option::is_some) {
                Some(i) => i,
                None => return Ok(false),
            },
        };
        if self.operators.get(i).is_none_or(Option::is_none) {
            return Ok(false);
        }
        if let Some(mut p) = self.operators[i].take() {
            p.kill()?;
        }
        self.operator_back[i] = Some(Instant::now() + down);
        Ok(true)
    }
}

#[test]
fn random_sigkills_of_agents_and_operators_lose_nothing_and_recopy_nothing() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    cp.kubectl_ok(&["create", "namespace", "ferry-system"])?;
    let hosts = cp.dir().join("hosts");
    for node in NODES {
        cp.add_node(node)?;
    }
    let shared = cp.dir().join("nfs");
    let src = shared.join("src");
    let seed = std::env::var("FERRY_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    println!("chaos seed {seed} (FERRY_CHAOS_SEED={seed} replays the tree and the kill times)");
    let mut rng = Rng(seed);
    // A few thousand files of 1 B to 32 KiB in nested directories.
    for i in 0..FILES {
        let dir = src.join(format!("d{}/e{}", i % 12, i % 5));
        std::fs::create_dir_all(&dir)?;
        let size = 1 + rng.below(32 * 1024) as usize;
        let body: Vec<u8> = (0..size)
            .map(|b| (b as u64 ^ seed ^ i as u64) as u8)
            .collect();
        std::fs::write(dir.join(format!("f{i}")), body)?;
    }
    let bytes = ferry_e2e::tree_bytes(&src)?;
    let _mounts = NODES
        .iter()
        .map(|n| BindMount::new(&shared, &hosts.join(n).join("srv/shared")))
        .collect::<Result<Vec<_>>>()?;
    let mut cluster = Cluster {
        cp: &cp,
        agents: Vec::new(),
        agent_back: vec![None; NODES.len()],
        operators: Vec::new(),
        operator_back: vec![None; 2],
        written: 0,
    };
    for i in 0..2 {
        cluster.operators.push(Some(cluster.operator(i)?));
    }
    for node in NODES {
        cluster.agents.push(Some(cp.spawn_agent(node, &AGENT_ENV)?));
    }
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: nfs\nspec:\n  path: /srv/shared\n  shared: true\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: chaos\n  namespace: default\nspec:\n  source: {root: nfs, path: src}\n  destination: {root: nfs, path: copy}\n  verify: Checksum\n  parallelism: {maxAgents: 2, workersPerAgent: 2}\n")?;
    cp.wait_until(
        "copyjob/chaos",
        "default",
        "{.status.progress.filesDone}",
        Duration::from_secs(60),
        |v| v.parse::<u64>().unwrap_or(0) > 0,
    )?;
    let mut kills = Vec::new();
    let mut took_over = false;
    let started = Instant::now();
    while kills.len() < KILLS {
        std::thread::sleep(Duration::from_millis(150 + rng.below(700)));
        cluster.revive()?;
        let phase = cp.get("copyjob/chaos", "default", "{.status.phase}")?;
        ensure!(
            phase != "Failed",
            "the job failed: {}",
            cp.get("copyjob/chaos", "default", "{.status}")?
        );
        if phase == "Succeeded" {
            break;
        }
        // Mostly short outages (the agent resumes its own shard); a few longer than the
        // 3 s lease (its shared work moves to the other agent at a new epoch); now and
        // then the leader stays down until the other replica takes over.
        let down = Duration::from_millis(match rng.below(10) {
            0..=5 => rng.below(1000),
            6..=8 => 3500 + rng.below(1500),
            _ => 18_000,
        });
        // Once, for certain: the leader goes mid-copy and stays away past its 15 s lease,
        // so the other replica must take over and go on.
        let both_up = cluster.operators.iter().all(Option::is_some);
        if kills.len() >= 3 && !took_over && both_up {
            took_over = cluster.kill_leader(Duration::from_secs(20))?;
            println!(
                "{:>6.1}s kill operator, down 20.0s (the standby must take over)",
                started.elapsed().as_secs_f64()
            );
            kills.push("operator (standby takes over)".to_string());
            continue;
        }
        let what = match rng.below(4) {
            0 | 1 => {
                let i = rng.below(NODES.len() as u64) as usize;
                cluster
                    .kill_agent(i, down)?
                    .then(|| format!("agent {}", NODES[i]))
            }
            2 => cluster.kill_leader(down)?.then(|| "operator".to_string()),
            _ => {
                let i = rng.below(NODES.len() as u64) as usize;
                let a = cluster.kill_agent(i, down)?;
                let o = cluster.kill_leader(down)?;
                (a || o).then(|| format!("agent {} and operator", NODES[i]))
            }
        };
        if let Some(what) = what {
            let files = cp.get("copyjob/chaos", "default", "{.status.progress.filesDone}")?;
            println!(
                "{:>6.1}s kill {what}, down {:.1}s (filesDone {files})",
                started.elapsed().as_secs_f64(),
                down.as_secs_f64()
            );
            kills.push(what);
        }
    }
    // Everything comes back, and the job must finish.
    for t in cluster
        .agent_back
        .iter_mut()
        .chain(&mut cluster.operator_back)
    {
        if t.is_some() {
            *t = Some(Instant::now());
        }
    }
    cluster.revive()?;
    ensure!(
        kills.len() >= 20,
        "only {} kills happened before the copy finished; slow it down",
        kills.len()
    );
    ensure!(took_over, "the leader was never killed with its standby up");
    cp.wait_succeeded("default", "chaos", 300)?;
    for p in cluster.agents.iter_mut().flatten() {
        cluster.written += written(p.id())?;
    }
    let copy = shared.join("copy");
    assert_same_tree(&src, &copy)?;
    let left = staging_leftovers(&copy)?;
    ensure!(left.is_empty(), "staging names left: {left:?}");
    // The joined manifest lists each file once, and xxh128sum agrees with it.
    let manifest = cp.get("copyjob/chaos", "default", "{.status.manifest}")?;
    let text = std::fs::read_to_string(shared.join(&manifest))?;
    let mut names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once("  ").map(|x| x.1))
        .collect();
    names.sort_unstable();
    let lines = names.len();
    names.dedup();
    ensure!(
        lines == FILES && names.len() == FILES,
        "the manifest has {lines} lines for {} names; {FILES} files were copied",
        names.len()
    );
    // Its paths are relative to the copy.
    let check = std::process::Command::new("xxh128sum")
        .args(["-c", "--quiet"])
        .arg(shared.join(&manifest))
        .current_dir(&copy)
        .output()?;
    ensure!(
        check.status.success(),
        "xxh128sum -c failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout)
            .lines()
            .take(10)
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&check.stderr)
    );
    let files_done = cp.get("copyjob/chaos", "default", "{.status.progress.filesDone}")?;
    ensure!(
        files_done == FILES.to_string(),
        "filesDone is {files_done}, not {FILES}"
    );
    let transitions = cp.get(
        "lease/ferry-operator",
        "ferry-system",
        "{.spec.leaseTransitions}",
    )?;
    ensure!(
        transitions.parse::<u32>().unwrap_or(0) >= 1,
        "the leader Lease never changed hands ({transitions:?})"
    );
    // No double assignment: each shard ran at each epoch on one node only (a new epoch
    // on another node is a takeover, which is the point).
    let mut ran: std::collections::BTreeMap<(String, String), std::collections::BTreeSet<&str>> =
        Default::default();
    let logs: Vec<(&str, String)> = NODES
        .iter()
        .map(|n| {
            Ok((
                *n,
                std::fs::read_to_string(cp.dir().join(format!("agent-{n}.log")))?,
            ))
        })
        .collect::<Result<_>>()?;
    for (node, log) in &logs {
        for line in log.lines().filter(|l| l.contains("starting shard")) {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{name}=")))
                    .unwrap_or_default()
                    .to_string()
            };
            ran.entry((field("shard"), field("epoch")))
                .or_default()
                .insert(node);
        }
    }
    let doubled: Vec<_> = ran.iter().filter(|(_, nodes)| nodes.len() > 1).collect();
    ensure!(
        !ran.is_empty() && doubled.is_empty(),
        "shards run at the same epoch on two nodes: {doubled:?}"
    );
    println!(
        "{} (shard, epoch) runs, the highest epoch {}",
        ran.len(),
        ran.keys()
            .filter_map(|(_, e)| e.parse::<u32>().ok())
            .max()
            .unwrap_or(0)
    );
    // Bytes written by every agent process, over the tree's bytes. The manifest, logs and
    // API traffic add a little; recopied files would add their whole size.
    let ratio = cluster.written as f64 / bytes as f64;
    println!(
        "{} kills ({} agent, {} operator); agents wrote {} bytes for a {bytes}-byte tree: ratio {ratio:.3}",
        kills.len(),
        kills.iter().filter(|k| k.contains("agent")).count(),
        kills.iter().filter(|k| k.contains("operator")).count(),
        cluster.written
    );
    ensure!(
        ratio < 1.10,
        "the agents wrote {ratio:.3}x the tree: finished files were copied again"
    );
    Ok(())
}
