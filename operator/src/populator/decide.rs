//! The populator's pure decision: from a user's claim and what exists for it (its
//! VolumeSource, its prime claim, the CopyJob that fills it, the prime's volume), the one
//! step to take now, and what to say about it (the claim's event, its entry in the
//! VolumeSource's status). The steps, in order, as the contract of Kubernetes' volume
//! populators has them:
//!
//! 1. [`source_of`]: the claim names a VolumeSource of its own namespace (another
//!    namespace is refused);
//! 2. the claim is fit to populate (a class, a size, no selector), and, when its class
//!    waits for a first consumer, the scheduler has picked a node for it;
//! 3. the prime claim ([`prime_claim`]): the user's class, size, modes and node;
//! 4. the CopyJob ([`populate_job`]) from the VolumeSource into the prime claim;
//! 5. once that CopyJob has Succeeded (every file verified), the rebind ([`claim_ref`]):
//!    the prime's volume is given to the user's claim, and the PV controller binds it;
//! 6. the prime claim is deleted (its volume no longer names it, so it is neither
//!    released nor reclaimed).
//!
//! Every object is made by name from the claim's uid and checked to be the operator's
//! (owned by the claim, labelled) before it is followed; the chart's `-populator`
//! admission policy lets no one else create those names.

use std::collections::BTreeMap;

use ferry_crds::{
    populate_job_name, prime_claim_name, CopyJob, CopyJobSpec, Endpoint, Overwrite, Phase,
    PopulatePhase, PopulateReason, VolumeSource, GROUP, POPULATE_FOR, SELECTED_NODE_ANNOTATION,
    SOURCE_GENERATION_ANNOTATION, VOLUME_SOURCE_LABEL,
};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

use crate::status::story;

/// The label every object the operator makes carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ferry-operator");

/// What to say about a claim: its event (when this changed) and its status entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    pub phase: PopulatePhase,
    pub reason: PopulateReason,
    pub message: String,
    /// The copy's progress, as the CopyJob's PROGRESS column has it.
    pub percent: Option<String>,
}

impl Said {
    fn new(phase: PopulatePhase, reason: PopulateReason, message: String) -> Self {
        Self {
            phase,
            reason,
            message,
            percent: None,
        }
    }
}

/// The one step to take for a claim now.
#[derive(Debug, Clone)]
pub enum Step {
    /// Not a claim Ferry populates (or it is being deleted): nothing to do or say.
    Ignore,
    /// Nothing to do until something changes: a consumer, the source, the copy.
    Wait,
    /// Populated, and the prime claim gone: nothing is left to do for the claim.
    Done,
    /// A refusal that only the user can lift (say it, and wait for a change).
    Refuse,
    CreatePrime(Box<PersistentVolumeClaim>),
    CreateJob(Box<CopyJob>),
    /// The CopyJob failed for an older spec of the VolumeSource: delete it (the next
    /// reconcile makes a new one).
    DeleteJob,
    /// Give the prime's volume `volume` (at `resource_version`) to the user's claim.
    Rebind {
        volume: String,
        resource_version: String,
        claim_ref: Box<ObjectReference>,
    },
    /// The prime claim has done its part: delete it.
    DeletePrime,
}

