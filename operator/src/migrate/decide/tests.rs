//! A migration's steps against a small simulated cluster: each step the decision picks is
//! applied as the API server and the PV and workload controllers would, and the decision is
//! asked again, as a reconcile would after any restart. What the tests check is what a user
//! would: where the claim's name points at the end, that the old volume's data is never at
//! risk, and that the users run, on old or new data, whatever fails.

use std::collections::BTreeMap;

use super::*;
use ferry_crds::{
    ClaimMigrationSpec, Compare, CopyJobStatus, MigrationTarget, Overwrite, UserKind, Verify,
    SELECTED_NODE_ANNOTATION,
};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimStatus, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, PodSpec,
    Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::SignedDuration;

const MIG: &str = "99999999-0000-0000-0000-000000000001";
const OLD: &str = "c0000000-0000-0000-0000-00000000000a";

fn migration(to: &str, node: Option<&str>) -> ClaimMigration {
    let mut m = ClaimMigration::new(
        "move-data",
        ClaimMigrationSpec {
            claim: "data".into(),
            to: MigrationTarget {
                storage_class_name: to.into(),
                node: node.map(String::from),
            },
            quiesce_timeout_seconds: 60,
            parallelism: Default::default(),
            hooks: Default::default(),
        },
    );
    m.metadata.namespace = Some("app".into());
    m.metadata.uid = Some(MIG.into());
    m
}

fn gi() -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_string(), Quantity("1Gi".into()))])
}

fn bound_claim(name: &str, uid: &str, class: &str, volume: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("app".into()),
            uid: Some(uid.into()),
            labels: Some(BTreeMap::from([("app".to_string(), "db".to_string())])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(class.into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(gi()),
                limits: None,
            }),
            volume_name: Some(volume.into()),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: Some(gi()),
            ..Default::default()
        }),
    }
}

fn volume(name: &str, class: &str, claim: &PersistentVolumeClaim) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            storage_class_name: Some(class.into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(gi()),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.namespace(),
                name: Some(claim.name_any()),
                uid: claim.uid(),
                resource_version: Some("7".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

fn class(name: &str, mode: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: "ferry-csi".into(),
        volume_binding_mode: Some(mode.into()),
        ..Default::default()
    }
}

/// What fails in a simulated run.
#[derive(Default, Clone, Copy)]
struct Faults {
    copy_fails: bool,
    sync_fails: bool,
    /// A pod (not the users') keeps the claim for good.
    pod_stays: bool,
    /// A user is scaled up again while the final sync runs (once).
    scaled_up_during_sync: bool,
}

/// The cluster a migration runs in, and what the decision did to it.
struct World {
    m: ClaimMigration,
    claims: BTreeMap<String, PersistentVolumeClaim>,
    volumes: BTreeMap<String, PersistentVolume>,
    classes: Vec<StorageClass>,
    found: Vec<Found>,
    replicas: BTreeMap<(UserKind, String), i32>,
    jobs: BTreeMap<String, CopyJob>,
    now: Timestamp,
    faults: Faults,
    /// Volumes deleted (by a Delete reclaim policy once their claim went).
    lost: Vec<String>,
    steps: Vec<Step>,
    next_uid: u32,
    /// The hooks' Jobs, by name.
    hooks: BTreeMap<String, Job>,
    /// What a hook's Job does once started (absent: it completes).
    hook_does: BTreeMap<String, HookDoes>,
    /// Each start of a hook: its Job, the users' replicas then, whether the final sync
    /// existed then.
    hook_starts: Vec<(String, i32, bool)>,
}

/// What a hook's Job does in a simulated run once started.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HookDoes {
    Fails,
    Hangs,
}

impl World {
    fn new(m: ClaimMigration) -> Self {
        let old = bound_claim("data", OLD, "slow", "pv-old");
        let pv = volume("pv-old", "slow", &old);
        World {
            m,
            claims: BTreeMap::from([("data".to_string(), old)]),
            volumes: BTreeMap::from([("pv-old".to_string(), pv)]),
            classes: vec![class("slow", "Immediate"), class("fast", "Immediate")],
            found: vec![Found::User(MigrationUser {
                kind: UserKind::StatefulSet,
                name: "db".into(),
                replicas: 2,
            })],
            replicas: BTreeMap::from([((UserKind::StatefulSet, "db".to_string()), 2)]),
            jobs: BTreeMap::new(),
            now: Timestamp::from_second(1_800_000_000).expect("set in the simulated cluster"),
            faults: Faults::default(),
            lost: Vec::new(),
            steps: Vec::new(),
            next_uid: 0,
            hooks: BTreeMap::new(),
            hook_does: BTreeMap::new(),
            hook_starts: Vec::new(),
        }
    }

