//! `ferry-agent run`: one per node. Heartbeats a Lease, watches CopyJobs for shards
//! assigned to its node, runs each on the engine (on its own OS thread, never on a tokio
//! worker) and publishes the shard's progress by server-side apply under its own field
//! manager, so it owns only its shard's progress fields.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_crds::{
    CopyJob, CopyJobSpec, ManifestName, Reason, ShardState, ShardStatus, AGENT_MANAGER_PREFIX,
    STATE_DIR,
};
use ferry_engine::{Failure, Part, Progress, Strategy};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

/// A copy still running after this long gets its totals counted, for the ETA.
const PLAN_AFTER: Duration = Duration::from_secs(2);
/// How often running shards publish progress: bounded, whatever the copy rate.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// How often every known job is looked at again, for what no watch event announces: a
/// shard whose older run (a stale epoch) has just stopped, a heartbeat that came back.
const RESCAN_EVERY: Duration = Duration::from_secs(3);

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
    /// Test-only: sleep this long before each file (`FERRY_FAULT_FILE_DELAY_MS`), so
    /// end-to-end tests can act while a copy runs.
    pub file_delay: Option<Duration>,
    /// Test-only: flip a byte of every destination file with this name after it is
    /// written (`FERRY_FAULT_CORRUPT_FILE`), so end-to-end tests see a checksum mismatch.
    pub corrupt_file: Option<String>,
    /// Test-only: append a byte to every source file with this name each time it has been
    /// copied (`FERRY_FAULT_CHANGE_SOURCE`), so end-to-end tests see `SourceChanged`.
    pub change_source: Option<String>,
    /// Address of the /metrics, /healthz and /readyz endpoints.
    pub listen: std::net::SocketAddr,
    /// Duration of the heartbeat Lease (renewed every third of it).
    pub lease_seconds: i32,
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
    /// Why the shard could not start at all (reported with reason `CannotStart`).
    start_error: Mutex<Option<(Reason, String)>>,
    /// Bytes of files an earlier run committed (a resumed shard), left out of its rate.
    resumed_bytes: AtomicU64,
    /// What this shard carries in all (files, bytes), once a plan has counted it.
    planned: Mutex<Option<(i64, i64)>>,
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
            start_error: Mutex::default(),
            resumed_bytes: AtomicU64::default(),
            planned: Mutex::default(),
        }
    }
}

/// A shard this agent is running, and how to stop it.
#[derive(Default)]
struct Active {
    /// The assignment it runs for.
    epoch: i64,
    /// Read by the engine at every file boundary.
    cancel: Arc<AtomicBool>,
    /// The job is being deleted (rather than suspended).
    deleting: AtomicBool,
    /// The shard is no longer this agent's to run (given to another node or epoch, as the
    /// watch or the API server says): it stops without publishing anything more.
    fenced: AtomicBool,
}

/// Until when this agent may run shards: two thirds of a lease after its last successful
/// renewal was sent. The operator gives an agent's shared work away only after a whole
/// lease without renewal, so an agent cut off from the API server (or frozen) stops a
/// third of a lease before anyone else may start on the same files.
#[derive(Debug)]
pub struct Fence {
    base: std::time::Instant,
    /// Nanoseconds after `base`; 0 before the first renewal.
    until: AtomicU64,
    /// Times a renewal came after `until` had passed: a run that began before such a gap
    /// may have lost its work meanwhile, so it never commits again (see `Run::owns`).
    lapses: AtomicU64,
    lease: Duration,
}

