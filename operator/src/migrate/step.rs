//! What a claim migration's decision reads ([`Inputs`]: the migration and what exists for
//! it) and what it returns ([`Step`]: the one action to take now), apart from the
//! decision itself (`decide.rs`) so that each reads on its own.

use std::collections::BTreeMap;

use ferry_crds::{ClaimMigration, ClaimMigrationStatus, CopyJob, MigrationUser, UserKind};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;

/// What runs a pod that has the claim, as the operator found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A Deployment or StatefulSet with `replicas` wanted now.
    User(MigrationUser),
    /// Anything Ferry does not scale; the sentence names it and says what to change.
    Unsupported(String),
}

/// The one step to take for a migration now.
#[derive(Debug, Clone)]
pub enum Step {
    /// Nothing to do until something changes (a copy, a pod going, the PV controller).
    Wait,
    /// Finished (or refused), and nothing left to do.
    Done,
    AddFinalizer,
    RemoveFinalizer,
    /// Write this status (the next step, or where the current one is): always before the
    /// step is taken.
    Status(Box<ClaimMigrationStatus>),
    CreateClaim(Box<PersistentVolumeClaim>),
    CreateJob(Box<CopyJob>),
    /// The final sync ran while a pod had the claim again: it is deleted and run anew.
    DeleteJob(String),
    Scale {
        kind: UserKind,
        name: String,
        replicas: i32,
    },
    /// Set the volume's reclaim policy to Retain, at `resource_version`.
    Retain {
        volume: String,
        resource_version: String,
    },
    /// Give the new volume (at `resource_version`) to the claim's name, no uid: the claim
    /// of that name made next is bound to it.
    PreBind {
        volume: String,
        resource_version: String,
        claim_ref: Box<ObjectReference>,
    },
    /// Delete the claim `name`, only if its uid is still `uid`.
    DeleteClaim {
        name: String,
        uid: String,
    },
    /// Set a hook's Job's `spec.suspend` (false: start it; true: stop it), at
    /// `resource_version`.
    SuspendJob {
        name: String,
        suspend: bool,
        resource_version: String,
    },
    /// Delete a completed hook's Job (uid `uid`) whose pods mount the claim: a finished pod
    /// that is not deleted keeps its claims from being deleted (the PVC protection
    /// controller waits for it, kubernetes#113828), and the swap deletes the claim.
    DeleteHook {
        name: String,
        uid: String,
    },
}

impl PartialEq for Step {
    fn eq(&self, other: &Self) -> bool {
        use Step::*;
        match (self, other) {
            (Status(a), Status(b)) => a == b,
            (CreateClaim(a), CreateClaim(b)) => a == b,
            // A CopyJob is its metadata and spec (the derive gives it no PartialEq).
            (CreateJob(a), CreateJob(b)) => a.metadata == b.metadata && a.spec == b.spec,
            (DeleteJob(a), DeleteJob(b)) => a == b,
            (
                Scale {
                    kind: k1,
                    name: n1,
                    replicas: r1,
                },
                Scale {
                    kind: k2,
                    name: n2,
                    replicas: r2,
                },
            ) => (k1, n1, r1) == (k2, n2, r2),
            (
                Retain {
                    volume: v1,
                    resource_version: r1,
                },
                Retain {
                    volume: v2,
                    resource_version: r2,
                },
            ) => (v1, r1) == (v2, r2),
            (
                PreBind {
                    volume: v1,
                    resource_version: r1,
                    claim_ref: c1,
                },
                PreBind {
                    volume: v2,
                    resource_version: r2,
                    claim_ref: c2,
                },
            ) => (v1, r1, c1) == (v2, r2, c2),
            (DeleteClaim { name: n1, uid: u1 }, DeleteClaim { name: n2, uid: u2 }) => {
                (n1, u1) == (n2, u2)
            }
            (
                SuspendJob {
                    name: n1,
                    suspend: s1,
                    resource_version: r1,
                },
                SuspendJob {
                    name: n2,
                    suspend: s2,
                    resource_version: r2,
                },
            ) => (n1, s1, r1) == (n2, s2, r2),
            (DeleteHook { name: n1, uid: u1 }, DeleteHook { name: n2, uid: u2 }) => {
                (n1, u1) == (n2, u2)
            }
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

/// What the decision reads.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub migration: &'a ClaimMigration,
    pub now: Timestamp,
    /// The claim named `spec.claim` in the migration's namespace, if any (after the swap,
    /// the one made for the new volume).
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The claim's volume before the swap (`status.oldVolume`, or the claim's own).
    pub old_volume: Option<&'a PersistentVolume>,
    /// The target StorageClass, if it exists.
    pub class: Option<&'a StorageClass>,
    /// At `Checking`: what runs each pod that has the claim (one entry per workload).
    pub found: &'a [Found],
    /// Other ClaimMigrations of the namespace, not finished, that name the same claim.
    pub others: &'a [String],
    /// The recorded users' `spec.replicas` now (absent: the workload is gone).
    pub replicas: &'a BTreeMap<(UserKind, String), i32>,
    /// Pods that have the claim (any not Succeeded or Failed, terminating ones included).
    pub pods_using: usize,
    /// The object named [`migration_claim_name`], if any.
    pub new_claim: Option<&'a PersistentVolumeClaim>,
    /// The new claim's volume (`status.newVolume`, or the new claim's own).
    pub new_volume: Option<&'a PersistentVolume>,
    /// The objects named [`migration_copy_name`] and [`migration_sync_name`], if any.
    pub copy: Option<&'a CopyJob>,
    pub sync: Option<&'a CopyJob>,
    /// At `Checking`, `RunningHook` and `RollingBack`: the Jobs `spec.hooks` names that
    /// exist, by name.
    pub hooks: &'a BTreeMap<String, Job>,
}
