//! Two nodes simulated honestly on one machine: each node's processes on a CPU of their own
//! (`NET_CPUS=split`, the default on a machine with two or more CPUs), so that the sender
//! and the receiver of a copy between nodes no longer take CPU from each other, as two real
//! nodes would not. node-a (the sender: its agent, the rsync daemon and the connections it
//! forks, `tar c` and its `socat`, and every copy on one node) runs on CPU 0; node-b (the
//! receiver: its agent, the rsync client, the listening `socat` and `tar x`) on CPU 1. The
//! control plane (etcd, kube-apiserver, the operator) and the harness are not placed: they
//! run on either CPU, as a control plane runs on other machines than the nodes.
//!
//! A node is a cgroup v1 cpuset (`/sys/fs/cgroup/cpuset/ferry-bench-<node>`, `cpuset.cpus`
//! its CPU): a process moved there takes all its threads along, and whatever it forks or
//! spawns later stays there. Where no cpuset can be made (cgroup v2, no cpuset controller),
//! the node's processes get a CPU affinity instead (`taskset`), which threads and children
//! inherit as well. `NET_CPUS=shared` leaves every process on every CPU (the table this
//! benchmark measured before).

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

/// Where v1 cpusets are made.
const CPUSET_ROOT: &str = "/sys/fs/cgroup/cpuset";

/// How the benchmark's processes share the machine's CPUs.
pub(crate) enum Cpus {
    /// Every process on every CPU.
    Shared,
    /// node-a's processes on one CPU, node-b's on another.
    Split([Node; 2]),
}

/// One simulated node's CPU.
pub(crate) struct Node {
    cpu: usize,
    /// The node's cpuset, or `None` where its processes are pinned by affinity.
    cpuset: Option<PathBuf>,
}

impl Cpus {
    /// From `NET_CPUS` (`split`, `shared`; default `split` with two or more CPUs).
    pub(crate) fn from_env() -> Result<Self> {
        let nproc = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let split = match std::env::var("NET_CPUS").as_deref() {
            Ok("shared") => false,
            Ok("split") => {
                ensure!(
                    nproc >= 2,
                    "NET_CPUS=split needs two CPUs, this machine has {nproc}"
                );
                true
            }
            Ok("") | Err(_) => nproc >= 2,
            Ok(other) => bail!("NET_CPUS must be split or shared, not {other:?}"),
        };
        if !split {
            return Ok(Self::Shared);
        }
        Ok(Self::Split([
            Node::make("node-a", 0)?,
            Node::make("node-b", 1)?,
        ]))
    }

    /// Move the running process `pid` (all its threads) onto `node`'s CPU (0: node-a).
    pub(crate) fn place(&self, node: usize, pid: u32) -> Result<()> {
        match self {
            Self::Shared => Ok(()),
            Self::Split(nodes) => nodes[node].place(pid),
        }
    }

    /// `script` (bash), prefixed so that it runs on `node`'s CPU with everything it starts.
    pub(crate) fn enter(&self, node: usize, script: &str) -> String {
        match self {
            Self::Shared => script.to_string(),
            Self::Split(nodes) => format!("{} {script}", nodes[node].prefix()),
        }
    }

    /// A command that runs `program` on `node`'s CPU (arguments are added to it as usual).
    pub(crate) fn command(&self, node: usize, program: impl AsRef<OsStr>) -> Command {
        match self {
            Self::Shared => Command::new(program),
            Self::Split(nodes) => {
                let mut c = Command::new("bash");
                c.arg("-c")
                    .arg(format!("{} exec \"$@\"", nodes[node].prefix()))
                    .arg("bash")
                    .arg(program);
                c
            }
        }
    }

    /// How the processes were placed, for the report.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Shared => "**shared CPUs**: every process (both agents, every peer's processes on both sides, the control plane) ran on any of the machine's CPUs, so a copy's sender and receiver took CPU from each other".into(),
            Self::Split(nodes) => {
                let how = match nodes[0].cpuset {
                    Some(_) => format!("each node a cgroup v1 cpuset of one CPU (`{CPUSET_ROOT}/ferry-bench-node-a` with `cpuset.cpus` {}, `ferry-bench-node-b` with {}): a process moved there takes its threads along, and what it starts stays there", nodes[0].cpu, nodes[1].cpu),
                    None => format!("no cpuset could be made, so each node's processes were pinned by CPU affinity (`taskset`; inherited by threads and children): node-a CPU {}, node-b CPU {}", nodes[0].cpu, nodes[1].cpu),
                };
                format!("**one CPU per node** (`NET_CPUS=split`): {how}. node-a's CPU runs its agent, the rsync daemon and the connections it forks, `tar c` with its `socat`, and every copy on one node (the local CopyJob, the CLI); node-b's runs its agent, the rsync client, the listening `socat` with `tar x`. The control plane (etcd, kube-apiserver, the operator) and the harness are not placed: they run on either CPU, as a control plane runs on other machines than the nodes")
            }
        }
    }
}

impl Node {
    fn make(node: &str, cpu: usize) -> Result<Self> {
        let dir = PathBuf::from(CPUSET_ROOT).join(format!("ferry-bench-{node}"));
        let made = (|| -> Result<()> {
            ensure!(
                PathBuf::from(CPUSET_ROOT).join("cpuset.cpus").exists(),
                "no cgroup v1 cpuset controller at {CPUSET_ROOT}"
            );
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(e).with_context(|| format!("mkdir {}", dir.display()))
                }
                _ => {}
            }
            // The memory nodes first: a cpuset without them takes no task.
            let mems = std::fs::read_to_string(PathBuf::from(CPUSET_ROOT).join("cpuset.mems"))?;
            std::fs::write(dir.join("cpuset.mems"), mems.trim())?;
            std::fs::write(dir.join("cpuset.cpus"), cpu.to_string())?;
            Ok(())
        })();
        let cpuset = match made {
            Ok(()) => Some(dir),
            Err(e) => {
                eprintln!("no cpuset for {node} ({e:#}): pinning its processes by CPU affinity");
                None
            }
        };
        Ok(Self { cpu, cpuset })
    }

    fn place(&self, pid: u32) -> Result<()> {
        match &self.cpuset {
            Some(dir) => std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("move process {pid} into {}", dir.display())),
            None => {
                let out = Command::new("taskset")
                    .args(["-a", "-p", "-c", &self.cpu.to_string(), &pid.to_string()])
                    .output()
                    .context("run taskset")?;
                ensure!(
                    out.status.success(),
                    "taskset -a -p -c {} {pid}: {}",
                    self.cpu,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                Ok(())
            }
        }
    }

    /// A bash prefix that puts the shell running it (and so what it runs) on this CPU.
    fn prefix(&self) -> String {
        match &self.cpuset {
            Some(dir) => format!("echo $BASHPID > {}/cgroup.procs &&", dir.display()),
            None => format!("taskset -p -c {} $BASHPID >/dev/null &&", self.cpu),
        }
    }
}

impl Drop for Node {
    /// The cpuset is removed once its processes are gone (the benchmark's cluster drops
    /// before it); one still in use stays, harmless, until the next run makes it again.
    fn drop(&mut self) {
        if let Some(dir) = &self.cpuset {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
