//! Claim migrations: the controller of `ClaimMigration`s (a claim moved to another
//! StorageClass keeping its name), wiring and I/O around [`decide`], which picks the one
//! step to take. Each reconcile reads what the migration's step needs, takes that step
//! (one write), and comes back; the status, written before each step, is the record a
//! restarted operator resumes from.
//!
//! Its grants, each held by the chart's `-migrations` admission policy to the shape
//! [`decide`] builds: `patch` on `deployments/scale` and `statefulsets/scale` (only to zero,
//! or back from zero), create and delete of claims (the new claim, the old one once its
//! volume is `Retain`, the one that takes the original name), and two changes to a volume:
//! its reclaim policy to `Retain`, and its `claimRef` from the new claim to the original
//! name; and `patch` and `delete` on Jobs labelled `ferry.dev/hook-for` (a hook, the
//! user's own Job): only its `spec.suspend` (started and, past its timeout, stopped), and
//! deleted once completed if its pods mount the claim.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{
    migration_claim_name, migration_copy_name, migration_sync_name, ClaimMigration, CopyJob,
    MigrationStep, MigrationUser, UserKind, MIGRATION_FINALIZER, MIGRATION_LABEL, OPERATOR_MANAGER,
};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};

use crate::holder::HOLDER_OF;
use crate::resolve::{pods_with_claims, uses_claim};
use crate::Error;

pub mod decide;
pub mod hook;
pub mod objects;
pub mod step;

use decide::{Found, Inputs, Step};

/// Shared state of the reconciler.
#[allow(missing_debug_implementations)] // Recorder is not Debug
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
}

/// Run the controller until the process is stopped.
pub async fn run(client: Client) {
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: OPERATOR_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        client: client.clone(),
    });
    Controller::new(
        Api::<ClaimMigration>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<CopyJob>::all(client.clone()),
        watcher::Config::default().labels(MIGRATION_LABEL),
    )
    .shutdown_on_signal()
    .run(reconcile, error_policy, ctx)
    .for_each(|res| async move {
        match res {
            Err(kube::runtime::controller::Error::ObjectNotFound(_)) | Ok(_) => {}
            Err(e) => tracing::warn!(error = %crate::error_chain(&e), "migration reconcile failed"),
        }
    })
    .await;
}

fn error_policy(_m: Arc<ClaimMigration>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "requeueing ClaimMigration");
    Action::requeue(Duration::from_secs(5))
}

/// What runs `pod`, by its controller: a Deployment (through its ReplicaSet) or a
/// StatefulSet Ferry can scale, or a sentence saying why not.
async fn user_of(pod: &Pod, ns: &str, client: &Client) -> Result<Found, Error> {
    let name = pod.name_any();
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .cloned();
    let Some(owner) = owner else {
        return Ok(Found::Unsupported(format!(
            "pod {name} is a bare pod (no controller to scale it to zero and back)"
        )));
    };
    if pod.labels().contains_key(HOLDER_OF) && owner.kind == "CopyJob" {
        return Ok(Found::Unsupported(format!(
            "pod {name} holds the claim for CopyJob {}: wait until that job ends",
            owner.name
        )));
    }
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let rs = Api::<ReplicaSet>::namespaced(client.clone(), ns)
                .get_opt(&owner.name)
                .await?;
            let deployment = rs.as_ref().and_then(|rs| {
                rs.owner_references()
                    .iter()
                    .find(|o| o.controller == Some(true) && o.kind == "Deployment")
                    .map(|o| o.name.clone())
            });
            let Some(deployment) = deployment else {
                return Ok(Found::Unsupported(format!(
                    "pod {name} is run by ReplicaSet {}, not by a Deployment",
                    owner.name
                )));
            };
            let d = Api::<Deployment>::namespaced(client.clone(), ns)
                .get_opt(&deployment)
                .await?;
            Ok(match d {
                Some(d) => Found::User(MigrationUser {
                    kind: UserKind::Deployment,
                    name: deployment,
                    replicas: d.spec.and_then(|s| s.replicas).unwrap_or(1),
                }),
                None => Found::Unsupported(format!(
                    "pod {name}'s Deployment {deployment} is gone: wait until its pods are"
                )),
            })
        }
        "StatefulSet" => {
            let s = Api::<StatefulSet>::namespaced(client.clone(), ns)
                .get_opt(&owner.name)
                .await?;
            let Some(s) = s else {
                return Ok(Found::Unsupported(format!(
                    "pod {name}'s StatefulSet {} is gone: wait until its pods are",
                    owner.name
                )));
            };
            let spec = s.spec.unwrap_or_default();
            let deletes = spec
                .persistent_volume_claim_retention_policy
                .and_then(|p| p.when_scaled)
                .is_some_and(|w| w == "Delete");
            if deletes {
                return Ok(Found::Unsupported(format!(
                    "StatefulSet {} deletes its claims when scaled down (persistentVolumeClaimRetentionPolicy.whenScaled: Delete): set it to Retain for the migration",
                    owner.name
                )));
            }
            Ok(Found::User(MigrationUser {
                kind: UserKind::StatefulSet,
                name: owner.name,
                replicas: spec.replicas.unwrap_or(1),
            }))
        }
        other => Ok(Found::Unsupported(format!(
            "pod {name} is run by {other} {}",
            owner.name
        ))),
    }
}

