//! The populator's steps, each from the objects a reconcile would read.

use super::*;
use ferry_crds::{Progress, VolumeSourceSpec};
use k8s_openapi::api::core::v1::{
    PersistentVolumeSpec, TypedObjectReference, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

const UID: &str = "11111111-2222-3333-4444-555555555555";

fn claim(ns_of_ref: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("team-a".into()),
            uid: Some(UID.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some("fast".into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                ..Default::default()
            }),
            data_source_ref: Some(TypedObjectReference {
                api_group: Some(GROUP.into()),
                kind: "VolumeSource".into(),
                name: "golden".into(),
                namespace: ns_of_ref.map(String::from),
            }),
            ..Default::default()
        }),
        status: None,
    }
}

fn source(generation: i64) -> VolumeSource {
    let mut s = VolumeSource::new(
        "golden",
        VolumeSourceSpec {
            source: Endpoint {
                pvc: Some("origin".into()),
                path: "data".into(),
                ..Default::default()
            },
            reflink: Default::default(),
            verify: ferry_crds::Verify::Checksum,
            preserve: Default::default(),
            include: vec![],
            exclude: vec!["*.tmp".into()],
            parallelism: Default::default(),
            transfer: Default::default(),
        },
    );
    s.metadata.namespace = Some("team-a".into());
    s.metadata.generation = Some(generation);
    s
}

fn with_phase(mut job: CopyJob, phase: Phase) -> CopyJob {
    job.status = Some(ferry_crds::CopyJobStatus {
        phase: Some(phase),
        progress: Some(Progress {
            percent: Some("40%".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    job
}

fn volume(bound_to: &PersistentVolumeClaim) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv-1".into()),
            resource_version: Some("42".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            claim_ref: Some(claim_ref(bound_to)),
            ..Default::default()
        }),
        status: None,
    }
}

fn bound_prime(c: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let mut p = prime_claim(c);
    p.metadata.uid = Some("prime-uid".into());
    p.spec.as_mut().expect("set above").volume_name = Some("pv-1".into());
    p
}

fn inputs<'a>(c: &'a PersistentVolumeClaim) -> Inputs<'a> {
    Inputs {
        claim: c,
        source: None,
        waits_for_consumer: false,
        prime: None,
        job: None,
        volume: None,
    }
}

#[test]
fn a_claim_without_a_volume_source_ref_is_not_ferrys() {
    let mut c = claim(None);
    c.spec
        .as_mut()
        .expect("set above")
        .data_source_ref
        .as_mut()
        .expect("set above")
        .kind = "Other".into();
    assert_eq!(decide(&inputs(&c)).0, Step::Ignore);
}

#[test]
fn a_volume_source_of_another_namespace_is_refused_and_nothing_is_made() {
    let c = claim(Some("team-b"));
    let s = source(1);
    let (step, said) = decide(&Inputs {
        source: Some(&s),
        ..inputs(&c)
    });
    assert_eq!(step, Step::Refuse);
    let said = said.expect("set above");
    assert_eq!(said.reason, PopulateReason::CrossNamespace);
    assert!(said.message.contains("team-b"), "{}", said.message);
}

#[test]
fn a_missing_source_waits_and_says_so() {
    let c = claim(None);
    let (step, said) = decide(&inputs(&c));
    assert_eq!(step, Step::Wait);
    assert_eq!(
        said.expect("set above").reason,
        PopulateReason::VolumeSourceNotFound
    );
}

#[test]
fn wait_for_first_consumer_waits_for_the_node_then_the_prime_claim_gets_it() {
    let mut c = claim(None);
    let s = source(1);
    let (step, said) = decide(&Inputs {
        source: Some(&s),
        waits_for_consumer: true,
        ..inputs(&c)
    });
    assert_eq!(step, Step::Wait);
    assert_eq!(
        said.expect("set above").reason,
        PopulateReason::WaitingForConsumer
    );
    c.metadata.annotations = Some(BTreeMap::from([(
        SELECTED_NODE_ANNOTATION.into(),
        "node-a".into(),
    )]));
    let (step, _) = decide(&Inputs {
        source: Some(&s),
        waits_for_consumer: true,
        ..inputs(&c)
    });
    let Step::CreatePrime(prime) = step else {
        panic!("{step:?}")
    };
    assert_eq!(
        prime
            .annotations()
            .get(SELECTED_NODE_ANNOTATION)
            .expect("set above"),
        "node-a"
    );
}

