//! `ferry-dev bench-rerun` (`make bench-rerun`): re-runs over a destination that has the tree
//! already, on `bench/run.sh`'s 100k-file tree: a no-change re-run of `ferry-agent copy
//! --overwrite if-changed` and of a CopyJob with `overwrite: IfChanged` against `rsync -a`'s
//! no-change re-run (what pv-migrate and VolSync run) and against Ferry's first full copy;
//! then the same after touching 1% of the files. Release builds, the process tier, one tmpfs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};

use crate::machine::{median, shell_line};
use crate::throughput::{Bench, Cache, Tier, TREE_100K};

/// One timed command that must succeed: its wall seconds and stdout.
pub(crate) fn timed(mut cmd: Command, what: &str) -> Result<(f64, String)> {
    let start = Instant::now();
    let out = cmd.output().with_context(|| format!("run {what}"))?;
    let secs = start.elapsed().as_secs_f64();
    ensure!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((secs, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// Every `step`-th regular file under `dir`, sorted: the files a round touches.
fn every_nth_file(dir: &Path, step: usize) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    files.sort();
    Ok(files.into_iter().step_by(step).collect())
}

/// Set the mtime of `files` to `secs` since the epoch (as `touch -d @secs` would).
fn touch(files: &[PathBuf], secs: u64) -> Result<()> {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    for f in files {
        std::fs::File::options()
            .write(true)
            .open(f)?
            .set_modified(when)?;
    }
    Ok(())
}

struct Rows {
    cli: Vec<f64>,
    /// The CopyJob from created to Succeeded, as a watcher sees it.
    job: Vec<f64>,
    /// The same from the start of `kubectl apply`.
    job_apply: Vec<f64>,
    rsync: Vec<f64>,
}

/// Re-runs against rsync; `runs` rounds of each kind. Prints a Markdown report; with
/// `out`, also writes it there.
pub fn bench_rerun(runs: usize, out: Option<&Path>) -> Result<()> {
    let bench = Bench::set_up(Tier::Process, Cache::Warm)?;
    let rsync = "rsync";
    // First full copies: Ferry's timed (the reference a re-run is compared with), then the
    // destinations every re-run goes into.
    eprintln!("first full copies ...");
    let mut full = Vec::new();
    for i in 0..runs {
        let (secs, _, dst, manifest) = bench.cli(&format!("full-{i}"))?;
        full.push(secs);
        Bench::remove(&dst, &manifest)?;
    }
    let (_, _, cli_dst, _) = bench.cli("rerun")?;
    let job_dst = bench.job_into("first", "out/job", "")?.0;
    let rsync_dst = bench.root().join("out/rsync");
    let mut first = Command::new(rsync);
    first
        .arg("-a")
        .arg(format!("{}/", bench.src().display()))
        .arg(format!("{}/", rsync_dst.display()));
    timed(first, "rsync -a (first copy)")?;

    let cli_rerun = |round: &str| -> Result<(f64, serde_json::Value)> {
        let mut cmd = Command::new(bench.agent());
        cmd.args([
            "copy",
            "--no-progress",
            "--json",
            "--overwrite",
            "if-changed",
            "--verify",
            "checksum",
        ])
        .arg(bench.src())
        .arg(&cli_dst);
        let (secs, stdout) = timed(cmd, &format!("ferry-agent copy ({round})"))?;
        Ok((secs, serde_json::from_str(stdout.trim())?))
    };
    let rsync_rerun = || -> Result<f64> {
        let mut cmd = Command::new(rsync);
        cmd.arg("-a")
            .arg(format!("{}/", bench.src().display()))
            .arg(format!("{}/", rsync_dst.display()));
        Ok(timed(cmd, "rsync -a (re-run)")?.0)
    };
    let files = bench.tree().files;
    let touched = every_nth_file(bench.src(), 100)?;
    let mut results: Vec<(&str, Rows)> = Vec::new();
    for (kind, change) in [("no change", false), ("1% of the files touched", true)] {
        let mut rows = Rows {
            cli: Vec::new(),
            job: Vec::new(),
            job_apply: Vec::new(),
            rsync: Vec::new(),
        };
        for i in 0..runs {
            let want = if change {
                // A new mtime on the same files each round: each tool finds them changed.
                touch(&touched, 1_600_000_000 + 60 * (i as u64 + 1))?;
                touched.len() as u64
            } else {
                0
            };
            let round = format!("{kind}, round {}", i + 1);
            let (secs, summary) = cli_rerun(&round)?;
            ensure!(
                summary["files"] == want && summary["skipped"] == files - want,
                "{round}: ferry-agent copied {} files and kept {}, want {want} and {}",
                summary["files"],
                summary["skipped"],
                files - want
            );
            rows.cli.push(secs);
            let tag = format!("{}-{i}", if change { "touched" } else { "same" });
            let (times, copied) = bench
                .job_into(&tag, "out/job", "  overwrite: IfChanged\n")
                .map(|(_, times, copied)| (times, copied))?;
            let job_secs = times.created_to_done;
            ensure!(
                copied == want,
                "{round}: the CopyJob copied {copied} files, want {want}"
            );
            rows.job.push(job_secs);
            rows.job_apply.push(times.apply_to_done);
            rows.rsync.push(rsync_rerun()?);
            eprintln!(
                "{round}: ferry-agent copy {:.3} s, CopyJob {job_secs:.3} s, rsync -a {:.3} s",
                secs, rows.rsync[i]
            );
        }
        results.push((kind, rows));
    }
    for dst in [&cli_dst, &job_dst, &rsync_dst] {
        bench.check_same(dst)?;
    }
    let md = report(&bench, runs, &full, &results, touched.len())?;
    print!("{md}");
    if let Some(file) = out {
        std::fs::write(file, &md)?;
        eprintln!("wrote {}", file.display());
    }
    Ok(())
}

fn report(
    bench: &Bench,
    runs: usize,
    full: &[f64],
    results: &[(&str, Rows)],
    touched: usize,
) -> Result<String> {
    let nproc = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    let cpu = shell_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'");
    let date = shell_line("date -u '+%Y-%m-%d %H:%M UTC'");
    let rsync_version = shell_line("rsync --version | head -n1");
    let tree = bench.tree();
    let range = |v: &[f64]| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{min:.3} | {max:.3}")
    };
    let mut md = String::new();
    writeln!(md, "# Re-runs: a destination that has the tree already\n")?;
    writeln!(md, "Generated by `make bench-rerun` on {date}; nproc {nproc} ({cpu}); release builds of ferry-agent and ferry-operator; {rsync_version}.\n")?;
    writeln!(md, "Targets (issue 16): a no-change re-run and a re-run after touching 1% of the files each at most 0.5x `rsync -a`'s time for the same re-run.\n")?;
    writeln!(md, "- Tree: `ftzz -e {}` (`bench/run.sh`'s `many`): {} files, {} directories, {} bytes, on a tmpfs mounted for the run; every destination on the same tmpfs.", TREE_100K.join(" "), tree.files, tree.dirs, tree.bytes)?;
    writeln!(md, "- Ferry CLI: `ferry-agent copy --no-progress --json --overwrite if-changed --verify checksum SRC DST` (compare SizeAndTime, the default: type, size and mtime, rsync's quick check); its JSON summary is checked each round (files copied = files changed, the rest kept).")?;
    writeln!(md, "- Ferry CopyJob: a new CopyJob each round, `overwrite: IfChanged`, the rest at the CRD defaults (verify Checksum, manifest), into the destination the first CopyJob made; its `progress.filesDone` is checked, and `progress.unlisted` is 0 (its manifest lists every file, the kept ones from the records the previous job left on the node). Two times, both taken by a `kubectl get -w` started before the job: from the watcher seeing the CopyJob created to seeing it `Succeeded` (the job's own time: the operator, the agent and the copy), and from the start of `kubectl apply` (which adds kubectl's start-up and discovery, about 0.1 s, before the object reaches the API server). The target is judged on the first.")?;
    writeln!(md, "- rsync: `rsync -a SRC/ DST/` into the destination its own first run made (rsync's default quick check: size and mtime).")?;
    writeln!(md, "- 1% touched: before each round, the mtime of every 100th file ({touched} files) is set to a new value; each tool then finds those changed and copies them again.")?;
    writeln!(md, "- Ferry's first full copy: `ferry-agent copy` into a new destination (as `make bench-throughput` runs it), {runs} runs.")?;
    writeln!(md, "- {runs} rounds of each kind, the three tools in turn within a round. The last destinations are compared with the source (`bench/check.py`: contents, modes, owners, mtimes).\n")?;
    writeln!(
        md,
        "| run | tool | median (s) | min (s) | max (s) | / rsync -a |\n|---|---|---:|---:|---:|---:|"
    )?;
    writeln!(
        md,
        "| first full copy | Ferry CLI | {:.3} | {} | |",
        median(full),
        range(full)
    )?;
    let mut verdicts = Vec::new();
    for (kind, rows) in results {
        let r = median(&rows.rsync);
        for (tool, v) in [
            ("Ferry CLI", &rows.cli),
            ("Ferry CopyJob (created to Succeeded)", &rows.job),
            ("Ferry CopyJob (from kubectl apply)", &rows.job_apply),
            ("rsync -a", &rows.rsync),
        ] {
            writeln!(
                md,
                "| {kind} | {tool} | {:.3} | {} | {:.2} |",
                median(v),
                range(v),
                median(v) / r
            )?;
        }
        for (tool, v) in [("CLI", &rows.cli), ("CopyJob", &rows.job)] {
            let ratio = median(v) / r;
            verdicts.push(format!(
                "{kind}, Ferry {tool}: {ratio:.2}x rsync -a ({})",
                if ratio <= 0.5 { "met" } else { "NOT met" }
            ));
        }
    }
    writeln!(md, "\nAgainst the target (<= 0.5x):\n")?;
    for v in verdicts {
        writeln!(md, "- {v}")?;
    }
    Ok(md)
}
