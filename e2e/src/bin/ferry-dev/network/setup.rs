//! The benchmark's cluster ([`Net::start`]): the control plane with the chart's manifests
//! (its RBAC and policies), the operator and node-a's and node-b's agents as the chart runs
//! them (`ferry_e2e`'s `spawn_chart_operator`, `spawn_chart_agent`: ServiceAccount tokens,
//! the tickets namespace) with transfer ports on 127.0.0.2 and 127.0.0.3, each node's `/srv/vol` on a tmpfs,
//! the StorageRoots, and an rsync daemon serving node-a's trees, each node's processes on
//! its own CPU unless `NET_CPUS=shared` (`cpus`); and the CPU its processes use.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use ferry_e2e::{workspace_bin, ControlPlane, Proc};

use super::cpus::Cpus;
use super::{Net, NODES, TEAM, TMPFS_A, TMPFS_B};
use crate::machine::{cpu_secs, pids_mentioning, Tmpfs};
use crate::throughput::{ftzz, release_builds};

impl Net {
    pub(super) fn start() -> Result<Self> {
        release_builds();
        let cpus = Cpus::from_env()?;
        let ftzz = ftzz()?;
        let ferry = workspace_bin("ferry-agent", "ferry-agent")?;
        eprintln!("starting etcd and kube-apiserver, installing deploy/ferry.yaml ...");
        let cp = ControlPlane::start_required()?;
        let mut roots = Vec::new();
        for (node, _) in NODES {
            roots.push(cp.add_node(node)?.join("srv/vol"));
        }
        // The chart's manifests, with its admission policies in force.
        cp.install_chart(NODES[0].0)?;
        let (a, b) = (roots[0].clone(), roots[1].clone());
        let tmpfs_a = Tmpfs::mount(&a, TMPFS_A)?;
        let tmpfs_b = Tmpfs::mount(&b, TMPFS_B)?;
        for dir in [a.join("src"), a.join("local")] {
            std::fs::create_dir_all(dir)?;
        }
        eprintln!("building and starting the operator and the agents (release) ...");
        // As the chart runs them: on their ServiceAccounts' tokens (each agent's bound to its
        // Node), told the tickets namespace.
        let operator = cp.spawn_chart_operator()?;
        cp.kubectl_ok(&["create", "namespace", TEAM])?;
        for (root, node) in [("vol-a", "node-a"), ("vol-b", "node-b")] {
            cp.apply(&format!(
                "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {root}\nspec:\n  path: /srv/vol\n  nodeSelector: {{ferry.dev/node: {node}}}\n  namespaces: {{names: [{TEAM}]}}\n"
            ))?;
        }
        let mut agents = Vec::new();
        for (i, (node, ip)) in NODES.into_iter().enumerate() {
            let agent = cp.spawn_chart_agent(node, ip, &[])?;
            cpus.place(i, agent.id())?;
            agents.push(agent);
        }
        // Paired only once both advertise their transfer ports (after their certificates).
        for (node, _) in NODES {
            cp.advertised_transfer_address(node, ferry_e2e::ADVERTISED_WITHIN)?;
        }
        let (rsyncd, rsync_port) = rsync_daemon(&cp, &a.join("src"), NODES[0].1)?;
        // On node-a's CPU, with the connections it forks.
        cpus.place(0, rsyncd.id())?;
        let tar_port = ferry_e2e::free_port()?;
        let agent_pids: Vec<u32> = agents.iter().map(Proc::id).collect();
        let mut cluster_pids = pids_mentioning(&cp.dir().to_string_lossy());
        cluster_pids.retain(|p| !agent_pids.contains(p) && *p != std::process::id());
        cluster_pids.push(operator.id());
        cluster_pids.sort_unstable();
        cluster_pids.dedup();
        Ok(Self {
            agents,
            _operator: operator,
            _rsyncd: rsyncd,
            _tmpfs_b: tmpfs_b,
            _tmpfs_a: tmpfs_a,
            cp,
            a,
            b,
            ferry,
            ftzz,
            rsync_port,
            tar_port,
            cluster_pids,
            cpus,
        })
    }

    pub(super) fn agent_pids(&self) -> [u32; 2] {
        [self.agents[0].id(), self.agents[1].id()]
    }

    /// CPU seconds of everything this benchmark runs (itself and its waited-for children,
    /// the cluster, the agents, the rsync daemon and the connections it served), to tell the
    /// rest of the machine's load apart.
    pub(super) fn harness_cpu(&self) -> f64 {
        cpu_secs(std::process::id(), true)
            + self
                .cluster_pids
                .iter()
                .chain(&self.agent_pids())
                .map(|p| cpu_secs(*p, true))
                .sum::<f64>()
    }
}

/// An rsync daemon on `address` serving `dir` read-only as module `src` (what the rsync-based
/// movers run against), once it answers; it and its port. `make bench-network`'s and
/// `make bench-clusters`' peer.
pub(crate) fn rsync_daemon(cp: &ControlPlane, dir: &Path, address: &str) -> Result<(Proc, u16)> {
    let port = ferry_e2e::free_port()?;
    let conf = cp.dir().join("rsyncd.conf");
    std::fs::write(
        &conf,
        format!(
            "use chroot = no\nlog file = {}\n[src]\n    path = {}\n    read only = yes\n    uid = root\n    gid = root\n",
            cp.dir().join("rsyncd.log").display(),
            dir.display()
        ),
    )?;
    let rsyncd = cp.spawn(
        Path::new("rsync"),
        &[
            "--daemon",
            "--no-detach",
            &format!("--config={}", conf.display()),
            &format!("--address={address}"),
            &format!("--port={port}"),
        ],
        &[],
        "rsyncd.out",
    )?;
    ferry_e2e::wait_for("the rsync daemon", Duration::from_secs(10), || {
        std::net::TcpStream::connect((address, port)).is_ok()
    })?;
    Ok((rsyncd, port))
}
