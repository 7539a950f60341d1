//! `ferry-agent run`: one per node. Heartbeats a Lease, watches CopyJobs for shards
//! assigned to its node, runs each on the engine (on its own OS thread, never on a tokio
//! worker) and publishes the shard's progress by server-side apply under its own field
//! manager, so it owns only its shard's progress fields.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_crds::{CopyJob, CopyJobSpec, ShardStatus, AGENT_MANAGER_PREFIX, STATE_DIR};
use ferry_engine::{Failure, Overwrite, Preserve, Progress, Reflink, Strategy, Verify};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

/// How often running shards publish progress: bounded, whatever the copy rate.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// Lease renewal period and duration (the operator treats an expired lease as a lost agent).
const LEASE_RENEW: Duration = Duration::from_secs(10);
pub const LEASE_SECONDS: i32 = 30;

/// What the daemon needs to know about its node.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node: String,
    /// Where the node's filesystem is mounted (`/host` in the DaemonSet).
    pub host_root: PathBuf,
    /// Namespace of the heartbeat Leases.
    pub namespace: String,
    /// Copy workers per shard (0: CPUs).
    pub workers: usize,
}

/// Name of a node's heartbeat Lease.
pub fn lease_name(node: &str) -> String {
    format!("ferry-agent-{node}")
}

/// Counters one running shard publishes.
struct Live {
    started: std::time::Instant,
    files: AtomicU64,
    bytes: AtomicU64,
    reflinked: AtomicU64,
    failed: AtomicU64,
    failures: Mutex<Vec<Failure>>,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            started: std::time::Instant::now(),
            files: AtomicU64::default(),
            bytes: AtomicU64::default(),
            reflinked: AtomicU64::default(),
            failed: AtomicU64::default(),
            failures: Mutex::default(),
        }
    }
}

impl Progress for Live {
    fn bytes_copied(&self, bytes: u64, strategy: Strategy) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if strategy == Strategy::Reflink {
            self.reflinked.fetch_add(bytes, Ordering::Relaxed);
        }
    }
    fn entry_done(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }
    fn failed(&self, failure: &Failure) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut f = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.len() < 20 {
            f.push(failure.clone());
        }
    }
}

pub async fn run(settings: Settings) -> Result<()> {
    let client = Client::try_default()
        .await
        .context("connect to the Kubernetes API")?;
    tokio::spawn(heartbeat(client.clone(), settings.clone()));
    let running: Arc<Mutex<HashSet<String>>> = Arc::default();
    let jobs = Api::<CopyJob>::all(client.clone());
    let mut stream = watcher(jobs, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    tracing::info!(node = %settings.node, host_root = %settings.host_root.display(), "ferry-agent running");
    while let Some(event) = stream.next().await {
        let job = match event {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(error = %e, "watch error");
                continue;
            }
        };
        let Some(status) = &job.status else { continue };
        for shard in &status.shards {
            let mine =
                shard.node == settings.node && (shard.state.is_empty() || shard.state == "Pending");
            let key = format!(
                "{}/{}/{}/{}",
                job.namespace().unwrap_or_default(),
                job.name_any(),
                shard.id,
                shard.epoch
            );
            if !mine || job.spec.suspend || job.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if !running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(key.clone())
            {
                continue;
            }
            let (client, settings, job, shard, running) = (
                client.clone(),
                settings.clone(),
                job.clone(),
                shard.clone(),
                running.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = run_shard(&client, &settings, &job, &shard).await {
                    tracing::warn!(job = %job.name_any(), error = %e, "shard failed to start");
                    let _ = publish(
                        &client,
                        &settings,
                        &job,
                        &shard,
                        "Failed",
                        &Live::default(),
                        None,
                    )
                    .await;
                }
                running
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&key);
            });
        }
    }
    Ok(())
}

async fn heartbeat(client: Client, settings: Settings) {
    let leases = Api::<Lease>::namespaced(client, &settings.namespace);
    let name = lease_name(&settings.node);
    loop {
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.node.clone()),
                lease_duration_seconds: Some(LEASE_SECONDS),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        let mut body = serde_json::to_value(&lease).unwrap_or_default();
        body["apiVersion"] = "coordination.k8s.io/v1".into();
        body["kind"] = "Lease".into();
        let pp = PatchParams::apply(&format!("{AGENT_MANAGER_PREFIX}{}", settings.node)).force();
        if let Err(e) = leases.patch(&name, &pp, &Patch::Apply(&body)).await {
            tracing::warn!(error = %e, "lease renewal failed");
        }
        tokio::time::sleep(LEASE_RENEW).await;
    }
}

/// A root or volume's directory on this node, as the agent sees it (under `--host-root`).
fn host_dir(host_root: &Path, resolved: &str) -> Result<PathBuf> {
    anyhow::ensure!(
        resolved.starts_with('/'),
        "the operator assigned no host path for this shard"
    );
    Ok(host_root.join(resolved.trim_start_matches('/')))
}