    fn pods_using(&self) -> usize {
        let users: i32 = self.replicas.values().sum();
        users as usize + usize::from(self.faults.pod_stays)
    }

    fn decide(&self) -> Step {
        let uid = MIG;
        let status = self.m.status.clone().unwrap_or_default();
        let claim = self.claims.get("data");
        let new_claim = self.claims.get(&migration_claim_name(uid));
        let old_volume = status
            .old_volume
            .clone()
            .or_else(|| claim.and_then(volume_of))
            .and_then(|v| self.volumes.get(&v));
        let new_volume = status
            .new_volume
            .clone()
            .or_else(|| new_claim.and_then(volume_of))
            .and_then(|v| self.volumes.get(&v));
        let found = if status.step == Some(MigrationStep::Checking) {
            self.found.clone()
        } else {
            Vec::new()
        };
        let inputs = Inputs {
            migration: &self.m,
            now: self.now,
            claim,
            old_volume,
            class: self
                .classes
                .iter()
                .find(|c| c.name_any() == self.m.spec.to.storage_class_name),
            found: &found,
            others: &[],
            replicas: &self.replicas,
            pods_using: self.pods_using(),
            new_claim,
            new_volume,
            copy: self.jobs.get(&migration_copy_name(uid)),
            sync: self.jobs.get(&migration_sync_name(uid)),
            hooks: &self.hooks,
        };
        decide(&inputs)
    }

    fn uid(&mut self) -> String {
        self.next_uid += 1;
        format!("u{}", self.next_uid)
    }