#[test]
fn the_prime_claim_is_the_claims_class_size_and_modes_owned_by_it_and_nothing_else() {
    let c = claim(None);
    let p = prime_claim(&c);
    assert_eq!(
        serde_json::to_value(&p).expect("set above"),
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": format!("ferry-prime-{UID}"),
                "namespace": "team-a",
                "labels": {"app.kubernetes.io/managed-by": "ferry-operator", "ferry.dev/populate-for": UID},
                "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": UID, "controller": true}],
            },
            "spec": {
                "storageClassName": "fast",
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        })
    );
}

#[test]
fn the_copyjob_copies_the_source_with_its_options_into_the_top_of_the_prime_claim() {
    let c = claim(None);
    let s = source(3);
    let j = populate_job(&c, &s);
    assert_eq!(j.spec.source, s.spec.source);
    assert_eq!(
        j.spec.destination.pvc.as_deref(),
        Some(prime_claim_name(UID).as_str())
    );
    assert_eq!(j.spec.destination.path, "");
    assert_eq!(j.spec.exclude, vec!["*.tmp".to_string()]);
    assert_eq!(j.spec.overwrite, Overwrite::Always);
    assert_eq!(
        j.annotations()
            .get(SOURCE_GENERATION_ANNOTATION)
            .expect("set above"),
        "3"
    );
    assert_eq!(
        j.labels().get(VOLUME_SOURCE_LABEL).expect("set above"),
        "golden"
    );
    assert!(made_for(&j.metadata, &c));
}

#[test]
fn the_steps_in_order_prime_then_job_then_rebind_then_the_prime_deleted() {
    let c = claim(None);
    let s = source(1);
    let base = Inputs {
        source: Some(&s),
        ..inputs(&c)
    };
    assert!(matches!(decide(&base).0, Step::CreatePrime(_)));
    let prime = bound_prime(&c);
    let (step, said) = decide(&Inputs {
        prime: Some(&prime),
        ..base
    });
    assert!(matches!(step, Step::CreateJob(_)), "{step:?}");
    assert_eq!(said.expect("set above").phase, PopulatePhase::Populating);

    let running = with_phase(populate_job(&c, &s), Phase::Running);
    let (step, said) = decide(&Inputs {
        prime: Some(&prime),
        job: Some(&running),
        ..base
    });
    assert_eq!(step, Step::Wait);
    assert_eq!(said.expect("set above").percent.as_deref(), Some("40%"));

    // Succeeded, but the prime's volume is not known yet: wait, never rebind blind.
    let done = with_phase(populate_job(&c, &s), Phase::Succeeded);
    let (step, _) = decide(&Inputs {
        prime: Some(&prime),
        job: Some(&done),
        ..base
    });
    assert_eq!(step, Step::Wait);

    let v = volume(&prime);
    let (step, _) = decide(&Inputs {
        prime: Some(&prime),
        job: Some(&done),
        volume: Some(&v),
        ..base
    });
    assert_eq!(
        step,
        Step::Rebind {
            volume: "pv-1".into(),
            resource_version: "42".into(),
            claim_ref: Box::new(claim_ref(&c)),
        }
    );
    let rebound = volume(&c);
    let (step, _) = decide(&Inputs {
        prime: Some(&prime),
        job: Some(&done),
        volume: Some(&rebound),
        ..base
    });
    assert_eq!(step, Step::DeletePrime);

    let mut bound = c.clone();
    bound.spec.as_mut().expect("set above").volume_name = Some("pv-1".into());
    let (step, said) = decide(&Inputs {
        claim: &bound,
        job: Some(&done),
        ..base
    });
    assert_eq!(step, Step::Done);
    assert_eq!(said.expect("set above").phase, PopulatePhase::Populated);
    // Bound while the prime claim is still there: it goes first.
    let (step, _) = decide(&Inputs {
        claim: &bound,
        job: Some(&done),
        prime: Some(&prime),
        ..base
    });
    assert_eq!(step, Step::DeletePrime);
}

