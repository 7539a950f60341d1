//! The volume populator's grants: create and delete on claims in every namespace (its prime
//! claims) and patch on every PersistentVolume (the rebind), narrowed only by the chart's
//! `-populator` admission policy. A stolen operator token must not be able to give any volume
//! to any claim, nor provision a claim that reaches existing data; and no one but the operator
//! may take the names the operator follows (`ferry-prime-<uid>`, `ferry-populate-<uid>`).
//! Here, on the operator's own ServiceAccount token (and a tenant's) against the chart as
//! rendered into `deploy/`:
//!
//! - the prime claims `populator::decide::prime_claim` builds (with and without the
//!   scheduler's node) are admitted, and that claim with any one field added or changed is
//!   refused naming the field, but for what varies from claim to claim;
//! - a tenant (create on claims and CopyJobs in its namespace) is refused those names;
//! - the rebind the operator sends is admitted on the prime's volume, and with anything else
//!   changed, or on a volume that is not a prime's, refused;
//! - the operator deletes its prime claims, and no other claim of that name;
//! - the policy's validations type-check against the kinds it matches (kube-controller-
//!   manager's policy status controller, on a copy of concrete versions).
//!
//! The tables are checked against the objects first, as hostile/holder.rs's are: a field
//! added to `prime_claim` (or to the rebind) without a row here fails.

use anyhow::{ensure, Context, Result};
use ferry_crds::VolumeSource;
use ferry_e2e::ControlPlane;
use ferry_operator::populator::decide;
use serde_json::{json, Value};

use super::holder::{
    affinity, apply, ask, ask_all, ask_delete, ask_patch, ask_rows, ask_until, check_coverage,
    csi_volume, install, row, set, type_checked, Answer, Row, BETA_ZONE, TEAM,
};

/// The user's claim being populated, and two others of its namespace.
const UID: &str = "4f1c9a52-7d3e-4b8a-a6c1-2e9f0d7b5c31";
const OTHER: &str = "9a2b7c4d-1e3f-4a5b-8c6d-7e8f9a0b1c2d";
const THIRD: &str = "c3d4e5f6-a7b8-4c9d-8e0f-1a2b3c4d5e6f";
/// The policy's refusal of a reserved name to anyone but the operator.
const RESERVED: &str = "is reserved for the Ferry operator's volume populator";
/// The `-migrations` policy's refusal of a claim the operator creates that is none of its
/// restored, prime or migrations' claims (it judges every such claim, `operator.migrations`
/// being on by default): the shape of the claim that takes a migrated claim's name.
const NOT_RENAMED: &str = "a claim the Ferry operator creates under a migrated claim's name";
/// The same policy's refusal of a deletion of such a claim that is not bound.
const NOT_MIGRATED: &str = "deletes only its migrations' claims";
/// The `-populator` policy's refusal of a deletion.
const NOT_A_PRIME: &str = "deletes only its prime claims";
/// The API server's refusal of a patch at an old resourceVersion.
const CONFLICT: &str = "the object has been modified";
/// The API server's refusal of another node affinity on a volume.
const IMMUTABLE: &str = "nodeAffinity: Invalid value";

/// Which object a row starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    /// The prime claim of a claim whose class binds at once (no node).
    Prime,
    /// The prime claim of a WaitForFirstConsumer claim, the scheduler's node on it.
    PrimeOnNode,
    /// A tenant's own claim, and its CopyJob.
    TenantClaim,
    TenantJob,
    /// The operator's rebind patch, on the prime's volume (bound to `ferry-prime-<UID>`).
    Rebind,
    /// The same patch on a volume bound to the user's claim itself (not a prime's).
    RebindClaimed,
    /// The same patch on a volume bound to no claim.
    RebindAvailable,
}

/// The user's claim with `uid`: what `prime_claim` copies (class, size, modes, volume mode,
/// the scheduler's node) and what it must not (its data source, its other metadata).
fn user_claim(uid: &str, node: Option<&str>) -> Result<Value> {
    let mut annotations = json!({"example.com/owner": "team-a"});
    if let Some(node) = node {
        annotations["volume.kubernetes.io/selected-node"] = json!(node);
    }
    let source = json!({"apiGroup": "ferry.dev", "kind": "VolumeSource", "name": "golden"});
    Ok(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": TEAM, "uid": uid,
            "labels": {"app": "db"}, "annotations": annotations,
            "finalizers": ["kubernetes.io/pvc-protection"]},
        "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}, "volumeMode": "Filesystem",
            "dataSource": source, "dataSourceRef": source}
    }))
}