    /// Apply `step` as the cluster would; the PV controller binds what it can after.
    fn apply(&mut self, step: &Step) {
        self.now += SignedDuration::from_secs(1);
        match step {
            Step::Wait | Step::Done => self.now += SignedDuration::from_secs(5),
            Step::AddFinalizer => {
                self.m.metadata.finalizers = Some(vec![MIGRATION_FINALIZER.into()])
            }
            Step::RemoveFinalizer => self.m.metadata.finalizers = None,
            Step::Status(s) => self.m.status = Some((**s).clone()),
            Step::CreateClaim(c) => {
                let name = c.name_any();
                assert!(!self.claims.contains_key(&name), "created {name} twice");
                assert!(
                    c.spec
                        .as_ref()
                        .expect("set in the simulated cluster")
                        .volume_name
                        .is_none(),
                    "a claim Ferry makes names no volume"
                );
                let mut c = (**c).clone();
                c.metadata.uid = Some(self.uid());
                if name.starts_with("ferry-migrate-") {
                    // Provisioned new.
                    let pv = format!("pv-{}", c.uid().expect("set in the simulated cluster"));
                    c.spec
                        .as_mut()
                        .expect("set in the simulated cluster")
                        .volume_name = Some(pv.clone());
                    let class = c
                        .spec
                        .as_ref()
                        .expect("set in the simulated cluster")
                        .storage_class_name
                        .clone()
                        .expect("set in the simulated cluster");
                    self.volumes.insert(pv.clone(), volume(&pv, &class, &c));
                }
                self.claims.insert(name, c);
            }
            Step::CreateJob(j) => {
                let name = j.name_any();
                let fails = if name.contains("final") {
                    self.faults.sync_fails
                } else {
                    self.faults.copy_fails
                };
                let mut j = (**j).clone();
                let uid = self.uid();
                j.metadata.uid = Some(uid.clone());
                j.status = Some(CopyJobStatus {
                    phase: Some(if fails {
                        Phase::Failed
                    } else {
                        Phase::Succeeded
                    }),
                    manifest: Some(format!(".ferry/{uid}.xxh128")),
                    ..Default::default()
                });
                if name.contains("final") && self.faults.scaled_up_during_sync {
                    self.faults.scaled_up_during_sync = false;
                    self.replicas
                        .insert((UserKind::StatefulSet, "db".into()), 1);
                }
                self.jobs.insert(name, j);
            }
            Step::DeleteJob(name) => {
                self.jobs.remove(name);
            }
            Step::Scale {
                kind,
                name,
                replicas,
            } => {
                self.replicas.insert((*kind, name.clone()), *replicas);
            }
            Step::Retain { volume, .. } => {
                let v = self
                    .volumes
                    .get_mut(volume)
                    .expect("set in the simulated cluster");
                v.spec
                    .as_mut()
                    .expect("set in the simulated cluster")
                    .persistent_volume_reclaim_policy = Some("Retain".into());
            }
            Step::PreBind {
                volume, claim_ref, ..
            } => {
                assert!(claim_ref.uid.is_none());
                let v = self
                    .volumes
                    .get_mut(volume)
                    .expect("set in the simulated cluster");
                v.spec
                    .as_mut()
                    .expect("set in the simulated cluster")
                    .claim_ref = Some((**claim_ref).clone());
            }
            Step::SuspendJob { name, suspend, .. } => {
                let does = self.hook_does.get(name).copied();
                let replicas = self.replicas.values().sum();
                let synced = self.jobs.contains_key(&migration_sync_name(MIG));
                let job = self
                    .hooks
                    .get_mut(name)
                    .expect("set in the simulated cluster");
                job.spec
                    .as_mut()
                    .expect("set in the simulated cluster")
                    .suspend = Some(*suspend);
                let status = job.status.get_or_insert_with(Default::default);
                if *suspend {
                    // The Job controller deletes its pods.
                    status.active = Some(0);
                    return;
                }
                self.hook_starts.push((name.clone(), replicas, synced));
                status.start_time = Some(Time(self.now));
                let condition = |type_: &str| JobCondition {
                    type_: type_.into(),
                    status: "True".into(),
                    reason: Some("Simulated".into()),
                    message: Some("the simulated Job ended".into()),
                    ..Default::default()
                };
                match does {
                    None => status.conditions = Some(vec![condition("Complete")]),
                    Some(HookDoes::Fails) => status.conditions = Some(vec![condition("Failed")]),
                    Some(HookDoes::Hangs) => status.active = Some(1),
                }
            }
            Step::DeleteHook { name, uid } => {
                if self.hooks.get(name).and_then(|j| j.uid()).as_deref() == Some(uid.as_str()) {
                    self.hooks.remove(name);
                }
            }
            Step::DeleteClaim { name, uid } => {
                let Some(c) = self.claims.get(name) else {
                    return;
                };
                if c.uid().as_deref() != Some(uid.as_str()) {
                    return;
                }
                // The PVC protection controller: a pod of a Job that mounts it, finished but
                // not deleted, keeps it.
                if self.hooks.values().any(|j| super::mounts(j, name)) {
                    return;
                }
                let c = self
                    .claims
                    .remove(name)
                    .expect("set in the simulated cluster");
                // The PV controller: a volume still bound to the claim gone is reclaimed.
                if let Some(v) = volume_of(&c) {
                    let pv = &self.volumes[&v];
                    let bound = claim_ref_of(pv).is_some_and(|r| r.uid == c.uid());
                    let policy = pv
                        .spec
                        .as_ref()
                        .expect("set in the simulated cluster")
                        .persistent_volume_reclaim_policy
                        .clone();
                    if bound && policy.as_deref() == Some("Delete") {
                        self.volumes.remove(&v);
                        self.lost.push(v);
                    }
                }
            }
        }
        // The PV controller binds a claim to the volume pre-bound to its name.
        for (name, c) in self.claims.iter_mut() {
            if volume_of(c).is_some() {
                continue;
            }
            for v in self.volumes.values_mut() {
                let r = v
                    .spec
                    .as_mut()
                    .expect("set in the simulated cluster")
                    .claim_ref
                    .as_mut()
                    .expect("set in the simulated cluster");
                if r.name.as_deref() == Some(name) && r.uid.is_none() {
                    r.uid = c.uid();
                    c.spec
                        .as_mut()
                        .expect("set in the simulated cluster")
                        .volume_name = v.metadata.name.clone();
                }
            }
        }
    }

    /// Decide and apply until done (at most `limit` steps), each step also decided a
    /// second time first, as a restarted operator would, and required to be the same.
    fn run(&mut self, limit: usize) {
        for _ in 0..limit {
            let step = self.decide();
            assert_eq!(step, self.decide(), "the same state, another step");
            if step == Step::Done {
                return;
            }
            self.apply(&step);
            self.steps.push(step);
        }
        panic!("not done after {limit} steps: {:#?}", self.steps.last());
    }

    fn status(&self) -> ClaimMigrationStatus {
        self.m.status.clone().unwrap_or_default()
    }

    fn position(&self, what: impl Fn(&Step) -> bool) -> Option<usize> {
        self.steps.iter().position(what)
    }
}

fn scaled_to(n: i32) -> impl Fn(&Step) -> bool {
    move |s| matches!(s, Step::Scale { replicas, .. } if *replicas == n)
}

