//! The finalizer's two sides, and the reconciler's I/O: `apply` reads what a decision needs
//! (the endpoints, the heartbeats, the eligible nodes), lets the pure [`decide`] decide,
//! then writes the status by server-side apply, publishes the events that explain it, and
//! deletes a job after `ttlSecondsAfterFinished`; `cleanup` makes a deletion wait for the
//! agents to stop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{CopyJob, CopyJobStatus, Phase, ShardState, ShardStatus, OPERATOR_MANAGER};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::{Api, Client, Resource, ResourceExt};

use crate::decide::{self, Decision, Inputs};
use crate::heartbeat::Heartbeats;
use crate::resolve::{self, Endpoints};
use crate::Error;

/// Shared state of the reconciler.
#[allow(missing_debug_implementations)] // Recorder is not Debug
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub heartbeats: Arc<Heartbeats>,
    /// How long node-local work waits for a lost node before failing `NodeUnavailable`.
    pub node_deadline: Duration,
    /// Ferry's own namespace: the agents' Leases.
    pub namespace: String,
    /// Where the tickets of copies between nodes are (`FERRY_TICKET_NAMESPACE`; the chart
    /// gives them a namespace of their own, see `charts/ferry/templates/tickets.yaml`).
    pub ticket_namespace: String,
    /// What each job reading an export last had written into its ticket.
    pub export_tickets: crate::ticket::Issued,
    /// The image of holder pods (see [`crate::holder`]); `None`: none are made.
    pub holder_image: Option<String>,
    /// Whether snapshot sources may be used (`FERRY_SNAPSHOT_SOURCES=true`: the chart's
    /// `operator.snapshotSources`, which grants what [`crate::snapshot`] needs).
    pub snapshot_sources: bool,
    /// Whether a block snapshot taken for a copy onto a claim is kept as that claim's base
    /// for changed-block tracking (`FERRY_SNAPSHOT_BASES=true`: the chart's
    /// `changedBlockTracking.enabled`; see [`crate::snapshot`]).
    pub snapshot_bases: bool,
}