impl Fence {
    fn new(lease_seconds: i32) -> Self {
        Self {
            base: std::time::Instant::now(),
            until: AtomicU64::new(0),
            lapses: AtomicU64::new(0),
            lease: Duration::from_secs(lease_seconds.max(1) as u64),
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// A renewal sent at `sent` succeeded. A gap is recorded before the deadline moves,
    /// so a worker that sees the new deadline also sees the gap.
    fn renewed(&self, sent: std::time::Instant) {
        let until = self.until.load(Ordering::SeqCst);
        if until != 0 && self.now() >= until {
            self.lapses.fetch_add(1, Ordering::SeqCst);
        }
        let next = sent.duration_since(self.base) + self.lease * 2 / 3;
        self.until
            .fetch_max(next.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Whether this agent may still commit work.
    pub fn holds(&self) -> bool {
        self.now() < self.until.load(Ordering::SeqCst)
    }

    /// Whether a run that began when the lapse count was `lapses` may still commit: the
    /// lease holds and has held without a gap since.
    fn holds_since(&self, lapses: u64) -> bool {
        self.holds() && self.lapses.load(Ordering::SeqCst) == lapses
    }
}

/// What every shard task shares.
struct Agent {
    client: Client,
    settings: Settings,
    fence: Arc<Fence>,
    /// The syncfs that shards finishing together share.
    flushes: Arc<crate::flush::Flushes>,
    /// Running shards by `<ns>/<job>/<shard id>`.
    running: Mutex<HashMap<String, Arc<Active>>>,
    /// Runs this process finished, by `<ns>/<job>/<shard id>/<epoch>`: a stale event
    /// (published before the final state) must not start one again.
    finished: Mutex<HashSet<String>>,
}

impl Progress for Live {
    fn bytes_copied(&self, bytes: u64, strategy: Strategy) {
        if strategy == Strategy::Reflink {
            self.reflinked.fetch_add(bytes, Ordering::Relaxed);
        }
        crate::serve::metrics().bytes_copied(bytes, strategy);
    }
    // Counted as the summary counts them, so the last update does not jump.
    fn file_done(&self, size: u64, took: Duration) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        crate::serve::metrics().file_copied(took.as_secs_f64());
    }
    fn bytes_verified(&self, bytes: u64) {
        crate::serve::metrics().bytes_verified.inc_by(bytes);
    }
    fn skipped(&self) {
        crate::serve::metrics().file_skipped();
    }
    // Committed by an earlier run of this shard: done, but not copied by this one (the
    // counters start from zero and count the tree as it is, so they are exact whatever
    // the earlier run managed to publish before it died).
    fn resumed(&self, size: u64) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        self.resumed_bytes.fetch_add(size, Ordering::Relaxed);
    }
    fn failed(&self, failure: &Failure) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        crate::serve::metrics().file_failed(failure.kind);
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
    let health = Arc::new(crate::serve::Health {
        lease_seconds: i64::from(settings.lease_seconds),
        ..Default::default()
    });
    let metrics = crate::serve::init_metrics(&settings.node);
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("listen on {} for /metrics and /healthz", settings.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    tokio::spawn(ferry_serve::serve(
        listener,
        Arc::new(crate::serve::AgentEndpoints {
            metrics,
            health: health.clone(),
        }),
    ));
    let fence = Arc::new(Fence::new(settings.lease_seconds));
    tokio::spawn(heartbeat(
        client.clone(),
        settings.clone(),
        health.clone(),
        fence.clone(),
    ));
    let agent = Arc::new(Agent {
        client: client.clone(),
        settings: settings.clone(),
        fence,
        flushes: Arc::default(),
        running: Mutex::default(),
        finished: Mutex::default(),
    });
    let (store, writer) = reflector::store();
    let jobs = Api::<CopyJob>::all(client.clone());
    let mut stream = reflector(writer, watcher(jobs, watcher::Config::default()))
        .default_backoff()
        .boxed();
    // Look again at every job now and then (see RESCAN_EVERY), and stop runs the moment
    // the heartbeat is stale.
    {
        let agent = agent.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                agent.fence_if_stale();
            }
        });
    }
    {
        let (agent, store) = (agent.clone(), store.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RESCAN_EVERY).await;
                for job in store.state() {
                    agent.consider(&job);
                }
            }
        });
    }
    tracing::info!(node = %settings.node, host_root = %settings.host_root.display(), "ferry-agent running");
    // The jobs a (re)list has shown so far: at its end, the per-job gauges of jobs it did
    // not show (deleted while the watch was down) are dropped.
    let mut listed: Option<HashSet<(String, String)>> = None;
    let job_key = |job: &CopyJob| (job.namespace().unwrap_or_default(), job.name_any());
    while let Some(event) = stream.next().await {
        let job = match event {
            Ok(watcher::Event::Apply(job)) => job,
            Ok(watcher::Event::InitApply(job)) => {
                listed
                    .get_or_insert_with(HashSet::new)
                    .insert(job_key(&job));
                job
            }
            Ok(watcher::Event::Init) => {
                listed = Some(HashSet::new());
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                metrics.retain_jobs(&listed.take().unwrap_or_default());
                health.watching.store(true, Ordering::Relaxed);
                continue;
            }
            Ok(watcher::Event::Delete(job)) => {
                // A finished job's gauges stay (with their final values) as long as the
                // job exists, and go with it.
                let (ns, name) = job_key(&job);
                metrics.forget_job(&ns, &name);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "watch error");
                continue;
            }
        };
        agent.consider(&Arc::new(job));
    }
    Ok(())
}