#[test]
fn a_migration_moves_the_name_to_the_new_volume_and_keeps_the_old_one() {
    let mut w = World::new(migration("fast", None));
    w.run(100);
    let s = w.status();
    assert_eq!(s.step, Some(MigrationStep::Succeeded), "{}", s.message);
    assert_eq!(s.reason, Some(MigrationReason::Migrated));
    // What `kubectl ferry verify --migration` checks the claim against: the final sync's.
    let sync = w
        .jobs
        .values()
        .find(|j| j.name_any().contains("final"))
        .expect("the final sync");
    assert_eq!(
        s.manifest,
        sync.status.as_ref().and_then(|st| st.manifest.clone())
    );
    assert!(s.manifest.is_some());
    let claim = &w.claims["data"];
    let new = s.new_volume.clone().expect("set in the simulated cluster");
    assert_eq!(
        volume_of(claim),
        Some(new.clone()),
        "the name is on the new volume"
    );
    assert_eq!(
        claim
            .spec
            .as_ref()
            .expect("set in the simulated cluster")
            .storage_class_name
            .as_deref(),
        Some("fast")
    );
    assert_eq!(
        claim.labels().get("app").map(String::as_str),
        Some("db"),
        "the claim's labels kept"
    );
    assert_eq!(
        claim.labels().get(MIGRATION_LABEL).map(String::as_str),
        Some(MIG)
    );
    assert!(w.lost.is_empty(), "no volume was reclaimed: {:?}", w.lost);
    let old = &w.volumes["pv-old"];
    assert_eq!(
        old.spec
            .as_ref()
            .expect("set in the simulated cluster")
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    assert!(
        s.message.contains("pv-old") && s.message.contains("Retain"),
        "{}",
        s.message
    );
    assert!(
        !w.claims.contains_key(&migration_claim_name(MIG)),
        "the new claim is gone"
    );
    assert_eq!(
        w.replicas[&(UserKind::StatefulSet, "db".into())],
        2,
        "the users are back"
    );
    // The order that makes it safe.
    let down = w
        .position(scaled_to(0))
        .expect("set in the simulated cluster");
    let sync = w
        .position(|s| matches!(s, Step::CreateJob(j) if j.name_any() == migration_sync_name(MIG)))
        .expect("set in the simulated cluster");
    let retain = w
        .position(|s| matches!(s, Step::Retain { .. }))
        .expect("set in the simulated cluster");
    let delete_old = w
        .position(|s| matches!(s, Step::DeleteClaim { uid, .. } if uid == OLD))
        .expect("set in the simulated cluster");
    let up = w
        .position(scaled_to(2))
        .expect("set in the simulated cluster");
    assert!(down < sync && sync < retain && retain < delete_old && delete_old < up);
    let copy = w
        .position(|s| matches!(s, Step::CreateJob(j) if j.name_any() == migration_copy_name(MIG)))
        .expect("set in the simulated cluster");
    assert!(copy < down, "the live copy runs before the users stop");
    let downtime = s.downtime_seconds.expect("set in the simulated cluster");
    assert!(downtime > 0.0 && downtime < 60.0, "{downtime}");
    assert!(s.copy_seconds.is_some());
    assert_eq!(s.users.len(), 1);
}

#[test]
fn the_final_sync_checks_every_byte_and_deletes_what_the_claim_lost() {
    let m = migration("fast", None);
    let sync = sync_job(&m, false).spec;
    assert_eq!(
        (sync.overwrite, sync.compare, sync.verify),
        (Overwrite::IfChanged, Compare::Checksum, Verify::Checksum)
    );
    assert!(sync.delete_extraneous);
    assert!(
        !sync_job(&m, true).spec.delete_extraneous,
        "a device has no files to delete"
    );
    let copy = copy_job(&m).spec;
    assert_eq!(copy.source.pvc.as_deref(), Some("data"));
    assert_eq!(copy.destination.pvc, Some(migration_claim_name(MIG)));
    assert_eq!(copy.verify, Verify::Checksum);
}

#[test]
fn each_step_survives_being_taken_twice() {
    // A reconcile whose write landed but whose operator died before it saw the answer: the
    // next one decides from what is there.
    let mut w = World::new(migration("fast", None));
    for _ in 0..100 {
        let step = w.decide();
        if step == Step::Done {
            break;
        }
        w.apply(&step);
        let again = w.decide();
        if let Step::CreateClaim(_) | Step::CreateJob(_) = again {
            assert_ne!(again, step, "made twice");
        }
        w.steps.push(step);
    }
    assert_eq!(w.status().step, Some(MigrationStep::Succeeded));
    assert_eq!(volume_of(&w.claims["data"]), w.status().new_volume);
}

#[test]
fn a_failed_live_copy_leaves_the_users_running_on_the_old_claim() {
    let mut w = World::new(migration("fast", None));
    w.faults.copy_fails = true;
    w.run(100);
    let s = w.status();
    assert_eq!(
        (s.step, s.reason),
        (
            Some(MigrationStep::Failed),
            Some(MigrationReason::CopyFailed)
        )
    );
    assert!(
        w.position(scaled_to(0)).is_none(),
        "the users were never stopped"
    );
    assert_eq!(w.claims["data"].uid().as_deref(), Some(OLD));
    assert_eq!(volume_of(&w.claims["data"]).as_deref(), Some("pv-old"));
    assert!(s.message.contains("on its old volume"), "{}", s.message);
    assert!(s.downtime_seconds.is_none());
}

#[test]
fn a_failed_final_sync_scales_the_users_back_on_the_old_claim() {
    let mut w = World::new(migration("fast", None));
    w.faults.sync_fails = true;
    w.run(100);
    let s = w.status();
    assert_eq!(
        (s.step, s.reason),
        (
            Some(MigrationStep::Failed),
            Some(MigrationReason::FinalSyncFailed)
        )
    );
    assert_eq!(w.replicas[&(UserKind::StatefulSet, "db".into())], 2);
    assert_eq!(
        w.claims["data"].uid().as_deref(),
        Some(OLD),
        "the old claim untouched"
    );
    let pv = &w.volumes["pv-old"];
    assert_eq!(
        pv.spec
            .as_ref()
            .expect("set in the simulated cluster")
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Delete"),
        "nothing of the old volume changed"
    );
    assert!(
        s.downtime_seconds.is_some(),
        "the downtime it cost is reported"
    );
}

#[test]
fn a_user_someone_scaled_up_meanwhile_is_left_as_it_is() {
    let mut w = World::new(migration("fast", None));
    w.faults.sync_fails = true;
    for _ in 0..100 {
        if w.status().step == Some(MigrationStep::RollingBack) {
            break;
        }
        let s = w.decide();
        w.apply(&s);
    }
    assert_eq!(w.status().step, Some(MigrationStep::RollingBack));
    w.replicas.insert((UserKind::StatefulSet, "db".into()), 1);
    w.run(20);
    assert_eq!(w.status().step, Some(MigrationStep::Failed));
    assert_eq!(
        w.replicas[&(UserKind::StatefulSet, "db".into())],
        1,
        "not resized from 1 to 2"
    );
}

#[test]
fn users_that_do_not_stop_are_scaled_back_after_the_timeout() {
    let mut w = World::new(migration("fast", None));
    w.faults.pod_stays = true;
    w.run(200);
    let s = w.status();
    assert_eq!(
        (s.step, s.reason),
        (
            Some(MigrationStep::Failed),
            Some(MigrationReason::QuiesceTimeout)
        )
    );
    assert!(s.message.contains("quiesceTimeoutSeconds"), "{}", s.message);
    assert_eq!(w.replicas[&(UserKind::StatefulSet, "db".into())], 2);
    assert!(
        !w.jobs.contains_key(&migration_sync_name(MIG)),
        "no final sync with a pod writing"
    );
}

#[test]
fn a_user_scaled_up_during_the_final_sync_means_another_sync() {
    let mut w = World::new(migration("fast", None));
    w.faults.scaled_up_during_sync = true;
    w.run(200);
    assert_eq!(w.status().step, Some(MigrationStep::Succeeded));
    let syncs = w
        .steps
        .iter()
        .filter(|s| matches!(s, Step::CreateJob(j) if j.name_any() == migration_sync_name(MIG)))
        .count();
    assert_eq!(syncs, 2, "the first sync is not trusted");
    assert!(w.steps.iter().any(|s| matches!(s, Step::DeleteJob(_))));
    let retain = w
        .position(|s| matches!(s, Step::Retain { .. }))
        .expect("set in the simulated cluster");
    let last_down = w
        .steps
        .iter()
        .rposition(scaled_to(0))
        .expect("set in the simulated cluster");
    assert!(last_down < retain);
}

/// Run until the status reaches `step`, then mark the migration deleted.
fn delete_at(step: MigrationStep) -> World {
    let mut w = World::new(migration("fast", None));
    for _ in 0..100 {
        if w.status().step == Some(step) {
            w.m.metadata.deletion_timestamp = Some(Time(w.now));
            return w;
        }
        let s = w.decide();
        w.apply(&s);
        w.steps.push(s);
    }
    panic!("never reached {step:?}");
}

#[test]
fn deleted_before_the_swap_it_rolls_back_and_lets_go() {
    for step in [MigrationStep::Quiescing, MigrationStep::FinalSync] {
        let mut w = delete_at(step);
        w.run(100);
        let s = w.status();
        assert_eq!(
            (s.step, s.reason),
            (
                Some(MigrationStep::Failed),
                Some(MigrationReason::Cancelled)
            ),
            "{step:?}"
        );
        assert_eq!(
            w.replicas[&(UserKind::StatefulSet, "db".into())],
            2,
            "{step:?}"
        );
        assert_eq!(w.claims["data"].uid().as_deref(), Some(OLD), "{step:?}");
        assert!(
            w.m.finalizers().is_empty(),
            "{step:?}: the finalizer is removed"
        );
    }
    let mut w = delete_at(MigrationStep::Copying);
    w.run(100);
    assert!(w.m.finalizers().is_empty());
    assert_eq!(w.claims["data"].uid().as_deref(), Some(OLD));
}

#[test]
fn deleted_during_the_swap_it_finishes_first() {
    let mut w = delete_at(MigrationStep::Swapping);
    w.run(100);
    let s = w.status();
    assert_eq!(s.step, Some(MigrationStep::Succeeded));
    assert_eq!(volume_of(&w.claims["data"]), s.new_volume);
    assert_eq!(w.replicas[&(UserKind::StatefulSet, "db".into())], 2);
    assert!(w.m.finalizers().is_empty());
    assert!(w.lost.is_empty());
}

/// The refusal a migration in `w` ends with; nothing was made or scaled.
fn refused(mut w: World) -> (MigrationReason, String) {
    w.run(20);
    let s = w.status();
    assert_eq!(s.step, Some(MigrationStep::Failed), "{}", s.message);
    assert!(
        w.steps
            .iter()
            .all(|s| matches!(s, Step::Status(_) | Step::AddFinalizer)),
        "only its status changed: {:?}",
        w.steps
    );
    (s.reason.expect("set in the simulated cluster"), s.message)
}

#[test]
fn what_cannot_be_moved_is_refused_saying_what_to_change() {
    let mut bare = World::new(migration("fast", None));
    bare.found.push(Found::Unsupported(
        "pod debug is a bare pod (no controller to scale it to zero and back)".into(),
    ));
    let (reason, message) = refused(bare);
    assert_eq!(reason, MigrationReason::UnsupportedUser);
    assert!(
        message.contains("pod debug") && message.contains("Deployments and StatefulSets"),
        "{message}"
    );

    let (reason, message) = refused(World::new(migration("slow", None)));
    assert_eq!(reason, MigrationReason::InvalidMigration);
    assert!(message.contains("to.storageClassName"), "{message}");

    let (reason, message) = refused(World::new(migration("nvme", None)));
    assert_eq!(reason, MigrationReason::InvalidMigration);
    assert!(message.contains("no StorageClass nvme"), "{message}");

    let (reason, message) = refused(World::new(migration("fast", Some("node-b"))));
    assert_eq!(reason, MigrationReason::InvalidMigration);
    assert!(message.contains("remove to.node"), "{message}");

    let mut ferrys = World::new(migration("fast", None));
    let old = ferrys.claims.remove("data").expect("made");
    ferrys.m.spec.claim = "ferry-cache".into();
    ferrys.claims.insert("data".into(), old);
    let (reason, message) = refused(ferrys);
    assert_eq!(reason, MigrationReason::InvalidMigration);
    assert!(message.contains("ferry-*"), "{message}");

    let mut gone = World::new(migration("fast", None));
    gone.claims.clear();
    assert_eq!(refused(gone).0, MigrationReason::ClaimNotFound);

    let mut pending = World::new(migration("fast", None));
    pending
        .claims
        .get_mut("data")
        .expect("set in the simulated cluster")
        .spec
        .as_mut()
        .expect("set in the simulated cluster")
        .volume_name = None;
    assert_eq!(refused(pending).0, MigrationReason::ClaimNotBound);

    let mut squatted = World::new(migration("fast", None));
    let mut other = bound_claim(&migration_claim_name(MIG), "x", "fast", "pv-x");
    other.metadata.labels = None;
    squatted.claims.insert(migration_claim_name(MIG), other);
    let (reason, message) = refused(squatted);
    assert_eq!(reason, MigrationReason::InvalidMigration);
    assert!(message.contains("delete it"), "{message}");
}

#[test]
fn a_node_places_the_new_volume_of_a_class_that_waits() {
    let mut w = World::new(migration("fast", Some("node-b")));
    w.classes[1] = class("fast", "WaitForFirstConsumer");
    w.run(100);
    assert_eq!(w.status().step, Some(MigrationStep::Succeeded));
    let made = w
        .steps
        .iter()
        .find_map(|s| match s {
            Step::CreateClaim(c) if c.name_any() == migration_claim_name(MIG) => Some(c.clone()),
            _ => None,
        })
        .expect("set in the simulated cluster");
    assert_eq!(
        made.annotations()
            .get(SELECTED_NODE_ANNOTATION)
            .map(String::as_str),
        Some("node-b")
    );
}

#[test]
fn another_migration_of_the_claim_goes_first() {
    let w = World::new(migration("fast", None));
    let mut m = w.m.clone();
    m.metadata.finalizers = Some(vec![MIGRATION_FINALIZER.into()]);
    m.status = Some(ClaimMigrationStatus {
        step: Some(MigrationStep::Checking),
        ..Default::default()
    });
    let others = ["earlier".to_string()];
    let replicas = BTreeMap::new();
    let claim = &w.claims["data"];
    let inputs = Inputs {
        migration: &m,
        now: w.now,
        claim: Some(claim),
        old_volume: None,
        class: Some(&w.classes[1]),
        found: &[],
        others: &others,
        replicas: &replicas,
        pods_using: 0,
        new_claim: None,
        new_volume: None,
        copy: None,
        sync: None,
        hooks: &BTreeMap::new(),
    };
    let Step::Status(s) = decide(&inputs) else {
        panic!()
    };
    assert_eq!(
        (s.step, s.reason),
        (
            Some(MigrationStep::Failed),
            Some(MigrationReason::AlreadyMigrating)
        )
    );
    assert!(s.message.contains("earlier"));
}

/// A hook's Job as its author makes it: suspended, labelled for `for_` (if given).
fn hook_job(name: &str, for_: Option<&str>, suspend: bool) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("app".into()),
            uid: Some(format!("uid-of-{name}")),
            resource_version: Some("7".into()),
            labels: for_.map(|f| BTreeMap::from([(HOOK_LABEL.to_string(), f.to_string())])),
            ..Default::default()
        },
        spec: Some(JobSpec {
            suspend: Some(suspend),
            ..Default::default()
        }),
        status: None,
    }
}