impl PartialEq for Step {
    fn eq(&self, other: &Self) -> bool {
        use Step::*;
        match (self, other) {
            (CreatePrime(a), CreatePrime(b)) => a == b,
            // A CopyJob is its metadata and spec (the derive gives it no PartialEq).
            (CreateJob(a), CreateJob(b)) => a.metadata == b.metadata && a.spec == b.spec,
            (
                Rebind {
                    volume: v1,
                    resource_version: r1,
                    claim_ref: c1,
                },
                Rebind {
                    volume: v2,
                    resource_version: r2,
                    claim_ref: c2,
                },
            ) => v1 == v2 && r1 == r2 && c1 == c2,
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

/// What the decision reads.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub claim: &'a PersistentVolumeClaim,
    /// The VolumeSource the claim names, in its namespace, if it exists.
    pub source: Option<&'a VolumeSource>,
    /// The claim's StorageClass binds on its first consumer.
    pub waits_for_consumer: bool,
    /// The object named [`prime_claim_name`] in the claim's namespace, if any.
    pub prime: Option<&'a PersistentVolumeClaim>,
    /// The object named [`populate_job_name`] in the claim's namespace, if any.
    pub job: Option<&'a CopyJob>,
    /// The volume the prime claim is bound to, if any.
    pub volume: Option<&'a PersistentVolume>,
}

/// The VolumeSource a claim names: `None` if it names none (not Ferry's claim); `Err` if
/// it names one of another namespace.
pub fn source_of(claim: &PersistentVolumeClaim) -> Option<Result<String, String>> {
    let r = claim.spec.as_ref()?.data_source_ref.as_ref()?;
    if r.api_group.as_deref() != Some(GROUP) || r.kind != "VolumeSource" {
        return None;
    }
    let ns = claim.namespace().unwrap_or_default();
    match r.namespace.as_deref() {
        Some(other) if !other.is_empty() && other != ns => Some(Err(other.to_string())),
        _ => Some(Ok(r.name.clone())),
    }
}

/// The reference that makes the user's claim the controller of what is made for it, so
/// that it goes when the claim goes (deleted mid-population: the CopyJob stops, the prime
/// claim and its new volume are deleted).
pub fn owned_by(claim: &PersistentVolumeClaim) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "PersistentVolumeClaim".into(),
        name: claim.name_any(),
        uid: claim.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.into(), MANAGED_BY.1.into()),
        (POPULATE_FOR.into(), uid.into()),
    ])
}

/// Made by the operator for `claim`: controlled by it and labelled for it.
fn made_for(meta: &ObjectMeta, claim: &PersistentVolumeClaim) -> bool {
    let uid = claim.uid().unwrap_or_default();
    let controlled = meta.owner_references.as_deref().is_some_and(|o| {
        o.iter().any(|o| {
            o.controller == Some(true) && o.kind == "PersistentVolumeClaim" && o.uid == uid
        })
    });
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(POPULATE_FOR))
        .is_some_and(|v| *v == uid);
    controlled && labelled
}

/// The prime claim of `claim`: provisioned like it (its class, size, access modes, volume
/// mode and, with WaitForFirstConsumer, the node the scheduler chose for its pod), empty,
/// no data source, owned by it. The chart's `-populator` policy admits exactly this shape.
pub fn prime_claim(claim: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let uid = claim.uid().unwrap_or_default();
    let spec = claim.spec.clone().unwrap_or_default();
    let annotations = claim
        .annotations()
        .get(SELECTED_NODE_ANNOTATION)
        .map(|node| BTreeMap::from([(SELECTED_NODE_ANNOTATION.to_string(), node.clone())]));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(prime_claim_name(&uid)),
            namespace: claim.namespace(),
            labels: Some(labels(&uid)),
            annotations,
            owner_references: Some(vec![owned_by(claim)]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: spec.storage_class_name,
            access_modes: spec.access_modes,
            resources: spec.resources,
            volume_mode: spec.volume_mode,
            ..Default::default()
        }),
        status: None,
    }
}

