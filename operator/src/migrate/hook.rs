//! A migration's hooks: the Jobs of the user's it starts and waits for. The operator only
//! flips a hook's `spec.suspend` (the `-migrations` admission policy holds it to that, on
//! Jobs labelled [`HOOK_LABEL`]); what the Job does is the user's, with the user's
//! ServiceAccount.

use ferry_crds::{HookPoint, HOOK_LABEL};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

/// Where a hook's Job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Suspended, never started: what a hook must be when the migration begins.
    Ready,
    /// Suspended again after it started (or started and suspended by someone).
    Suspended,
    Running,
    Complete,
    /// Failed, with the condition's reason and message.
    Failed(String),
}

pub fn job_state(job: &Job) -> JobState {
    let status = job.status.clone().unwrap_or_default();
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if condition("Complete").is_some() {
        return JobState::Complete;
    }
    if let Some(c) = condition("Failed") {
        return JobState::Failed(format!(
            "{}: {}",
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default()
        ));
    }
    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
    let ran = status.start_time.is_some()
        || status.active.unwrap_or(0) > 0
        || status.succeeded.unwrap_or(0) > 0
        || status.failed.unwrap_or(0) > 0;
    match (suspended, ran) {
        (true, false) => JobState::Ready,
        (true, true) => JobState::Suspended,
        (false, _) => JobState::Running,
    }
}

/// Whether the pods of `job` mount claim `claim` (of its namespace).
pub fn mounts(job: &Job, claim: &str) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.volumes.as_ref())
        .is_some_and(|v| {
            v.iter().any(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == claim)
            })
        })
}

/// The label a hook's Job carries for migration `name`.
pub fn hook_for<'a>(job: &'a Job, name: &str) -> Option<&'a Job> {
    (job.labels().get(HOOK_LABEL).map(String::as_str) == Some(name)).then_some(job)
}

pub fn hook_field(point: HookPoint) -> &'static str {
    match point {
        HookPoint::BeforeScaleDown => "hooks.beforeScaleDown",
        HookPoint::BeforeFinalSync => "hooks.beforeFinalSync",
    }
}

/// The patch that sets a hook's `spec.suspend`, at the resourceVersion read (a Job changed
/// since is read again): nothing else of it.
pub fn suspend_patch(suspend: bool, resource_version: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"suspend": suspend},
    })
}
