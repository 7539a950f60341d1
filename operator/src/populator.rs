//! The volume populator: claims whose `spec.dataSourceRef` names a `VolumeSource` are filled
//! by an ordinary CopyJob into a prime claim, whose volume is then handed to them (the
//! contract of Kubernetes' volume populators, GA in 1.33, as lib-volume-populator shapes
//! it; run in the operator, no controller of its own). Two controllers:
//!
//! - the claims' ([`run`]): watches every claim (a claim is Ferry's only by its
//!   dataSourceRef, which no selector can pick) and the CopyJobs labelled
//!   [`POPULATE_FOR`], lets [`decide`] pick the step and takes it, in the claim's namespace
//!   only, and says each new state as an event on the claim;
//! - the sources' ([`run_sources`]): writes each VolumeSource's status from the claims
//!   that name it, read from the first controller's cache, by server-side apply.
//!
//! The one new privilege is the rebind: `patch` on PersistentVolumes, held by the chart's
//! `-populator` admission policy to exactly "a volume bound to `ferry-prime-<uid>` is given
//! to the claim with that uid in the same namespace, nothing else changed".

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_crds::{
    populate_job_name, prime_claim_name, CopyJob, PopulatePhase, PopulatedClaim, VolumeSource,
    VolumeSourceStatus, MAX_LISTED_CLAIMS, OPERATOR_MANAGER, POPULATE_FOR, VOLUME_SOURCE_LABEL,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};

use crate::Error;

pub mod decide;

use decide::{Inputs, Said, Step};

/// Shared state of the claims' reconciler.
#[allow(missing_debug_implementations)] // Recorder is not Debug
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    /// What was last said of each claim (by uid): an event only when it changes, and a
    /// progress event at most every 10 %.
    said: Mutex<HashMap<String, (Said, u8)>>,
}

fn reporter() -> Reporter {
    Reporter {
        controller: OPERATOR_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    }
}

/// Run both controllers until the process is stopped.
pub async fn run(client: Client) {
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = claims.store();
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter()),
        client: client.clone(),
        said: Mutex::new(HashMap::new()),
    });
    // A VolumeSource that appears or changes wakes the claims that name it.
    let naming = store.clone();
    let claims = claims
        .owns(
            Api::<CopyJob>::all(client.clone()),
            watcher::Config::default().labels(POPULATE_FOR),
        )
        .watches(
            Api::<VolumeSource>::all(client.clone()),
            watcher::Config::default(),
            move |source| {
                naming_claims(&naming, &source)
                    .iter()
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                // A claim deleted before its queued reconcile ran (every populated claim
                // that goes): nothing to do for it.
                Err(kube::runtime::controller::Error::ObjectNotFound(_)) | Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), "populator reconcile failed")
                }
            }
        });
    tokio::join!(claims, run_sources(client, store));
}

/// The cached claims that name `source` (of its namespace).
fn naming_claims(
    claims: &Store<PersistentVolumeClaim>,
    source: &VolumeSource,
) -> Vec<Arc<PersistentVolumeClaim>> {
    let ns = source.namespace();
    let name = source.name_any();
    claims
        .state()
        .into_iter()
        .filter(|c| c.namespace() == ns)
        .filter(|c| matches!(decide::source_of(c), Some(Ok(n)) if n == name))
        .collect()
}