/// The CopyJob that fills `claim`'s prime claim from `source`: its source and options,
/// into the top of the new volume, everything overwritten (the volume is new: a resumed
/// run finds only what the job itself wrote).
pub fn populate_job(claim: &PersistentVolumeClaim, source: &VolumeSource) -> CopyJob {
    let uid = claim.uid().unwrap_or_default();
    let s = &source.spec;
    let mut labels = labels(&uid);
    labels.insert(VOLUME_SOURCE_LABEL.into(), source.name_any());
    let spec = CopyJobSpec {
        source: s.source.clone(),
        destination: Endpoint {
            pvc: Some(prime_claim_name(&uid)),
            ..Default::default()
        },
        check: None,
        reflink: s.reflink,
        verify: s.verify,
        overwrite: Overwrite::Always,
        compare: Default::default(),
        preserve: s.preserve,
        include: s.include.clone(),
        exclude: s.exclude.clone(),
        delete_extraneous: false,
        delete_excluded: false,
        parallelism: s.parallelism,
        suspend: false,
        ttl_seconds_after_finished: None,
        dry_run: false,
        transfer: s.transfer.clone(),
    };
    let mut job = CopyJob::new(&populate_job_name(&uid), spec);
    job.metadata.namespace = claim.namespace();
    job.metadata.labels = Some(labels);
    job.metadata.annotations = Some(BTreeMap::from([(
        SOURCE_GENERATION_ANNOTATION.to_string(),
        source.metadata.generation.unwrap_or_default().to_string(),
    )]));
    job.metadata.owner_references = Some(vec![owned_by(claim)]);
    job
}

/// The `claimRef` that gives a volume to `claim`.
pub fn claim_ref(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.namespace(),
        name: Some(claim.name_any()),
        uid: claim.uid(),
        ..Default::default()
    }
}

/// The merge patch of the rebind: the volume at `resource_version` (the one the decision
/// read: a volume changed since is read again, never overwritten blind), its `claimRef`
/// exactly `claim_ref` (the prime claim's resourceVersion and any fieldPath dropped), and
/// nothing else. The chart's `-populator` policy admits this change and no other.
pub fn rebind_patch(resource_version: &str, claim_ref: &ObjectReference) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"claimRef": {
            "apiVersion": claim_ref.api_version,
            "kind": claim_ref.kind,
            "namespace": claim_ref.namespace,
            "name": claim_ref.name,
            "uid": claim_ref.uid,
            "resourceVersion": null,
            "fieldPath": null,
        }},
    })
}

/// `volume`'s claim is `claim` (by namespace, name and uid).
fn claimed_by(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.uid == claim.uid()
                && r.name == Some(claim.name_any())
                && r.namespace == claim.namespace()
        })
}

fn generation_of(job: &CopyJob) -> Option<i64> {
    job.annotations()
        .get(SOURCE_GENERATION_ANNOTATION)
        .and_then(|g| g.parse().ok())
}