fn with_hooks(scale_down: Option<&str>, final_sync: Option<&str>, timeout: i32) -> World {
    let mut m = migration("fast", None);
    let hook = |job: &str| ferry_crds::MigrationHook {
        job: job.into(),
        timeout_seconds: timeout,
    };
    m.spec.hooks.before_scale_down = scale_down.map(hook);
    m.spec.hooks.before_final_sync = final_sync.map(hook);
    let mut w = World::new(m);
    for job in scale_down.into_iter().chain(final_sync) {
        w.hooks
            .insert(job.into(), hook_job(job, Some("move-data"), true));
    }
    w
}

fn starts(w: &World, job: &str, suspend: bool) -> usize {
    w.steps
        .iter()
        .filter(|s| matches!(s, Step::SuspendJob { name, suspend: s, .. } if name == job && *s == suspend))
        .count()
}

#[test]
fn each_hook_runs_once_at_its_point() {
    let mut w = with_hooks(Some("flush"), Some("check"), 60);
    w.run(200);
    let s = w.status();
    assert_eq!(s.step, Some(MigrationStep::Succeeded), "{}", s.message);
    assert_eq!(
        w.hook_starts,
        vec![
            ("flush".to_string(), 2, false),
            ("check".to_string(), 0, false)
        ],
        "flush with the users running; check with them at zero, before the final sync"
    );
    assert_eq!(
        s.hooks_done,
        vec![HookPoint::BeforeScaleDown, HookPoint::BeforeFinalSync]
    );
    let flush = w
        .position(|s| matches!(s, Step::SuspendJob { name, .. } if name == "flush"))
        .expect("set in the simulated cluster");
    let down = w
        .position(scaled_to(0))
        .expect("set in the simulated cluster");
    assert!(flush < down, "the first hook runs before the scale-down");
}

