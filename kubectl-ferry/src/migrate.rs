//! `kubectl ferry migrate CLAIM --to-class C`: a ClaimMigration created and followed, one
//! line per step (the status's message), to its end: the downtime and the copy's time when
//! it succeeds, the reason and what to change when it fails.

use std::time::Duration;

use anyhow::{bail, Result};
use ferry_crds::{ClaimMigration, MigrationStep};
use futures::TryStreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;

/// How a followed migration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
}

/// One line for where `m` is.
pub fn line(m: &ClaimMigration) -> String {
    let s = m.status.clone().unwrap_or_default();
    let step = s
        .step
        .map_or_else(|| "Pending".to_string(), |s| s.to_string());
    match s.step {
        Some(MigrationStep::Succeeded) => format!(
            "{step}: {} (users at zero {} s; live copy {} s)",
            s.message,
            s.downtime_seconds
                .map_or_else(|| "-".into(), |d| d.to_string()),
            s.copy_seconds.map_or_else(|| "-".into(), |d| d.to_string()),
        ),
        _ => match s.reason {
            Some(r) => format!("{step} ({r}): {}", s.message),
            None => format!("{step}: {}", s.message),
        },
    }
}

/// Follow migration `name` until it Succeeds or Fails, a line on stderr per change of step
/// (the last line, on stdout, is the outcome). `timeout`: give up after it.
pub async fn follow(
    migrations: &Api<ClaimMigration>,
    name: &str,
    timeout: Option<Duration>,
) -> Result<(Outcome, ClaimMigration)> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(watcher(migrations.clone(), config).applied_objects());
    let mut last = None;
    let run = async {
        while let Some(m) = stream.try_next().await? {
            let step = m.status.as_ref().and_then(|s| s.step);
            match step {
                Some(MigrationStep::Succeeded) => return Ok((Outcome::Succeeded, m)),
                Some(MigrationStep::Failed) => return Ok((Outcome::Failed, m)),
                _ => {}
            }
            if last != Some(step) {
                eprintln!("{name}: {}", line(&m));
            }
            last = Some(step);
        }
        bail!("the watch of ClaimMigration {name} ended")
    };
    match timeout {
        Some(t) => match tokio::time::timeout(t, run).await {
            Ok(r) => r,
            Err(_) => bail!(
                "ClaimMigration {name} did not finish within {} s; it goes on: kubectl get claimmigration {name} -w",
                t.as_secs()
            ),
        },
        None => run.await,
    }
}