/// Decide the step for `i.claim`, and what to say (`None`: nothing new to say).
pub fn decide(i: &Inputs) -> (Step, Option<Said>) {
    use PopulatePhase as P;
    use PopulateReason as R;
    let claim = i.claim;
    let Some(named) = source_of(claim) else {
        return (Step::Ignore, None);
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return (Step::Ignore, None);
    }
    let uid = claim.uid().unwrap_or_default();
    let prime_name = prime_claim_name(&uid);
    let job_name = populate_job_name(&uid);
    let prime = i.prime.filter(|p| made_for(&p.metadata, claim));
    let job = i.job.filter(|j| made_for(&j.metadata, claim));
    let spec = claim.spec.clone().unwrap_or_default();
    let job_succeeded =
        job.is_some_and(|j| j.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded));

    // Bound: populated (or bound to a volume by someone else, which is not Ferry's to say).
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        if !job_succeeded {
            return (Step::Ignore, None);
        }
        let said = Said::new(
            P::Populated,
            R::Populated,
            format!(
                "bound to volume {}, a verified copy made by CopyJob {job_name}",
                spec.volume_name.unwrap_or_default()
            ),
        );
        let step = if prime.is_some() {
            Step::DeletePrime
        } else {
            Step::Done
        };
        return (step, Some(said));
    }
    let refuse =
        |reason, message: String| (Step::Refuse, Some(Said::new(P::Pending, reason, message)));
    let source_name = match named {
        Ok(n) => n,
        Err(other) => {
            return refuse(
                R::CrossNamespace,
                format!("spec.dataSourceRef names a VolumeSource in namespace {other}: only a VolumeSource of the claim's own namespace populates it; create one here"),
            )
        }
    };
    let Some(source) = i.source else {
        return (
            Step::Wait,
            Some(Said::new(
                P::Pending,
                R::VolumeSourceNotFound,
                format!("no VolumeSource {source_name} in this namespace; the claim is populated once one is created"),
            )),
        );
    };
    if spec
        .storage_class_name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        return refuse(R::InvalidClaim, "the claim has no storageClassName and the cluster no default class: a populated claim gets a new volume of its class; set spec.storageClassName".into());
    }
    if spec.selector.is_some() {
        return refuse(R::InvalidClaim, "a populated claim gets a new volume, not one chosen by spec.selector; remove the selector".into());
    }
    let has_size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|r| r.contains_key("storage"));
    if !has_size {
        return refuse(
            R::InvalidClaim,
            "the claim requests no storage: set spec.resources.requests.storage".into(),
        );
    }
    if i.waits_for_consumer && !claim.annotations().contains_key(SELECTED_NODE_ANNOTATION) {
        return (
            Step::Wait,
            Some(Said::new(
                P::Pending,
                R::WaitingForConsumer,
                "its StorageClass binds on first use: the claim is populated on the node of the first pod that uses it, once that pod is scheduled".into(),
            )),
        );
    }
    if i.prime.is_some() && prime.is_none() {
        return refuse(R::InvalidClaim, format!("claim {prime_name} exists and is not this claim's prime claim: Ferry needs that name; delete it"));
    }
    if i.job.is_some() && job.is_none() {
        return refuse(R::InvalidClaim, format!("CopyJob {job_name} exists and was not made for this claim: Ferry needs that name; delete it"));
    }
    let Some(prime) = prime else {
        return (Step::CreatePrime(Box::new(prime_claim(claim))), None);
    };
    let Some(job) = job else {
        let said = Said::new(
            P::Populating,
            R::Populating,
            format!("copying VolumeSource {source_name} into claim {prime_name} (CopyJob {job_name}); the claim is bound once the copy is verified"),
        );
        return (
            Step::CreateJob(Box::new(populate_job(claim, source))),
            Some(said),
        );
    };
    let status = job.status.as_ref();
    let percent = status
        .and_then(|s| s.progress.as_ref())
        .and_then(|p| p.percent.clone());
    match status.and_then(|s| s.phase) {
        Some(Phase::Failed) => {
            if generation_of(job) != source.metadata.generation {
                return (Step::DeleteJob, None);
            }
            let mut said = Said::new(
                P::Failed,
                R::PopulateFailed,
                format!("CopyJob {job_name} failed: {}; fix VolumeSource {source_name} (it is tried again when it changes) or delete the CopyJob to try again", story(job)),
            );
            said.percent = percent;
            (Step::Wait, Some(said))
        }
        Some(Phase::Succeeded) => {
            let volume = i.volume.filter(|v| {
                Some(v.name_any()) == prime.spec.as_ref().and_then(|s| s.volume_name.clone())
            });
            match volume {
                Some(v) if claimed_by(v, prime) => (
                    Step::Rebind {
                        volume: v.name_any(),
                        resource_version: v.resource_version().unwrap_or_default(),
                        claim_ref: Box::new(claim_ref(claim)),
                    },
                    None,
                ),
                // Rebound already: the prime has done its part; the PV controller binds.
                Some(v) if claimed_by(v, claim) => (Step::DeletePrime, None),
                _ => (Step::Wait, None),
            }
        }
        _ => {
            let story = story(job);
            let mut said = Said::new(
                P::Populating,
                R::Populating,
                if story.is_empty() {
                    format!("copying VolumeSource {source_name} (CopyJob {job_name}); the claim is bound once the copy is verified")
                } else {
                    format!("copying VolumeSource {source_name} (CopyJob {job_name}, {story}); the claim is bound once the copy is verified")
                },
            );
            said.percent = percent;
            (Step::Wait, Some(said))
        }
    }
}

#[cfg(test)]
#[path = "decide/tests.rs"]
mod tests;
