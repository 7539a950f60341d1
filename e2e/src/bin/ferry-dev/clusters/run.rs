//! One timed run of a tool: the page cache dropped and the counters zeroed (untimed), then a
//! CopyJob applied and waited for (its status checked and the job deleted after), or an
//! rsync client run to its end; the wire and the peaks read after.

use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use ferry_e2e::ControlPlane;
use serde_json::Value;

use super::measure::Peaks;
use super::{
    Clusters, Phase, Sample, Tool, EAST_A, EAST_B, EXPORT_SECRET, JOB_TIMEOUT, READER, TEAM,
};

impl Clusters {
    /// One run of `tool` on `tree` in `phase` (round `round`), timed and measured.
    pub(super) fn run(&self, tool: Tool, tree: &str, phase: Phase, round: usize) -> Result<Sample> {
        if let Err(e) = crate::machine::drop_caches("1") {
            eprintln!("could not drop the page cache before a run: {e:#}");
        }
        let [east_a, east_b, west_a] = self.agent_pids();
        let (port, sides) = match tool {
            Tool::Clusters => (self.peering_port, [vec![east_a], vec![west_a]]),
            Tool::Nodes => (self.transfer_port, [vec![east_a], vec![east_b]]),
            Tool::RsyncDaemon => (self.rsync_port, [vec![self.server_pids[0]], vec![]]),
            Tool::RsyncSsh => (self.ssh_port, [vec![self.server_pids[1]], vec![]]),
        };
        self.wire.zero()?;
        let peaks = Peaks::start(sides)?;
        let start = Instant::now();
        let progress = match tool {
            Tool::Clusters | Tool::Nodes => Some(self.job(tool, tree, phase, round)?),
            Tool::RsyncDaemon | Tool::RsyncSsh => {
                self.rsync(tool, tree, &peaks)?;
                None
            }
        };
        let secs = start.elapsed().as_secs_f64();
        let rss_kib = peaks.finish();
        let wire = self.wire.bytes(port)?;
        let progress = match progress {
            Some((cp, ns, name)) => Some(self.finish_job(cp, ns, &name, tool)?),
            None => None,
        };
        Ok(Sample {
            secs,
            wire,
            rss_kib,
            progress,
        })
    }

    /// Apply `tool`'s CopyJob and wait until it has Succeeded: its cluster, namespace, name.
    fn job(
        &self,
        tool: Tool,
        tree: &str,
        phase: Phase,
        round: usize,
    ) -> Result<(&ControlPlane, &'static str, String)> {
        let phase_slug = if phase == Phase::First {
            "first"
        } else {
            "again"
        };
        let name = format!("{}-{tree}-{phase_slug}-{round}", tool.slug());
        let dst = format!("{}-{tree}", tool.slug());
        // Again: only what changed. A file changed in a few places is found and mended by
        // checksum (`large`); the many small files by size and time, as a nightly re-run.
        let again = match (phase, tree) {
            (Phase::First, _) => "",
            (Phase::Again, "large") => "  overwrite: IfChanged\n  compare: Checksum\n",
            (Phase::Again, _) => "  overwrite: IfChanged\n",
        };
        let (cp, ns, source, root) = match tool {
            Tool::Clusters => (
                &self.west,
                READER,
                format!("{{export: {EXPORT_SECRET}, path: {tree}}}"),
                "vol",
            ),
            _ => (
                &self.east,
                TEAM,
                format!("{{root: vol-a, path: src/{tree}}}"),
                "vol-b",
            ),
        };
        cp.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  source: {source}\n  destination: {{root: {root}, path: {dst}}}\n{again}"
        ))?;
        cp.wait_succeeded(ns, &name, JOB_TIMEOUT).with_context(|| {
            format!(
                "{}\n{}",
                cp.log_tail("operator.log", 10),
                cp.log_tail(
                    &format!(
                        "agent-{}.log",
                        if tool == Tool::Clusters {
                            super::WEST_A.0
                        } else {
                            EAST_B.0
                        }
                    ),
                    10
                )
            )
        })?;
        Ok((cp, ns, name))
    }

    /// A Succeeded job's status says it ran as it should (verify Checksum; between nodes,
    /// from east-a to east-b); its progress. Its manifest is removed and the job deleted.
    fn finish_job(&self, cp: &ControlPlane, ns: &str, name: &str, tool: Tool) -> Result<Value> {
        let job: Value = serde_json::from_str(
            &cp.kubectl_ok(&["get", "copyjob", name, "-n", ns, "-o", "json"])?,
        )?;
        let (spec, status) = (&job["spec"], &job["status"]);
        ensure!(
            spec["verify"] == "Checksum",
            "{name}: verify {}",
            spec["verify"]
        );
        if tool == Tool::Nodes {
            let shard = &status["shards"][0];
            ensure!(
                status["mode"] == "Network"
                    && shard["sender"] == EAST_A.0
                    && shard["node"] == EAST_B.0,
                "{name}: not a copy from east-a to east-b: mode {}, shard {shard}",
                status["mode"]
            );
        }
        if let Some(m) = status["manifest"].as_str() {
            let root = if tool == Tool::Nodes {
                &self.east_b
            } else {
                &self.west_a
            };
            let _ = std::fs::remove_file(root.join(m));
        }
        cp.kubectl_ok(&[
            "delete",
            "copyjob",
            name,
            "-n",
            ns,
            "--wait=true",
            "--timeout=120s",
        ])?;
        Ok(status["progress"].clone())
    }

    /// `rsync -a` of `tree` into `tool`'s destination on west-a, from the daemon or over
    /// ssh, on the receiving side's CPU; the client joins the receiving side's peaks.
    fn rsync(&self, tool: Tool, tree: &str, peaks: &Peaks) -> Result<()> {
        let dst = format!("{}/", self.destination(tool, tree).display());
        let mut c: Command = self.cpus.command(1, "rsync");
        c.arg("-a");
        if tool == Tool::RsyncDaemon {
            c.arg(format!(
                "rsync://{}:{}/src/{tree}/",
                EAST_A.1, self.rsync_port
            ));
        } else {
            c.arg("-e").arg(format!(
                "ssh -F /dev/null -p {} -i {} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                self.ssh_port,
                self.ssh_key.display()
            ));
            c.arg(format!(
                "root@{}:{}/",
                EAST_A.1,
                self.east_a.join("src").join(tree).display()
            ));
        }
        c.arg(&dst)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let child = c.spawn().context("run rsync")?;
        peaks.add(1, child.id());
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "{} failed: {}",
            tool.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}