impl Agent {
    /// Stop every running shard when this agent may no longer hold work (its heartbeat has
    /// not been renewed for two thirds of a lease); they publish nothing (see run_shard).
    fn fence_if_stale(&self) {
        if self.fence.holds() {
            return;
        }
        // Only stopped, not marked as given away: if the heartbeat comes back before the
        // operator gives the shard to someone else, a rescan runs it again (resumed).
        for (key, active) in lock(&self.running).iter() {
            if !active.cancel.swap(true, Ordering::Relaxed) {
                tracing::warn!(shard = %key, "heartbeat not renewed: stopping the shard (another agent may be given it)");
            }
        }
    }

    /// Start the shards of `job` given to this node, and stop those no longer its own.
    fn consider(self: &Arc<Self>, job: &Arc<CopyJob>) {
        let Some(status) = &job.status else { return };
        let prefix = format!(
            "{}/{}/",
            job.namespace().unwrap_or_default(),
            job.name_any()
        );
        let deleting = job.metadata.deletion_timestamp.is_some();
        // Stop runs this job no longer wants here: suspended or deleted (they publish
        // where they stopped), or given to another node or epoch (they stop silently; the
        // API server would refuse what they publish).
        for (key, active) in lock(&self.running).iter() {
            let Some(id) = key.strip_prefix(&prefix) else {
                continue;
            };
            let mine = status.shards.iter().any(|s| {
                s.id == id
                    && s.node == self.settings.node
                    && s.epoch == active.epoch
                    && !s.failed_by_operator()
            });
            if !mine && !active.fenced.swap(true, Ordering::Relaxed) {
                active.cancel.store(true, Ordering::Relaxed);
                tracing::warn!(shard = %key, epoch = active.epoch, "the shard was given to another node or epoch: stopping");
            } else if job.spec.suspend || deleting {
                if deleting {
                    active.deleting.store(true, Ordering::Relaxed);
                }
                if !active.cancel.swap(true, Ordering::Relaxed) {
                    tracing::info!(shard = %key, deleting, "stopping shard");
                }
            }
        }
        if job.spec.suspend || deleting || !self.fence.holds() {
            return;
        }
        for (index, shard) in status.shards.iter().enumerate() {
            if shard.node != self.settings.node || shard.state.over() {
                continue;
            }
            let key = format!("{prefix}{}", shard.id);
            if lock(&self.finished).contains(&format!("{key}/{}", shard.epoch)) {
                continue;
            }
            let active = Arc::new(Active {
                epoch: shard.epoch,
                ..Active::default()
            });
            {
                // One run of a shard at a time: a new epoch's run waits until the old
                // one has stopped (a rescan starts it then).
                let mut r = lock(&self.running);
                if r.contains_key(&key) {
                    continue;
                }
                r.insert(key.clone(), active.clone());
            }
            let (agent, job, shard) = (self.clone(), job.clone(), shard.clone());
            tokio::spawn(async move {
                let active_shards = &crate::serve::metrics().active_shards;
                active_shards.inc();
                let target = Target {
                    job: &job,
                    shard: &shard,
                    index,
                };
                // None: fenced (the shard moved, or the heartbeat lapsed while it ran).
                let state = match run_shard(&agent, target, &active).await {
                    Ok(state) => Some(state),
                    Err(e) if fenced_error(&e) => {
                        if e.downcast_ref::<Fenced>().is_none() {
                            tracing::warn!(job = %job.name_any(), shard = %shard.id, "the API server refused our update: the shard was given to another node or epoch");
                        }
                        None
                    }
                    Err(e) => {
                        tracing::warn!(job = %job.name_any(), error = %format!("{e:#}"), "shard failed to start");
                        let live = Live::default();
                        *lock(&live.start_error) = Some((refusal_reason(&e), format!("{e:#}")));
                        live.failed.store(1, Ordering::Relaxed);
                        let _ = publish(&agent, target, ShardState::Failed, &live, None).await;
                        Some(ShardState::Failed)
                    }
                };
                // A suspended shard runs again when the job is resumed, and one stopped
                // by a stale heartbeat when it is fresh again (if it is still ours); the
                // others are done.
                // A run stopped by its heartbeat alone (not by the shard moving) runs
                // again on a rescan if the shard is still this node's at this epoch.
                let heartbeat_lost = state.is_none() && !active.fenced.load(Ordering::Relaxed);
                if state != Some(ShardState::Suspended) && !heartbeat_lost {
                    lock(&agent.finished).insert(format!("{key}/{}", shard.epoch));
                }
                let mut running = lock(&agent.running);
                if running.get(&key).is_some_and(|a| Arc::ptr_eq(a, &active)) {
                    running.remove(&key);
                }
                active_shards.dec();
            });
        }
    }
}