#[test]
fn a_hook_is_not_run_again_when_the_final_sync_is() {
    let mut w = with_hooks(None, Some("check"), 60);
    w.faults.scaled_up_during_sync = true;
    w.run(200);
    assert_eq!(w.status().step, Some(MigrationStep::Succeeded));
    let syncs = w
        .steps
        .iter()
        .filter(|s| matches!(s, Step::CreateJob(j) if j.name_any() == migration_sync_name(MIG)))
        .count();
    assert_eq!(syncs, 2);
    assert_eq!(starts(&w, "check", false), 1, "a Job runs once");
}

#[test]
fn a_failed_hook_rolls_back_on_the_old_claim() {
    for (scale_down, final_sync) in [(Some("flush"), None), (None, Some("check"))] {
        let mut w = with_hooks(scale_down, final_sync, 60);
        let job = scale_down.or(final_sync).expect("one of the two");
        w.hook_does.insert(job.into(), HookDoes::Fails);
        w.run(200);
        let s = w.status();
        assert_eq!(
            (s.step, s.reason),
            (
                Some(MigrationStep::Failed),
                Some(MigrationReason::HookFailed)
            ),
            "{job}: {}",
            s.message
        );
        assert!(
            s.message.contains(job) && s.message.contains("failed"),
            "{}",
            s.message
        );
        assert_eq!(
            w.replicas[&(UserKind::StatefulSet, "db".into())],
            2,
            "{job}"
        );
        assert_eq!(w.claims["data"].uid().as_deref(), Some(OLD), "{job}");
        assert!(
            !w.jobs.contains_key(&migration_sync_name(MIG)),
            "{job}: no final sync after a failed hook"
        );
        assert!(
            !w.steps.iter().any(|s| matches!(s, Step::Retain { .. })),
            "{job}"
        );
    }
}

