//! The CopyJob reconciler, in the controller-rs shape: `reconcile` only dispatches through
//! the finalizer to an idempotent `apply` or `cleanup`; `error_policy` requeues transient
//! errors with backoff, while refusals are written as conditions and wait for a change.
//!
//! `apply` validates the spec, resolves both endpoints to host paths on nodes, cuts the
//! job into shards and hands them to live agents (taking them back from lost ones), then
//! sums the agents' progress into the job's phase, conditions and events.

use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{
    ConditionType, CopyJob, Endpoint, FailedPath, ManifestName, Part, Phase, Plan, Progress,
    Reason, ShardState, ShardStatus, StorageRoot, FINALIZER, OPERATOR_MANAGER,
};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};

use crate::heartbeat::Heartbeats;
use crate::schedule;
use crate::validate;
use crate::volume::{self, Nodes, PvAccess, Volume};

/// Errors that are worth a retry (the API server, the network).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("{0} has no namespace")]
    NoNamespace(String),
    /// Not a failure: deletion waits for these nodes' agents to stop their shards.
    #[error("waiting for the agents on {0} to stop")]
    Stopping(String),
}

/// Shared state of the reconciler.
#[allow(missing_debug_implementations)] // Recorder is not Debug
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub heartbeats: Arc<Heartbeats>,
    /// How long node-local work waits for a lost node before failing `NodeUnavailable`.
    pub node_deadline: Duration,
}

/// Why a job cannot proceed, as a condition reason and a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub condition: ConditionType,
    pub reason: Reason,
    pub message: String,
}

/// Run the controller until the process is stopped. `health` gets the controller's
/// CopyJob cache (readiness waits for its first list; scrapes count jobs from it).
pub async fn run(
    client: Client,
    metrics: Arc<crate::metrics::Metrics>,
    health: &crate::metrics::Health,
    node_deadline: Duration,
) {
    let jobs = Api::<CopyJob>::all(client.clone());
    let reporter = Reporter {
        controller: OPERATOR_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    // The agents' heartbeats, cached: every reconcile asks who is alive.
    let (leases, lease_writer) = reflector::store::<Lease>();
    let lease_api = Api::<Lease>::namespaced(client.clone(), &agent_namespace());
    tokio::spawn(
        reflector(lease_writer, watcher(lease_api, watcher::Config::default()))
            .default_backoff()
            .for_each(|_| async {}),
    );
    if leases.wait_until_ready().await.is_err() {
        tracing::warn!("the agents' Lease watch ended before its first list");
    }
    let heartbeats = Arc::new(Heartbeats::new(leases));
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics,
        heartbeats: heartbeats.clone(),
        node_deadline,
    });
    // An agent that comes or goes changes no CopyJob, and a Lease that expires sends no
    // event at all: so the set of live agents is watched here, and every job is looked at
    // again when it changes (rare: a node lost or added).
    let (flip_tx, flip_rx) = futures::channel::mpsc::channel::<()>(1);
    tokio::spawn(async move {
        let mut flip_tx = flip_tx;
        let mut last = heartbeats.live();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = heartbeats.live();
            if now != last {
                tracing::info!(live = ?now, was = ?last, "agents changed");
                last = now;
                // A full channel already holds a pending "look again".
                let _ = flip_tx.try_send(());
            }
        }
    });
    // What Controller::new builds, with a look at the events on the way: the first
    // InitDone (the watch has listed every job) makes this replica ready.
    let (reader, writer) = reflector::store();
    let listed = health.watch_listed();
    let trigger = reflector(writer, watcher(jobs, watcher::Config::default()))
        .inspect(move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                listed();
            }
        })
        .applied_objects();
    health.set_store(reader.clone());
    Controller::for_stream(trigger, reader)
        .reconcile_all_on(flip_rx)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::warn!(error = %e, "reconcile failed");
            }
        })
        .await;
}

/// One reconcile, timed and its errors counted by kind.
async fn reconcile(job: Arc<CopyJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_job(job, &ctx).await;
    ctx.metrics
        .reconciled(started.elapsed(), result.as_ref().err());
    result
}

