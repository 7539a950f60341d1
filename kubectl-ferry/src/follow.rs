//! A CopyJob followed to its end: its status watched (no polling), a live bar of files and
//! bytes with rate and ETA as the operator computes them, and the outcome.

use std::time::Duration;

use anyhow::{bail, Result};
use ferry_crds::{CopyJob, Phase};
use futures::TryStreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

/// How a followed job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
}

/// One line of numbers for a job (the bar's message, `get`'s columns).
pub fn numbers(job: &CopyJob) -> String {
    let p = job
        .status
        .as_ref()
        .and_then(|s| s.progress.clone())
        .unwrap_or_default();
    let files = match p.files_total {
        Some(t) => format!("{}/{t} files", p.files_done),
        None => format!("{} files", p.files_done),
    };
    let bytes = match p.bytes_total {
        Some(t) => format!("{}/{}", human(p.bytes_done), human(t)),
        None => human(p.bytes_done),
    };
    let rate = p.rate.unwrap_or_else(|| "-".into());
    let eta = p.eta.map_or_else(String::new, |e| format!(", ETA {e}"));
    format!("{files}, {bytes}, {rate}{eta}")
}

fn human(n: i64) -> String {
    ferry_crds::human_bytes(u64::try_from(n).unwrap_or(0))
}

fn phase(job: &CopyJob) -> Phase {
    job.status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or_default()
}

/// Follow job `name` until it Succeeds or Fails, drawing a bar on stderr (hidden when stderr
/// is not a terminal: then one line per phase change). `timeout`: give up after it.
pub async fn follow(jobs: &Api<CopyJob>, name: &str, timeout: Option<Duration>) -> Result<Outcome> {
    let bar = ProgressBar::new(100);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {pos:>3}% {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if !terminal {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(watcher(jobs.clone(), config).applied_objects());
    let mut last_phase = None;
    let run = async {
        while let Some(job) = stream.try_next().await? {
            let now = phase(&job);
            let percent = job
                .status
                .as_ref()
                .and_then(|s| s.progress.as_ref())
                .and_then(|p| match (p.bytes_total, p.files_total) {
                    (Some(t), _) if t > 0 => Some(p.bytes_done * 100 / t),
                    (_, Some(t)) if t > 0 => Some(p.files_done * 100 / t),
                    _ => None,
                })
                .unwrap_or(0);
            bar.set_position(percent.clamp(0, 100) as u64);
            bar.set_message(format!("{now:?}: {}", numbers(&job)));
            bar.tick();
            if !terminal && last_phase != Some(now) {
                eprintln!("{name}: {now:?}: {}", numbers(&job));
            }
            last_phase = Some(now);
            match now {
                Phase::Succeeded => return Ok(Outcome::Succeeded),
                Phase::Failed => return Ok(Outcome::Failed),
                _ => {}
            }
        }
        bail!("the watch of CopyJob {name} ended")
    };
    let outcome = match timeout {
        Some(t) => match tokio::time::timeout(t, run).await {
            Ok(r) => r,
            Err(_) => {
                bar.abandon();
                bail!("CopyJob {name} did not finish within {} s; it goes on: kubectl ferry watch {name}", t.as_secs())
            }
        },
        None => run.await,
    }?;
    bar.finish();
    Ok(outcome)
}
