//! `ferry-dev bench-patch` (`make bench-patch`): the users' case that hurts most on a
//! re-run (volsync#1028: 13 minutes to re-sync a 27.85 GB file with 5 bytes changed), on
//! [`Net`]'s two nodes (release builds, each node's `/srv/vol` a tmpfs): one large file (a
//! VM disk image or a database file, 1 GiB of incompressible bytes by default) copied from
//! node-a to node-b, then, each round, 16 bytes written at 8 places of it and copied again,
//! by a CopyJob with `overwrite: IfChanged` and `compare: Checksum` (Ferry mends the file
//! from node-b's copy and the chunks that differ) and by `rsync -a` from the rsync daemon
//! (rsync's delta transfer, what pv-migrate and VolSync run). Wall time and bytes each way:
//! Ferry's from node-b's agent (`ferry_agent_network_bytes_total`: the file bytes and chunk
//! hashes it received), rsync's from its `--stats`. Every copy is compared with the source
//! at the end. Writes `bench/PATCH.md`.

use std::fmt::Write as _;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use ferry_e2e::repo_root;

use super::{built_from, Net, NODES, TEAM};
use crate::machine::median;
use crate::rerun::timed;

/// The file's size: PATCH_MIB (default 1024).
fn size() -> Result<u64> {
    let mib: u64 = std::env::var("PATCH_MIB")
        .map_or(Ok(1024), |v| v.trim().parse())
        .context("PATCH_MIB must be a number")?;
    ensure!(mib >= 16, "PATCH_MIB must be at least 16");
    Ok(mib << 20)
}

/// A step of xorshift64, the bench's only randomness (seeded: runs are comparable).
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// `size` incompressible bytes at `path`, written 1 MiB at a time.
fn make_image(path: &Path, size: u64) -> Result<()> {
    let f = std::fs::File::create(path)?;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 1 << 20];
    for off in (0..size).step_by(buf.len()) {
        for w in buf.chunks_mut(8) {
            w.copy_from_slice(&next(&mut seed).to_le_bytes());
        }
        f.write_all_at(&buf, off)?;
    }
    Ok(())
}

/// rsync's `--stats` "Total bytes received" (what came from the daemon, protocol included).
fn rsync_received(stats: &str) -> Result<u64> {
    stats
        .lines()
        .find_map(|l| l.strip_prefix("Total bytes received: "))
        .map(|n| n.replace(',', "").trim().parse::<u64>())
        .context("rsync --stats printed no \"Total bytes received\"")?
        .context("rsync's bytes received")
}

impl Net {
    /// The file bytes node-b's agent received for CopyJob `job`.
    fn received(&self, job: &str) -> Result<f64> {
        let port = self.cp.agent_port(NODES[1].0)?;
        let text = ferry_e2e::http_get(port, "/metrics").context("scrape node-b's agent")?;
        Ok(ferry_e2e::metric(
            &text,
            "ferry_agent_network_bytes_total",
            &[
                ("direction", "received"),
                ("copyjob_namespace", TEAM),
                ("copyjob", job),
            ],
        )
        .unwrap_or(0.0))
    }

    /// CopyJob `name` from `src/patch` into `vol-b:patch-ferry`, `extra` spec lines: its
    /// seconds (apply to Succeeded) and the bytes node-b received, the job then deleted.
    fn patch_job(&self, name: &str, extra: &str) -> Result<(f64, f64, serde_json::Value)> {
        let start = Instant::now();
        self.cp.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {TEAM}\nspec:\n  source: {{root: vol-a, path: src/patch}}\n  destination: {{root: vol-b, path: patch-ferry}}\n  verify: Checksum\n{extra}"
        ))?;
        self.cp.wait_succeeded(TEAM, name, 600)?;
        let secs = start.elapsed().as_secs_f64();
        let bytes = self.received(name)?;
        let status: serde_json::Value = serde_json::from_str(
            &self
                .cp
                .kubectl_ok(&["get", "copyjob", name, "-n", TEAM, "-o", "json"])?,
        )?;
        self.finish_job(name)?;
        Ok((secs, bytes, status["status"]["progress"].clone()))
    }

    fn rsync_patch(&self, stats: bool) -> Result<(f64, u64)> {
        let url = format!("rsync://{}:{}/src/patch/", NODES[0].1, self.rsync_port);
        let mut c = self.cpus.command(1, "rsync");
        c.arg("-a");
        if stats {
            c.arg("--stats");
        }
        c.arg(url)
            .arg(format!("{}/", self.b.join("patch-rsync").display()));
        let (secs, out) = timed(c, "rsync -a")?;
        let bytes = if stats { rsync_received(&out)? } else { 0 };
        Ok((secs, bytes))
    }
}

