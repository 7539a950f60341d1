//! A claim migration's pure decision: from the ClaimMigration (its status is the record of
//! where it is) and what exists for it (the claim, its volume, the target class, the claim's
//! users and their replica counts, the new claim and volume, the two CopyJobs), the one
//! step to take now. A new step is always first written to the status ([`Step::Status`]),
//! and only the next reconcile acts on it; every action checks the state it expects, so an
//! operator killed anywhere resumes where the status says, or rolls back:
//!
//! 1. `Checking`: the claim is bound; the class exists and is another; every pod that has
//!    the claim is run by a Deployment or a StatefulSet (else refused, naming it); their
//!    replica counts are recorded.
//! 2. `Copying`: the new claim ([`migration_claim`]) and the live copy into it.
//! 3. `Quiescing`: the downtime's start is recorded, the users scaled to zero, until no
//!    pod has the claim (or the timeout rolls back).
//!
//!    Before it and after it, `RunningHook` for a hook the spec names: the user's
//!    suspended Job started (`spec.suspend` to false, the only change the operator makes to
//!    a Job) and waited for; failed, gone or past its timeout (then suspended again, which
//!    stops its pods), it rolls back. Each hook runs once.
//! 4. `FinalSync`: what changed since, by checksum, deletions included, verified.
//! 5. `Swapping` (never undone once begun): the old volume `Retain`; the new volume
//!    pre-bound by name to the claim's name; the old claim and the new claim deleted; a
//!    claim of the original name ([`renamed_claim`]) made, which the PV controller binds to
//!    the pre-bound volume.
//! 6. `Resuming`: the users scaled back to their recorded counts; the downtime written.
//!
//! A failure (or the ClaimMigration's deletion) before `Swapping` is `RollingBack`: the
//! users scaled back on the old claim, which the copies only read.

use ferry_crds::{
    migration_claim_name, migration_copy_name, migration_sync_name, ClaimMigration,
    ClaimMigrationStatus, CopyJob, HookPoint, MigrationReason, MigrationStep, MigrationUser, Phase,
    HOOK_LABEL, MAX_MIGRATION_USERS, MIGRATION_FINALIZER, MIGRATION_LABEL,
};

use super::hook::{hook_field, hook_for, job_state, mounts, JobState};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::status::story;

use super::objects::size_of;
pub use super::objects::{
    copy_job, migration_claim, owned_by, pre_bind_patch, pre_bind_ref, renamed_claim, retain_patch,
    sync_job,
};
pub use super::step::{Found, Inputs, Step};

/// Made by the operator for `m`: controlled by it and labelled for it.
fn made_for(meta: &ObjectMeta, m: &ClaimMigration) -> bool {
    let uid = m.uid().unwrap_or_default();
    let controlled = meta.owner_references.as_deref().is_some_and(|o| {
        o.iter()
            .any(|o| o.controller == Some(true) && o.kind == "ClaimMigration" && o.uid == uid)
    });
    controlled && meta.labels.as_ref().and_then(|l| l.get(MIGRATION_LABEL)) == Some(&uid)
}

fn claim_ref_of(v: &PersistentVolume) -> Option<&ObjectReference> {
    v.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
}

fn volume_of(c: &PersistentVolumeClaim) -> Option<String> {
    c.spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|v| !v.is_empty())
}

fn phase(job: Option<&CopyJob>) -> Option<Phase> {
    job.and_then(|j| j.status.as_ref()).and_then(|s| s.phase)
}

fn seconds_between(from: Option<&Time>, to: Timestamp) -> Option<f64> {
    from.map(|t| {
        let d = to.duration_since(t.0);
        (d.as_secs_f64() * 10.0).round() / 10.0
    })
}