/// Read what the decision needs (the endpoints, who is lost, the eligible nodes when
/// there is something to hand out), [`decide`], then write the status the operator owns
/// and publish the events that explain it; delete a finished job whose TTL is up.
pub async fn apply(job: &CopyJob, ctx: &Context) -> Result<Action, Error> {
    let ns = job
        .namespace()
        .ok_or_else(|| Error::NoNamespace(job.name_any()))?;
    // Borrowed, not cloned: a status holds up to 65 shards with their failures.
    let unset = CopyJobStatus::default();
    let old = job.status.as_ref().unwrap_or(&unset);
    // A finished job is history: it is not resolved again.
    let mut export = None;
    let mut endpoints = if matches!(old.phase, Some(Phase::Succeeded | Phase::Failed)) {
        Endpoints::Finished
    } else if let Some(b) = snapshot_source(job, ctx, &ns).await? {
        Endpoints::Blocked(b)
    } else {
        match resolve::check(&ctx.client, &ns, job).await? {
            // Another install's export: its Secret read and judged (the job's ticket gets
            // what the receiver dials with).
            resolved @ Endpoints::Resolved { .. } => match &job.spec.source.export {
                Some(secret) => match crate::import::read(&ctx.client, &ns, secret).await? {
                    Ok(t) => {
                        export = Some(t);
                        resolved
                    }
                    Err(b) => Endpoints::Blocked(b),
                },
                None => resolved,
            },
            other => other,
        }
    };
    // A CSI claim no running pod mounts: hold it with a pod of our own (not for a job being
    // deleted), and say what the holders are doing instead of asking the user for a pod.
    if let (Endpoints::Blocked(b), Some(image)) = (&mut endpoints, &ctx.holder_image) {
        if b.reason == ferry_crds::Reason::VolumeNotMounted
            && job.meta().deletion_timestamp.is_none()
        {
            let unmounted = resolve::unmounted_claims(&ctx.client, &ns, job).await?;
            if !unmounted.is_empty() {
                b.message = crate::holder::hold(&ctx.client, &ns, job, &unmounted, image).await?;
            }
        }
    }
    // One look at the heartbeats of the nodes that hold shards of a job being scheduled,
    // so that what decides whether Nodes are listed and what decides with them agree.
    let lost: BTreeMap<&str, Option<Duration>> = match endpoints {
        Endpoints::Resolved { .. } => old
            .shards
            .iter()
            .flat_map(|s| std::iter::once(s.node.as_str()).chain(s.sender.as_deref()))
            .filter(|n| !n.is_empty() && *n != ferry_crds::EXPORT_SENDER)
            .map(|n| (n, ctx.heartbeats.lost_for(n)))
            .collect(),
        _ => BTreeMap::new(),
    };
    let lost_for = |node: &str| {
        lost.get(node)
            .copied()
            .unwrap_or_else(|| ctx.heartbeats.lost_for(node))
    };
    let (eligible, reachable) = match &endpoints {
        Endpoints::Resolved {
            source,
            destination,
        } if decide::needs_nodes(job, &endpoints, &lost_for) => {
            resolve::eligible_nodes(&ctx.client, &ctx.heartbeats.live(), [source, destination])
                .await?
        }
        _ => Default::default(),
    };
    let Decision {
        status,
        write,
        assignment_changed,
        events,
        shape: _,
        mut requeue,
    } = decide::decide(&Inputs {
        job,
        endpoints: &endpoints,
        eligible: &eligible,
        reachable: &reachable,
        lost_for: &lost_for,
        node_deadline: ctx.node_deadline,
        // A job reading another install's export is received by an agent with a peering
        // identity; a copy between nodes is paired between agents with transfer ports.
        transfers: &|node: &str| match job.spec.source.export {
            Some(_) => ctx.heartbeats.serves_peering(node),
            None => ctx.heartbeats.serves_transfers(node),
        },
    });
    // A pair of agents is given a shard only with its ticket in place: written first, so
    // the receiver finds it when it sees the assignment (on a conflict below, the next
    // decision writes another; the one written here then opens nothing).
    // A job reading an export has it written again when its carried Secret changed.
    let stale = ctx
        .export_tickets
        .stale(&job.uid().unwrap_or_default(), export.as_ref());
    if (write && assignment_changed || stale) && crate::ticket::needed(&status.shards) {
        crate::ticket::issue(
            &ctx.client,
            &ctx.ticket_namespace,
            job,
            &status.shards,
            export.as_ref(),
            &ctx.export_tickets,
        )
        .await?;
    }
    if write {
        // The shard entries carry only the assignment: their progress fields belong to the
        // agents' field managers.
        // A shard the operator failed (its node never came back) carries its state and
        // failure too; the operator keeps sending them, or server-side apply would drop them.
        let assignment: Vec<serde_json::Value> = status
            .shards
            .iter()
            .map(|s| {
                let mut a = serde_json::json!({
                    "id": s.id, "node": s.node, "epoch": s.epoch, "part": s.part,
                    // "" on one node: sent, so that a sender this manager set before is cleared.
                    "sender": s.sender.as_deref().unwrap_or_default(),
                    "sourceRoot": s.source_root, "destinationRoot": s.destination_root,
                });
                if !s.spec_digest.is_empty() {
                    a["specDigest"] = s.spec_digest.clone().into();
                }
                if s.failed_by_operator() {
                    a["state"] = s.progress.state.as_str().into();
                    a["failures"] = serde_json::to_value(&s.progress.failures).unwrap_or_default();
                }
                a
            })
            .collect();
        // Every field spelled out (not the status type, which skips empty ones): a field
        // this manager stops sending would be left to no owner instead of cleared.
        let mut patch = serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "CopyJob",
            "status": {
                "phase": status.phase,
                "conditions": status.conditions,
                "progress": status.progress,
                "shards": assignment,
                "failures": status.failures,
                "manifest": status.manifest,
                "finishedAt": status.finished_at,
                "plan": status.plan,
            },
        });
        // Handing out shards is decided on what this reconcile read, and the watch cache can
        // lag our own last write: a shard that looks unassigned may already be running
        // somewhere. So an assignment only lands on the version it was decided on; on a
        // conflict the next reconcile decides again from fresher state.
        // Sent once decided, and from then on always (a decided mode is never taken back):
        // the API server refuses a null for an enum.
        if let Some(mode) = status.mode {
            patch["status"]["mode"] = mode.as_str().into();
        }
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
        for ev in &events {
            // An event is a courtesy; the condition is the record.
            let _ = ctx.recorder.publish(ev, &job.object_ref(&())).await;
        }
        // A finished copy between nodes needs its tickets no more.
        let finished = |p: Option<Phase>| matches!(p, Some(Phase::Succeeded | Phase::Failed));
        if finished(status.phase)
            && !finished(old.phase)
            && old.shards.iter().any(ShardStatus::between_nodes)
        {
            crate::ticket::revoke(&ctx.client, &ctx.ticket_namespace, job, &ctx.export_tickets)
                .await?;
        }
        // Nor its holder pods (the agents are done with the volumes), nor the claim its
        // snapshot was restored to, nor a snapshot it took.
        if finished(status.phase) && ctx.holder_image.is_some() {
            crate::holder::release(&ctx.client, &ns, job).await?;
        }
        if finished(status.phase) && ctx.snapshot_sources {
            let succeeded = status.phase == Some(Phase::Succeeded);
            crate::snapshot::release(&ctx.client, &ns, job, succeeded).await?;
        }
    }
    label_nodes(job, &status, ctx, &ns).await?;
    // ttlSecondsAfterFinished: delete the finished job once its time is up (the finalizer
    // runs as for any deletion), or come back when it will be.
    if let (Some(ttl), Some(done)) = (job.spec.ttl_seconds_after_finished, &status.finished_at) {
        let left = done.0.as_second() + ttl - Timestamp::now().as_second();
        if left <= 0 {
            Api::<CopyJob>::namespaced(ctx.client.clone(), &ns)
                .delete(&job.name_any(), &Default::default())
                .await?;
            return Ok(Action::await_change());
        }
        requeue = Some(Duration::from_secs(left as u64));
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Label the job for the agents that work on it (see [`ferry_crds::node_labels`]): the
/// nodes of its shards, and no others. Checked on every reconcile, so a label a
/// tenant removed or added (the chart's policy refuses that) is set right again.
async fn label_nodes(
    job: &CopyJob,
    status: &CopyJobStatus,
    ctx: &Context,
    ns: &str,
) -> Result<(), Error> {
    let want = ferry_crds::node_labels(&status.shards);
    let have: std::collections::BTreeSet<&String> = job
        .labels()
        .keys()
        .filter(|k| k.starts_with(ferry_crds::NODE_LABEL_PREFIX))
        .collect();
    if have.len() == want.len() && want.iter().all(|w| have.contains(w)) {
        return Ok(());
    }
    // A merge patch: every label of ours that should go is null, every one wanted is set.
    let mut labels = serde_json::Map::new();
    for k in have {
        labels.insert(k.clone(), serde_json::Value::Null);
    }
    for k in want {
        labels.insert(k, "".into());
    }
    let patch = serde_json::json!({ "metadata": { "labels": labels } });
    Api::<CopyJob>::namespaced(ctx.client.clone(), ns)
        .patch(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// A snapshot source not restored yet: why the job waits (see [`crate::snapshot`]).
async fn snapshot_source(
    job: &CopyJob,
    ctx: &Context,
    ns: &str,
) -> Result<Option<resolve::Blocked>, Error> {
    if !resolve::from_snapshot(&job.spec.source) {
        return Ok(None);
    }
    if !ctx.snapshot_sources || ctx.holder_image.is_none() {
        return Ok(Some(resolve::Blocked {
            condition: ferry_crds::ConditionType::Accepted,
            reason: ferry_crds::Reason::InvalidSpec,
            message: "spec.source: snapshot sources are off in this installation (chart values operator.snapshotSources and operator.holderPods); copy the live claim, or ask an admin to turn them on".into(),
        }));
    }
    Ok(crate::snapshot::prepare(&ctx.client, ns, job, ctx.snapshot_bases).await?)
}

/// Deletion: the agents see the deletion timestamp and stop their running shards at the
/// next file boundary (committed files stay; unfinished directories get their names, and
/// no staging name or partial file is left). The finalizer stays until every shard whose
/// agent is alive has stopped, so the job is gone only when nothing writes for it.
pub async fn cleanup(job: &CopyJob, ctx: &Context) -> Result<Action, Error> {
    let live = ctx.heartbeats.live();
    let between_nodes = job
        .status
        .iter()
        .flat_map(|s| &s.shards)
        .any(ShardStatus::between_nodes);
    let running: Vec<&str> = job
        .status
        .iter()
        .flat_map(|s| &s.shards)
        .filter(|s| s.progress.state == ShardState::Running && live.contains(&s.node))
        .map(|s| s.node.as_str())
        .collect();
    if running.is_empty() {
        // Its tickets go with it (the receivers have stopped: nothing dials for it), and
        // its holder pods (no agent copies through their mounts any more).
        if between_nodes {
            crate::ticket::revoke(&ctx.client, &ctx.ticket_namespace, job, &ctx.export_tickets)
                .await?;
        }
        if let Some(ns) = job.namespace() {
            if ctx.holder_image.is_some() {
                crate::holder::release(&ctx.client, &ns, job).await?;
            }
            if ctx.snapshot_sources {
                // A job deleted after it succeeded leaves the base it kept.
                let succeeded = job.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded);
                crate::snapshot::release(&ctx.client, &ns, job, succeeded).await?;
            }
        }
        return Ok(Action::await_change());
    }
    Err(Error::Stopping(running.join(", ")))
}