pub fn bench_patch(runs: usize, out: Option<&Path>) -> Result<()> {
    ensure!(
        ferry_e2e::is_root(),
        "bench-patch mounts tmpfs: run it as root"
    );
    let size = size()?;
    let build = built_from();
    let net = Net::start()?;
    let src = net.a.join("src/patch");
    std::fs::create_dir_all(&src)?;
    let image = src.join("disk.img");
    eprintln!("writing a {} MiB image ...", size >> 20);
    make_image(&image, size)?;
    let (ferry_first, ferry_first_bytes, _) = net.patch_job("patch-first", "")?;
    let (rsync_first, rsync_first_bytes) = net.rsync_patch(true)?;
    eprintln!("first copies: Ferry {ferry_first:.2} s, rsync {rsync_first:.2} s");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let (mut ferry, mut rsync) = (Vec::new(), Vec::new());
    for round in 0..runs {
        // 16 bytes at 8 places, the size kept (pages of a database, blocks of a VM's disk).
        let f = std::fs::OpenOptions::new().write(true).open(&image)?;
        for _ in 0..8 {
            let at = next(&mut seed) % (size - 16);
            f.write_all_at(&next(&mut seed).to_le_bytes().repeat(2), at)?;
        }
        drop(f);
        // Interleaved, rsync first in even rounds and Ferry first in odd ones.
        let mut one = |ferry_first: bool| -> Result<()> {
            if ferry_first {
                let extra = "  overwrite: IfChanged\n  compare: Checksum\n";
                let (secs, bytes, progress) =
                    net.patch_job(&format!("patch-again-{round}"), extra)?;
                ensure!(
                    progress["patched"] == 1,
                    "round {round}: the file was not mended: {progress}"
                );
                ferry.push((secs, bytes));
            } else {
                let (secs, bytes) = net.rsync_patch(true)?;
                rsync.push((secs, bytes as f64));
            }
            Ok(())
        };
        one(round % 2 == 1)?;
        one(round % 2 == 0)?;
        eprintln!(
            "round {round}: Ferry {:.2} s {:.0} bytes, rsync {:.2} s {:.0} bytes",
            ferry[round].0, ferry[round].1, rsync[round].0, rsync[round].1
        );
    }
    for dst in ["patch-ferry", "patch-rsync"] {
        let got = std::fs::read(net.b.join(dst).join("disk.img"))?;
        ensure!(
            got == std::fs::read(&image)?,
            "{dst}/disk.img differs from the source"
        );
    }
    let med = |v: &[(f64, f64)], i: usize| {
        median(
            &v.iter()
                .map(|s| if i == 0 { s.0 } else { s.1 })
                .collect::<Vec<_>>(),
        )
    };
    let (fs, fb, rs, rb) = (
        med(&ferry, 0),
        med(&ferry, 1),
        med(&rsync, 0),
        med(&rsync, 1),
    );
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mut md = String::new();
    writeln!(
        md,
        "# Re-running a large file changed in a few places (`make bench-patch`)\n"
    )?;
    writeln!(
        md,
        "Written by `ferry-dev bench-patch` ({build}); {cores} cores, {}. One file of {} MiB (incompressible) on node-a's tmpfs, copied to node-b's; then {runs} rounds of 16 bytes written at 8 random places (the size kept) and the file copied again by each tool, interleaved. Ferry: a CopyJob from node-a to node-b (mutual TLS between the agents, release builds) with `overwrite: IfChanged`, `compare: Checksum`, `verify: Checksum`; bytes are the file bytes and chunk hashes node-b's agent received (`ferry_agent_network_bytes_total`). rsync: `rsync -a --stats` from an rsync daemon on node-a's address (its delta transfer; no TLS); bytes are its \"Total bytes received\". Warm: tmpfs on both sides, so this measures the protocols and the hashing, not a disk. Medians.\n",
        crate::machine::loadavg(),
        size >> 20
    )?;
    writeln!(md, "| | Ferry | rsync -a | Ferry / rsync |")?;
    writeln!(md, "|---|---:|---:|---:|")?;
    writeln!(
        md,
        "| first copy, s | {ferry_first:.2} | {rsync_first:.2} | {:.2} |",
        ferry_first / rsync_first
    )?;
    writeln!(
        md,
        "| first copy, bytes received | {ferry_first_bytes:.0} | {rsync_first_bytes} | |"
    )?;
    writeln!(
        md,
        "| re-run after 8 small changes, s | {fs:.3} | {rs:.3} | {:.2} |",
        fs / rs
    )?;
    writeln!(
        md,
        "| re-run, bytes received | {fb:.0} | {rb:.0} | {:.2} |",
        fb / rb
    )?;
    writeln!(
        md,
        "| re-run / first copy, time | {:.3} | {:.3} | |",
        fs / ferry_first,
        rs / rsync_first
    )?;
    writeln!(
        md,
        "| re-run bytes / file size | {:.5} | {:.5} | |\n",
        fb / size as f64,
        rb / size as f64
    )?;
    writeln!(
        md,
        "Every round: {:?} (Ferry s, bytes), {:?} (rsync s, bytes).",
        ferry, rsync
    )?;
    print!("{md}");
    let file = out.map_or_else(|| repo_root().join("bench/PATCH.md"), Path::to_path_buf);
    std::fs::write(&file, md)?;
    eprintln!("wrote {}", file.display());
    Ok(())
}
