//! The finalizer's two sides: `apply` (validate and resolve the endpoints, decide, write the
//! status by server-side apply, publish the events that explain it, delete after
//! `ttlSecondsAfterFinished`) and `cleanup` (a deletion waits for the agents to stop).

use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{
    ConditionType, CopyJob, ManifestName, Phase, Plan, Reason, ShardState, OPERATOR_MANAGER,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};

use crate::decide::{decide, Decided};
use crate::heartbeat::Heartbeats;
use crate::resolve;
use crate::status::{aggregate, condition, failed_reason};
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
}

pub async fn apply(job: &CopyJob, ctx: &Context) -> Result<Action, Error> {
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
        resolve::check(&ctx.client, &ns, job, &mut roots).await?
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
        requeue = decide(
            &ctx.client,
            &ctx.heartbeats,
            ctx.node_deadline,
            job,
            &blocked,
            &roots,
            &mut shards,
            &mut decided,
        )
        .await?;
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
pub async fn cleanup(job: &CopyJob, ctx: &Context) -> Result<Action, Error> {
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
