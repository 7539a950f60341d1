//! The CopySchedule controller: `run` watches CopySchedules and the CopyJobs they created
//! (labelled [`SCHEDULE_LABEL`]; a change of one wakes its schedule), `reconcile` lets the
//! pure [`decide`] decide and then carries it out in the schedule's namespace only: delete
//! the unfinished CopyJobs a Replace run replaces, create the run's CopyJob, delete
//! finished ones beyond the history limits, write the status by server-side apply, publish
//! the events; `error_policy` requeues API failures with a delay. There is no finalizer:
//! a schedule's CopyJobs name it as their controller, so the garbage collector deletes
//! them with it.

use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{CopyJob, CopySchedule, CopyScheduleStatus, OPERATOR_MANAGER, SCHEDULE_LABEL};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, reflector, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};

use crate::Error;

pub mod decide;

use decide::{Decision, Inputs};

/// Shared state of the schedule reconciler.
#[allow(missing_debug_implementations)] // Recorder is not Debug
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// CopyJobs that carry [`SCHEDULE_LABEL`], cached.
    pub jobs: Store<CopyJob>,
}

/// Run the controller until the process is stopped. `health` gets its CopySchedule cache,
/// which scrapes read the schedule gauges from.
pub async fn run(client: Client, health: &crate::metrics::Health) {
    let reporter = Reporter {
        controller: OPERATOR_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    // Only the CopyJobs schedules made: the CopyJob controller has its own cache of all.
    let (jobs, writer) = reflector::store::<CopyJob>();
    let labelled = watcher::Config::default().labels(SCHEDULE_LABEL);
    let job_changes = reflector(
        writer,
        watcher(Api::<CopyJob>::all(client.clone()), labelled),
    )
    .default_backoff()
    // A deleted job changes its schedule's active list and history too.
    .touched_objects();
    let controller = Controller::new(
        Api::<CopySchedule>::all(client.clone()),
        watcher::Config::default(),
    );
    health.set_schedule_store(controller.store());
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        jobs,
    });
    controller
        .owns_stream(job_changes)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::warn!(error = %crate::error_chain(&e), "schedule reconcile failed");
            }
        })
        .await;
}

async fn reconcile(schedule: Arc<CopySchedule>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = schedule
        .namespace()
        .ok_or_else(|| Error::NoNamespace(schedule.name_any()))?;
    let jobs = ctx.jobs.state_filter(|j| decide::owned_by(&schedule, j));
    let jobs: Vec<&CopyJob> = jobs.iter().map(Arc::as_ref).collect();
    let mut decision = decide::decide(&Inputs {
        schedule: &schedule,
        jobs: &jobs,
        now: Timestamp::now(),
    });
    apply(&schedule, &ns, &mut decision, &ctx).await?;
    Ok(decision
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

/// Carry out `decision` in namespace `ns` (the schedule's: every call below is scoped to it).
async fn apply(
    schedule: &CopySchedule,
    ns: &str,
    decision: &mut Decision,
    ctx: &Context,
) -> Result<(), Error> {
    let jobs = Api::<CopyJob>::namespaced(ctx.client.clone(), ns);
    let mut events = Vec::new();
    // Replace: the unfinished jobs go first. Their agents stop at the next file once they
    // see the deletion, as for any deleted CopyJob; the new job does not wait for that.
    for d in decision.replace.drain(..) {
        delete(&jobs, &d.name).await?;
        events.push(d.event);
    }
    if let Some(run) = &decision.run {
        let name = run.job.name_any();
        let params = PostParams {
            field_manager: Some(OPERATOR_MANAGER.into()),
            ..Default::default()
        };
        match jobs.create(&params, &run.job).await {
            Ok(_) => decision.ran(true),
            // Created before (a restart, a new leader, a cache behind our own write): the
            // name is the run's, so this is the same run, never a second one, as long as
            // the job is this schedule's.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = jobs.get_opt(&name).await?;
                match existing {
                    Some(j) if decide::owned_by(schedule, &j) => decision.ran(false),
                    Some(j) => decision.name_taken(&controller_of(&j)),
                    // Deleted meanwhile: the next reconcile decides again.
                    None => return Ok(()),
                }
            }
            // The API server refused the job itself (a template label it does not take):
            // a spec error, said where the user looks.
            Err(kube::Error::Api(e)) if e.code == 422 => {
                refused(decision, schedule, &e.message);
            }
            Err(e) => return Err(e.into()),
        }
    }
    for d in decision.prune.drain(..) {
        delete(&jobs, &d.name).await?;
        events.push(d.event);
    }
    if decide::changed(schedule, &decision.status) {
        write_status(schedule, ns, &decision.status, ctx).await?;
    }
    for ev in events.iter().chain(&decision.events) {
        // An event is a courtesy; the status is the record.
        let _ = ctx.recorder.publish(ev, &schedule.object_ref(&())).await;
    }
    Ok(())
}

/// What `job` names as its controller, for a message.
fn controller_of(job: &CopyJob) -> String {
    job.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map_or_else(
            || "it has no controller".to_string(),
            |o| format!("its controller is {} {} (uid {})", o.kind, o.name, o.uid),
        )
}

/// The run's CopyJob was refused by the API server: Accepted=False, InvalidSpec, with its
/// message, and no run.
fn refused(decision: &mut Decision, schedule: &CopySchedule, why: &str) {
    let Some(run) = decision.run.take() else {
        return;
    };
    let message = format!(
        "the API server refused CopyJob {} made from spec.jobTemplate: {why}; fix spec.jobTemplate",
        run.job.name_any()
    );
    let previous = schedule
        .status
        .as_ref()
        .map_or(&[][..], |s| s.conditions.as_slice());
    let new = !previous.iter().any(|c| c.message == message);
    decision.status.conditions = vec![crate::status::condition(
        ferry_crds::ConditionType::Accepted,
        false,
        ferry_crds::Reason::InvalidSpec,
        &message,
        schedule.meta().generation,
        previous,
    )];
    if new {
        decision.events.push(kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: ferry_crds::Reason::InvalidSpec.to_string(),
            note: Some(ferry_crds::shorten(&message, 1024)),
            action: "Schedule".into(),
            secondary: None,
        });
    }
    // Until the template changes: a retry would be refused the same way.
    decision.requeue = None;
}

/// Delete one of the schedule's CopyJobs; one already gone is fine.
async fn delete(jobs: &Api<CopyJob>, name: &str) -> Result<(), Error> {
    match jobs.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Write the status by server-side apply, every field spelled out (a field this manager
/// stops sending would be left to no owner instead of cleared).
async fn write_status(
    schedule: &CopySchedule,
    ns: &str,
    status: &CopyScheduleStatus,
    ctx: &Context,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "CopySchedule",
        "status": {
            "lastScheduleTime": status.last_schedule_time,
            "lastSuccessfulTime": status.last_successful_time,
            "lastSkippedTime": status.last_skipped_time,
            "active": status.active,
            "activeCount": status.active_count,
            "conditions": status.conditions,
        },
    });
    Api::<CopySchedule>::namespaced(ctx.client.clone(), ns)
        .patch_status(
            &schedule.name_any(),
            &PatchParams::apply(OPERATOR_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

fn error_policy(_schedule: Arc<CopySchedule>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "requeueing schedule");
    Action::requeue(Duration::from_secs(5))
}