/// Decide the step for `i.migration`.
pub fn decide(i: &Inputs) -> Step {
    use MigrationReason as R;
    use MigrationStep as S;
    let m = i.migration;
    let status = m.status.clone().unwrap_or_default();
    let deleting = m.metadata.deletion_timestamp.is_some();
    let has_finalizer = m.finalizers().iter().any(|f| f == MIGRATION_FINALIZER);
    let uid = m.uid().unwrap_or_default();
    let claim_name = &m.spec.claim;
    let next = |step: S, reason: R, message: String| {
        let mut s = status.clone();
        s.step = Some(step);
        s.reason = Some(reason);
        s.message = message;
        Step::Status(Box::new(s))
    };
    let step = status.step.unwrap_or(S::Checking);
    let terminal = matches!(step, S::Succeeded | S::Failed);
    if deleting {
        if !has_finalizer {
            return Step::Done;
        }
        // Nothing of the users' touched yet, or all of it back: nothing holds it.
        if terminal || matches!(step, S::Checking | S::Copying) {
            return Step::RemoveFinalizer;
        }
        if matches!(step, S::Quiescing | S::RunningHook | S::FinalSync) {
            return next(S::RollingBack, R::Cancelled, format!("the ClaimMigration was deleted before the swap: scaling the users of claim {claim_name} back, on its old volume"));
        }
        // Swapping and Resuming are finished, RollingBack too: on with them.
    } else if terminal {
        return Step::Done;
    } else if !has_finalizer {
        return Step::AddFinalizer;
    }
    let new_name = migration_claim_name(&uid);
    let new_claim = i.new_claim.filter(|c| made_for(&c.metadata, m));
    let fail = |reason: R, message: String| next(S::Failed, reason, message);
    // Users scaled back to the counts recorded, then `done` is written.
    // Only from zero: a user someone scaled up meanwhile is theirs again (and the policy
    // lets the operator change a scale only to or from zero).
    let scale_back = |done: Step| {
        for u in &status.users {
            match i.replicas.get(&(u.kind, u.name.clone())) {
                Some(&0) if u.replicas != 0 => {
                    return Step::Scale {
                        kind: u.kind,
                        name: u.name.clone(),
                        replicas: u.replicas,
                    }
                }
                _ => {}
            }
        }
        done
    };
    let scale_down = || {
        status
            .users
            .iter()
            .find_map(|u| match i.replicas.get(&(u.kind, u.name.clone())) {
                Some(&r) if r != 0 => Some(Step::Scale {
                    kind: u.kind,
                    name: u.name.clone(),
                    replicas: 0,
                }),
                _ => None,
            })
    };
    // The next step with what it records: the users scaled to zero (the downtime's start),
    // a hook started, the final sync.
    let quiesce = |s: &mut ClaimMigrationStatus| {
        s.step = Some(S::Quiescing);
        s.reason = Some(R::Migrating);
        s.message = format!("scaling the users of claim {claim_name} to zero for the final sync");
        s.scaled_down_at = Some(Time(i.now));
        s.quiescing_since = Some(Time(i.now));
    };
    let start_hook = |s: &mut ClaimMigrationStatus, point: HookPoint| {
        let Some(hook) = m
            .spec
            .hooks
            .at(point)
            .filter(|_| !s.hooks_done.contains(&point))
        else {
            return false;
        };
        s.step = Some(S::RunningHook);
        s.reason = Some(R::Migrating);
        s.message = format!(
            "running the Job {} of {} (at most {}s)",
            hook.job,
            hook_field(point),
            hook.timeout_seconds
        );
        s.hook = Some(point);
        s.hook_started_at = Some(Time(i.now));
        true
    };
    let final_sync = |s: &mut ClaimMigrationStatus| {
        s.step = Some(S::FinalSync);
        s.reason = Some(R::Migrating);
        s.message = format!(
            "the users of claim {claim_name} are at zero: syncing what changed since the copy"
        );
    };
    match step {
        S::Checking => {
            if status.step.is_none() {
                let mut s = status.clone();
                s.step = Some(S::Checking);
                s.reason = Some(R::Migrating);
                s.message = format!("checking claim {claim_name} and its users");
                s.started_at = Some(Time(i.now));
                return Step::Status(Box::new(s));
            }
            let Some(claim) = i.claim else {
                return fail(R::ClaimNotFound, format!("no claim {claim_name} in this namespace: spec.claim names the claim to move"));
            };
            if claim_name.starts_with("ferry-") {
                return fail(R::InvalidMigration, format!("claim {claim_name} has a name of Ferry's own (ferry-*), which no volume is handed to: copy it to a claim of another name with a CopyJob instead"));
            }
            let Some(volume) = volume_of(claim) else {
                return fail(
                    R::ClaimNotBound,
                    format!(
                        "claim {claim_name} is not bound to a volume yet: there is nothing to move"
                    ),
                );
            };
            if let Some(other) = i.others.first() {
                return fail(R::AlreadyMigrating, format!("ClaimMigration {other} is moving claim {claim_name}: wait until it ends, or delete it"));
            }
            let target = &m.spec.to.storage_class_name;
            let Some(class) = i.class else {
                return fail(R::InvalidMigration, format!("no StorageClass {target}: to.storageClassName names the class of the new volume"));
            };
            let own = claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default();
            if own == *target && m.spec.to.node.is_none() {
                return fail(R::InvalidMigration, format!("claim {claim_name} is of class {target} already: name another class in to.storageClassName, or a node in to.node"));
            }
            let waits = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
            if m.spec.to.node.is_some() && !waits {
                return fail(R::InvalidMigration, format!("to.node places a volume of a class that waits for a first consumer, and StorageClass {target} binds at once (volumeBindingMode Immediate): remove to.node, or choose a WaitForFirstConsumer class"));
            }
            if size_of(claim).is_none() {
                return fail(R::InvalidMigration, format!("claim {claim_name} has no size (neither status.capacity nor spec.resources.requests.storage)"));
            }
            if i.new_claim.is_some() && new_claim.is_none() {
                return fail(R::InvalidMigration, format!("claim {new_name} exists and was not made for this migration: Ferry needs that name; delete it"));
            }
            let unsupported: Vec<&str> = i
                .found
                .iter()
                .filter_map(|f| match f {
                    Found::Unsupported(why) => Some(why.as_str()),
                    Found::User(_) => None,
                })
                .collect();
            if !unsupported.is_empty() {
                return fail(R::UnsupportedUser, format!("{}; Ferry scales only Deployments and StatefulSets to zero for the final sync: stop the others, or run them under one", unsupported.join("; ")));
            }
            let mut users: Vec<MigrationUser> = i
                .found
                .iter()
                .filter_map(|f| match f {
                    Found::User(u) => Some(u.clone()),
                    Found::Unsupported(_) => None,
                })
                .collect();
            users.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
            users.dedup();
            if users.len() > MAX_MIGRATION_USERS {
                return fail(R::UnsupportedUser, format!("{} workloads have claim {claim_name}, and a migration scales at most {MAX_MIGRATION_USERS}", users.len()));
            }
            for point in HookPoint::ALL {
                let Some(hook) = m.spec.hooks.at(*point) else {
                    continue;
                };
                let field = hook_field(*point);
                let name = m.name_any();
                let how = format!("a hook is a Job of this namespace created with spec.suspend: true and the label {HOOK_LABEL}: {name}, which the migration starts");
                let Some(job) = i.hooks.get(&hook.job) else {
                    return fail(
                        R::InvalidMigration,
                        format!("no Job {} in this namespace ({field}.job): {how}", hook.job),
                    );
                };
                if hook_for(job, &name).is_none() {
                    return fail(R::InvalidMigration, format!("Job {} does not carry the label {HOOK_LABEL}: {name} ({field}.job): {how}", hook.job));
                }
                if job_state(job) != JobState::Ready {
                    return fail(
                        R::InvalidMigration,
                        format!(
                            "Job {} is not suspended, or has run ({field}.job): {how}",
                            hook.job
                        ),
                    );
                }
            }
            let mut s = status.clone();
            s.step = Some(S::Copying);
            s.reason = Some(R::Migrating);
            s.message = format!(
                "copying claim {claim_name} into {new_name} of class {target} while its users run"
            );
            s.users = users;
            s.claim_uid = claim.uid();
            s.claim_labels = claim.labels().clone();
            s.claim_labels.remove(MIGRATION_LABEL);
            s.old_volume = Some(volume);
            Step::Status(Box::new(s))
        }
        S::Copying => {
            let Some(claim) = i.claim.filter(|c| c.uid() == status.claim_uid) else {
                return next(
                    S::RollingBack,
                    R::ClaimNotFound,
                    format!("claim {claim_name} went during the copy: nothing was changed"),
                );
            };
            if i.new_claim.is_none() {
                return Step::CreateClaim(Box::new(migration_claim(m, claim)));
            }
            if new_claim.is_none() {
                return next(S::RollingBack, R::InvalidMigration, format!("claim {new_name} exists and was not made for this migration: Ferry needs that name; delete it"));
            }
            let copy = i.copy.filter(|j| made_for(&j.metadata, m));
            let Some(copy) = copy else {
                if i.copy.is_some() {
                    return next(S::RollingBack, R::InvalidMigration, format!("CopyJob {} exists and was not made for this migration: Ferry needs that name; delete it", migration_copy_name(&uid)));
                }
                return Step::CreateJob(Box::new(copy_job(m)));
            };
            match phase(Some(copy)) {
                Some(Phase::Failed) => next(
                    S::RollingBack,
                    R::CopyFailed,
                    format!(
                        "the live copy (CopyJob {}) failed: {}; the users were not stopped",
                        copy.name_any(),
                        story(copy)
                    ),
                ),
                Some(Phase::Succeeded) => {
                    let mut s = status.clone();
                    s.copy_seconds = seconds_between(status.started_at.as_ref(), i.now);
                    if !start_hook(&mut s, HookPoint::BeforeScaleDown) {
                        quiesce(&mut s);
                    }
                    Step::Status(Box::new(s))
                }
                _ => Step::Wait,
            }
        }
        S::Quiescing => {
            if let Some(s) = scale_down() {
                return s;
            }
            // A final sync run while a pod had the claim again: run it anew.
            if let Some(sync) = i.sync.filter(|j| made_for(&j.metadata, m)) {
                return Step::DeleteJob(sync.name_any());
            }
            if i.pods_using == 0 {
                let mut s = status.clone();
                if !start_hook(&mut s, HookPoint::BeforeFinalSync) {
                    final_sync(&mut s);
                }
                return Step::Status(Box::new(s));
            }
            let waited = seconds_between(status.quiescing_since.as_ref(), i.now).unwrap_or(0.0);
            if waited > f64::from(m.spec.quiesce_timeout_seconds) {
                return next(S::RollingBack, R::QuiesceTimeout, format!("{} pods still had claim {claim_name} {}s after its users were scaled to zero (quiesceTimeoutSeconds); scaling them back", i.pods_using, m.spec.quiesce_timeout_seconds));
            }
            Step::Wait
        }
        S::FinalSync => {
            // A user scaled up again, or another pod with the claim: what the sync read may
            // have changed since; stop them and sync again.
            if scale_down().is_some() || i.pods_using > 0 {
                let mut s = status.clone();
                s.step = Some(S::Quiescing);
                s.message = format!("a pod had claim {claim_name} again during the final sync: stopping it and syncing again");
                s.quiescing_since = Some(Time(i.now));
                return Step::Status(Box::new(s));
            }
            let sync = i.sync.filter(|j| made_for(&j.metadata, m));
            let Some(sync) = sync else {
                if i.sync.is_some() {
                    return next(S::RollingBack, R::InvalidMigration, format!("CopyJob {} exists and was not made for this migration: Ferry needs that name; delete it", migration_sync_name(&uid)));
                }
                let block = i
                    .claim
                    .and_then(|c| c.spec.as_ref())
                    .and_then(|s| s.volume_mode.as_deref())
                    == Some("Block");
                return Step::CreateJob(Box::new(sync_job(m, block)));
            };
            match phase(Some(sync)) {
                Some(Phase::Failed) => next(S::RollingBack, R::FinalSyncFailed, format!("the final sync (CopyJob {}) failed: {}; scaling the users back on the old volume", sync.name_any(), story(sync))),
                Some(Phase::Succeeded) => {
                    let Some(volume) = new_claim.and_then(volume_of) else {
                        return Step::Wait;
                    };
                    let mut s = status.clone();
                    s.step = Some(S::Swapping);
                    s.reason = Some(R::Migrating);
                    s.message = format!("giving claim name {claim_name} the new volume {volume}");
                    s.new_volume = Some(volume);
                    s.manifest = sync.status.as_ref().and_then(|st| st.manifest.clone());
                    Step::Status(Box::new(s))
                }
                _ => Step::Wait,
            }
        }
        S::Swapping => {
            let (Some(old), Some(new)) = (i.old_volume, i.new_volume) else {
                // Both were bound when recorded, and both are kept: read again.
                return Step::Wait;
            };
            let ns = m.namespace().unwrap_or_default();
            let policy = |v: &PersistentVolume| {
                v.spec
                    .as_ref()
                    .and_then(|s| s.persistent_volume_reclaim_policy.clone())
            };
            if policy(old).as_deref() != Some("Retain") {
                return Step::Retain {
                    volume: old.name_any(),
                    resource_version: old.resource_version().unwrap_or_default(),
                };
            }
            let to_name = claim_ref_of(new).is_some_and(|r| {
                r.name.as_deref() == Some(claim_name.as_str())
                    && r.namespace.as_deref() == Some(ns.as_str())
            });
            let from_new = claim_ref_of(new).is_some_and(|r| {
                r.name.as_deref() == Some(new_name.as_str())
                    && r.namespace.as_deref() == Some(ns.as_str())
                    && r.uid == new_claim.and_then(|c| c.uid())
            });
            if from_new && new_claim.is_some() {
                return Step::PreBind {
                    volume: new.name_any(),
                    resource_version: new.resource_version().unwrap_or_default(),
                    claim_ref: Box::new(pre_bind_ref(&ns, claim_name)),
                };
            }
            if !to_name {
                // Neither the new claim's nor the name's: not Ferry's to change.
                return next(
                    S::Swapping,
                    R::Migrating,
                    format!(
                        "volume {} is bound to neither {new_name} nor {claim_name}: waiting",
                        new.name_any()
                    ),
                );
            }
            if let Some(old_claim) = i.claim.filter(|c| c.uid() == status.claim_uid) {
                // Its users stay at zero (the claim's deletion waits for its last pod).
                if let Some(s) = scale_down() {
                    return s;
                }
                return Step::DeleteClaim {
                    name: claim_name.clone(),
                    uid: old_claim.uid().unwrap_or_default(),
                };
            }
            if let Some(c) = new_claim {
                return Step::DeleteClaim {
                    name: new_name,
                    uid: c.uid().unwrap_or_default(),
                };
            }
            let Some(claim) = i.claim else {
                let Some(spec_from) = i.new_claim.cloned().or_else(|| {
                    // The new claim is gone: its spec, made again from the volume's.
                    let v = new.spec.clone().unwrap_or_default();
                    Some(PersistentVolumeClaim {
                        spec: Some(PersistentVolumeClaimSpec {
                            storage_class_name: v.storage_class_name,
                            access_modes: v.access_modes,
                            resources: Some(VolumeResourceRequirements {
                                requests: v.capacity,
                                limits: None,
                            }),
                            volume_mode: v.volume_mode,
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                }) else {
                    return Step::Wait;
                };
                return Step::CreateClaim(Box::new(renamed_claim(m, &spec_from)));
            };
            if volume_of(claim).as_deref() == Some(new.name_any().as_str()) {
                return next(
                    S::Resuming,
                    R::Migrating,
                    format!(
                        "claim {claim_name} is bound to the new volume {}: scaling its users back",
                        new.name_any()
                    ),
                );
            }
            Step::Wait
        }
        S::RunningHook => {
            let point = status.hook.unwrap_or(HookPoint::BeforeScaleDown);
            let Some(hook) = m.spec.hooks.at(point) else {
                return next(
                    S::RollingBack,
                    R::InvalidMigration,
                    format!(
                        "the status names hook {}, which the spec does not have",
                        hook_field(point)
                    ),
                );
            };
            if point == HookPoint::BeforeFinalSync {
                // The users stay at zero while it runs.
                if let Some(s) = scale_down() {
                    return s;
                }
            }
            let field = hook_field(point);
            let job = i
                .hooks
                .get(&hook.job)
                .and_then(|j| hook_for(j, &m.name_any()));
            let next_step = |s: &mut ClaimMigrationStatus| match point {
                HookPoint::BeforeScaleDown => quiesce(s),
                HookPoint::BeforeFinalSync => final_sync(s),
            };
            if status.hooks_done.contains(&point) {
                // Completed: its pods let go of the claim before the migration goes on.
                if let Some(job) =
                    job.filter(|j| mounts(j, claim_name) && j.metadata.deletion_timestamp.is_none())
                {
                    return Step::DeleteHook {
                        name: job.name_any(),
                        uid: job.uid().unwrap_or_default(),
                    };
                }
                let mut s = status.clone();
                next_step(&mut s);
                return Step::Status(Box::new(s));
            }
            let Some(job) = job else {
                return next(S::RollingBack, R::HookFailed, format!("the Job {} of {field} went (or lost its label {HOOK_LABEL}) before it completed", hook.job));
            };
            let state = job_state(job);
            if let JobState::Failed(why) = &state {
                return next(
                    S::RollingBack,
                    R::HookFailed,
                    format!(
                        "the Job {} of {field} failed ({why}): kubectl logs job/{} says why",
                        hook.job, hook.job
                    ),
                );
            }
            if state == JobState::Complete {
                let mut s = status.clone();
                s.hooks_done.push(point);
                if mounts(job, claim_name) {
                    s.message = format!("the Job {} of {field} completed: deleting it, since its finished pods would keep claim {claim_name} from the swap", hook.job);
                } else {
                    next_step(&mut s);
                }
                return Step::Status(Box::new(s));
            }
            let waited = seconds_between(status.hook_started_at.as_ref(), i.now).unwrap_or(0.0);
            if waited > f64::from(hook.timeout_seconds) {
                // RollingBack suspends it again.
                return next(S::RollingBack, R::HookTimedOut, format!("the Job {} of {field} did not complete within {}s (its timeoutSeconds): it is suspended again, which stops its pods", hook.job, hook.timeout_seconds));
            }
            match state {
                JobState::Ready | JobState::Suspended => Step::SuspendJob {
                    name: hook.job.clone(),
                    suspend: false,
                    resource_version: job.resource_version().unwrap_or_default(),
                },
                _ => Step::Wait,
            }
        }
        S::Resuming => {
            let mut s = status.clone();
            s.step = Some(S::Succeeded);
            s.reason = Some(R::Migrated);
            s.scaled_up_at = Some(Time(i.now));
            s.downtime_seconds = seconds_between(status.scaled_down_at.as_ref(), i.now);
            s.message = format!(
                "claim {claim_name} is on volume {} of class {}; its old volume {} is kept (Retain): delete it when it is no longer needed",
                status.new_volume.clone().unwrap_or_default(),
                m.spec.to.storage_class_name,
                status.old_volume.clone().unwrap_or_default(),
            );
            scale_back(Step::Status(Box::new(s)))
        }
        S::RollingBack => {
            // A hook that had started and not ended is stopped (suspended: its pods go).
            let running = status
                .hook
                .filter(|p| !status.hooks_done.contains(p))
                .and_then(|p| m.spec.hooks.at(p))
                .and_then(|h| i.hooks.get(&h.job))
                .and_then(|j| hook_for(j, &m.name_any()))
                .filter(|j| job_state(j) == JobState::Running);
            if let Some(job) = running {
                return Step::SuspendJob {
                    name: job.name_any(),
                    suspend: true,
                    resource_version: job.resource_version().unwrap_or_default(),
                };
            }
            let mut s = status.clone();
            s.step = Some(S::Failed);
            s.scaled_up_at = status.scaled_down_at.as_ref().map(|_| Time(i.now));
            s.downtime_seconds = seconds_between(status.scaled_down_at.as_ref(), i.now);
            if !s.message.contains("on its old volume") {
                s.message = format!(
                    "{}; the users run on claim {claim_name}, on its old volume",
                    status.message
                );
            }
            scale_back(Step::Status(Box::new(s)))
        }
        S::Succeeded | S::Failed => {
            if deleting {
                Step::RemoveFinalizer
            } else {
                Step::Done
            }
        }
    }
}

#[cfg(test)]
#[path = "decide/tests.rs"]
mod tests;