/// The shard a run is for: where it sits in the job's status, for the fenced update.
#[derive(Clone, Copy)]
struct Target<'a> {
    job: &'a CopyJob,
    shard: &'a ShardStatus,
    index: usize,
}

/// Whether publishing failed because the shard is no longer this agent's (a JSON patch
/// `test` of its node and epoch did not hold).
fn fenced_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 422)
            || c.downcast_ref::<Fenced>().is_some()
    })
}

/// A run stopped because the shard is no longer this agent's.
#[derive(Debug, thiserror::Error)]
#[error("the shard is no longer assigned to this agent's node and epoch")]
struct Fenced;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn heartbeat(
    client: Client,
    settings: Settings,
    health: Arc<crate::serve::Health>,
    fence: Arc<Fence>,
) {
    let leases = Api::<Lease>::namespaced(client, &settings.namespace);
    let name = lease_name(&settings.node);
    let every = Duration::from_secs(settings.lease_seconds.max(3) as u64) / 3;
    loop {
        let sent = std::time::Instant::now();
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.node.clone()),
                lease_duration_seconds: Some(settings.lease_seconds),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        let mut body = serde_json::to_value(&lease).unwrap_or_default();
        body["apiVersion"] = "coordination.k8s.io/v1".into();
        body["kind"] = "Lease".into();
        let pp = PatchParams::apply(&format!("{AGENT_MANAGER_PREFIX}{}", settings.node)).force();
        match leases.patch(&name, &pp, &Patch::Apply(&body)).await {
            Ok(_) => {
                fence.renewed(sent);
                health
                    .lease_renewed
                    .store(crate::serve::unix_now(), Ordering::Relaxed)
            }
            Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
        }
        tokio::time::sleep(every.saturating_sub(sent.elapsed())).await;
    }
}

/// The condition reason for a shard that could not start: the engine's refusal reason
/// (PathEscape, SymlinkRejected, Openat2Unavailable) when it refused, else CannotStart.
fn refusal_reason(e: &anyhow::Error) -> Reason {
    e.downcast_ref::<ferry_engine::Error>()
        .map_or(Reason::CannotStart, engine_reason)
}

fn engine_reason(e: &ferry_engine::Error) -> Reason {
    match e {
        ferry_engine::Error::Refused { reason, .. } => *reason,
        _ => Reason::CannotStart,
    }
}

/// [`ferry_engine::plan_beneath`], for the daemon's `anyhow` errors.
fn plan_beneath(
    root: &OwnedFd,
    path: &Path,
    select: Part,
    links: bool,
) -> Result<ferry_engine::Totals> {
    Ok(ferry_engine::plan_beneath(
        root.as_fd(),
        path,
        select,
        links,
    )?)
}

fn engine_options(
    spec: &CopyJobSpec,
    workers: usize,
    manifest: Option<PathBuf>,
) -> ferry_engine::Options {
    ferry_engine::Options {
        workers: match spec.parallelism.workers_per_agent {
            n if n > 0 => n as usize,
            _ => workers,
        },
        reflink: spec.reflink,
        verify: spec.verify,
        overwrite: spec.overwrite,
        preserve: spec.preserve,
        manifest,
        ..ferry_engine::Options::default()
    }
}