/// A scalable workload's `spec.replicas` now, through its scale subresource (`None`: gone).
async fn replicas_of(u: &MigrationUser, ns: &str, client: &Client) -> Result<Option<i32>, Error> {
    let scale = match u.kind {
        UserKind::Deployment => {
            Api::<Deployment>::namespaced(client.clone(), ns)
                .get_scale(&u.name)
                .await
        }
        UserKind::StatefulSet => {
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .get_scale(&u.name)
                .await
        }
    };
    match scale {
        Ok(s) => Ok(Some(s.spec.and_then(|s| s.replicas).unwrap_or(0))),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn get_volume(
    name: Option<String>,
    client: &Client,
) -> Result<Option<PersistentVolume>, Error> {
    match name.filter(|n| !n.is_empty()) {
        Some(n) => Ok(Api::<PersistentVolume>::all(client.clone())
            .get_opt(&n)
            .await?),
        None => Ok(None),
    }
}

fn volume_name(c: Option<&PersistentVolumeClaim>) -> Option<String> {
    c.and_then(|c| c.spec.as_ref())
        .and_then(|s| s.volume_name.clone())
}

/// Whether `other` (a migration of the same claim) goes first: it is under way, or, both
/// checking, it is older (by creation, then name).
fn goes_first(other: &ClaimMigration, m: &ClaimMigration) -> bool {
    let step = other.status.as_ref().and_then(|s| s.step);
    match step {
        Some(MigrationStep::Succeeded | MigrationStep::Failed) => false,
        None | Some(MigrationStep::Checking) => {
            (other.creation_timestamp(), other.name_any()) < (m.creation_timestamp(), m.name_any())
        }
        Some(_) => true,
    }
}

async fn reconcile(m: Arc<ClaimMigration>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let ns = m
        .namespace()
        .ok_or_else(|| Error::NoNamespace(m.name_any()))?;
    let uid = m.uid().unwrap_or_default();
    let status = m.status.clone().unwrap_or_default();
    let step_now = status.step;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    let jobs = Api::<CopyJob>::namespaced(client.clone(), &ns);
    let claim = pvcs.get_opt(&m.spec.claim).await?;
    let new_claim = pvcs.get_opt(&migration_claim_name(&uid)).await?;
    let old_volume = get_volume(
        status
            .old_volume
            .clone()
            .or_else(|| volume_name(claim.as_ref())),
        client,
    )
    .await?;
    let new_volume = get_volume(
        status
            .new_volume
            .clone()
            .or_else(|| volume_name(new_claim.as_ref())),
        client,
    )
    .await?;
    let class = Api::<StorageClass>::all(client.clone())
        .get_opt(&m.spec.to.storage_class_name)
        .await?;
    let copy = jobs.get_opt(&migration_copy_name(&uid)).await?;
    let sync = jobs.get_opt(&migration_sync_name(&uid)).await?;
    // The pods that have the claim, but for the holders of this migration's own copies.
    let ours: Vec<String> = [&copy, &sync]
        .iter()
        .filter_map(|j| j.as_ref().and_then(|j| j.uid()))
        .collect();
    // Pending ones too: they may start writing.
    let pods: Vec<Pod> =
        pods_with_claims(client, &ns, "status.phase!=Succeeded,status.phase!=Failed")
            .await?
            .into_iter()
            .filter(|p| uses_claim(p, &m.spec.claim))
            .filter(|p| {
                !p.labels()
                    .get(HOLDER_OF)
                    .is_some_and(|of| ours.contains(of))
            })
            .collect();
    let mut found = Vec::new();
    let mut others = Vec::new();
    if step_now == Some(MigrationStep::Checking) {
        // One lookup per controller, not per pod; a few of what cannot be scaled say enough,
        // and one more user than a migration scales refuses it.
        let mut seen = std::collections::BTreeSet::new();
        for pod in &pods {
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| (o.kind.clone(), o.name.clone()));
            if owner.as_ref().is_some_and(|o| !seen.insert(o.clone())) {
                continue;
            }
            let f = user_of(pod, &ns, client).await?;
            if !found.contains(&f) {
                found.push(f);
            }
            if found.len() > ferry_crds::MAX_MIGRATION_USERS {
                break;
            }
        }
        for other in Api::<ClaimMigration>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await?
        {
            if other.uid() != m.uid() && other.spec.claim == m.spec.claim && goes_first(&other, &m)
            {
                others.push(other.name_any());
            }
        }
    }
    // The hooks' Jobs, where a step reads them: at most two gets.
    let mut hooks = BTreeMap::new();
    if matches!(
        step_now,
        Some(MigrationStep::Checking | MigrationStep::RunningHook | MigrationStep::RollingBack)
    ) {
        let api = Api::<Job>::namespaced(client.clone(), &ns);
        for h in [
            &m.spec.hooks.before_scale_down,
            &m.spec.hooks.before_final_sync,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(job) = api.get_opt(&h.job).await? {
                hooks.insert(h.job.clone(), job);
            }
        }
    }
    let mut replicas = BTreeMap::new();
    for u in &status.users {
        if let Some(r) = replicas_of(u, &ns, client).await? {
            replicas.insert((u.kind, u.name.clone()), r);
        }
    }
    let inputs = Inputs {
        migration: &m,
        now: Timestamp::now(),
        claim: claim.as_ref(),
        old_volume: old_volume.as_ref(),
        class: class.as_ref(),
        found: &found,
        others: &others,
        replicas: &replicas,
        pods_using: pods.len(),
        new_claim: new_claim.as_ref(),
        new_volume: new_volume.as_ref(),
        copy: copy.as_ref(),
        sync: sync.as_ref(),
        hooks: &hooks,
    };
    let step = decide::decide(&inputs);
    let name = m.name_any();
    let params = PostParams {
        field_manager: Some(OPERATOR_MANAGER.into()),
        ..Default::default()
    };
    let migrations = Api::<ClaimMigration>::namespaced(client.clone(), &ns);
    let quick = Action::requeue(Duration::from_millis(200));
    match step {
        Step::Done => return Ok(Action::await_change()),
        Step::Wait => {}
        Step::AddFinalizer | Step::RemoveFinalizer => {
            let mut finalizers: Vec<String> = m
                .finalizers()
                .iter()
                .filter(|f| *f != MIGRATION_FINALIZER)
                .cloned()
                .collect();
            if step == Step::AddFinalizer {
                finalizers.push(MIGRATION_FINALIZER.into());
            }
            // At the resourceVersion read: a change since is read again.
            let patch = serde_json::json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": m.resource_version(),
            }});
            ignore(
                migrations
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
            return Ok(quick);
        }
        Step::Status(s) => {
            if Some(&*s) == m.status.as_ref() {
                // Where it was: wait for what it waits on.
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
            if s.step != step_now {
                tracing::info!(migration = %name, %ns, step = ?s.step, "migration step");
                let type_ = match s.step {
                    Some(MigrationStep::Failed | MigrationStep::RollingBack) => EventType::Warning,
                    _ => EventType::Normal,
                };
                let event = Event {
                    type_,
                    reason: s.reason.map_or_else(String::new, |r| r.to_string()),
                    note: Some(ferry_crds::shorten(&s.message, 1024)),
                    action: s.step.map_or_else(String::new, |s| s.to_string()),
                    secondary: None,
                };
                // An event is a courtesy; the status is the record.
                let _ = ctx.recorder.publish(&event, &m.object_ref(&())).await;
            }
            let patch = serde_json::json!({
                "apiVersion": "ferry.dev/v1alpha1",
                "kind": "ClaimMigration",
                "status": *s,
            });
            migrations
                .patch_status(
                    &name,
                    &PatchParams::apply(OPERATOR_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await?;
            return Ok(quick);
        }
        Step::CreateClaim(c) => {
            tracing::info!(migration = %name, %ns, claim = %c.name_any(), "migration: claim");
            ignore(pvcs.create(&params, &c).await)?;
            return Ok(quick);
        }
        Step::CreateJob(j) => {
            tracing::info!(migration = %name, %ns, job = %j.name_any(), "migration: CopyJob");
            ignore(jobs.create(&params, &j).await)?;
        }
        Step::DeleteJob(job) => {
            ignore(jobs.delete(&job, &DeleteParams::default()).await)?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Step::Scale {
            kind,
            name: user,
            replicas,
        } => {
            tracing::info!(migration = %name, %ns, ?kind, %user, replicas, "migration: scale");
            let patch = serde_json::json!({"spec": {"replicas": replicas}});
            let pp = PatchParams::default();
            match kind {
                UserKind::Deployment => ignore(
                    Api::<Deployment>::namespaced(client.clone(), &ns)
                        .patch_scale(&user, &pp, &Patch::Merge(&patch))
                        .await,
                )?,
                UserKind::StatefulSet => ignore(
                    Api::<StatefulSet>::namespaced(client.clone(), &ns)
                        .patch_scale(&user, &pp, &Patch::Merge(&patch))
                        .await,
                )?,
            }
            return Ok(quick);
        }
        Step::Retain {
            volume,
            resource_version,
        } => {
            tracing::info!(migration = %name, %ns, %volume, "migration: volume Retain");
            ignore(
                Api::<PersistentVolume>::all(client.clone())
                    .patch(
                        &volume,
                        &PatchParams::default(),
                        &Patch::Merge(&decide::retain_patch(&resource_version)),
                    )
                    .await,
            )?;
            return Ok(quick);
        }
        Step::PreBind {
            volume,
            resource_version,
            claim_ref,
        } => {
            tracing::info!(migration = %name, %ns, %volume, "migration: new volume pre-bound to the claim's name");
            ignore(
                Api::<PersistentVolume>::all(client.clone())
                    .patch(
                        &volume,
                        &PatchParams::default(),
                        &Patch::Merge(&decide::pre_bind_patch(&resource_version, &claim_ref)),
                    )
                    .await,
            )?;
            return Ok(quick);
        }
        Step::DeleteClaim { name: claim, uid } => {
            tracing::info!(migration = %name, %ns, %claim, "migration: claim deleted");
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            ignore(pvcs.delete(&claim, &dp).await)?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Step::SuspendJob {
            name: job,
            suspend,
            resource_version,
        } => {
            tracing::info!(migration = %name, %ns, %job, suspend, "migration: hook");
            ignore(
                Api::<Job>::namespaced(client.clone(), &ns)
                    .patch(
                        &job,
                        &PatchParams::default(),
                        &Patch::Merge(&hook::suspend_patch(suspend, &resource_version)),
                    )
                    .await,
            )?;
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        Step::DeleteHook { name: job, uid } => {
            tracing::info!(migration = %name, %ns, %job, "migration: deleting a completed hook");
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            ignore(
                Api::<Job>::namespaced(client.clone(), &ns)
                    .delete(&job, &dp)
                    .await,
            )?;
            return Ok(Action::requeue(Duration::from_millis(300)));
        }
    }
    // Waiting on a copy, pods going or the PV controller: the CopyJobs' changes wake it,
    // and this bounds what a missed change costs. Pods and claims are not watched (every
    // pod of the cluster would be cached): while the users are at zero, each half second
    // of a missed change is downtime, so those steps look again sooner.
    let users_down = matches!(
        step_now,
        Some(
            MigrationStep::Quiescing
                | MigrationStep::RunningHook
                | MigrationStep::Swapping
                | MigrationStep::Resuming
        )
    );
    Ok(Action::requeue(Duration::from_millis(if users_down {
        300
    } else {
        2000
    })))
}

/// A conflict (changed since read, or made by an earlier reconcile) or a missing object
/// (gone already) is read again by the next reconcile.
fn ignore<T>(r: Result<T, kube::Error>) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
