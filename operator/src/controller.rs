//! The CopyJob controller's wiring, in the controller-rs shape: `run` watches CopyJobs (and
//! the agents' heartbeats), `reconcile` only dispatches through the finalizer to the
//! idempotent [`apply`] or [`cleanup`], and `error_policy` requeues transient errors with
//! backoff, while refusals are written as conditions and wait for a change.

use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{CopyJob, FINALIZER, OPERATOR_MANAGER};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

pub use crate::apply::Context;
use crate::apply::{apply, cleanup};
use crate::heartbeat::Heartbeats;
pub use crate::Error;

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
        namespace: agent_namespace(),
        ticket_namespace: std::env::var("FERRY_TICKET_NAMESPACE")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(agent_namespace),
        holder_image: crate::holder::image(),
        export_tickets: Default::default(),
        snapshot_sources: std::env::var("FERRY_SNAPSHOT_SOURCES").is_ok_and(|v| v == "true"),
        snapshot_bases: std::env::var("FERRY_SNAPSHOT_BASES").is_ok_and(|v| v == "true"),
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
                tracing::warn!(error = %crate::error_chain(&e), "reconcile failed");
            }
        })
        .await;
}

/// One reconcile, timed and its errors counted by kind.
async fn reconcile(job: Arc<CopyJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_job(job, &ctx).await;
    ctx.metrics
        .reconciled(started.elapsed(), result.as_ref().err().map(|e| e as _));
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
        tracing::info!(error = %crate::error_chain(error), "deletion waits");
        return Action::requeue(Duration::from_millis(500));
    }
    tracing::warn!(error = %crate::error_chain(error), "requeueing");
    Action::requeue(Duration::from_secs(5))
}

/// Namespace of the agents' heartbeat Leases (the operator's own namespace).
fn agent_namespace() -> String {
    std::env::var("FERRY_NAMESPACE").unwrap_or_else(|_| "ferry-system".into())
}