async fn run_shard(agent: &Agent, target: Target<'_>, active: &Arc<Active>) -> Result<ShardState> {
    let (settings, job, shard) = (&agent.settings, target.job, target.shard);
    // Every path from here on is resolved from a directory fd: the roots (admin paths)
    // inside the node's filesystem, the job's paths (tenant paths) beneath the roots with
    // openat2 and no symlinks (ferry_engine::copy_beneath). A root is the admin's (or the
    // kubelet's) to create: a missing one is a mount that is not there, and writing into the
    // node's own disk below it would hide the data.
    let host = std::fs::File::open(&settings.host_root)
        .with_context(|| format!("open the host root {}", settings.host_root.display()))?;
    let open_root = |what: &str, path: &str| {
        anyhow::ensure!(
            path.starts_with('/'),
            "the operator assigned no host path for this shard"
        );
        ferry_engine::open_host_path(host.as_fd(), path).with_context(|| {
            format!(
                "the {what} root {path} is not a directory on node {} (is the volume mounted?)",
                settings.node
            )
        })
    };
    let src_root = Arc::new(open_root("source", &shard.source_root)?);
    let dst_root = Arc::new(open_root("destination", &shard.destination_root)?);
    // For the "destination full" message, after the copy thread has the roots.
    let (src_for_plan, dst_volume) = (src_root.clone(), dst_root.clone());
    let select = shard.part;
    let src_path = PathBuf::from(&job.spec.source.path);
    let src_rel = src_path.clone();
    let dst_path = PathBuf::from(&job.spec.destination.path);
    let links = job.spec.preserve.hard_links;
    if job.spec.dry_run {
        // Count what the copy would carry; touch nothing on the destination.
        let (root, path) = (src_root.clone(), src_path.clone());
        let totals =
            tokio::task::spawn_blocking(move || plan_beneath(&root, &path, Part::All, links))
                .await??;
        let planned = Some((totals.files as i64, totals.bytes as i64));
        publish(
            agent,
            target,
            ShardState::Succeeded,
            &Live::default(),
            planned,
        )
        .await?;
        return Ok(ShardState::Succeeded);
    }
    // The manifest lives with the data it describes, under the destination root; each
    // part of a split job writes its own, and the directories pass joins them.
    // (Reached through /proc/self/fd: the directory itself, whatever its path does later.)
    let state_fd = ferry_engine::state_dir(dst_root.as_fd(), STATE_DIR)?;
    let state_path = PathBuf::from(format!("/proc/self/fd/{}", state_fd.as_raw_fd()));
    let names = ManifestName::new(&job.namespace().unwrap_or_default(), &job.name_any());
    let base = names.base();
    let manifest = names.for_part(select).map(|name| state_path.join(name));
    // Anything but a fresh shard is a resumption: suspended, left Running by an agent
    // process that died, or taken over from a lost agent; so is a job re-created after a
    // failure (its manifest is there). Committed files are kept, not copied again, and
    // unfinished directories and the staging an interrupted run left are finished.
    let resume = shard.state != ShardState::Pending
        || manifest
            .as_ref()
            .is_some_and(|m| std::fs::symlink_metadata(m).is_ok());
    let mut opts = engine_options(&job.spec, settings.workers, manifest);
    opts.select = select;
    opts.resume = resume;
    // Staging names every run of this shard shares (on any node, at any epoch), so a
    // resumed run adopts what a killed one staged and sweeps its leftovers.
    opts.staging_tag = Some(format!(
        "{:012x}",
        xxhash_rust::xxh3::xxh3_64(format!("{base}/{}", shard.id).as_bytes()) >> 16
    ));
    // Nothing becomes visible once the shard is not ours (it moved, per the watch or the
    // API server) or may not be (the heartbeat lapsed since this run began).
    let lapses = agent.fence.lapses.load(Ordering::SeqCst);
    opts.fence = Some(ferry_engine::Fence(Arc::new({
        let (fence, mine) = (agent.fence.clone(), active.clone());
        move || !mine.fenced.load(Ordering::Relaxed) && fence.holds_since(lapses)
    })));
    opts.cancel = Some(active.cancel.clone());
    opts.faults.delay_per_file = settings.file_delay;
    opts.faults.corrupt_after_write = settings.corrupt_file.clone().map(String::into_bytes);
    opts.faults.change_source = settings
        .change_source
        .clone()
        .map(|name| (name.into_bytes(), u32::MAX));
    let live = Arc::new(Live::default());
    tracing::info!(job = %base, shard = %shard.id, epoch = shard.epoch, part = %shard.part, resume, "starting shard");
    let done = Arc::new(AtomicBool::new(false));
    publish(agent, target, ShardState::Running, &live, None).await?;
    // Totals for the job's PROGRESS and ETA: counted next to a copy that outlasts a few
    // seconds (a short one needs no estimate, and would pay for the extra walk).
    {
        let (live, done) = (live.clone(), done.clone());
        let (root, path) = (src_root.clone(), src_path.clone());
        tokio::spawn(async move {
            tokio::time::sleep(PLAN_AFTER).await;
            if done.load(Ordering::Relaxed) {
                return;
            }
            let totals =
                tokio::task::spawn_blocking(move || plan_beneath(&root, &path, select, links))
                    .await;
            if let Ok(Ok(t)) = totals {
                *lock(&live.planned) = Some((t.files as i64, t.bytes as i64));
            }
        });
    }
    // The copy runs on its own OS thread; the async side only publishes.
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let (live, done) = (live.clone(), done.clone());
        std::thread::Builder::new()
            .name("ferry-shard".into())
            .spawn(move || {
                let result = ferry_engine::copy_beneath(
                    src_root.as_fd(),
                    &src_path,
                    dst_root.as_fd(),
                    &dst_path,
                    &opts,
                    &*live,
                );
                done.store(true, Ordering::Relaxed);
                let _ = tx.send(result);
            })?;
    }
    let mut rx = rx;
    let result = loop {
        tokio::select! {
            r = &mut rx => break r.context("copy thread vanished")?,
            _ = tokio::time::sleep(PUBLISH_EVERY) => {
                if !done.load(Ordering::Relaxed) && !active.fenced.load(Ordering::Relaxed) {
                    match publish(agent, target, ShardState::Running, &live, None).await {
                        // Not ours any more: stop copying at once.
                        Err(e) if fenced_error(&e) => {
                            active.fenced.store(true, Ordering::Relaxed);
                            active.cancel.store(true, Ordering::Relaxed);
                            tracing::warn!(shard = %shard.id, epoch = shard.epoch, "the API server refused our progress for this epoch: stopping");
                        }
                        Err(e) => tracing::warn!(error = %e, "progress update failed"),
                        Ok(()) => {}
                    }
                }
            }
        }
    };
    let mut state = match &result {
        Ok(summary) if summary.cancelled => {
            if active.deleting.load(Ordering::Relaxed) {
                ShardState::Stopped
            } else {
                ShardState::Suspended
            }
        }
        Ok(summary) if summary.failed == 0 && summary.aborted.is_none() => ShardState::Succeeded,
        Ok(summary) => {
            let mut f = lock(&live.failures);
            if f.is_empty() {
                f.extend(summary.failures.iter().take(20).cloned());
            }
            ShardState::Failed
        }
        Err(e) => {
            tracing::warn!(error = %e.with_causes(), "copy could not start");
            *lock(&live.start_error) = Some((engine_reason(e), e.with_causes()));
            ShardState::Failed
        }
    };
    // A full destination stops the copy (or, at its end, the manifest's last lines).
    let full = match &result {
        Ok(summary) => summary
            .failures
            .iter()
            .any(|f| f.kind == ferry_engine::Reason::DestinationFull),
        Err(ferry_engine::Error::Io { source, .. }) => {
            ferry_engine::reason_of_io(source) == ferry_engine::Reason::DestinationFull
        }
        Err(_) => false,
    };
    if full {
        let message =
            destination_full(&live, src_for_plan, &dst_volume, &src_rel, select, links).await;
        *lock(&live.start_error) = Some((Reason::DestinationFull, message));
    }
    if select == Part::Directories && state == ShardState::Succeeded {
        let parts = job
            .status
            .iter()
            .flat_map(|s| &s.shards)
            .filter(|s| matches!(s.part, Part::Slice { .. }))
            .count();
        if let Err(e) = join_manifests(&state_path, &names, parts) {
            *lock(&live.start_error) = Some((
                Reason::CannotStart,
                format!("joining the parts' manifests: {e:#}"),
            ));
            state = ShardState::Failed;
        }
    }
    if let Ok(summary) = &result {
        // Final numbers from the summary, not the live counters.
        live.files
            .store(summary.files + summary.files_resumed, Ordering::Relaxed);
        live.bytes
            .store(summary.bytes + summary.bytes_resumed, Ordering::Relaxed);
        live.reflinked
            .store(summary.bytes_reflinked, Ordering::Relaxed);
        live.failed.store(summary.failed, Ordering::Relaxed);
    }
    // Succeeded means on stable storage: a syncfs of the destination volume, shared with
    // the shards that finish on it at the same time (see flush.rs), never retried. The
    // flush can take a while after a large copy, so the final counts are shown first.
    if state == ShardState::Succeeded {
        if let Err(e) = publish(agent, target, ShardState::Running, &live, None).await {
            tracing::warn!(error = %e, "progress update failed");
        }
        let (flushes, volume) = (agent.flushes.clone(), dst_volume.clone());
        let flushed = tokio::task::spawn_blocking(move || {
            let dev = ferry_engine::volume::device(volume.as_fd()).map_err(|e| e.to_string())?;
            flushes.flush(dev, || ferry_engine::volume::syncfs(volume.as_fd()))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        if let Err(why) = flushed {
            *lock(&live.start_error) = Some((
                Reason::IOError,
                format!(
                    "flushing the destination volume failed ({why}): the files may not be on \
                     stable storage; check the device, then re-create the job"
                ),
            ));
            state = ShardState::Failed;
        }
    }
    tracing::info!(job = %base, shard = %shard.id, %state, "shard finished");
    // Another agent (or epoch) owns the shard now, or may: say nothing more.
    if active.fenced.load(Ordering::Relaxed) {
        tracing::warn!(job = %base, shard = %shard.id, epoch = shard.epoch, "stopped: the shard was given to another node or epoch");
        return Err(Fenced.into());
    }
    if !agent.fence.holds_since(lapses) {
        tracing::warn!(job = %base, shard = %shard.id, epoch = shard.epoch, "stopped: the heartbeat not renewed in time while the shard ran (another agent may be given it)");
        return Err(Fenced.into());
    }
    publish(agent, target, state, &live, None).await?;
    Ok(state)
}

/// What a user whose destination filled up needs to know: how much was copied, about how
/// much more is needed, and how much is free.
async fn destination_full(
    live: &Live,
    src_root: Arc<OwnedFd>,
    dst_volume: &OwnedFd,
    src_path: &Path,
    select: Part,
    links: bool,
) -> String {
    let done = live.bytes.load(Ordering::Relaxed);
    let files = live.files.load(Ordering::Relaxed);
    let planned = *lock(&live.planned);
    let total = match planned {
        Some((_, bytes)) => Some(bytes.max(0) as u64),
        // Not counted while copying (a short copy): count it now, the walk is cheap next
        // to the copy that filled a volume.
        None => {
            let path = src_path.to_path_buf();
            tokio::task::spawn_blocking(move || plan_beneath(&src_root, &path, select, links))
                .await
                .ok()
                .and_then(|t| t.ok())
                .map(|t| t.bytes)
        }
    };
    let free = ferry_engine::volume::free_bytes(dst_volume.as_fd()).unwrap_or(0);
    let human = crate::copy_cmd::human;
    let copied = format!("{files} files ({}) were copied", human(done));
    let kept = "re-create the job: what was copied is kept and not copied again";
    match total {
        Some(total) => {
            let needed = total.saturating_sub(done);
            format!(
                "the destination volume is full: {copied}; about {} more are needed and {} \
                 are free. Free or add at least {}, then {kept}",
                human(needed),
                human(free),
                human(needed.saturating_sub(free)),
            )
        }
        None => format!(
            "the destination volume is full: {copied} and {} are free. Free some space, then {kept}",
            human(free),
        ),
    }
}

/// The last step of a split job: the parts' manifests (`<base>.part-<i>.xxh128`) become
/// one `<base>.xxh128`, written under a temporary name and renamed, then the parts go.
///
/// It may be run again after being killed at any point: the joined file appears whole
/// (rename) before any part is removed, so fewer parts than `expected` next to a joined
/// manifest means an earlier run joined them all and only the removal is left to do.
fn join_manifests(state: &Path, names: &ManifestName, expected: usize) -> Result<()> {
    let mut parts: Vec<(u32, PathBuf)> = std::fs::read_dir(state)?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((names.slice_of(e.file_name().to_str()?)?, e.path())))
        .collect();
    parts.sort();
    let joined = state.join(names.joined());
    if parts.len() < expected && std::fs::symlink_metadata(&joined).is_ok() {
        for (_, p) in &parts {
            std::fs::remove_file(p)?;
        }
        return Ok(());
    }
    // Never through a link a tenant planted in the state directory.
    let no_follow = |p: &Path, write: bool| {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .create_new(write)
            .custom_flags(libc::O_NOFOLLOW)
            .open(p)
    };
    let tmp = state.join(names.joined_tmp());
    let _ = std::fs::remove_file(&tmp);
    let mut out = std::io::BufWriter::new(no_follow(&tmp, true)?);
    for (_, p) in &parts {
        std::io::copy(&mut no_follow(p, false)?, &mut out)?;
    }
    out.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, &joined)?;
    for (_, p) in &parts {
        std::fs::remove_file(p)?;
    }
    Ok(())
}