#[test]
fn a_job_not_yet_succeeded_is_never_rebound() {
    let c = claim(None);
    let s = source(1);
    let prime = bound_prime(&c);
    let v = volume(&prime);
    for phase in [
        Phase::Pending,
        Phase::Running,
        Phase::Suspended,
        Phase::Failed,
    ] {
        let job = with_phase(populate_job(&c, &s), phase);
        let (step, _) = decide(&Inputs {
            source: Some(&s),
            prime: Some(&prime),
            job: Some(&job),
            volume: Some(&v),
            ..inputs(&c)
        });
        assert!(!matches!(step, Step::Rebind { .. }), "{phase:?}: {step:?}");
    }
}

#[test]
fn a_failed_copy_is_said_and_tried_again_once_the_source_changes() {
    let c = claim(None);
    let prime = bound_prime(&c);
    let s1 = source(1);
    let failed = with_phase(populate_job(&c, &s1), Phase::Failed);
    let (step, said) = decide(&Inputs {
        source: Some(&s1),
        prime: Some(&prime),
        job: Some(&failed),
        ..inputs(&c)
    });
    assert_eq!(step, Step::Wait);
    assert_eq!(
        said.expect("set above").reason,
        PopulateReason::PopulateFailed
    );
    let s2 = source(2);
    let (step, _) = decide(&Inputs {
        source: Some(&s2),
        prime: Some(&prime),
        job: Some(&failed),
        ..inputs(&c)
    });
    assert_eq!(step, Step::DeleteJob);
}

#[test]
fn objects_with_ferrys_names_not_made_for_the_claim_are_never_followed() {
    let c = claim(None);
    let s = source(1);
    let mut squatter = bound_prime(&c);
    squatter.metadata.owner_references = None;
    let (step, said) = decide(&Inputs {
        source: Some(&s),
        prime: Some(&squatter),
        ..inputs(&c)
    });
    assert_eq!(step, Step::Refuse);
    assert_eq!(
        said.expect("set above").reason,
        PopulateReason::InvalidClaim
    );

    let prime = bound_prime(&c);
    let mut job = with_phase(populate_job(&c, &s), Phase::Succeeded);
    job.metadata
        .labels
        .as_mut()
        .expect("set above")
        .insert(POPULATE_FOR.into(), "other".into());
    let v = volume(&prime);
    let (step, _) = decide(&Inputs {
        source: Some(&s),
        prime: Some(&prime),
        job: Some(&job),
        volume: Some(&v),
        ..inputs(&c)
    });
    assert_eq!(step, Step::Refuse);
}

#[test]
fn a_claim_without_class_or_size_or_with_a_selector_is_refused_with_what_to_change() {
    let s = source(1);
    let mut no_class = claim(None);
    no_class
        .spec
        .as_mut()
        .expect("set above")
        .storage_class_name = None;
    let mut no_size = claim(None);
    no_size.spec.as_mut().expect("set above").resources = None;
    let mut selector = claim(None);
    selector.spec.as_mut().expect("set above").selector = Some(Default::default());
    for (c, field) in [
        (no_class, "storageClassName"),
        (no_size, "requests.storage"),
        (selector, "selector"),
    ] {
        let (step, said) = decide(&Inputs {
            source: Some(&s),
            ..inputs(&c)
        });
        assert_eq!(step, Step::Refuse);
        let said = said.expect("set above");
        assert!(said.message.contains(field), "{field}: {}", said.message);
    }
}