#[test]
fn a_hook_past_its_timeout_is_stopped_and_rolled_back() {
    let mut w = with_hooks(None, Some("check"), 10);
    w.hook_does.insert("check".into(), HookDoes::Hangs);
    w.run(200);
    let s = w.status();
    assert_eq!(
        (s.step, s.reason),
        (
            Some(MigrationStep::Failed),
            Some(MigrationReason::HookTimedOut)
        ),
        "{}",
        s.message
    );
    assert_eq!(
        starts(&w, "check", true),
        1,
        "suspended again: its pods stop"
    );
    let stop = w
        .position(|s| matches!(s, Step::SuspendJob { suspend: true, .. }))
        .expect("set in the simulated cluster");
    let up = w
        .steps
        .iter()
        .rposition(scaled_to(2))
        .expect("set in the simulated cluster");
    assert!(stop < up, "the hook is stopped before the users come back");
    assert_eq!(w.claims["data"].uid().as_deref(), Some(OLD));
}

#[test]
fn deleted_while_a_hook_runs_it_stops_the_hook_and_rolls_back() {
    let mut w = with_hooks(None, Some("check"), 600);
    w.hook_does.insert("check".into(), HookDoes::Hangs);
    for _ in 0..100 {
        if w.hook_starts.len() == 1 {
            break;
        }
        let s = w.decide();
        w.apply(&s);
        w.steps.push(s);
    }
    assert_eq!(w.status().step, Some(MigrationStep::RunningHook));
    w.m.metadata.deletion_timestamp = Some(Time(w.now));
    w.run(100);
    let s = w.status();
    assert_eq!(s.reason, Some(MigrationReason::Cancelled), "{}", s.message);
    assert_eq!(starts(&w, "check", true), 1);
    assert_eq!(w.replicas[&(UserKind::StatefulSet, "db".into())], 2);
    assert!(w.m.finalizers().is_empty());
}

