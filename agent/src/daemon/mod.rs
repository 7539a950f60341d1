//! `ferry-agent run`: one per node. Heartbeats a Lease, watches CopyJobs for shards
//! assigned to its node, runs each on the engine (on its own OS thread, never on a tokio
//! worker) and publishes the shard's progress under its own field manager, as a JSON
//! patch of only its shard's progress fields that the API server applies only while the
//! shard is still this node's at this epoch (see `publish`).
//!
//! This module is the watch loop: it starts the runs of the shards given to this node
//! and stops those no longer its own. `fence` keeps the heartbeat, `shard` runs one
//! shard (`error`: why a run ended without a state of its own), `publish` writes its
//! status, `manifest` joins a split job's manifests.

mod certs;
mod devices;
mod error;
mod exports;
mod fence;
mod job_options;
mod journal;
mod manifest;
mod network;
mod peer_identity;
mod publish;
mod roots;
mod settings;
mod shard;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_crds::{CopyJob, Phase, ShardState};
use futures::StreamExt;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

pub use fence::{lease_name, Fence};
pub use peer_identity::{PeerIdentity, PeeringTls};
pub use settings::Settings;

use publish::Target;
use shard::{Active, Node};

use crate::lock;

/// How often every known job is looked at again, for what no watch event announces: a
/// shard whose older run (a stale epoch) has just stopped, a heartbeat that came back.
const RESCAN_EVERY: Duration = Duration::from_secs(3);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("connect to the Kubernetes API")]
    Connect(#[source] kube::Error),
    #[error("create the agent's state directory under {}", host_root.display())]
    State {
        host_root: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("listen on {addr} for /metrics and /healthz")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listen on {addr} for the transfer port (--transfer-listen)")]
    TransferListen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listen on {addr} for the peering port (--peering-listen)")]
    PeeringListen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// What every shard task shares.
struct Agent {
    node: Node,
    /// Running shards by `<job uid>/<shard id>`.
    running: Mutex<HashMap<String, Arc<Active>>>,
    /// Runs this process finished, by `<job uid>/<shard id>/<epoch>`: a stale event
    /// (published before the final state) must not start one again.
    finished: Mutex<HashSet<String>>,
}

pub async fn run(settings: Settings) -> Result<(), RunError> {
    let journals = Arc::new(
        journal::Journals::open(&settings.host_root).map_err(|source| RunError::State {
            host_root: settings.host_root.clone(),
            source,
        })?,
    );
    let client = Client::try_default().await.map_err(RunError::Connect)?;
    let health = Arc::new(crate::serve::Health {
        lease_seconds: i64::from(settings.lease_seconds),
        ..Default::default()
    });
    let metrics = crate::serve::init_metrics(&settings.node);
    let (listener, addr) = tokio::net::TcpListener::bind(settings.listen)
        .await
        .and_then(|l| l.local_addr().map(|addr| (l, addr)))
        .map_err(|source| RunError::Listen {
            addr: settings.listen,
            source,
        })?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    tokio::spawn(ferry_serve::serve(
        listener,
        Arc::new(crate::serve::AgentEndpoints {
            metrics,
            health: health.clone(),
        }),
    ));
    let (store, writer) = reflector::store();
    let mut settings = settings;
    let mut identity = None;
    if let Some(addr) = settings.transfer_listen {
        // The transfer port, with this node's certificate (asked for now): where receivers
        // reach the sources this node is made the sender of, as the operator's tickets say.
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::TransferListen { addr, source })?;
        let bound = listener.local_addr().unwrap_or(addr);
        let pod_ip = std::env::var("POD_IP").ok();
        settings.transfer_address = Some(advertised(
            settings.transfer_address.take(),
            bound,
            pod_ip.as_deref(),
        ));
        tracing::info!(addr = %bound, advertised = ?settings.transfer_address, "serving the transfer port");
        let tls = certs::start(
            client.clone(),
            settings.node.clone(),
            settings.namespace.clone(),
        );
        tokio::spawn(crate::transfer::serve(
            listener,
            tls.clone(),
            Arc::new(network::SenderGrants {
                client: client.clone(),
                settings: settings.clone(),
                jobs: store.clone(),
            }),
        ));
        identity = Some(tls);
    }
    let mut peering = None;
    if let Some(addr) = settings.peering_listen {
        // The peering port, with this node's peering certificate (asked for now).
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::PeeringListen { addr, source })?;
        let bound = listener.local_addr().unwrap_or(addr);
        let pod_ip = std::env::var("POD_IP").ok();
        settings.peering_address = Some(advertised(
            settings.peering_address.take(),
            bound,
            pod_ip.as_deref(),
        ));
        tracing::info!(addr = %bound, advertised = ?settings.peering_address, "serving the peering port");
        let identity = peer_identity::start(client.clone(), settings.node.clone());
        // The exports it may serve: every CopyExport of this install, watched (their
        // status, which only the operator writes, lists the credentials' hashes).
        let (exports, writer) = reflector::store();
        let watched = reflector(
            writer,
            watcher(
                Api::<ferry_crds::CopyExport>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .for_each(|_| futures::future::ready(()));
        tokio::spawn(watched);
        let grants = Arc::new(exports::ExportGrants {
            client: client.clone(),
            settings: settings.clone(),
            exports,
            identity: identity.clone(),
            holders: Arc::default(),
        });
        tokio::spawn(crate::peering::serve(listener, identity.clone(), grants));
        peering = Some(identity);
    }
    let fence = Arc::new(Fence::new(settings.lease_seconds));
    tokio::spawn(fence::heartbeat(
        client.clone(),
        settings.clone(),
        health.clone(),
        fence.clone(),
    ));
    let agent = Arc::new(Agent {
        node: Node {
            client: client.clone(),
            settings: settings.clone(),
            fence,
            flushes: Arc::default(),
            journals: journals.clone(),
            identity,
            peering,
        },
        running: Mutex::default(),
        finished: Mutex::default(),
    });
    // Only the jobs the operator labelled for this node (ferry_crds::node_label), and
    // without their managedFields: an agent holds the jobs it works on, not the cluster's.
    let jobs = Api::<CopyJob>::all(client.clone());
    let mine = watcher::Config::default().labels(&ferry_crds::node_label(&settings.node));
    let mut stream = reflector(
        writer,
        watcher(jobs, mine).modify(|job| job.managed_fields_mut().clear()),
    )
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
        let (agent, store, health) = (agent.clone(), store.clone(), health.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RESCAN_EVERY).await;
                let jobs = store.state();
                metrics.jobs_watched.set(jobs.len() as i64);
                for job in &jobs {
                    agent.consider(job);
                }
                // Only from a complete list (the watch has listed once): journals of jobs
                // finished or deleted go, and so does what this agent holds of jobs it no
                // longer sees (a re-list after an outage sends no deletions).
                if health.watching.load(Ordering::Relaxed) {
                    let seen: HashSet<String> = jobs.iter().filter_map(|j| j.uid()).collect();
                    agent.keep_only(&seen);
                    forget_finished(&journals, &jobs).await;
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
                // job exists (or is labelled for this node), and go with it.
                let (ns, name) = job_key(&job);
                metrics.forget_job(&ns, &name);
                // Deleted, or no longer labelled for this node: nothing of it runs here.
                agent.let_go(&job);
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

/// Where other agents reach this one's transfer port: as told (`--transfer-address`), else
/// the address it is bound to, or, bound to every address (0.0.0.0, [::]), the pod's IP
/// (`POD_IP`, from the downward API) with its port.
fn advertised(told: Option<String>, bound: std::net::SocketAddr, pod_ip: Option<&str>) -> String {
    if let Some(a) = told {
        return a;
    }
    match pod_ip.and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) {
        Some(ip) if bound.ip().is_unspecified() => {
            std::net::SocketAddr::new(ip, bound.port()).to_string()
        }
        _ => bound.to_string(),
    }
}

/// Remove the journals of jobs that are finished or gone: nothing resumes them.
async fn forget_finished(journals: &Arc<journal::Journals>, jobs: &[Arc<CopyJob>]) {
    let keep: HashSet<String> = jobs
        .iter()
        .filter(|j| {
            let phase = j.status.as_ref().and_then(|s| s.phase);
            !matches!(phase, Some(Phase::Succeeded | Phase::Failed))
        })
        .filter_map(|j| j.uid())
        .collect();
    let journals = journals.clone();
    let forgotten = tokio::task::spawn_blocking({
        let journals = journals.clone();
        move || journals.forget_records(journal::RECORDS_KEPT)
    });
    match forgotten.await {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::info!(destinations = n, "removed records no job wrote for 90 days"),
        Ok(Err(e)) => tracing::warn!(error = %e, "removing old records failed"),
        Err(e) => tracing::warn!(error = %e, "removing old records failed"),
    }
    match tokio::task::spawn_blocking(move || journals.retain(&keep)).await {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::info!(jobs = n, "removed the journals of finished or deleted jobs"),
        Ok(Err(e)) => tracing::warn!(error = %e, "removing old journals failed"),
        Err(e) => tracing::warn!(error = %e, "removing old journals failed"),
    }
}

impl Agent {
    /// Stop the runs of a job this agent no longer sees (deleted, or its shards no longer
    /// on this node), as a run given to another node stops, and forget its finished runs.
    fn let_go(&self, job: &CopyJob) {
        let uid = job.uid().unwrap_or_default();
        self.let_go_where(|u| u == uid);
    }

    /// [`Agent::let_go`] of every job whose uid is not in `seen`: the set of finished runs
    /// stays as small as the jobs this node works on.
    fn keep_only(&self, seen: &HashSet<String>) {
        self.let_go_where(|u| !seen.contains(u));
    }

    /// Stop the runs, and forget the finished runs, of the jobs whose uid is `gone`. Keys
    /// are `<job uid>/<shard id>[/<epoch>]`.
    fn let_go_where(&self, gone: impl Fn(&str) -> bool) {
        let uid_of = |key: &str| key.split('/').next().unwrap_or_default().to_string();
        for (key, active) in lock(&self.running).iter() {
            if gone(&uid_of(key)) && !active.fenced.swap(true, Ordering::Relaxed) {
                active.cancel.store(true, Ordering::Relaxed);
                tracing::warn!(shard = %key, "the job is no longer this node's to run: stopping");
            }
        }
        lock(&self.finished).retain(|k| !gone(&uid_of(k)));
    }

    /// Stop every running shard when this agent may no longer hold work (its heartbeat has
    /// not been renewed for two thirds of a lease); they publish nothing (see run_shard).
    fn fence_if_stale(&self) {
        if self.node.fence.holds() {
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
        // By uid: a job deleted and created again under its name is another job, whose
        // shards (same ids, same first epoch) must not pass for the old one's.
        let prefix = format!("{}/", job.uid().unwrap_or_default());
        let deleting = job.metadata.deletion_timestamp.is_some();
        // A shard runs only for the spec it was cut for: a spec changed since (the CRD's
        // rule refuses that; this holds without it) is the operator's to fail, never this
        // agent's to copy and report as verified.
        let digest = status
            .shards
            .iter()
            .any(|s| !s.spec_digest.is_empty())
            .then(|| job.spec.digest());
        let cut_for_spec = |s: &ferry_crds::ShardStatus| {
            s.spec_digest.is_empty() || Some(&s.spec_digest) == digest.as_ref()
        };
        // Stop runs this job no longer wants here: suspended or deleted (they publish
        // where they stopped), or given to another node or epoch (they stop silently; the
        // API server would refuse what they publish).
        for (key, active) in lock(&self.running).iter() {
            let Some(id) = key.strip_prefix(&prefix) else {
                continue;
            };
            let mine = status.shards.iter().any(|s| {
                s.id == id
                    && s.node == self.node.settings.node
                    && s.epoch == active.epoch
                    && !s.failed_by_operator()
                    && cut_for_spec(s)
            });
            if !mine && !active.fenced.swap(true, Ordering::Relaxed) {
                active.cancel.store(true, Ordering::Relaxed);
                tracing::warn!(shard = %key, epoch = active.epoch, "the shard was given to another node or epoch, or the spec changed: stopping");
            } else if job.spec.suspend || deleting {
                if deleting {
                    active.deleting.store(true, Ordering::Relaxed);
                }
                if !active.cancel.swap(true, Ordering::Relaxed) {
                    tracing::info!(shard = %key, deleting, "stopping shard");
                }
            }
        }
        if job.spec.suspend || deleting || !self.node.fence.holds() {
            return;
        }
        for (index, shard) in status.shards.iter().enumerate() {
            if shard.node != self.node.settings.node || shard.progress.state.over() {
                continue;
            }
            if !cut_for_spec(shard) {
                tracing::warn!(job = %job.name_any(), shard = %shard.id, "the job's spec changed since its shard was cut: not running it");
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
                // At most max_shards at once (stopping ones too: they still hold their
                // workers and buffers); the rest stay Pending until a rescan finds a slot.
                if r.len() >= self.node.settings.max_shards {
                    tracing::debug!(shard = %key, running = r.len(), "all shard slots taken: waiting");
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
                let state = shard::run(&agent.node, target, &active).await;
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

#[cfg(test)]
mod tests {
    use super::advertised;

    #[test]
    fn the_transfer_address_is_the_one_told_else_the_bound_one_else_the_pods_ip() {
        let any: std::net::SocketAddr = "0.0.0.0:7450".parse().expect("addr");
        let one: std::net::SocketAddr = "127.0.0.2:7450".parse().expect("addr");
        assert_eq!(
            advertised(Some("proxy:1".into()), any, Some("10.0.0.9")),
            "proxy:1"
        );
        assert_eq!(advertised(None, one, Some("10.0.0.9")), "127.0.0.2:7450");
        assert_eq!(advertised(None, any, Some("10.0.0.9")), "10.0.0.9:7450");
        assert_eq!(advertised(None, any, Some("fd00::9")), "[fd00::9]:7450");
        // No pod IP (or a bad one): the bound address, which says it is unusable as is.
        assert_eq!(advertised(None, any, Some("x")), "0.0.0.0:7450");
    }
}