fn engine_options(spec: &CopyJobSpec, workers: usize, manifest: PathBuf) -> ferry_engine::Options {
    let p = &spec.preserve;
    let mut preserve = Preserve::ALL;
    preserve.mode = p.permissions;
    preserve.ownership = p.ownership;
    preserve.timestamps = p.timestamps;
    preserve.xattrs = p.xattrs;
    preserve.links = p.hard_links;
    preserve.sparse = p.sparseness;
    ferry_engine::Options {
        workers: match spec.parallelism.workers_per_agent {
            n if n > 0 => n as usize,
            _ => workers,
        },
        reflink: match spec.reflink {
            ferry_crds::ReflinkMode::Auto => Reflink::Auto,
            ferry_crds::ReflinkMode::Always => Reflink::Always,
            ferry_crds::ReflinkMode::Never => Reflink::Never,
        },
        verify: match spec.verify {
            ferry_crds::VerifyMode::None => Verify::None,
            ferry_crds::VerifyMode::Checksum => Verify::Checksum,
            ferry_crds::VerifyMode::Full => Verify::Full,
        },
        overwrite: match spec.overwrite {
            ferry_crds::OverwritePolicy::Never => Overwrite::Never,
            ferry_crds::OverwritePolicy::IfChanged => Overwrite::IfChanged,
            ferry_crds::OverwritePolicy::Always => Overwrite::Always,
        },
        preserve,
        manifest: Some(manifest),
        ..ferry_engine::Options::default()
    }
}

async fn run_shard(
    client: &Client,
    settings: &Settings,
    job: &CopyJob,
    shard: &ShardStatus,
) -> Result<()> {
    let src_root = host_dir(&settings.host_root, &shard.source_root)?;
    let dst_root = host_dir(&settings.host_root, &shard.destination_root)?;
    let src = src_root.join(&job.spec.source.path);
    let dst = dst_root.join(&job.spec.destination.path);
    if job.spec.dry_run {
        // Count what the copy would carry; touch nothing on the destination.
        let totals = tokio::task::spawn_blocking(move || ferry_engine::plan(&src)).await??;
        let planned = Some((totals.files as i64, totals.bytes as i64));
        return publish(
            client,
            settings,
            job,
            shard,
            "Succeeded",
            &Live::default(),
            planned,
        )
        .await;
    }
    // The manifest lives with the data it describes, under the destination root.
    let state = dst_root.join(STATE_DIR);
    std::fs::create_dir_all(&state)?;
    let manifest = state.join(format!(
        "{}-{}.xxh128",
        job.namespace().unwrap_or_default(),
        job.name_any()
    ));
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let opts = engine_options(&job.spec, settings.workers, manifest);
    let live = Arc::new(Live::default());
    let done = Arc::new(AtomicBool::new(false));
    publish(client, settings, job, shard, "Running", &live, None).await?;
    // The copy runs on its own OS thread; the async side only publishes.
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let (live, done) = (live.clone(), done.clone());
        std::thread::Builder::new()
            .name("ferry-shard".into())
            .spawn(move || {
                let result = ferry_engine::copy(&src, &dst, &opts, &*live);
                done.store(true, Ordering::Relaxed);
                let _ = tx.send(result);
            })?;
    }
    let mut rx = rx;
    let result = loop {
        tokio::select! {
            r = &mut rx => break r.context("copy thread vanished")?,
            _ = tokio::time::sleep(PUBLISH_EVERY) => {
                if !done.load(Ordering::Relaxed) {
                    if let Err(e) = publish(client, settings, job, shard, "Running", &live, None).await {
                        tracing::warn!(error = %e, "progress update failed");
                    }
                }
            }
        }
    };
    let state = match &result {
        Ok(summary) if summary.failed == 0 && summary.aborted.is_none() => "Succeeded",
        Ok(summary) => {
            let mut f = live
                .failures
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if f.is_empty() {
                f.extend(summary.failures.iter().take(20).cloned());
            }
            "Failed"
        }
        Err(e) => {
            tracing::warn!(error = %e, "copy could not start");
            "Failed"
        }
    };
    if let Ok(summary) = &result {
        // Final numbers from the summary, not the live counters.
        live.files.store(summary.files, Ordering::Relaxed);
        live.bytes.store(summary.bytes, Ordering::Relaxed);
        live.reflinked
            .store(summary.bytes_reflinked, Ordering::Relaxed);
        live.failed.store(summary.failed, Ordering::Relaxed);
    }
    publish(client, settings, job, shard, state, &live, None).await
}

/// Apply this shard's progress fields (and only those: the operator owns the assignment).
/// `planned`: a dry run's (files, bytes).
async fn publish(
    client: &Client,
    settings: &Settings,
    job: &CopyJob,
    shard: &ShardStatus,
    state: &str,
    live: &Live,
    planned: Option<(i64, i64)>,
) -> Result<()> {
    let failures: Vec<serde_json::Value> = live
        .failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|f| serde_json::json!({"path": f.path.to_string_lossy(), "reason": f.kind.as_str(), "message": f.message}))
        .collect();
    let body = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "CopyJob",
        "status": {
            "shards": [{
                "id": shard.id,
                "state": state,
                "filesDone": live.files.load(Ordering::Relaxed),
                "bytesDone": live.bytes.load(Ordering::Relaxed),
                "bytesReflinked": live.reflinked.load(Ordering::Relaxed),
                "failed": live.failed.load(Ordering::Relaxed),
                "bytesPerSecond": (live.bytes.load(Ordering::Relaxed) as f64 / live.started.elapsed().as_secs_f64().max(1e-3)) as i64,
                "failures": failures,
                "plannedFiles": planned.map(|p| p.0),
                "plannedBytes": planned.map(|p| p.1),
            }]
        }
    });
    let ns = job.namespace().unwrap_or_default();
    let pp = PatchParams::apply(&format!("{AGENT_MANAGER_PREFIX}{}", settings.node)).force();
    Api::<CopyJob>::namespaced(client.clone(), &ns)
        .patch_status(&job.name_any(), &pp, &Patch::Apply(&body))
        .await?;
    Ok(())
}