/// The prime claim the code builds for [`user_claim`].
fn prime(uid: &str, node: Option<&str>) -> Result<Value> {
    let claim = serde_json::from_value(user_claim(uid, node)?)?;
    Ok(serde_json::to_value(decide::prime_claim(&claim))?)
}

/// The prime claim's rows: one field added or changed each, and what varies from prime to
/// prime (the user's class, size, modes, node, namespace, and the claim itself).
#[rustfmt::skip]
fn prime_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{Prime as P, PrimeOnNode as N};
    vec![
        // What varies from claim to claim.
        row(P, "another class", vec![set("/spec/storageClassName", json!("fast"))], Admitted),
        row(P, "another size", vec![set("/spec/resources/requests/storage", json!("5Gi"))], Admitted),
        row(P, "a storage limit", vec![set("/spec/resources/limits", json!({"storage": "5Gi"}))], Admitted),
        row(P, "shared by many nodes", vec![set("/spec/accessModes/0", json!("ReadWriteMany"))], Admitted),
        row(P, "two access modes", vec![set("/spec/accessModes/1", json!("ReadOnlyMany"))], Admitted),
        row(P, "a block device", vec![set("/spec/volumeMode", json!("Block"))], Admitted),
        row(P, "the volume mode left to the API server", vec![("/spec/volumeMode", None)], Admitted),
        row(P, "another namespace", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        // The owner's name cannot be checked against its uid here; the garbage collector and
        // the operator's own reads go by uid.
        row(P, "an owner of another name", vec![set("/metadata/ownerReferences/0/name", json!("other"))], Admitted),
        row(P, "another claim", vec![
            set("/metadata/name", json!(format!("ferry-prime-{OTHER}"))),
            set("/metadata/labels/ferry.dev~1populate-for", json!(OTHER)),
            set("/metadata/ownerReferences/0/name", json!("other")),
            set("/metadata/ownerReferences/0/uid", json!(OTHER)),
        ], Admitted),
        row(N, "another node", vec![set("/metadata/annotations/volume.kubernetes.io~1selected-node", json!("node-b"))], Admitted),
        // Metadata.
        row(P, "a name not made from the owner", vec![set("/metadata/name", json!("ferry-prime-evil"))], Refused("metadata.name")),
        row(P, "an owner other than the name's", vec![set("/metadata/ownerReferences/0/uid", json!(OTHER))], Refused("metadata.name")),
        row(P, "labelled for another claim", vec![set("/metadata/labels/ferry.dev~1populate-for", json!(OTHER))], Refused("metadata.labels")),
        row(P, "managed by someone else", vec![set("/metadata/labels/app.kubernetes.io~1managed-by", json!("helm"))], Refused("metadata.labels")),
        row(P, "an extra label", vec![set("/metadata/labels/app", json!("db"))], Refused("metadata.labels")),
        row(P, "a provisioner's annotation", vec![set("/metadata/annotations", json!({"nfs.io/storage-path": "team-b/data"}))], Refused("metadata.annotations")),
        row(N, "a second annotation", vec![set("/metadata/annotations/nfs.io~1storage-path", json!("team-b/data"))], Refused("metadata.annotations")),
        row(N, "the selected node's annotation renamed", vec![
            ("/metadata/annotations/volume.kubernetes.io~1selected-node", None),
            set("/metadata/annotations/volume.beta.kubernetes.io~1storage-provisioner", json!("csi.example.com")),
        ], Refused("metadata.annotations")),
        row(P, "an owner of another API version", vec![set("/metadata/ownerReferences/0/apiVersion", json!("v2"))], Refused("metadata.ownerReferences")),
        row(P, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopyJob"))], Refused("metadata.ownerReferences")),
        row(P, "an owner that is not the controller", vec![set("/metadata/ownerReferences/0/controller", json!(false))], Refused("metadata.ownerReferences")),
        row(P, "an owner blocking deletion", vec![set("/metadata/ownerReferences/0/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(P, "a second owner", vec![set("/metadata/ownerReferences/1", json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "other", "uid": OTHER}))], Refused("metadata.ownerReferences")),
        row(P, "no owner", vec![("/metadata/ownerReferences", None)], Refused("metadata.ownerReferences")),
        row(P, "a generated name", vec![set("/metadata/generateName", json!("ferry-prime-"))], Refused("metadata.generateName")),
        row(P, "a finalizer", vec![set("/metadata/finalizers", json!(["example.com/never"]))], Refused("metadata.finalizers")),
        // The spec: provisioned new, like the user's claim.
        row(P, "a clone of another claim", vec![set("/spec/dataSource", json!({"kind": "PersistentVolumeClaim", "name": "other"}))], Refused("spec.dataSource")),
        row(P, "a snapshot restored", vec![set("/spec/dataSource", json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "other"}))], Refused("spec.dataSource")),
        row(P, "populated itself (the user's dataSourceRef)", vec![set("/spec/dataSourceRef", json!({"apiGroup": "ferry.dev", "kind": "VolumeSource", "name": "golden"}))], Refused("spec.dataSourceRef")),
        row(P, "another tenant's released volume", vec![set("/spec/volumeName", json!("someone-elses"))], Refused("spec.volumeName")),
        row(P, "a volume selector", vec![set("/spec/selector", json!({"matchLabels": {"tenant": "team-b"}}))], Refused("spec.selector")),
        row(P, "a volume attributes class", vec![set("/spec/volumeAttributesClassName", json!("fast"))], Refused("spec.volumeAttributesClassName")),
        row(P, "no storage class (a pre-provisioned volume's)", vec![("/spec/storageClassName", None)], Refused("spec.storageClassName")),
        row(P, "the empty storage class", vec![set("/spec/storageClassName", json!(""))], Refused("spec.storageClassName")),
        row(P, "another resource", vec![set("/spec/resources/requests/example.com~1iops", json!("1"))], Refused("spec.resources")),
        row(P, "a limit of another resource", vec![set("/spec/resources/limits", json!({"storage": "5Gi", "example.com/iops": "1"}))], Refused("spec.resources")),
        // The API server itself refuses these, before any policy.
        row(P, "no access mode", vec![("/spec/accessModes", None)], Refused("spec.accessModes")),
        row(P, "no size", vec![("/spec/resources/requests/storage", None)], Refused("spec.resources")),
        row(P, "a volume mode of no kind", vec![set("/spec/volumeMode", json!("Tape"))], Refused("spec.volumeMode")),
    ]
}

/// A tenant's rows: the names the operator follows are refused, every other name is the
/// tenant's.
#[rustfmt::skip]
fn tenant_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{TenantClaim as C, TenantJob as J};
    vec![
        row(C, "a claim of its own name", vec![], Admitted),
        row(C, "a name like a prime's", vec![set("/metadata/name", json!("ferry-primex"))], Admitted),
        row(C, "a name ending like a prime's", vec![set("/metadata/name", json!("my-ferry-prime-x"))], Admitted),
        row(C, "a prime claim's name", vec![set("/metadata/name", json!("ferry-prime-x"))], Refused(RESERVED)),
        row(C, "the prime claim's name of its own claim", vec![set("/metadata/name", json!(format!("ferry-prime-{UID}")))], Refused(RESERVED)),
        row(C, "a prime claim's generated name", vec![("/metadata/name", None), set("/metadata/generateName", json!("ferry-prime-"))], Refused(RESERVED)),
        row(C, "the prime claim exactly as the operator makes it", vec![
            set("/metadata/name", json!(format!("ferry-prime-{UID}"))),
            set("/metadata/labels", json!({"app.kubernetes.io/managed-by": "ferry-operator", "ferry.dev/populate-for": UID})),
            set("/metadata/ownerReferences", json!([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": UID, "controller": true}])),
        ], Refused(RESERVED)),
        row(J, "a CopyJob of its own name", vec![], Admitted),
        row(J, "a name like a populating job's", vec![set("/metadata/name", json!("populate-x"))], Admitted),
        row(J, "a populating job's name", vec![set("/metadata/name", json!("ferry-populate-x"))], Refused(RESERVED)),
        row(J, "the populating job's name of its own claim", vec![set("/metadata/name", json!(format!("ferry-populate-{UID}")))], Refused(RESERVED)),
        row(J, "a populating job's generated name", vec![("/metadata/name", None), set("/metadata/generateName", json!("ferry-populate-"))], Refused(RESERVED)),
    ]
}

/// The rebind's rows: the patch the operator sends with one field added or changed, and
/// that patch on volumes that are not a prime's.
#[rustfmt::skip]
fn rebind_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{Rebind as R, RebindAvailable as A, RebindClaimed as C};
    vec![
        // The claim's name is not the policy's to know (it has only the volume); the PV
        // controller binds the volume only to the claim of that name and uid.
        row(R, "the claim by another name", vec![set("/spec/claimRef/name", json!("other"))], Admitted),
        row(R, "another claim", vec![set("/spec/claimRef/uid", json!(OTHER))], Refused("spec.claimRef.uid")),
        row(R, "a claim of another namespace", vec![set("/spec/claimRef/namespace", json!("team-b"))], Refused("spec.claimRef.namespace")),
        row(R, "no claim (the volume made anyone's)", vec![set("/spec/claimRef", Value::Null)], Refused("spec.claimRef")),
        row(R, "a reference of another kind", vec![set("/spec/claimRef/kind", json!("Pod"))], Refused("spec.claimRef.kind")),
        row(R, "a reference of another API version", vec![set("/spec/claimRef/apiVersion", json!("v2"))], Refused("spec.claimRef.apiVersion")),
        row(R, "a reference with a fieldPath", vec![set("/spec/claimRef/fieldPath", json!("spec"))], Refused("spec.claimRef.fieldPath")),
        row(R, "a reference with a resourceVersion", vec![set("/spec/claimRef/resourceVersion", json!("1"))], Refused("spec.claimRef.resourceVersion")),
        row(R, "at an old resourceVersion", vec![set("/metadata/resourceVersion", json!("1"))], Refused(CONFLICT)),
        row(R, "a larger capacity", vec![set("/spec/capacity", json!({"storage": "1Ti"}))], Refused("spec.capacity")),
        row(R, "the volume kept once released", vec![set("/spec/persistentVolumeReclaimPolicy", json!("Retain"))], Refused("spec.persistentVolumeReclaimPolicy")),
        row(R, "another storage class", vec![set("/spec/storageClassName", json!("fast"))], Refused("spec.storageClassName")),
        row(R, "mount options", vec![set("/spec/mountOptions", json!(["nosuid"]))], Refused("spec.mountOptions")),
        row(R, "another access mode", vec![set("/spec/accessModes", json!(["ReadWriteMany"]))], Refused("spec.accessModes")),
        // The one change of a node affinity the API server allows (a beta label made GA).
        row(R, "its zone's beta label made GA", vec![set("/spec/nodeAffinity", affinity("node-a", "topology.kubernetes.io/zone"))], Refused("spec.nodeAffinity")),
        // The API server itself refuses these.
        row(R, "another node", vec![set("/spec/nodeAffinity", affinity("node-b", BETA_ZONE))], Refused(IMMUTABLE)),
        row(R, "another volume", vec![set("/spec/csi", json!({"driver": "csi.example.com", "volumeHandle": "someone-elses"}))], Refused("spec.persistentvolumesource")),
        row(R, "a label", vec![set("/metadata/labels", json!({"tenant": "team-b"}))], Refused("metadata.labels")),
        row(R, "an annotation", vec![set("/metadata/annotations/example.com~1note", json!("x"))], Refused("metadata.annotations")),
        row(R, "its protection finalizer removed", vec![set("/metadata/finalizers", Value::Null)], Refused("metadata.finalizers")),
        row(R, "its protection finalizer replaced", vec![set("/metadata/finalizers", json!(["example.com/never"]))], Refused("metadata.finalizers")),
        row(R, "an owner", vec![set("/metadata/ownerReferences", json!([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": UID}]))], Refused("metadata.ownerReferences")),
        // Only a prime's volume is given.
        row(C, "a volume bound to the claim itself", vec![], Refused("spec.claimRef.uid")),
        row(A, "a volume bound to no claim", vec![], Refused("spec.claimRef.uid")),
    ]
}

/// A PersistentVolume as a CSI driver provisions it, of the populator's class and size.
fn volume(name: &str, claim: Option<(&str, &str)>) -> Value {
    csi_volume(name, claim, "1Gi", "csi")
}

/// The merge patch `populator::reconcile` sends for `Step::Rebind` ([`decide::rebind_patch`])
/// for the user's claim `claim` ([`decide::claim_ref`]).
fn rebind_patch(claim: &Value, resource_version: &str) -> Result<Value> {
    let claim = serde_json::from_value(claim.clone())?;
    Ok(decide::rebind_patch(
        resource_version,
        &decide::claim_ref(&claim),
    ))
}

#[test]
fn populator_policy_admits_exactly_the_prime_claim_and_rebind_the_operator_makes() -> Result<()> {
    let bases = [
        (Base::Prime, prime(UID, None)?),
        (Base::PrimeOnNode, prime(UID, Some("node-a"))?),
    ];
    let rows = prime_rows();
    check_coverage(&bases, &rows, &[])?;
    let claim = user_claim(UID, None)?;
    // Its rebind patch, checked against its rows as an object ("whole": every field of a
    // reference is set, to a value or to null).
    let patch = rebind_patch(&claim, "1")?;
    check_coverage(
        &[(Base::Rebind, patch)],
        &rebind_rows(),
        &["/spec/claimRef"],
    )?;

    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let mut labelled = bases[0].1.clone();
    apply(&mut labelled, &set("/metadata/labels/app", json!("db")))?;
    // The controller that type-checks policies and says so in their status.
    let checker =
        cp.start_controller_manager_or_skip(&["validatingadmissionpolicy-status-controller"])?;
    let kc = install(&cp, &labelled, "metadata.labels")?;
    if checker.is_some() {
        type_checked(&cp, "ferry-populator")?;
    }
    for (_, exact) in &bases {
        ask(&cp, &kc, exact, Answer::Admitted)
            .with_context(|| format!("the prime claim the code builds: {exact}"))?;
    }
    // And the CopyJob that fills it; but no claim but a prime (or a restored one, or a
    // migration's).
    let source: VolumeSource = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "VolumeSource",
        "metadata": {"name": "golden", "namespace": TEAM, "generation": 3},
        "spec": {"source": {"pvc": "golden"}}
    }))?;
    let job = decide::populate_job(&serde_json::from_value(claim.clone())?, &source);
    ask(&cp, &kc, &serde_json::to_value(&job)?, Answer::Admitted)
        .context("the CopyJob the code builds")?;
    ask(&cp, &kc, &claim, Answer::Refused(NOT_RENAMED))
        .context("the user's claim, by the operator")?;
    ask_all(&cp, &kc, &bases, &rows)?;

    // A tenant: create on claims and CopyJobs of its namespace.
    cp.kubectl_ok(&["create", "serviceaccount", "tenant", "-n", TEAM])?;
    cp.kubectl_ok(&[
        "create",
        "role",
        "tenant",
        "-n",
        TEAM,
        "--verb=create",
        "--resource=persistentvolumeclaims,copyjobs.ferry.dev",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "tenant",
        "-n",
        TEAM,
        "--role=tenant",
        &format!("--serviceaccount={TEAM}:tenant"),
    ])?;
    let tenant = cp.service_account_kubeconfig(TEAM, "tenant", None)?;
    let tenant_bases = [
        (
            Base::TenantClaim,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": TEAM},
                "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}),
        ),
        (
            Base::TenantJob,
            json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob",
                "metadata": {"name": "copy", "namespace": TEAM},
                "spec": {"source": {"pvc": "data"}, "destination": {"pvc": "copy"}}}),
        ),
    ];
    // The role is in force a moment after it is stored.
    ask_until(&cp, &tenant, &tenant_bases[0].1, Answer::Admitted).context("the tenant's role")?;
    ask_all(&cp, &tenant, &tenant_bases, &tenant_rows())?;
    // Nor an admin (the names are the operator's alone).
    let admin = cp.kubeconfig.clone();
    let mut reserved = tenant_bases[0].1.clone();
    apply(
        &mut reserved,
        &set("/metadata/name", json!("ferry-prime-x")),
    )?;
    ask(&cp, &admin, &reserved, Answer::Refused(RESERVED))
        .context("a prime's name, by an admin")?;

    // The rebind: volumes made by an admin (as a provisioner and the PV controller would
    // leave them), patched by the operator.
    let prime_uid = "5b6c7d8e-9f0a-4b1c-8d2e-3f4a5b6c7d8e";
    let volumes = [
        (
            Base::Rebind,
            "pvc-prime",
            Some((format!("ferry-prime-{UID}"), prime_uid)),
        ),
        (
            Base::RebindClaimed,
            "pvc-claimed",
            Some(("data".to_string(), UID)),
        ),
        (Base::RebindAvailable, "pvc-available", None),
    ];
    let mut patches = Vec::new();
    for (base, name, bound) in &volumes {
        let bound = bound.as_ref().map(|(n, u)| (n.as_str(), *u));
        cp.apply(&volume(name, bound).to_string())?;
        let rv = cp.kubectl_ok(&[
            "get",
            "pv",
            name,
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])?;
        patches.push((*base, (*name, rebind_patch(&claim, rv.trim())?)));
    }
    let (_, (prime_volume, exact)) = &patches[0];
    ask_patch(&cp, &kc, prime_volume, exact, Answer::Admitted)
        .with_context(|| format!("the rebind the code sends: {exact}"))?;
    ask_rows(
        "rebind rows",
        &rebind_rows(),
        |base| {
            let found = patches.iter().find(|(b, _)| *b == base);
            found
                .map(|(_, (pv, p))| (*pv, p.clone()))
                .context("no such base")
        },
        |pv, patch, answer| ask_patch(&cp, &kc, pv, patch, answer),
    )?;

    // Deleting: the operator's prime claims, made on its token; one then relabelled by an
    // admin for another claim, one given a second owner.
    let kcs = kc.to_string_lossy();
    for uid in [UID, OTHER, THIRD] {
        let out = cp.kubectl_stdin(
            &["--kubeconfig", &kcs, "create", "-f", "-"],
            &prime(uid, None)?.to_string(),
        )?;
        ensure!(
            out.status.success(),
            "creating the prime claim of {uid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (exact, relabelled, two_owners) = (
        format!("ferry-prime-{UID}"),
        format!("ferry-prime-{OTHER}"),
        format!("ferry-prime-{THIRD}"),
    );
    cp.kubectl_ok(&[
        "label",
        "pvc",
        &relabelled,
        "-n",
        TEAM,
        &format!("ferry.dev/populate-for={UID}"),
        "--overwrite",
    ])?;
    let second = json!({"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": THIRD, "controller": true},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "other", "uid": OTHER}]}});
    cp.kubectl_ok(&ferry_e2e::merge_patch(
        &format!("pvc/{two_owners}"),
        TEAM,
        false,
        &second.to_string(),
    ))?;
    cp.apply(&tenant_bases[0].1.to_string())?;
    ask_delete(&cp, &kc, "pvc", &exact, Answer::Admitted).context("deleting a prime claim")?;
    ask_delete(&cp, &kc, "pvc", &relabelled, Answer::Refused(NOT_A_PRIME))
        .context("deleting a prime claim labelled for another claim")?;
    ask_delete(&cp, &kc, "pvc", &two_owners, Answer::Refused(NOT_A_PRIME))
        .context("deleting a prime claim of two owners")?;
    ask_delete(&cp, &kc, "pvc", "data", Answer::Refused(NOT_MIGRATED))
        .context("deleting a tenant's (pending) claim")?;
    // And for real.
    cp.kubectl_ok(&[
        "--kubeconfig",
        &kcs,
        "delete",
        "pvc",
        &exact,
        "-n",
        TEAM,
        "--wait=false",
    ])?;
    Ok(())
}