async fn reconcile(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, Error> {
    if decide::source_of(&claim).is_none() {
        return Ok(Action::await_change());
    }
    let ns = claim
        .namespace()
        .ok_or_else(|| Error::NoNamespace(claim.name_any()))?;
    let uid = claim.uid().unwrap_or_default();
    let inputs = gather(&claim, &ns, &ctx).await?;
    let (step, said) = decide::decide(&inputs.as_inputs(&claim));
    if let Some(said) = &said {
        say(&claim, said, &ctx).await;
    }
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    let params = PostParams {
        field_manager: Some(OPERATOR_MANAGER.into()),
        ..Default::default()
    };
    match step {
        Step::Ignore | Step::Refuse | Step::Done => return Ok(Action::await_change()),
        Step::Wait => {}
        Step::CreatePrime(prime) => {
            tracing::info!(claim = %claim.name_any(), %ns, "populating: prime claim");
            ignore_conflict(pvcs.create(&params, &prime).await)?;
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        Step::CreateJob(job) => {
            tracing::info!(claim = %claim.name_any(), %ns, "populating: CopyJob");
            let jobs = Api::<CopyJob>::namespaced(ctx.client.clone(), &ns);
            ignore_conflict(jobs.create(&params, &job).await)?;
        }
        Step::DeleteJob => {
            let jobs = Api::<CopyJob>::namespaced(ctx.client.clone(), &ns);
            ignore_missing(
                jobs.delete(&populate_job_name(&uid), &DeleteParams::default())
                    .await,
            )?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Step::Rebind {
            volume,
            resource_version,
            claim_ref,
        } => {
            let patch = decide::rebind_patch(&resource_version, &claim_ref);
            tracing::info!(claim = %claim.name_any(), %ns, %volume, "populated: volume handed to the claim");
            let pvs = Api::<PersistentVolume>::all(ctx.client.clone());
            ignore_conflict(
                pvs.patch(&volume, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        Step::DeletePrime => {
            ignore_missing(
                pvcs.delete(&prime_claim_name(&uid), &DeleteParams::default())
                    .await,
            )?;
        }
    }
    // While waiting on the copy or the PV controller: the CopyJob's changes wake this
    // claim, and this bounds what a missed one costs.
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// What a decision about `claim` reads, fetched.
struct Gathered {
    source: Option<VolumeSource>,
    waits_for_consumer: bool,
    prime: Option<PersistentVolumeClaim>,
    job: Option<CopyJob>,
    volume: Option<PersistentVolume>,
}

impl Gathered {
    fn as_inputs<'a>(&'a self, claim: &'a PersistentVolumeClaim) -> Inputs<'a> {
        Inputs {
            claim,
            source: self.source.as_ref(),
            waits_for_consumer: self.waits_for_consumer,
            prime: self.prime.as_ref(),
            job: self.job.as_ref(),
            volume: self.volume.as_ref(),
        }
    }
}

async fn gather(claim: &PersistentVolumeClaim, ns: &str, ctx: &Context) -> Result<Gathered, Error> {
    let client = &ctx.client;
    let uid = claim.uid().unwrap_or_default();
    let source = match decide::source_of(claim) {
        Some(Ok(name)) => {
            Api::<VolumeSource>::namespaced(client.clone(), ns)
                .get_opt(&name)
                .await?
        }
        _ => None,
    };
    let spec = claim.spec.clone().unwrap_or_default();
    let waits_for_consumer = match spec.storage_class_name.as_deref() {
        Some(class) if !class.is_empty() => Api::<StorageClass>::all(client.clone())
            .get_opt(class)
            .await?
            .and_then(|c| c.volume_binding_mode)
            .is_some_and(|m| m == "WaitForFirstConsumer"),
        _ => false,
    };
    let prime = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(&prime_claim_name(&uid))
        .await?;
    let job = Api::<CopyJob>::namespaced(client.clone(), ns)
        .get_opt(&populate_job_name(&uid))
        .await?;
    let volume_name = prime
        .as_ref()
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.volume_name.clone())
        .filter(|v| !v.is_empty());
    let volume = match volume_name {
        Some(v) => {
            Api::<PersistentVolume>::all(client.clone())
                .get_opt(&v)
                .await?
        }
        None => None,
    };
    Ok(Gathered {
        source,
        waits_for_consumer,
        prime,
        job,
        volume,
    })
}

/// Publish `said` as an event on the claim, if it is new: another reason or message, or
/// progress into another tenth.
async fn say(claim: &PersistentVolumeClaim, said: &Said, ctx: &Context) {
    let uid = claim.uid().unwrap_or_default();
    let tenth = said
        .percent
        .as_deref()
        .and_then(|p| p.trim_end_matches('%').parse::<f64>().ok())
        .map_or(0, |p| (p / 10.0).floor().clamp(0.0, 10.0) as u8);
    {
        let mut last = ctx
            .said
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let same = last.get(&uid).is_some_and(|(s, t)| {
            s.reason == said.reason
                && *t == tenth
                && (s.message == said.message || s.percent.is_some())
        });
        if same {
            return;
        }
        last.insert(uid, (said.clone(), tenth));
    }
    let note = match &said.percent {
        Some(p) => format!("{p}: {}", said.message),
        None => said.message.clone(),
    };
    let type_ = match said.phase {
        PopulatePhase::Failed => EventType::Warning,
        _ if matches!(
            said.reason,
            ferry_crds::PopulateReason::CrossNamespace | ferry_crds::PopulateReason::InvalidClaim
        ) =>
        {
            EventType::Warning
        }
        _ => EventType::Normal,
    };
    let event = Event {
        type_,
        reason: said.reason.to_string(),
        note: Some(ferry_crds::shorten(&note, 1024)),
        action: "Populate".into(),
        secondary: None,
    };
    // An event is a courtesy; the VolumeSource's status is the record.
    let _ = ctx.recorder.publish(&event, &claim.object_ref(&())).await;
}

fn ignore_conflict<T>(r: Result<T, kube::Error>) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        // Made by an earlier reconcile, or (a volume) changed since it was read: the next
        // reconcile reads again.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn ignore_missing<T>(r: Result<T, kube::Error>) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn error_policy(_claim: Arc<PersistentVolumeClaim>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "requeueing claim");
    Action::requeue(Duration::from_secs(5))
}

/// The VolumeSources' status: for each, the claims of its namespace that name it, from
/// `claims` (the claims controller's cache) and the CopyJobs that fill them.
async fn run_sources(client: Client, claims: Store<PersistentVolumeClaim>) {
    let to_source = |ns: Option<String>, name: Option<String>| {
        name.map(|n| {
            let r = ObjectRef::<VolumeSource>::new(&n);
            match ns {
                Some(ns) => r.within(&ns),
                None => r,
            }
        })
    };
    let ctx = Arc::new(SourcesContext {
        client: client.clone(),
        claims,
    });
    Controller::new(
        Api::<VolumeSource>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
        move |c| match decide::source_of(&c) {
            Some(Ok(name)) => to_source(c.namespace(), Some(name)),
            _ => None,
        },
    )
    .watches(
        Api::<CopyJob>::all(client.clone()),
        watcher::Config::default().labels(VOLUME_SOURCE_LABEL),
        move |j| to_source(j.namespace(), j.labels().get(VOLUME_SOURCE_LABEL).cloned()),
    )
    .shutdown_on_signal()
    .run(reconcile_source, source_error_policy, ctx)
    .for_each(|res| async move {
        match res {
            Err(kube::runtime::controller::Error::ObjectNotFound(_)) | Ok(_) => {}
            Err(e) => tracing::warn!(error = %crate::error_chain(&e), "VolumeSource status failed"),
        }
    })
    .await;
}

#[allow(missing_debug_implementations)]
struct SourcesContext {
    client: Client,
    claims: Store<PersistentVolumeClaim>,
}

async fn reconcile_source(
    source: Arc<VolumeSource>,
    ctx: Arc<SourcesContext>,
) -> Result<Action, Error> {
    let ns = source
        .namespace()
        .ok_or_else(|| Error::NoNamespace(source.name_any()))?;
    let name = source.name_any();
    let mut naming = naming_claims(&ctx.claims, &source);
    // Newest first.
    naming.sort_by_key(|c| std::cmp::Reverse(c.creation_timestamp()));
    // The CopyJobs made from this source, in one list rather than a get per claim.
    let mut jobs: HashMap<String, CopyJob> = Api::<CopyJob>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&format!("{VOLUME_SOURCE_LABEL}={name}")))
        .await?
        .items
        .into_iter()
        .map(|j| (j.name_any(), j))
        .collect();
    let mut status = VolumeSourceStatus::default();
    let previous = source.status.clone().unwrap_or_default();
    let mut unsettled = false;
    for claim in &naming {
        let uid = claim.uid().unwrap_or_default();
        let job = jobs.remove(&populate_job_name(&uid));
        let prime = ctx
            .claims
            .get(&ObjectRef::new(&prime_claim_name(&uid)).within(&ns));
        let inputs = Inputs {
            claim,
            source: Some(&source),
            // Only whether it waits is said, and the claims controller says why.
            waits_for_consumer: false,
            prime: prime.as_deref(),
            job: job.as_ref(),
            volume: None,
        };
        let (_, said) = decide::decide(&inputs);
        let said = said.unwrap_or(Said {
            phase: PopulatePhase::Pending,
            reason: ferry_crds::PopulateReason::Populating,
            message: String::new(),
            percent: None,
        });
        match said.phase {
            PopulatePhase::Populating => status.populating += 1,
            PopulatePhase::Populated => status.populated += 1,
            PopulatePhase::Failed => status.failed += 1,
            PopulatePhase::Pending => {}
        }
        unsettled |= !matches!(said.phase, PopulatePhase::Populated | PopulatePhase::Failed);
        if status.claims.len() < MAX_LISTED_CLAIMS {
            let populated_at = (said.phase == PopulatePhase::Populated).then(|| {
                previous
                    .claims
                    .iter()
                    .find(|c| c.name == claim.name_any())
                    .and_then(|c| c.populated_at.clone())
                    .unwrap_or(Time(Timestamp::now()))
            });
            status.claims.push(PopulatedClaim {
                name: claim.name_any(),
                phase: said.phase,
                reason: said.reason,
                message: said.message,
                copy_job: job.as_ref().map(|j| j.name_any()),
                percent: said.percent,
                populated_at,
            });
        }
    }
    if source.status.as_ref() != Some(&status) {
        let patch = serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "VolumeSource",
            "status": {
                "claims": status.claims,
                "populating": status.populating,
                "populated": status.populated,
                "failed": status.failed,
            },
        });
        Api::<VolumeSource>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::apply(OPERATOR_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
    }
    Ok(Action::requeue(Duration::from_secs(if unsettled {
        5
    } else {
        300
    })))
}

fn source_error_policy(_s: Arc<VolumeSource>, error: &Error, _ctx: Arc<SourcesContext>) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "requeueing VolumeSource");
    Action::requeue(Duration::from_secs(5))
}