#[test]
fn a_hook_that_is_not_a_suspended_job_for_this_migration_is_refused() {
    let cases = [
        (None, "no Job check"),
        (
            Some(hook_job("check", None, true)),
            "does not carry the label",
        ),
        (
            Some(hook_job("check", Some("another"), true)),
            "does not carry the label",
        ),
        (
            Some(hook_job("check", Some("move-data"), false)),
            "is not suspended",
        ),
    ];
    for (job, says) in cases {
        let mut w = with_hooks(None, Some("check"), 60);
        w.hooks.clear();
        if let Some(job) = job {
            w.hooks.insert("check".into(), job);
        }
        let (reason, message) = refused(w);
        assert_eq!(reason, MigrationReason::InvalidMigration, "{message}");
        assert!(message.contains(says), "{message}");
        assert!(
            message.contains("spec.suspend: true") && message.contains(HOOK_LABEL),
            "says what to change: {message}"
        );
    }
}

#[test]
fn a_completed_hook_whose_pods_mount_the_claim_is_deleted_before_the_swap() {
    let mut w = with_hooks(Some("flush"), Some("check"), 60);
    // "check" mounts the claim; "flush" does not (it would exec into the application).
    let check = w
        .hooks
        .get_mut("check")
        .expect("set in the simulated cluster");
    check
        .spec
        .as_mut()
        .expect("set in the simulated cluster")
        .template
        .spec = Some(PodSpec {
        volumes: Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "data".into(),
                read_only: None,
            }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    w.run(200);
    let s = w.status();
    assert_eq!(s.step, Some(MigrationStep::Succeeded), "{}", s.message);
    let deleted: Vec<&str> = w
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::DeleteHook { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, ["check"], "only the Job whose pods hold the claim");
    assert!(
        w.hooks.contains_key("flush"),
        "the other is the user's to keep"
    );
    let gone = w
        .position(|s| matches!(s, Step::DeleteHook { .. }))
        .expect("set in the simulated cluster");
    let sync = w
        .position(|s| matches!(s, Step::CreateJob(j) if j.name_any() == migration_sync_name(MIG)))
        .expect("set in the simulated cluster");
    assert!(
        gone < sync,
        "deleted as it completed, before the final sync"
    );
}