async fn reconcile_job(job: Arc<CopyJob>, ctx: &Context) -> Result<Action, Error> {
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(job.name_any()))?;
    let api = Api::<CopyJob>::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, job, |event| async {
        match event {
            Event::Apply(job) => apply(&job, ctx).await,
            Event::Cleanup(job) => cleanup(&job, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn error_policy(_job: Arc<CopyJob>, error: &Error, _ctx: Arc<Context>) -> Action {
    let stopping = match error {
        Error::Stopping(_) => true,
        Error::Finalizer(e) => matches!(
            **e,
            kube::runtime::finalizer::Error::CleanupFailed(Error::Stopping(_))
        ),
        _ => false,
    };
    if stopping {
        tracing::info!(%error, "deletion waits");
        return Action::requeue(Duration::from_millis(500));
    }
    tracing::warn!(%error, "requeueing");
    Action::requeue(Duration::from_secs(5))
}

fn condition(
    type_: ConditionType,
    ok: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time when nothing changed, so a re-reconcile writes the same bytes.
    let last = previous
        .iter()
        .find(|c| c.type_ == type_.as_str() && c.status == status && c.reason == reason.as_str())
        .map_or_else(
            || Time(Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
    Condition {
        type_: type_.to_string(),
        status: status.into(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: last,
    }
}

/// Resolve a PVC endpoint: a claim in the job's own namespace, bound to a `local` or
/// `hostPath` PersistentVolume whose node affinity says where it lives, or to a CSI volume
/// reached through the kubelet's mount for a pod that uses the claim, on that pod's node.
async fn resolve_pvc(
    ctx: &Context,
    ns: &str,
    field: &str,
    claim: &str,
) -> Result<Result<Volume, Blocked>, Error> {
    let unresolved = |reason: Reason, message: String| {
        Ok(Err(Blocked {
            condition: ConditionType::Resolved,
            reason,
            message,
        }))
    };
    let Some(pvc) = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns)
        .get_opt(claim)
        .await?
    else {
        return unresolved(Reason::PVCNotFound, format!("{field}.pvc: no PersistentVolumeClaim {claim:?} in namespace {ns:?} (claims of other namespaces cannot be used)"));
    };
    let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return unresolved(
            Reason::PVCNotBound,
            format!("{field}.pvc: claim {claim:?} is not bound to a volume yet"),
        );
    };
    let Some(pv) = Api::<PersistentVolume>::all(ctx.client.clone())
        .get_opt(&pv_name)
        .await?
    else {
        return unresolved(
            Reason::PVCNotBound,
            format!("{field}.pvc: claim {claim:?} names volume {pv_name:?}, which does not exist"),
        );
    };
    // A volume pre-bound to another claim is not this claim's, whatever the claim says.
    if let Some(cr) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        if cr.namespace.as_deref() != Some(ns) || cr.name.as_deref() != Some(claim) {
            return Ok(Err(Blocked {
                condition: ConditionType::Accepted,
                reason: Reason::CrossNamespace,
                message: format!("{field}.pvc: volume {pv_name:?} belongs to another claim; use a claim bound to it in namespace {ns:?}"),
            }));
        }
    }
    match volume::from_pv(&pv) {
        Ok(PvAccess::Direct(v)) => Ok(Ok(v)),
        Ok(PvAccess::Csi) => {
            // The claim's pods live in its namespace; the kubelet mounts the volume for them.
            let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
                .list(&ListParams::default())
                .await?;
            match volume::from_csi_mount(&volume::kubelet_dir(), &pv_name, claim, &pods.items) {
                Some(v) => Ok(Ok(v)),
                None => unresolved(
                    Reason::VolumeNotMounted,
                    format!("{field}.pvc: CSI volume {pv_name:?} is only reachable while a pod mounts it; start a pod in namespace {ns:?} that mounts claim {claim:?} (a pause pod is enough) and Ferry will copy on that pod's node"),
                ),
            }
        }
        Err(why) => unresolved(
            Reason::VolumeNotSupported,
            format!("{field}.pvc: volume {pv_name:?}: {why}"),
        ),
    }
}

/// Resolve one endpoint to a host path and the nodes that have it.
async fn resolve(
    ctx: &Context,
    ns: &str,
    field: &str,
    e: &Endpoint,
    destination: bool,
) -> Result<Result<Volume, Blocked>, Error> {
    if let Some(claim) = &e.pvc {
        return resolve_pvc(ctx, ns, field, claim).await;
    }
    Ok(resolve_root(ctx, ns, field, e, destination)
        .await?
        .map(|root| Volume {
            host_path: root.spec.path.clone(),
            shared: root.spec.shared,
            nodes: match (&root.spec.node_selector, root.spec.shared) {
                (Some(sel), _) => Nodes::Labels(sel.clone()),
                (None, true) => Nodes::All,
                // Admission refuses this; no node has it.
                (None, false) => Nodes::Terms(Vec::new()),
            },
        }))
}

/// Resolve one `root` endpoint: the StorageRoot exists, this namespace may use it, and a
/// destination is not read-only.
async fn resolve_root(
    ctx: &Context,
    ns: &str,
    field: &str,
    e: &Endpoint,
    destination: bool,
) -> Result<Result<StorageRoot, Blocked>, Error> {
    let name = e.root.as_deref().unwrap_or_default();
    let roots = Api::<StorageRoot>::all(ctx.client.clone());
    let Some(root) = roots.get_opt(name).await? else {
        return Ok(Err(Blocked {
            condition: ConditionType::Resolved,
            reason: Reason::RootNotFound,
            message: format!("{field}.root: StorageRoot {name:?} does not exist; ask an admin to create it or name another"),
        }));
    };
    let access = &root.spec.namespaces;
    let mut allowed = access.names.iter().any(|n| n == ns);
    if !allowed {
        if let Some(selector) = &access.selector {
            let namespace = Api::<Namespace>::all(ctx.client.clone()).get(ns).await?;
            allowed = selector_matches(selector, namespace.labels());
        }
    }
    if !allowed {
        return Ok(Err(Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::RootNotAllowed,
            message: format!(
                "{field}.root: namespace {ns:?} may not use StorageRoot {name:?}; ask an admin to add it to spec.namespaces"
            ),
        }));
    }
    if destination && root.spec.read_only {
        return Ok(Err(Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::ReadOnlyRoot,
            message: format!(
                "{field}.root: StorageRoot {name:?} is read-only and cannot be a destination"
            ),
        }));
    }
    Ok(Ok(root))
}

/// `matchLabels` and `matchExpressions` (In, NotIn, Exists, DoesNotExist) against labels.
pub fn selector_matches(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => labels.get(&req.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&req.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&req.key),
            "DoesNotExist" => !labels.contains_key(&req.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// Namespace of the agents' heartbeat Leases (the operator's own namespace).
fn agent_namespace() -> String {
    std::env::var("FERRY_NAMESPACE").unwrap_or_else(|_| "ferry-system".into())
}

/// Nodes that can run a job between these roots: they match both roots' node selectors
/// and their agent's heartbeat Lease is current. Sorted by name, so placement is stable.
async fn eligible_nodes(ctx: &Context, volumes: &[Volume]) -> Result<Vec<String>, Error> {
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    let live = ctx.heartbeats.live();
    let mut out: Vec<String> = nodes
        .items
        .iter()
        .filter(|n| {
            volumes
                .iter()
                .all(|v| v.nodes.matches(&n.name_any(), n.labels()))
        })
        .map(|n| n.name_any())
        .filter(|n| live.contains(n))
        .collect();
    out.sort();
    Ok(out)
}

/// 1536 -> "1.5 KiB": for the RATE column.
fn human_bytes(n: i64) -> String {
    let mut v = n as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if v < 1024.0 {
            return if unit == "B" {
                format!("{n} B")
            } else {
                format!("{v:.1} {unit}")
            };
        }
        v /= 1024.0;
    }
    format!("{v:.1} TiB")
}

/// 200 -> "3m20s": for the ETA column.
fn human_duration(secs: i64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The phase, progress and failures the shards add up to.
pub fn aggregate(shards: &[ShardStatus]) -> (Phase, Progress, Vec<FailedPath>) {
    let mut p = Progress::default();
    let mut failures = Vec::new();
    for s in shards {
        p.files_done += s.files_done;
        p.bytes_done += s.bytes_done;
        p.bytes_reflinked += s.bytes_reflinked;
        p.bytes_per_second += s.bytes_per_second;
        failures.extend(s.failures.iter().cloned());
    }
    if p.bytes_per_second > 0 {
        p.rate = Some(format!("{}/s", human_bytes(p.bytes_per_second)));
    }
    // Totals once every copying shard has counted its part (the directories pass copies
    // no files); then the PROGRESS and ETA columns.
    let counted: Vec<&ShardStatus> = shards
        .iter()
        .filter(|s| s.part != Part::Directories)
        .collect();
    if !counted.is_empty() && counted.iter().all(|s| s.planned_files.is_some()) {
        let files: i64 = counted.iter().filter_map(|s| s.planned_files).sum();
        let bytes: i64 = counted.iter().filter_map(|s| s.planned_bytes).sum();
        p.files_total = Some(files);
        p.bytes_total = Some(bytes);
        if bytes > 0 {
            let pct = (p.bytes_done as f64 * 100.0 / bytes as f64).min(100.0);
            p.percent = Some(format!("{pct:.0}%"));
        } else if files > 0 {
            let pct = (p.files_done as f64 * 100.0 / files as f64).min(100.0);
            p.percent = Some(format!("{pct:.0}%"));
        }
        if p.bytes_per_second > 0 && bytes > p.bytes_done {
            p.eta = Some(human_duration(
                (bytes - p.bytes_done) / p.bytes_per_second + 1,
            ));
        }
    }
    p.bytes_copied = p.bytes_done - p.bytes_reflinked;
    failures.truncate(20);
    let done = |s: &&ShardStatus| s.state.finished();
    let phase = if shards.is_empty() {
        Phase::Pending
    } else if shards.iter().all(|s| s.state == ShardState::Succeeded) {
        p.percent = Some("100%".into());
        p.eta = None;
        Phase::Succeeded
    } else if shards.iter().all(|s| done(&s)) {
        Phase::Failed
    } else if shards
        .iter()
        .any(|s| s.state == ShardState::Running || done(&s))
    {
        Phase::Running
    } else {
        Phase::Pending
    };
    (phase, p, failures)
}

/// Why a failed job failed, and a message that says what to do: what stopped a shard (a
/// full destination, a lost node, a refused path), else `IOError` when the volume returned
/// read or write errors, else `PartiallyFailed`: some entries failed, the rest was copied.
pub fn failed_reason(shards: &[ShardStatus], failures: &[FailedPath]) -> (Reason, String) {
    let failed: i64 = shards.iter().map(|s| s.failed).sum::<i64>().max(1);
    let files: i64 = shards.iter().map(|s| s.files_done).sum();
    let first = |reason: Reason| failures.iter().find(|f| f.reason == reason);
    for reason in Reason::STOPS_SHARD {
        if let Some(f) = first(reason) {
            let at = if f.path == "." {
                String::new()
            } else {
                format!("{}: ", f.path)
            };
            return (reason, format!("{at}{}", f.message));
        }
    }
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for f in failures {
        *counts.entry(f.reason.as_str()).or_default() += 1;
    }
    let kinds = counts
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let paths = failures
        .iter()
        .take(3)
        .map(|f| f.path.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let reason = if first(Reason::IOError).is_some() {
        Reason::IOError
    } else {
        Reason::PartiallyFailed
    };
    let what = if reason == Reason::IOError {
        "the volume returned I/O errors (each file was read and written twice); check the device"
    } else {
        "fix them and re-create the job to copy the rest (what was copied is kept)"
    };
    (
        reason,
        format!(
            "{failed} entries failed ({kinds}), e.g. {paths}; {files} files were copied. \
             {what}; the failing paths are in status.failures"
        ),
    )
}

/// Validate the spec and resolve both endpoints into `roots`; `Some` when it cannot go on.
async fn check(
    ctx: &Context,
    ns: &str,
    job: &CopyJob,
    roots: &mut Vec<Volume>,
) -> Result<Option<Blocked>, Error> {
    if let Err(refusal) = validate::validate(&job.spec) {
        return Ok(Some(Blocked {
            condition: ConditionType::Accepted,
            reason: refusal.reason,
            message: refusal.message,
        }));
    }
    match resolve(ctx, ns, "spec.source", &job.spec.source, false).await? {
        Err(b) => return Ok(Some(b)),
        Ok(src) => roots.push(src),
    }
    match resolve(ctx, ns, "spec.destination", &job.spec.destination, true).await? {
        Err(b) => return Ok(Some(b)),
        Ok(dst) => roots.push(dst),
    }
    Ok(None)
}

/// What `decide` adds to a reconcile besides the shards.
#[derive(Default)]
struct Decided {
    conditions: Vec<Condition>,
    /// A dry run of a job that would be split: (shards, nodes) it would use.
    shape: Option<(i64, Vec<String>)>,
    /// Events to publish once the status that explains them is written.
    notes: Vec<KubeEvent>,
}

/// The Accepted, Resolved and Scheduled conditions, and the shards: created on first
/// resolution, then handed to idle agents. Returns when to look again, if no status
/// change is bound to trigger it.
async fn decide(
    ctx: &Context,
    job: &CopyJob,
    blocked: &Option<Blocked>,
    roots: &[Volume],
    shards: &mut Vec<ShardStatus>,
    out: &mut Decided,
) -> Result<Option<Duration>, Error> {
    let Decided {
        conditions,
        shape,
        notes,
    } = out;
    let generation = job.metadata.generation;
    let old = job.status.clone().unwrap_or_default();
    let previous = old.conditions.as_slice();
    conditions.push(match blocked {
        Some(b) if b.condition == ConditionType::Accepted => condition(
            ConditionType::Accepted,
            false,
            b.reason,
            &b.message,
            generation,
            previous,
        ),
        _ => condition(
            ConditionType::Accepted,
            true,
            Reason::Valid,
            "the spec is valid",
            generation,
            previous,
        ),
    });
    match blocked {
        Some(b) if b.condition == ConditionType::Accepted => return Ok(None),
        Some(b) => {
            conditions.push(condition(
                ConditionType::Resolved,
                false,
                b.reason,
                &b.message,
                generation,
                previous,
            ));
            return Ok(None);
        }
        None => conditions.push(condition(
            ConditionType::Resolved,
            true,
            Reason::Resolved,
            "source and destination resolved",
            generation,
            previous,
        )),
    }
    let max_agents = job.spec.parallelism.max_agents.max(1);
    // Split only where every agent sees the same files on both sides. A dry run counts
    // the whole tree on one agent and reports the split it would make.
    let splittable = max_agents > 1 && roots.iter().all(|r| r.shared);
    let split = splittable && !job.spec.dry_run;
    if shards.is_empty() {
        *shards = schedule::initial(
            split.then(|| schedule::parts_for(max_agents)),
            &roots[0].host_path,
            &roots[1].host_path,
        );
    }
    let mut requeue = None;
    // Work held by agents that stopped heartbeating: moved on shared roots, waited for
    // (then failed) on node-local ones.
    let lost = schedule::handle_lost(
        shards,
        |node| ctx.heartbeats.lost_for(node),
        roots.iter().all(|r| r.shared),
        job.spec.suspend,
        ctx.node_deadline,
    );
    for (id, node) in &lost.failed {
        notes.push(KubeEvent {
            type_: EventType::Warning,
            reason: Reason::NodeUnavailable.to_string(),
            note: Some(format!(
                "shard {id}: the agent on node {node} did not come back within {}s",
                ctx.node_deadline.as_secs()
            )),
            action: "Schedule".into(),
            secondary: None,
        });
    }
    if let Some(left) = lost.next_deadline {
        requeue = Some(left + Duration::from_millis(100));
    }
    if shards.iter().any(|s| s.node.is_empty()) || (job.spec.dry_run && splittable) {
        let eligible = eligible_nodes(ctx, roots).await?;
        schedule::assign(shards, &eligible, max_agents as usize);
        for (id, from) in &lost.moved {
            let to = shards.iter().find(|s| &s.id == id).map(|s| s.node.as_str());
            let note = match to {
                Some(to) if !to.is_empty() => format!(
                    "shard {id}: the agent on node {from} stopped heartbeating; node {to} resumes it"
                ),
                _ => format!(
                    "shard {id}: the agent on node {from} stopped heartbeating; waiting for another agent"
                ),
            };
            notes.push(KubeEvent {
                type_: EventType::Warning,
                reason: Reason::Reassigned.to_string(),
                note: Some(note),
                action: "Schedule".into(),
                secondary: None,
            });
        }
        if job.spec.dry_run && splittable {
            let nodes: Vec<String> = eligible.into_iter().take(max_agents as usize).collect();
            *shape = Some((i64::from(schedule::parts_for(max_agents)) + 1, nodes));
        }
        // Finishing shards trigger the next assignment; an agent coming up does not.
        if shards.iter().any(|s| s.node.is_empty()) {
            requeue = Some(Duration::from_secs(2));
        }
    }
    let mut nodes: Vec<&str> = shards
        .iter()
        .filter(|s| !s.node.is_empty())
        .map(|s| s.node.as_str())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let (reason, msg) = match (nodes.is_empty(), shards.len()) {
        _ if !lost.waiting.is_empty() => (
            Reason::WaitingForNode,
            format!(
                "the agent on {} stopped heartbeating; the volumes are only reachable there. \
                 Waiting for it (the job fails with NodeUnavailable after {}s)",
                lost.waiting.join(", "),
                ctx.node_deadline.as_secs()
            ),
        ),
        (true, _) => (
            Reason::NoAgent,
            "no node with a live Ferry agent has both volumes; waiting for one".to_string(),
        ),
        (false, 1) => (
            Reason::Assigned,
            format!("assigned to node {}", nodes.join(", ")),
        ),
        (false, n) => (
            Reason::Assigned,
            format!(
                "split into {} parts and a directories pass; nodes {}",
                n - 1,
                nodes.join(", ")
            ),
        ),
    };
    conditions.push(condition(
        ConditionType::Scheduled,
        !nodes.is_empty(),
        reason,
        &msg,
        generation,
        previous,
    ));
    Ok(requeue)
}

async fn apply(job: &CopyJob, ctx: &Context) -> Result<Action, Error> {
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(job.name_any()))?;
    let generation = job.metadata.generation;
    let old = job.status.clone().unwrap_or_default();
    let previous = old.conditions.as_slice();
    let mut roots = Vec::new();
    // A finished job is history: it is not resolved again (a StorageRoot deleted or a
    // pod unmounting a CSI volume afterwards does not turn it back to Pending).
    let finished_before = matches!(old.phase, Some(Phase::Succeeded | Phase::Failed));
    let blocked = if finished_before {
        None
    } else {
        check(ctx, &ns, job, &mut roots).await?
    };
    let mut shards = old.shards.clone();
    let mut requeue = None;
    let mut decided = Decided::default();
    if finished_before {
        // Keep what was decided when it ran.
        decided.conditions.extend(
            previous
                .iter()
                .filter(|c| {
                    [
                        ConditionType::Accepted,
                        ConditionType::Resolved,
                        ConditionType::Scheduled,
                    ]
                    .iter()
                    .any(|t| c.type_ == t.as_str())
                })
                .cloned(),
        );
    } else {
        requeue = decide(ctx, job, &blocked, &roots, &mut shards, &mut decided).await?;
    }
    let Decided {
        mut conditions,
        shape,
        notes,
    } = decided;
    let (phase, progress, failures) = aggregate(&shards);
    let phase = match (&blocked, job.spec.suspend) {
        (Some(_), _) => Phase::Pending,
        (None, true) if !matches!(phase, Phase::Succeeded | Phase::Failed) => Phase::Suspended,
        _ => phase,
    };
    // A dry run's result is its plan: what each shard counted, where it would run.
    let plan = (job.spec.dry_run && phase == Phase::Succeeded).then(|| {
        let (count, nodes) = shape
            .or_else(|| old.plan.as_ref().map(|p| (p.shards, p.nodes.clone())))
            .unwrap_or_else(|| {
                let nodes = shards.iter().map(|s| s.node.clone()).collect();
                (shards.len() as i64, nodes)
            });
        Plan {
            files: shards.iter().filter_map(|s| s.planned_files).sum(),
            bytes: shards.iter().filter_map(|s| s.planned_bytes).sum(),
            nodes,
            shards: count,
        }
    });
    match phase {
        Phase::Succeeded if job.spec.dry_run => {
            let p = plan.clone().unwrap_or_default();
            let msg = format!(
                "dry run: {} files, {} bytes would be copied on {}",
                p.files,
                p.bytes,
                p.nodes.join(", ")
            );
            conditions.push(condition(
                ConditionType::Complete,
                true,
                Reason::Planned,
                &msg,
                generation,
                previous,
            ))
        }
        Phase::Succeeded => conditions.push(condition(
            ConditionType::Complete,
            true,
            Reason::Copied,
            "every file was copied",
            generation,
            previous,
        )),
        Phase::Failed => {
            let (reason, msg) = failed_reason(&shards, &failures);
            conditions.push(condition(
                ConditionType::Failed,
                true,
                reason,
                &msg,
                generation,
                previous,
            ));
        }
        _ => {}
    }
    let finished_at = match phase {
        Phase::Succeeded | Phase::Failed => old
            .finished_at
            .clone()
            .or_else(|| Some(Time(Timestamp::now()))),
        _ => None,
    };
    let manifest = (!shards.is_empty() && !job.spec.dry_run)
        .then(|| ManifestName::new(&ns, &job.name_any()).status_path());
    let assignment_changed = !old
        .shards
        .iter()
        .map(|s| (&s.id, &s.node, s.epoch, &s.part))
        .eq(shards.iter().map(|s| (&s.id, &s.node, s.epoch, &s.part)));
    let unchanged = old.phase == Some(phase)
        && old.conditions == conditions
        && old.progress.as_ref() == Some(&progress)
        && old.failures == failures
        && old.finished_at == finished_at
        && old.manifest == manifest
        && old.plan == plan
        && old
            .shards
            .iter()
            .map(|s| (&s.id, &s.node, s.epoch, &s.part))
            .eq(shards.iter().map(|s| (&s.id, &s.node, s.epoch, &s.part)));
    if !unchanged {
        // The shard entries carry only the assignment: their progress fields belong to the
        // agents' field managers.
        // A shard the operator failed (its node never came back) carries its state and
        // failure too; the operator keeps sending them, or server-side apply would drop them.
        let assignment: Vec<serde_json::Value> = shards
            .iter()
            .map(|s| {
                let mut a = serde_json::json!({
                    "id": s.id, "node": s.node, "epoch": s.epoch, "part": s.part,
                    "sourceRoot": s.source_root, "destinationRoot": s.destination_root,
                });
                if s.failed_by_operator() {
                    a["state"] = s.state.as_str().into();
                    a["failures"] = serde_json::to_value(&s.failures).unwrap_or_default();
                }
                a
            })
            .collect();
        let mut patch = serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "CopyJob",
            "status": {
                "phase": phase,
                "conditions": conditions,
                "progress": progress,
                "shards": assignment,
                "failures": failures,
                "manifest": manifest,
                "finishedAt": finished_at,
                "plan": plan,
            },
        });
        // Handing out shards is decided on what this reconcile read, and the watch cache can
        // lag our own last write: a shard that looks unassigned may already be running
        // somewhere. So an assignment only lands on the version it was decided on; on a
        // conflict the next reconcile decides again from fresher state.
        if assignment_changed {
            patch["metadata"] = serde_json::json!({ "resourceVersion": job.resource_version() });
        }
        let written = Api::<CopyJob>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &job.name_any(),
                &PatchParams::apply(OPERATOR_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await;
        match written {
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(job = %job.name_any(), "assignment raced a newer version; deciding again");
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            other => {
                other?;
            }
        }
        for ev in &notes {
            let _ = ctx.recorder.publish(ev, &job.object_ref(&())).await;
        }
        let new_refusal = blocked.as_ref().filter(|b| {
            !previous
                .iter()
                .any(|c| c.status == "False" && c.reason == b.reason.as_str())
        });
        if let Some(b) = new_refusal {
            let ev = KubeEvent {
                type_: EventType::Warning,
                reason: b.reason.to_string(),
                note: Some(b.message.clone()),
                action: "Reconcile".into(),
                secondary: None,
            };
            // An event is a courtesy; the condition is the record.
            let _ = ctx.recorder.publish(&ev, &job.object_ref(&())).await;
        }
        // A job that just failed says why, once, with the first failing paths.
        if phase == Phase::Failed && old.phase != Some(Phase::Failed) {
            let (reason, msg) = failed_reason(&shards, &failures);
            let ev = KubeEvent {
                type_: EventType::Warning,
                reason: reason.to_string(),
                note: Some(msg),
                action: "Copy".into(),
                secondary: None,
            };
            let _ = ctx.recorder.publish(&ev, &job.object_ref(&())).await;
        }
    }
    // ttlSecondsAfterFinished: delete the finished job once its time is up (the finalizer
    // runs as for any deletion), or come back when it will be.
    if let (Some(ttl), Some(done)) = (job.spec.ttl_seconds_after_finished, &finished_at) {
        let left = done.0.as_second() + ttl - Timestamp::now().as_second();
        if left <= 0 {
            Api::<CopyJob>::namespaced(ctx.client.clone(), &ns)
                .delete(&job.name_any(), &Default::default())
                .await?;
            return Ok(Action::await_change());
        }
        requeue = Some(Duration::from_secs(left as u64));
    }
    // A refusal waits for the spec (or the StorageRoot, on the next resync) to change.
    Ok(match (blocked, requeue) {
        (Some(b), _) if b.reason == Reason::VolumeNotMounted => {
            Action::requeue(Duration::from_secs(5))
        }
        (Some(_), _) => Action::requeue(Duration::from_secs(60)),
        (None, Some(after)) => Action::requeue(after),
        (None, None) => Action::await_change(),
    })
}

/// Deletion: the agents see the deletion timestamp and stop their running shards at the
/// next file boundary (committed files stay; unfinished directories get their names, and
/// no staging name or partial file is left). The finalizer stays until every shard whose
/// agent is alive has stopped, so the job is gone only when nothing writes for it.
async fn cleanup(job: &CopyJob, ctx: &Context) -> Result<Action, Error> {
    let live = ctx.heartbeats.live();
    let running: Vec<&str> = job
        .status
        .iter()
        .flat_map(|s| &s.shards)
        .filter(|s| s.state == ShardState::Running && live.contains(&s.node))
        .map(|s| s.node.as_str())
        .collect();
    if running.is_empty() {
        return Ok(Action::await_change());
    }
    Err(Error::Stopping(running.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_matches_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("team", "a")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["gold".into(), "silver".into()]),
            }]),
        };
        assert!(selector_matches(
            &sel,
            &labels(&[("team", "a"), ("tier", "gold")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("team", "a"), ("tier", "bronze")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("team", "b"), ("tier", "gold")])
        ));
        assert!(!selector_matches(&sel, &labels(&[("tier", "gold")])));
    }

    fn shard(state: ShardState, files: i64) -> ShardStatus {
        ShardStatus {
            id: files.to_string(),
            state,
            files_done: files,
            bytes_done: files * 10,
            ..Default::default()
        }
    }

    #[test]
    fn phase_is_the_sum_of_the_shards() {
        assert_eq!(aggregate(&[]).0, Phase::Pending);
        assert_eq!(
            aggregate(&[shard(ShardState::Pending, 0)]).0,
            Phase::Pending
        );
        assert_eq!(
            aggregate(&[shard(ShardState::Running, 1), shard(ShardState::Pending, 0)]).0,
            Phase::Running
        );
        assert_eq!(
            aggregate(&[shard(ShardState::Failed, 1), shard(ShardState::Running, 2)]).0,
            Phase::Running
        );
        assert_eq!(
            aggregate(&[
                shard(ShardState::Failed, 1),
                shard(ShardState::Succeeded, 2)
            ])
            .0,
            Phase::Failed
        );
        let (phase, progress, _) = aggregate(&[
            shard(ShardState::Succeeded, 3),
            shard(ShardState::Succeeded, 4),
        ]);
        assert_eq!(phase, Phase::Succeeded);
        assert_eq!((progress.files_done, progress.bytes_done), (7, 70));
        assert_eq!(progress.percent.as_deref(), Some("100%"));
    }

    #[test]
    fn totals_percent_and_eta_appear_once_every_part_is_counted() {
        let mut a = shard(ShardState::Running, 1);
        a.bytes_done = 50;
        a.bytes_per_second = 10;
        a.planned_files = Some(4);
        a.planned_bytes = Some(100);
        let mut b = shard(ShardState::Running, 0);
        b.bytes_done = 0;
        let dirs = ShardStatus {
            part: Part::Directories,
            ..Default::default()
        };
        // b has not counted its part yet: no totals, no guess.
        let (_, p, _) = aggregate(&[a.clone(), b.clone(), dirs.clone()]);
        assert_eq!(
            (p.bytes_total, p.percent.as_deref(), p.eta.as_deref()),
            (None, None, None)
        );
        b.planned_files = Some(6);
        b.planned_bytes = Some(100);
        let (phase, p, _) = aggregate(&[a, b, dirs]);
        assert_eq!(phase, Phase::Running);
        assert_eq!((p.files_total, p.bytes_total), (Some(10), Some(200)));
        assert_eq!(p.percent.as_deref(), Some("25%"));
        // 150 bytes left at 10 B/s.
        assert_eq!(p.eta.as_deref(), Some("16s"));
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(7300), "2h01m");
    }

    #[test]
    fn unchanged_condition_keeps_its_transition_time() {
        let first = condition(
            ConditionType::Accepted,
            true,
            Reason::Valid,
            "ok",
            Some(1),
            &[],
        );
        let again = condition(
            ConditionType::Accepted,
            true,
            Reason::Valid,
            "ok",
            Some(2),
            std::slice::from_ref(&first),
        );
        assert_eq!(first.last_transition_time, again.last_transition_time);
    }
}