/// Publish this shard's progress fields (and only those: the operator owns the
/// assignment), as a JSON patch that first tests the shard is still this node's, at this
/// epoch: an agent that lost its shard (its heartbeat expired and the work moved on) is
/// refused by the API server, whatever it believes. `planned`: a dry run's (files, bytes).
async fn publish(
    agent: &Agent,
    target: Target<'_>,
    state: ShardState,
    live: &Live,
    planned: Option<(i64, i64)>,
) -> Result<()> {
    let (settings, job, shard) = (&agent.settings, target.job, target.shard);
    let planned = planned.or(*lock(&live.planned));
    let bytes = live.bytes.load(Ordering::Relaxed);
    let rate = bytes.saturating_sub(live.resumed_bytes.load(Ordering::Relaxed)) as f64
        / live.started.elapsed().as_secs_f64().max(1e-3);
    let start = lock(&live.start_error)
        .as_ref()
        .map(|(r, m)| serde_json::json!({"path": ".", "reason": r, "message": m}));
    let failures: Vec<serde_json::Value> = start
        .into_iter()
        .chain(lock(&live.failures).iter().map(|f| serde_json::json!({"path": f.path.to_string_lossy(), "reason": f.kind, "message": f.message})))
        .collect();
    let at = format!("/status/shards/{}", target.index);
    let mut ops = vec![
        serde_json::json!({"op": "test", "path": format!("{at}/id"), "value": shard.id}),
        serde_json::json!({"op": "test", "path": format!("{at}/node"), "value": settings.node}),
        serde_json::json!({"op": "test", "path": format!("{at}/epoch"), "value": shard.epoch}),
    ];
    let mut set = |field: &str, value: serde_json::Value| {
        ops.push(serde_json::json!({"op": "add", "path": format!("{at}/{field}"), "value": value}));
    };
    set("state", state.as_str().into());
    set("filesDone", live.files.load(Ordering::Relaxed).into());
    set("bytesDone", bytes.into());
    set(
        "bytesReflinked",
        live.reflinked.load(Ordering::Relaxed).into(),
    );
    set("failed", live.failed.load(Ordering::Relaxed).into());
    set("bytesPerSecond", (rate as i64).into());
    set("failures", failures.into());
    if let Some((files, bytes)) = planned {
        set("plannedFiles", files.into());
        set("plannedBytes", bytes.into());
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))?;
    let ns = job.namespace().unwrap_or_default();
    let pp = PatchParams {
        field_manager: Some(ferry_crds::agent_manager(&settings.node, &shard.id)),
        ..Default::default()
    };
    Api::<CopyJob>::namespaced(agent.client.clone(), &ns)
        .patch_status(&job.name_any(), &pp, &Patch::<()>::Json(patch))
        .await?;
    // The gauges follow what the status says, after it says it (a dry run copies nothing).
    if !job.spec.dry_run {
        let bytes_total = match state {
            // A finished shard carried what it did, whatever its count said beforehand.
            ShardState::Succeeded => Some(bytes),
            _ => planned.map(|p| p.1.max(0) as u64),
        };
        crate::serve::metrics().shard_progress(
            &ns,
            &job.name_any(),
            &shard.id,
            crate::serve::ShardProgress {
                files_done: live.files.load(Ordering::Relaxed),
                bytes_done: bytes,
                bytes_total,
            },
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_may_commit_only_while_the_heartbeat_has_held_without_a_gap_since_it_began() {
        let fence = Fence::new(3);
        assert!(
            !fence.holds(),
            "nothing may be committed before the first renewal"
        );
        fence.renewed(std::time::Instant::now());
        assert!(fence.holds());
        let run = fence.lapses.load(Ordering::SeqCst);
        assert!(fence.holds_since(run));
        // A renewal sent long ago (the agent was frozen or cut off) has already run out...
        let long_ago = std::time::Instant::now() - Duration::from_secs(10);
        let fence = Fence {
            base: long_ago - Duration::from_secs(1),
            ..Fence::new(3)
        };
        fence.renewed(long_ago);
        let run = fence.lapses.load(Ordering::SeqCst);
        assert!(!fence.holds() && !fence.holds_since(run));
        // ...and the next renewal brings the agent back, but not the runs from before the gap.
        fence.renewed(std::time::Instant::now());
        assert!(fence.holds());
        assert!(
            !fence.holds_since(run),
            "a run from before the gap must stay fenced"
        );
        assert!(
            fence.holds_since(run + 1),
            "a run started after it may commit"
        );
    }
}
