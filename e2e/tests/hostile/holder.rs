//! Hole 5: the holder-pod policy checked parts of the pod, not the pod. The operator's token
//! may create pods in every namespace, narrowed only by the chart's `-holder-pods` admission
//! policy; that policy compared image, args, volumes and capabilities, so a "holder" with a
//! lifecycle hook, an exec probe, root, a Secret in its environment or a host port was
//! admitted. Now it compares the whole pod with the one `operator/src/holder.rs` builds.
//! Here, on the operator's own ServiceAccount token against the chart as rendered into
//! `deploy/`: the holders the operator's code builds are admitted, and that pod with any one
//! field added or changed is refused, with a message naming the field. The same for the
//! restored claims and VolumeSnapshots the `-snapshot-sources` policy narrows.
//!
//! The tables are checked against the objects themselves before any API call: every value
//! the code sets must be changed by some row and every object and list must get a field or
//! an element added by some row, so a field added to holder.rs (or snapshot.rs) without a
//! row here fails, as does one without its place in the policy (the exact object is then
//! refused).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ferry_crds::CopyJob;
use ferry_e2e::{repo_root, wait_for, ControlPlane};
use ferry_operator::{holder, snapshot};
use serde_json::{json, Value};

const NS: &str = "ferry-system";
pub(super) const TEAM: &str = "team-a";
const UID: &str = "0b5e2c1e-6a4c-4a5e-9d51-1f0e7c9c2d10";
/// The message of the `-holder-pods` policy's first rule (a pod that is no holder at all).
const NOT_A_HOLDER: &str = "creates and deletes only its holder pods";
/// The same of the `-snapshot-sources` policy.
const NOT_OURS: &str = "creates and deletes only its restored claims";
/// The `-migrations` policy's refusal of a claim the operator creates that is none of its
/// restored, prime or migrations' claims (with `operator.migrations` on, the default, the
/// `-snapshot-sources` policy judges only claims named `ferry-restore-*`).
const NOT_RENAMED: &str = "a claim the Ferry operator creates under a migrated claim's name";
/// The API server's own refusal of a volume that is both mounted and a device.
const MOUNTED_AND_DEVICE: &str = "must not already exist in volume";

/// A CopyJob of `TEAM` (the policy cannot read it: only its reference in the pod counts).
fn job(name: &str, uid: &str, snapshot_class: Option<&str>) -> Result<CopyJob> {
    let mut source = json!({"pvc": "data"});
    if let Some(class) = snapshot_class {
        source["copyMethod"] = json!("Snapshot");
        source["volumeSnapshotClassName"] = json!(class);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "CopyJob",
        "metadata": {"name": name, "namespace": TEAM, "uid": uid},
        "spec": {"source": source, "destination": {"pvc": "copy"}}
    }))?)
}

use ferry_e2e::holder_image;

/// One change to an object: the JSON pointer of a field (a new key, or the index one past
/// a list's end, adds it) and its new value, or `None` to remove it.
pub(super) type Edit = (&'static str, Option<Value>);

/// What the API server answers.
#[derive(Debug, Clone, Copy)]
pub(super) enum Answer {
    Admitted,
    /// Refused, the answer naming this (a field the policy's message lists, or the rule).
    Refused(&'static str),
}

/// Which of the objects the code builds a row starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Base {
    /// The source's holder, no node preferred.
    Source,
    /// The destination's holder, preferring node-b.
    Destination,
    /// A raw block source's holder (the claim as a device), no node preferred.
    BlockSource,
    /// A raw block destination's holder, preferring node-b.
    BlockDestination,
    /// A CopyExport's holder (its CSI claim, read-only, no node preferred).
    Export,
    Claim,
    Snapshot,
    /// A VolumeSnapshot taken to be kept as the base of the next copy onto a claim
    /// (changed-block tracking): that claim its second owner and its `ferry.dev/base-for`.
    KeptSnapshot,
}

/// One row of a table: `base` with `edits`, and the answer (generic for hostile/populator.rs).
#[derive(Debug)]
pub(super) struct Row<B = Base> {
    pub(super) base: B,
    pub(super) what: &'static str,
    pub(super) edits: Vec<Edit>,
    pub(super) answer: Answer,
}

pub(super) fn row<B>(base: B, what: &'static str, edits: Vec<Edit>, answer: Answer) -> Row<B> {
    Row {
        base,
        what,
        edits,
        answer,
    }
}

pub(super) fn set(pointer: &'static str, value: Value) -> Edit {
    (pointer, Some(value))
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Apply `edit` to `v`; a missing object on the way is made.
pub(super) fn apply(v: &mut Value, (pointer, value): &Edit) -> Result<()> {
    let tokens: Vec<String> = pointer.split('/').skip(1).map(unescape).collect();
    let (last, path) = tokens.split_last().context("an empty pointer")?;
    let mut at = v;
    for t in path {
        at = match at {
            Value::Object(m) => m.entry(t.clone()).or_insert_with(|| json!({})),
            Value::Array(a) => a
                .get_mut(t.parse::<usize>()?)
                .with_context(|| format!("{pointer}: no element {t}"))?,
            _ => bail!("{pointer}: {t} is not in an object or a list"),
        };
    }
    match (at, value) {
        (Value::Object(m), Some(new)) => {
            m.insert(last.clone(), new.clone());
        }
        (Value::Object(m), None) => {
            m.remove(last)
                .with_context(|| format!("{pointer}: nothing to remove"))?;
        }
        (Value::Array(a), Some(new)) => {
            let i: usize = last.parse()?;
            match i.cmp(&a.len()) {
                std::cmp::Ordering::Less => a[i] = new.clone(),
                std::cmp::Ordering::Equal => a.push(new.clone()),
                std::cmp::Ordering::Greater => bail!("{pointer}: past the list's end"),
            }
        }
        (Value::Array(a), None) => {
            let i: usize = last.parse()?;
            ensure!(i < a.len(), "{pointer}: nothing to remove");
            a.remove(i);
        }
        _ => bail!("{pointer}: cannot edit there"),
    }
    Ok(())
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Every value (not object or list) in `v`, every object and every list, by pointer.
fn walk(
    v: &Value,
    at: String,
    leaves: &mut BTreeSet<String>,
    objects: &mut BTreeSet<String>,
    lists: &mut BTreeSet<(String, usize)>,
) {
    match v {
        Value::Object(m) => {
            objects.insert(at.clone());
            for (k, v) in m {
                walk(v, format!("{at}/{}", escape(k)), leaves, objects, lists);
            }
        }
        Value::Array(a) => {
            lists.insert((at.clone(), a.len()));
            for (i, v) in a.iter().enumerate() {
                walk(v, format!("{at}/{i}"), leaves, objects, lists);
            }
        }
        _ => {
            leaves.insert(at);
        }
    }
}

/// The rows of `objects`' bases cover them: each value the code sets is changed by a row,
/// each object gets a field it does not have, each list an element, except `whole`: objects
/// whose every field the code sets (nothing valid is left to add), and the top level.
pub(super) fn check_coverage<B: Copy + PartialEq + std::fmt::Debug>(
    objects: &[(B, Value)],
    rows: &[Row<B>],
    whole: &[&str],
) -> Result<()> {
    let edited: BTreeSet<&str> = rows
        .iter()
        .filter(|r| objects.iter().any(|(b, _)| *b == r.base))
        .flat_map(|r| r.edits.iter().map(|(p, _)| *p))
        .collect();
    let mut missing = Vec::new();
    for (base, v) in objects {
        let (mut leaves, mut maps, mut lists) = Default::default();
        walk(v, String::new(), &mut leaves, &mut maps, &mut lists);
        for leaf in &leaves {
            if leaf != "/apiVersion" && leaf != "/kind" && !edited.contains(leaf.as_str()) {
                missing.push(format!("{base:?}: no row changes {leaf}"));
            }
        }
        for map in maps.iter().filter(|m| !m.is_empty()) {
            if whole.contains(&map.as_str()) {
                continue;
            }
            let keys: BTreeSet<String> = v
                .pointer(map)
                .and_then(Value::as_object)
                .map(|m| m.keys().map(|k| escape(k)).collect())
                .unwrap_or_default();
            let added = edited.iter().any(|p| {
                p.strip_prefix(map.as_str())
                    .and_then(|rest| rest.strip_prefix('/'))
                    .is_some_and(|k| !k.contains('/') && !keys.contains(k))
            });
            if !added {
                missing.push(format!("{base:?}: no row adds a field to {map}"));
            }
        }
        for (list, len) in &lists {
            if !edited.contains(format!("{list}/{len}").as_str()) {
                missing.push(format!("{base:?}: no row adds an element to {list}"));
            }
        }
    }
    ensure!(
        missing.is_empty(),
        "the rows do not cover what the code builds (add a row, and the field to the policy):\n{}",
        missing.join("\n")
    );
    Ok(())
}

/// The holder's rows: one field added or changed each (or a few that only make sense
/// together), and the changes a holder may have (another claim, namespace, node, job).
#[rustfmt::skip]
fn holder_rows(image: &str) -> Vec<Row> {
    use Answer::{Admitted, Refused};
    use Base::{Destination as D, Source as S};
    let exec = json!({"exec": {"command": ["sh", "-c", "rm -rf /data/*"]}});
    let other_container = json!({"name": "wipe", "image": image, "command": ["sh", "-c", "rm -rf /data/*"],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}]});
    vec![
        // What varies from holder to holder.
        row(S, "another claim", vec![set("/spec/volumes/0/persistentVolumeClaim/claimName", json!("other"))], Admitted),
        row(S, "another namespace", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        // What the API server adds in a cluster (the ServiceAccount admission, on in a cluster
        // but not in this test's control plane; DefaultTolerationSeconds).
        row(S, "the default ServiceAccount", vec![set("/spec/serviceAccountName", json!("default"))], Admitted),
        row(S, "the default tolerations", vec![set("/spec/tolerations", json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]))], Admitted),
        row(D, "another preferred node", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchExpressions/0/values/0", json!("node-a"))], Admitted),
        row(S, "another job", vec![
            set("/metadata/name", json!("ferry-holder-7c1d2e3f-source")),
            set("/metadata/labels/ferry.dev~1holder-of", json!("7c1d2e3f-0000-4000-8000-000000000001")),
            set("/metadata/annotations/ferry.dev~1copyjob", json!("another")),
            set("/metadata/ownerReferences/0/name", json!("another")),
            set("/metadata/ownerReferences/0/uid", json!("7c1d2e3f-0000-4000-8000-000000000001")),
        ], Admitted),
        // Metadata.
        row(S, "a name not made from the job", vec![set("/metadata/name", json!("ferry-holder-0b5e2c1e-sourcex"))], Refused("metadata.name")),
        row(S, "not labelled a holder", vec![set("/metadata/labels/app.kubernetes.io~1name", json!("ferry-holder-x"))], Refused(NOT_A_HOLDER)),
        row(S, "managed by someone else", vec![set("/metadata/labels/app.kubernetes.io~1managed-by", json!("helm"))], Refused("metadata.labels")),
        row(S, "holding for another job", vec![set("/metadata/labels/ferry.dev~1holder-of", json!("7c1d2e3f-0000-4000-8000-000000000001"))], Refused("metadata.labels")),
        row(S, "the source's holder labelled the destination's", vec![set("/metadata/labels/ferry.dev~1holds", json!("destination"))], Refused("metadata.name")),
        row(D, "the destination's holder labelled the source's", vec![set("/metadata/labels/ferry.dev~1holds", json!("source"))], Refused("metadata.name")),
        row(S, "an extra label (a Service's selector)", vec![set("/metadata/labels/app", json!("web"))], Refused("metadata.labels")),
        row(S, "an annotation naming another job", vec![set("/metadata/annotations/ferry.dev~1copyjob", json!("other"))], Refused("metadata.annotations")),
        row(S, "an extra annotation (another network)", vec![set("/metadata/annotations/k8s.v1.cni.cncf.io~1networks", json!("host-net"))], Refused("metadata.annotations")),
        row(S, "an owner of another API version", vec![set("/metadata/ownerReferences/0/apiVersion", json!("ferry.dev/v1"))], Refused("metadata.ownerReferences")),
        row(S, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopySchedule"))], Refused("metadata.ownerReferences")),
        row(S, "an owner other than the annotation's", vec![set("/metadata/ownerReferences/0/name", json!("other"))], Refused("metadata.annotations")),
        row(S, "an owner other than the label's", vec![set("/metadata/ownerReferences/0/uid", json!("7c1d2e3f-0000-4000-8000-000000000001"))], Refused("metadata.labels")),
        row(S, "an owner that is not the controller", vec![set("/metadata/ownerReferences/0/controller", json!(false))], Refused("metadata.ownerReferences")),
        row(S, "an owner blocking deletion", vec![set("/metadata/ownerReferences/0/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(S, "a second owner", vec![set("/metadata/ownerReferences/1", json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob", "name": "other", "uid": "7c1d2e3f-0000-4000-8000-000000000001"}))], Refused("metadata.ownerReferences")),
        row(S, "a finalizer", vec![set("/metadata/finalizers", json!(["example.com/never"]))], Refused("metadata.finalizers")),
        // The pod's spec.
        row(S, "a ServiceAccount token", vec![set("/spec/automountServiceAccountToken", json!(true))], Refused("spec.automountServiceAccountToken")),
        row(S, "the token's default (mounted)", vec![("/spec/automountServiceAccountToken", None)], Refused("spec.automountServiceAccountToken")),
        row(S, "service links", vec![set("/spec/enableServiceLinks", json!(true))], Refused("spec.enableServiceLinks")),
        row(S, "an hour to stop", vec![set("/spec/terminationGracePeriodSeconds", json!(3600))], Refused("spec.terminationGracePeriodSeconds")),
        row(S, "hostNetwork", vec![set("/spec/hostNetwork", json!(true))], Refused("spec.hostNetwork")),
        row(S, "hostPID", vec![set("/spec/hostPID", json!(true))], Refused("spec.hostPID")),
        row(S, "hostIPC", vec![set("/spec/hostIPC", json!(true))], Refused("spec.hostIPC")),
        row(S, "a nodeName (no scheduler)", vec![set("/spec/nodeName", json!("node-a"))], Refused("spec.nodeName")),
        row(S, "a ServiceAccount", vec![set("/spec/serviceAccountName", json!("ferry-operator"))], Refused("spec.serviceAccountName")),
        row(S, "an init container", vec![set("/spec/initContainers", json!([other_container]))], Refused("spec.initContainers")),
        // The API server itself refuses ephemeral containers on create (and the operator's
        // RBAC has no pods/ephemeralcontainers; the policy refuses that update too).
        row(S, "an ephemeral container", vec![set("/spec/ephemeralContainers", json!([{"name": "debug", "image": image, "command": ["sh"]}]))], Refused("spec.ephemeralContainers")),
        row(S, "a second container", vec![set("/spec/containers/1", other_container.clone())], Refused("spec.containers")),
        row(S, "a runtime class", vec![set("/spec/runtimeClassName", json!("ferry-e2e"))], Refused("spec.runtimeClassName")),
        // Without a RuntimeClass, the API server's RuntimeClass admission refuses an overhead.
        row(S, "an overhead", vec![set("/spec/overhead", json!({"cpu": "1"}))], Refused("Overhead")),
        row(S, "a priority class", vec![set("/spec/priorityClassName", json!("ferry-e2e-high"))], Refused("spec.priorityClassName")),
        row(S, "its own DNS", vec![set("/spec/dnsPolicy", json!("None")), set("/spec/dnsConfig", json!({"nameservers": ["10.0.0.53"]}))], Refused("spec.dnsPolicy")),
        row(S, "host aliases", vec![set("/spec/hostAliases", json!([{"ip": "10.0.0.1", "hostnames": ["kubernetes"]}]))], Refused("spec.hostAliases")),
        row(S, "a shared process namespace", vec![set("/spec/shareProcessNamespace", json!(true))], Refused("spec.shareProcessNamespace")),
        row(S, "a node selector", vec![set("/spec/nodeSelector", json!({"kubernetes.io/hostname": "node-a"}))], Refused("spec.nodeSelector")),
        row(S, "a toleration of every taint", vec![set("/spec/tolerations", json!([{"operator": "Exists"}]))], Refused("spec.tolerations")),
        row(S, "another scheduler", vec![set("/spec/schedulerName", json!("my-scheduler"))], Refused("spec.schedulerName")),
        row(S, "a resource claim", vec![set("/spec/resourceClaims", json!([{"name": "gpu", "resourceClaimName": "gpu"}]))], Refused("spec.resourceClaims")),
        row(S, "the host's user namespace choice", vec![set("/spec/hostUsers", json!(false))], Refused("spec.hostUsers")),
        row(S, "an OS", vec![set("/spec/os", json!({"name": "linux"}))], Refused("spec.os")),
        row(S, "image pull secrets", vec![set("/spec/imagePullSecrets", json!([{"name": "registry"}]))], Refused("spec.imagePullSecrets")),
        row(S, "a restart policy", vec![set("/spec/restartPolicy", json!("Never"))], Refused("spec.restartPolicy")),
        // Its volume.
        row(S, "a second volume", vec![set("/spec/volumes/1", json!({"name": "host", "hostPath": {"path": "/"}}))], Refused("spec.volumes")),
        row(S, "the host's root instead of the claim", vec![set("/spec/volumes/0", json!({"name": "data", "hostPath": {"path": "/"}}))], Refused("spec.volumes")),
        row(S, "the source's claim writable", vec![set("/spec/volumes/0/persistentVolumeClaim/readOnly", json!(false))], Refused("spec.volumes")),
        row(D, "the destination's claim read-only", vec![set("/spec/volumes/0/persistentVolumeClaim/readOnly", json!(true))], Refused("spec.volumes")),
        row(S, "another volume name", vec![set("/spec/volumes/0/name", json!("other")), set("/spec/containers/0/volumeMounts/0/name", json!("other"))], Refused("spec.volumes")),
        // Its security context.
        row(S, "root", vec![set("/spec/securityContext/runAsUser", json!(0))], Refused("spec.securityContext.runAsUser")),
        row(S, "root allowed", vec![set("/spec/securityContext/runAsNonRoot", json!(false))], Refused("spec.securityContext.runAsNonRoot")),
        row(S, "the root group", vec![set("/spec/securityContext/runAsGroup", json!(0))], Refused("spec.securityContext.runAsGroup")),
        row(S, "an fsGroup (the claim chowned)", vec![set("/spec/securityContext/fsGroup", json!(0))], Refused("spec.securityContext.fsGroup")),
        row(S, "supplemental groups", vec![set("/spec/securityContext/supplementalGroups", json!([0]))], Refused("spec.securityContext.supplementalGroups")),
        row(S, "sysctls", vec![set("/spec/securityContext/sysctls", json!([{"name": "kernel.shm_rmid_forced", "value": "1"}]))], Refused("spec.securityContext.sysctls")),
        row(S, "no seccomp", vec![set("/spec/securityContext/seccompProfile/type", json!("Unconfined"))], Refused("spec.securityContext.seccompProfile")),
        row(S, "an SELinux level", vec![set("/spec/securityContext/seLinuxOptions", json!({"level": "s0:c1,c2"}))], Refused("spec.securityContext.seLinuxOptions")),
        // Its container.
        row(S, "a postStart hook", vec![set("/spec/containers/0/lifecycle", json!({"postStart": exec}))], Refused("spec.containers[0].lifecycle")),
        row(S, "an exec liveness probe", vec![set("/spec/containers/0/livenessProbe", exec.clone())], Refused("spec.containers[0].livenessProbe")),
        row(S, "an exec readiness probe", vec![set("/spec/containers/0/readinessProbe", exec.clone())], Refused("spec.containers[0].readinessProbe")),
        row(S, "an exec startup probe", vec![set("/spec/containers/0/startupProbe", exec.clone())], Refused("spec.containers[0].startupProbe")),
        row(S, "a Secret in the environment", vec![set("/spec/containers/0/env", json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "other", "key": "token"}}}]))], Refused("spec.containers[0].env")),
        row(S, "a Secret as the environment", vec![set("/spec/containers/0/envFrom", json!([{"secretRef": {"name": "other"}}]))], Refused("spec.containers[0].envFrom")),
        row(S, "a host port", vec![set("/spec/containers/0/ports", json!([{"containerPort": 8080, "hostPort": 8080}]))], Refused("spec.containers[0].ports")),
        row(S, "a command", vec![set("/spec/containers/0/command", json!(["sh", "-c", "rm -rf /data/*"]))], Refused("spec.containers[0].command")),
        row(S, "another program", vec![set("/spec/containers/0/args/0", json!("copy"))], Refused("spec.containers[0].args")),
        row(S, "extra args", vec![set("/spec/containers/0/args/1", json!("--wipe"))], Refused("spec.containers[0].args")),
        row(S, "another image", vec![set("/spec/containers/0/image", json!("busybox:1.36"))], Refused("spec.containers[0].image")),
        row(S, "another container name", vec![set("/spec/containers/0/name", json!("shell"))], Refused("spec.containers[0].name")),
        row(S, "an image never pulled", vec![set("/spec/containers/0/imagePullPolicy", json!("Never"))], Refused("spec.containers[0].imagePullPolicy")),
        row(S, "a working directory", vec![set("/spec/containers/0/workingDir", json!("/data"))], Refused("spec.containers[0].workingDir")),
        row(S, "a terminal", vec![set("/spec/containers/0/stdin", json!(true)), set("/spec/containers/0/tty", json!(true))], Refused("spec.containers[0].stdin")),
        row(S, "a termination message in the claim", vec![set("/spec/containers/0/terminationMessagePath", json!("/data/.wipe"))], Refused("spec.containers[0].terminationMessagePath")),
        row(S, "a large CPU request", vec![set("/spec/containers/0/resources/requests/cpu", json!("64"))], Refused("spec.containers[0].resources")),
        row(S, "another memory request", vec![set("/spec/containers/0/resources/requests/memory", json!("16Mi"))], Refused("spec.containers[0].resources")),
        row(S, "another memory limit", vec![set("/spec/containers/0/resources/limits/memory", json!("1Gi"))], Refused("spec.containers[0].resources")),
        row(S, "a device", vec![set("/spec/containers/0/resources/requests/example.com~1gpu", json!("1")), set("/spec/containers/0/resources/limits/example.com~1gpu", json!("1"))], Refused("spec.containers[0].resources")),
        row(S, "a claimed device", vec![set("/spec/containers/0/resources/claims", json!([{"name": "gpu"}])), set("/spec/resourceClaims", json!([{"name": "gpu", "resourceClaimName": "gpu"}]))], Refused("spec.containers[0].resources")),
        row(S, "the source's mount writable", vec![set("/spec/containers/0/volumeMounts/0/readOnly", json!(false))], Refused("spec.containers[0].volumeMounts")),
        row(D, "the destination's mount read-only", vec![set("/spec/containers/0/volumeMounts/0/readOnly", json!(true))], Refused("spec.containers[0].volumeMounts")),
        row(S, "the claim mounted elsewhere", vec![set("/spec/containers/0/volumeMounts/0/mountPath", json!("/etc"))], Refused("spec.containers[0].volumeMounts")),
        row(S, "a sub-path", vec![set("/spec/containers/0/volumeMounts/0/subPath", json!("other"))], Refused("spec.containers[0].volumeMounts")),
        row(S, "a second mount", vec![set("/spec/containers/0/volumeMounts/1", json!({"name": "data", "mountPath": "/data2"}))], Refused("spec.containers[0].volumeMounts")),
        // Its container's security context.
        row(S, "privilege escalation", vec![set("/spec/containers/0/securityContext/allowPrivilegeEscalation", json!(true))], Refused("spec.containers[0].securityContext.allowPrivilegeEscalation")),
        row(S, "a writable root", vec![set("/spec/containers/0/securityContext/readOnlyRootFilesystem", json!(false))], Refused("spec.containers[0].securityContext.readOnlyRootFilesystem")),
        row(S, "privileged", vec![set("/spec/containers/0/securityContext/privileged", json!(true)), ("/spec/containers/0/securityContext/allowPrivilegeEscalation", None)], Refused("spec.containers[0].securityContext.privileged")),
        row(S, "one capability kept", vec![set("/spec/containers/0/securityContext/capabilities/drop/0", json!("NET_RAW"))], Refused("spec.containers[0].securityContext.capabilities")),
        row(S, "one more dropped", vec![set("/spec/containers/0/securityContext/capabilities/drop/1", json!("NET_RAW"))], Refused("spec.containers[0].securityContext.capabilities")),
        row(S, "a capability added", vec![set("/spec/containers/0/securityContext/capabilities/add", json!(["SYS_ADMIN"]))], Refused("spec.containers[0].securityContext.capabilities")),
        row(S, "the container as root", vec![set("/spec/containers/0/securityContext/runAsUser", json!(0))], Refused("spec.containers[0].securityContext.runAsUser")),
        row(S, "the container without seccomp", vec![set("/spec/containers/0/securityContext/seccompProfile", json!({"type": "Unconfined"}))], Refused("spec.containers[0].securityContext.seccompProfile")),
        // The destination's node preference.
        row(D, "a lighter preference", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/weight", json!(1))], Refused("spec.affinity")),
        row(D, "a preference by zone", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchExpressions/0/key", json!("topology.kubernetes.io/zone"))], Refused("spec.affinity")),
        row(D, "a preference against the node", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchExpressions/0/operator", json!("NotIn"))], Refused("spec.affinity")),
        row(D, "two nodes preferred", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchExpressions/0/values/1", json!("node-c"))], Refused("spec.affinity")),
        row(D, "a second expression", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchExpressions/1", json!({"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}))], Refused("spec.affinity")),
        row(D, "a field match", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchFields", json!([{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]))], Refused("spec.affinity")),
        row(D, "a second term", vec![set("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/1", json!({"weight": 1, "preference": {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}}))], Refused("spec.affinity")),
        row(D, "a required node", vec![set("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}))], Refused("spec.affinity")),
        row(D, "a pod affinity", vec![set("/spec/affinity/podAffinity", json!({"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}))], Refused("spec.affinity")),
        // A filesystem holder given a device: the API server itself refuses a volume both
        // mounted and a device; the claim as a device alone reaches the policy, which
        // compares the pod with the block holder's shape.
        row(S, "a device beside the mount", vec![set("/spec/containers/0/volumeDevices", json!([{"name": "data", "devicePath": "/dev/ferry-block"}]))], Refused(MOUNTED_AND_DEVICE)),
        row(S, "the claim as a device instead of the mount", vec![("/spec/containers/0/volumeMounts", None), set("/spec/containers/0/volumeDevices", json!([{"name": "data", "devicePath": "/dev/ferry-block"}]))], Refused("spec.volumes")),
    ]
}

/// An export's holder's rows (what it shares with a job's source holder is tried there):
/// its owner, and what only a job's holder may be (a destination, a preferred node, a
/// device).
#[rustfmt::skip]
fn export_holder_rows() -> Vec<Row> {
    use Answer::{Admitted, Refused};
    use Base::Export as E;
    let other = "7c1d2e3f-0000-4000-8000-000000000001";
    vec![
        row(E, "another export's claim", vec![set("/spec/volumes/0/persistentVolumeClaim/claimName", json!("other"))], Admitted),
        row(E, "another export", vec![
            set("/metadata/name", json!("ferry-holder-7c1d2e3f-source")),
            set("/metadata/labels/ferry.dev~1holder-of", json!(other)),
            set("/metadata/annotations/ferry.dev~1copyexport", json!("another")),
            set("/metadata/ownerReferences/0/name", json!("another")),
            set("/metadata/ownerReferences/0/uid", json!(other)),
        ], Admitted),
        row(E, "an annotation naming another export", vec![set("/metadata/annotations/ferry.dev~1copyexport", json!("other"))], Refused("metadata.annotations")),
        row(E, "a job's annotation on an export's holder", vec![
            ("/metadata/annotations/ferry.dev~1copyexport", None),
            set("/metadata/annotations/ferry.dev~1copyjob", json!("db")),
        ], Refused("metadata.annotations")),
        row(E, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopySchedule"))], Refused("metadata.ownerReferences")),
        row(E, "an export's holder of its claim writable", vec![
            set("/metadata/name", json!("ferry-holder-0b5e2c1e-destination")),
            set("/metadata/labels/ferry.dev~1holds", json!("destination")),
            set("/spec/volumes/0/persistentVolumeClaim/readOnly", json!(false)),
            set("/spec/containers/0/volumeMounts/0/readOnly", json!(false)),
        ], Refused("metadata.name")),
        row(E, "an export's holder preferring a node", vec![set("/spec/affinity", json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}}]}}))], Refused("spec.affinity")),
        row(E, "an export's holder of a device", vec![
            set("/spec/volumes/0/persistentVolumeClaim", json!({"claimName": "data"})),
            set("/spec/volumes/1", json!({"name": "ferry-fd", "emptyDir": {"sizeLimit": "1Mi"}})),
            set("/spec/containers/0/args", json!(["hold-block", "--device", "/dev/ferry-block", "--dir", "/ferry-fd"])),
            set("/spec/containers/0/volumeMounts", json!([{"name": "ferry-fd", "mountPath": "/ferry-fd"}])),
            set("/spec/containers/0/volumeDevices", json!([{"name": "data", "devicePath": "/dev/ferry-block"}])),
        ], Refused("spec.containers[0].volumeDevices")),
    ]
}

/// A raw block claim's holder's rows (what it shares with the filesystem holder is tried
/// there): its device, its socket's emptyDir, its command.
#[rustfmt::skip]
fn block_holder_rows() -> Vec<Row> {
    use Answer::{Admitted, Refused};
    use Base::{BlockDestination as BD, BlockSource as BS};
    const ARGS: &str = "spec.containers[0].args";
    const DEVICES: &str = "spec.containers[0].volumeDevices";
    const MOUNTS: &str = "spec.containers[0].volumeMounts";
    vec![
        row(BS, "another block claim", vec![set("/spec/volumes/0/persistentVolumeClaim/claimName", json!("other"))], Admitted),
        // The command.
        row(BS, "a source's device opened writable", vec![set("/spec/containers/0/args/5", json!("--write"))], Refused(ARGS)),
        row(BD, "a destination's device opened read-only", vec![("/spec/containers/0/args/5", None)], Refused(ARGS)),
        row(BD, "extra args", vec![set("/spec/containers/0/args/6", json!("--verbose"))], Refused(ARGS)),
        row(BS, "the node's disk instead of the claim's", vec![set("/spec/containers/0/args/2", json!("/dev/sda"))], Refused(ARGS)),
        row(BS, "another flag", vec![set("/spec/containers/0/args/3", json!("--device"))], Refused(ARGS)),
        row(BS, "the socket elsewhere", vec![set("/spec/containers/0/args/4", json!("/tmp"))], Refused(ARGS)),
        // The device.
        row(BS, "the device at another path", vec![set("/spec/containers/0/volumeDevices/0/devicePath", json!("/dev/vda"))], Refused(DEVICES)),
        row(BS, "the claim as a second device", vec![set("/spec/containers/0/volumeDevices/1", json!({"name": "data", "devicePath": "/dev/other"}))], Refused("spec.containers[0].volumeDevices[1].name")),
        row(BS, "a second claim's device", vec![
            set("/spec/volumes/2", json!({"name": "other", "persistentVolumeClaim": {"claimName": "other"}})),
            set("/spec/containers/0/volumeDevices/1", json!({"name": "other", "devicePath": "/dev/other"})),
        ], Refused(DEVICES)),
        // The API server itself refuses a device that is not a claim.
        row(BS, "the emptyDir as the device", vec![set("/spec/containers/0/volumeDevices/0/name", json!("ferry-fd"))], Refused("can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode")),
        row(BS, "no device", vec![("/spec/containers/0/volumeDevices", None)], Refused("spec.volumes")),
        // The volumes.
        row(BS, "the source's claim read-only (not published so)", vec![set("/spec/volumes/0/persistentVolumeClaim/readOnly", json!(true))], Refused("spec.volumes")),
        row(BS, "the host's kubelet directory instead of the emptyDir", vec![set("/spec/volumes/1", json!({"name": "ferry-fd", "hostPath": {"path": "/var/lib/kubelet"}}))], Refused("spec.volumes")),
        row(BS, "an emptyDir without a size limit", vec![("/spec/volumes/1/emptyDir/sizeLimit", None)], Refused("spec.volumes")),
        row(BS, "a larger emptyDir", vec![set("/spec/volumes/1/emptyDir/sizeLimit", json!("1Gi"))], Refused("spec.volumes")),
        row(BS, "an emptyDir in memory", vec![set("/spec/volumes/1/emptyDir/medium", json!("Memory"))], Refused("spec.volumes")),
        row(BS, "the emptyDir renamed", vec![set("/spec/volumes/1/name", json!("fd")), set("/spec/containers/0/volumeMounts/0/name", json!("fd"))], Refused("spec.volumes")),
        row(BS, "a third volume", vec![set("/spec/volumes/2", json!({"name": "host", "hostPath": {"path": "/"}}))], Refused("spec.volumes")),
        // The socket's mount.
        row(BS, "the emptyDir mounted elsewhere", vec![set("/spec/containers/0/volumeMounts/0/mountPath", json!("/etc"))], Refused(MOUNTS)),
        row(BS, "the emptyDir mounted read-only", vec![set("/spec/containers/0/volumeMounts/0/readOnly", json!(true))], Refused(MOUNTS)),
        row(BS, "a second emptyDir mount", vec![set("/spec/containers/0/volumeMounts/1", json!({"name": "ferry-fd", "mountPath": "/data"}))], Refused(MOUNTS)),
        // The filesystem holder's mount of the claim (the API server itself refuses it).
        row(BS, "the claim mounted at /data too", vec![set("/spec/containers/0/volumeMounts/1", json!({"name": "data", "mountPath": "/data"}))], Refused(MOUNTED_AND_DEVICE)),
        row(BD, "the claim mounted at /data instead of the emptyDir", vec![set("/spec/containers/0/volumeMounts/0", json!({"name": "data", "mountPath": "/data"}))], Refused(MOUNTED_AND_DEVICE)),
    ]
}

/// What of a block holder is whole (every field set): its device, and both volumes.
const BLOCK_HOLDER_WHOLE: &[&str] = &[
    "/spec/volumes/0",
    "/spec/volumes/0/persistentVolumeClaim",
    "/spec/volumes/1",
    "/spec/securityContext/seccompProfile",
    "/spec/containers/0/volumeDevices/0",
    "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0",
    "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchExpressions/0",
];

/// Objects whose every field the holder sets: nothing valid is left to add there (a volume
/// has one source: another one is the row replacing it).
const HOLDER_WHOLE: &[&str] = &[
    "/spec/volumes/0",
    "/spec/volumes/0/persistentVolumeClaim",
    "/spec/securityContext/seccompProfile",
    "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0",
    "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/preference/matchExpressions/0",
];

/// The restored claim's and the VolumeSnapshot's rows.
#[rustfmt::skip]
fn snapshot_rows() -> Vec<Row> {
    use Answer::{Admitted, Refused};
    use Base::{Claim as C, Snapshot as V};
    const CLAIM: &str = "a restored claim is provisioned new from a VolumeSnapshot";
    vec![
        row(C, "another class", vec![set("/spec/storageClassName", json!("other"))], Admitted),
        row(C, "another size", vec![set("/spec/resources/requests/storage", json!("5Gi"))], Admitted),
        row(C, "another snapshot", vec![set("/spec/dataSource/name", json!("named-by-the-user"))], Admitted),
        row(C, "not a restored claim", vec![set("/metadata/name", json!("grab"))], Refused(NOT_RENAMED)),
        row(C, "a name not made from the job", vec![set("/metadata/name", json!("ferry-restore-evil"))], Refused("metadata.name")),
        row(C, "another namespace's job's name", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        row(C, "a provisioner's annotation", vec![set("/metadata/annotations/nfs.io~1storage-path", json!("team-b/data"))], Refused("metadata.annotations")),
        row(C, "an annotation naming another job", vec![set("/metadata/annotations/ferry.dev~1copyjob", json!("other"))], Refused("metadata.annotations")),
        row(C, "an extra label", vec![set("/metadata/labels/tenant", json!("team-b"))], Refused("metadata.labels")),
        row(C, "managed by someone else", vec![set("/metadata/labels/app.kubernetes.io~1managed-by", json!("helm"))], Refused("metadata.labels")),
        row(C, "for another job", vec![set("/metadata/labels/ferry.dev~1snapshot-of", json!("7c1d2e3f-0000-4000-8000-000000000001"))], Refused("metadata.labels")),
        row(C, "an owner of another API version", vec![set("/metadata/ownerReferences/0/apiVersion", json!("ferry.dev/v1"))], Refused("metadata.ownerReferences")),
        row(C, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopySchedule"))], Refused(NOT_OURS)),
        row(C, "an owner other than the annotation's", vec![set("/metadata/ownerReferences/0/name", json!("other"))], Refused("metadata.annotations")),
        row(C, "an owner other than the name's", vec![set("/metadata/ownerReferences/0/uid", json!("7c1d2e3f-0000-4000-8000-000000000001"))], Refused("metadata.name")),
        row(C, "an owner that is not the controller", vec![set("/metadata/ownerReferences/0/controller", json!(false))], Refused(NOT_OURS)),
        row(C, "an owner blocking deletion", vec![set("/metadata/ownerReferences/0/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(C, "a second owner", vec![set("/metadata/ownerReferences/1", json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob", "name": "other", "uid": "7c1d2e3f-0000-4000-8000-000000000001"}))], Refused("metadata.ownerReferences")),
        row(C, "a finalizer", vec![set("/metadata/finalizers", json!(["example.com/never"]))], Refused("metadata.finalizers")),
        row(C, "another tenant's released volume", vec![set("/spec/volumeName", json!("someone-elses"))], Refused(CLAIM)),
        row(C, "a volume selector", vec![set("/spec/selector", json!({"matchLabels": {"tenant": "team-b"}}))], Refused("spec.selector")),
        row(C, "shared by many nodes", vec![set("/spec/accessModes/0", json!("ReadWriteMany"))], Refused("spec.accessModes")),
        row(C, "two access modes", vec![set("/spec/accessModes/1", json!("ReadOnlyMany"))], Refused("spec.accessModes")),
        // A block volume's snapshot restores as a block claim: what it reaches is its own.
        row(C, "a block device", vec![set("/spec/volumeMode", json!("Block"))], Admitted),
        row(C, "a filesystem said out loud", vec![set("/spec/volumeMode", json!("Filesystem"))], Admitted),
        row(C, "a volume mode of no kind", vec![set("/spec/volumeMode", json!("Tape"))], Refused("spec.volumeMode")),
        row(C, "a volume attributes class", vec![set("/spec/volumeAttributesClassName", json!("fast"))], Refused("spec.volumeAttributesClassName")),
        row(C, "a storage limit", vec![set("/spec/resources/limits", json!({"storage": "1Ti"}))], Refused("spec.resources")),
        row(C, "another resource", vec![set("/spec/resources/requests/example.com~1iops", json!("1"))], Refused("spec.resources")),
        row(C, "a clone of another claim", vec![set("/spec/dataSource", json!({"kind": "PersistentVolumeClaim", "name": "other"}))], Refused("spec.dataSource")),
        row(C, "a snapshot of another API group", vec![set("/spec/dataSource/apiGroup", json!("example.com"))], Refused("spec.dataSource")),
        row(C, "another kind of source", vec![set("/spec/dataSource/kind", json!("VolumeSnapshotContent"))], Refused("spec.dataSource")),
        row(V, "another class", vec![set("/spec/volumeSnapshotClassName", json!("other"))], Admitted),
        row(V, "another claim", vec![set("/spec/source/persistentVolumeClaimName", json!("other"))], Admitted),
        row(V, "not a taken snapshot", vec![set("/metadata/name", json!("grab"))], Refused(NOT_OURS)),
        row(V, "a name not made from the job", vec![set("/metadata/name", json!("ferry-snapshot-evil"))], Refused("metadata.name")),
        row(V, "an annotation", vec![set("/metadata/annotations", json!({"snapshot.storage.kubernetes.io/deletion-secret-name": "other"}))], Refused("metadata.annotations")),
        row(V, "an extra label", vec![set("/metadata/labels/tenant", json!("team-b"))], Refused("metadata.labels")),
        row(V, "managed by someone else", vec![set("/metadata/labels/app.kubernetes.io~1managed-by", json!("helm"))], Refused("metadata.labels")),
        row(V, "for another job", vec![set("/metadata/labels/ferry.dev~1snapshot-of", json!("7c1d2e3f-0000-4000-8000-000000000001"))], Refused("metadata.labels")),
        row(V, "another namespace", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        row(V, "an owner of another API version", vec![set("/metadata/ownerReferences/0/apiVersion", json!("ferry.dev/v1"))], Refused("metadata.ownerReferences")),
        row(V, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopySchedule"))], Refused(NOT_OURS)),
        row(V, "an owner of another name", vec![set("/metadata/ownerReferences/0/name", json!("other"))], Admitted),
        row(V, "an owner other than the name's", vec![set("/metadata/ownerReferences/0/uid", json!("7c1d2e3f-0000-4000-8000-000000000001"))], Refused("metadata.name")),
        row(V, "an owner that is not the controller", vec![set("/metadata/ownerReferences/0/controller", json!(false))], Refused(NOT_OURS)),
        row(V, "an owner blocking deletion", vec![set("/metadata/ownerReferences/0/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(V, "a second owner", vec![set("/metadata/ownerReferences/1", json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob", "name": "other", "uid": "7c1d2e3f-0000-4000-8000-000000000001"}))], Refused("metadata.ownerReferences")),
        row(V, "an existing content", vec![set("/spec/source/volumeSnapshotContentName", json!("someone-elses"))], Refused("spec.source")),
        row(V, "an extra field", vec![set("/spec/deletionPolicy", json!("Retain"))], Refused("spec.deletionPolicy")),
    ]
}

/// The rows of a VolumeSnapshot kept as a base: its second owner and label bound to each
/// other, and what every taken snapshot is refused.
#[rustfmt::skip]
fn kept_snapshot_rows() -> Vec<Row> {
    use Answer::{Admitted, Refused};
    use Base::KeptSnapshot as K;
    const OTHER: &str = "7c1d2e3f-0000-4000-8000-000000000001";
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "other", "uid": OTHER});
    vec![
        row(K, "kept for another claim", vec![set("/metadata/ownerReferences/1/name", json!("other")), set("/metadata/ownerReferences/1/uid", json!(OTHER)), set("/metadata/labels/ferry.dev~1base-for", json!(OTHER))], Admitted),
        row(K, "another claim", vec![set("/spec/source/persistentVolumeClaimName", json!("other"))], Admitted),
        row(K, "another namespace", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        row(K, "an owner of another name", vec![set("/metadata/ownerReferences/0/name", json!("other"))], Admitted),
        row(K, "another class", vec![set("/spec/volumeSnapshotClassName", json!("other"))], Admitted),
        row(K, "a job owner blocking deletion", vec![set("/metadata/ownerReferences/0/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(K, "kept for a claim that does not own it", vec![set("/metadata/labels/ferry.dev~1base-for", json!(OTHER))], Refused("metadata.labels")),
        row(K, "owned by a claim it is not kept for", vec![set("/metadata/ownerReferences/1/uid", json!(OTHER))], Refused("metadata.labels")),
        row(K, "a second owner of another kind", vec![set("/metadata/ownerReferences/1/kind", json!("Secret"))], Refused("metadata.ownerReferences")),
        row(K, "a second owner of another API version", vec![set("/metadata/ownerReferences/1/apiVersion", json!("v2"))], Refused("metadata.ownerReferences")),
        row(K, "the claim as its controller", vec![set("/metadata/ownerReferences/1/controller", json!(true))], Refused("metadata.ownerReferences")),
        row(K, "the claim blocking deletion", vec![set("/metadata/ownerReferences/1/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(K, "a third owner", vec![set("/metadata/ownerReferences/2", claim)], Refused("metadata.ownerReferences")),
        row(K, "not a taken snapshot", vec![set("/metadata/name", json!("grab"))], Refused(NOT_OURS)),
        row(K, "an annotation", vec![set("/metadata/annotations", json!({"snapshot.storage.kubernetes.io/deletion-secret-name": "other"}))], Refused("metadata.annotations")),
        row(K, "an extra label", vec![set("/metadata/labels/tenant", json!("team-b"))], Refused("metadata.labels")),
        row(K, "managed by someone else", vec![set("/metadata/labels/app.kubernetes.io~1managed-by", json!("helm"))], Refused("metadata.labels")),
        row(K, "for another job", vec![set("/metadata/labels/ferry.dev~1snapshot-of", json!(OTHER))], Refused("metadata.labels")),
        row(K, "an owner of another API version", vec![set("/metadata/ownerReferences/0/apiVersion", json!("ferry.dev/v1"))], Refused("metadata.ownerReferences")),
        row(K, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopySchedule"))], Refused(NOT_OURS)),
        row(K, "an owner other than the name's", vec![set("/metadata/ownerReferences/0/uid", json!(OTHER))], Refused("metadata.name")),
        row(K, "a job that is not the controller", vec![set("/metadata/ownerReferences/0/controller", json!(false))], Refused(NOT_OURS)),
        row(K, "an existing content", vec![set("/spec/source/volumeSnapshotContentName", json!("someone-elses"))], Refused("spec.source")),
        row(K, "an extra field", vec![set("/spec/deletionPolicy", json!("Retain"))], Refused("spec.deletionPolicy")),
    ]
}

/// Objects whose every field snapshot.rs sets.
const SNAPSHOT_WHOLE: &[&str] = &["/spec/dataSource"];

/// Ask the API server, as the operator, to create `obj` (a dry run: admission runs, nothing
/// is stored); `Err` with the answer when it is not `answer`.
pub(super) fn ask(cp: &ControlPlane, kc: &Path, obj: &Value, answer: Answer) -> Result<()> {
    let kc = kc.to_string_lossy();
    let out = cp.kubectl_stdin(
        &["--kubeconfig", &kc, "create", "--dry-run=server", "-f", "-"],
        &obj.to_string(),
    )?;
    answered(&out, answer)
}

/// `out` (kubectl's) is `answer`: admitted, or refused with a message naming what it says.
pub(super) fn answered(out: &std::process::Output, answer: Answer) -> Result<()> {
    let err = String::from_utf8_lossy(&out.stderr);
    match answer {
        Answer::Admitted => ensure!(out.status.success(), "refused: {err}"),
        Answer::Refused(why) => ensure!(
            !out.status.success() && err.contains(why),
            "expected a refusal naming {why:?}, got {}: {err}",
            if out.status.success() {
                "admitted"
            } else {
                "another refusal"
            }
        ),
    }
    Ok(())
}

/// The zone label a volume's node affinity may be moved from (to `topology.kubernetes.io/zone`).
pub(super) const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";

/// A volume's node affinity: `node`'s hostname and zone-a under `zone_key`.
pub(super) fn affinity(node: &str, zone_key: &str) -> Value {
    json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]},
        {"key": zone_key, "operator": "In", "values": ["zone-a"]}]}]}})
}

/// A PersistentVolume of `size` and `class` as a CSI driver provisions it, on node-a (beta
/// zone label), bound to `claim` (name, uid) of `TEAM`, or to none.
pub(super) fn csi_volume(
    name: &str,
    claim: Option<(&str, &str)>,
    size: &str,
    class: &str,
) -> Value {
    let mut pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": "csi.example.com"}},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": class,
            "volumeMode": "Filesystem",
            "csi": {"driver": "csi.example.com", "volumeHandle": name},
            "nodeAffinity": affinity("node-a", BETA_ZONE)}
    });
    if let Some((claim, uid)) = claim {
        pv["spec"]["claimRef"] = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": TEAM, "name": claim, "uid": uid, "resourceVersion": "1"});
    }
    pv
}

/// Patch volume `pv` with the merge patch `patch` on `kc` (a dry run: admission runs,
/// nothing is stored); `Err` with the answer when it is not `answer`.
pub(super) fn ask_patch(
    cp: &ControlPlane,
    kc: &Path,
    pv: &str,
    patch: &Value,
    answer: Answer,
) -> Result<()> {
    ask_patch_in(cp, kc, None, &format!("pv/{pv}"), patch, answer)
}

/// Patch `target` (`kind/name`, of namespace `ns` if any) with the merge patch `patch` on
/// `kc`, a dry run; `Err` with the answer when it is not `answer`.
pub(super) fn ask_patch_in(
    cp: &ControlPlane,
    kc: &Path,
    ns: Option<&str>,
    target: &str,
    patch: &Value,
    answer: Answer,
) -> Result<()> {
    let kc = kc.to_string_lossy();
    let patch = patch.to_string();
    let mut args = vec!["--kubeconfig", &kc, "patch", target];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    args.extend(["--type=merge", "--dry-run=server", "-p", &patch]);
    answered(&cp.kubectl(&args)?, answer)
}

/// Delete `kind` `name` of `TEAM` on `kc`, a dry run; `Err` when not `answer`.
pub(super) fn ask_delete(
    cp: &ControlPlane,
    kc: &Path,
    kind: &str,
    name: &str,
    answer: Answer,
) -> Result<()> {
    let kc = kc.to_string_lossy();
    let out = cp.kubectl(&[
        "--kubeconfig",
        &kc,
        "delete",
        kind,
        name,
        "-n",
        TEAM,
        "--dry-run=server",
        "--wait=false",
    ])?;
    answered(&out, answer)
}

/// The validations of the chart's policy `policy` (as installed) type-check against the
/// kinds it matches (the fields they name exist). kube-controller-manager's policy status
/// controller checks only concrete versions, so a copy with the versions served here (v1
/// for the core and apps groups, v1alpha1 for Ferry's) is checked, bound to nothing. It does
/// not check variables (their values are `dyn` to it), nor subresources' kinds: the rows
/// test those.
pub(super) fn type_checked(cp: &ControlPlane, policy: &str) -> Result<()> {
    let out = cp.kubectl_ok(&["get", "validatingadmissionpolicy", policy, "-o", "json"])?;
    let mut installed: Value = serde_json::from_str(&out)?;
    let rules = installed["spec"]["matchConstraints"]["resourceRules"]
        .as_array_mut()
        .context("the policy's resourceRules")?;
    for rule in rules {
        let version = match rule["apiGroups"][0].as_str() {
            Some("" | "apps") => "v1",
            _ => "v1alpha1",
        };
        rule["apiVersions"] = json!([version]);
    }
    let typed = format!("{policy}-typed");
    let copy = json!({"apiVersion": installed["apiVersion"], "kind": installed["kind"],
        "metadata": {"name": typed}, "spec": installed["spec"]});
    cp.apply(&copy.to_string())?;
    let checked = || -> Result<Value> {
        let out = cp.kubectl_ok(&["get", "validatingadmissionpolicy", &typed, "-o", "json"])?;
        let p: Value = serde_json::from_str(&out)?;
        ensure!(
            p["status"]["observedGeneration"] == p["metadata"]["generation"]
                && !p["status"]["typeChecking"].is_null(),
            "not type-checked yet: {}",
            p["status"]
        );
        Ok(p["status"]["typeChecking"].clone())
    };
    let _ = wait_for("the policy type-checked", Duration::from_secs(60), || {
        checked().is_ok()
    });
    let warnings = checked()?["expressionWarnings"].clone();
    ensure!(
        warnings.as_array().is_none_or(Vec::is_empty),
        "the {policy} policy's expressions do not type-check: {warnings:#}"
    );
    Ok(())
}

/// Every row against the API server; all the failures at once.
pub(super) fn ask_all<B: Copy + PartialEq + std::fmt::Debug>(
    cp: &ControlPlane,
    kc: &Path,
    bases: &[(B, Value)],
    rows: &[Row<B>],
) -> Result<()> {
    ask_rows(
        "rows",
        rows,
        |base| {
            let obj = bases
                .iter()
                .find(|(b, _)| *b == base)
                .map(|(_, v)| v.clone());
            Ok(((), obj.context("no such base")?))
        },
        |(), obj, answer| ask(cp, kc, obj, answer),
    )
}

/// Each of `rows` asked: `base` gives, for a row's base, where it goes and the object (or
/// patch) the code builds; the row's edits are applied to that, and `ask` sends it. All the
/// failures at once, the table named by `table`.
pub(super) fn ask_rows<B: Copy + std::fmt::Debug, T>(
    table: &str,
    rows: &[Row<B>],
    mut base: impl FnMut(B) -> Result<(T, Value)>,
    mut ask: impl FnMut(T, &Value, Answer) -> Result<()>,
) -> Result<()> {
    let mut failed = Vec::new();
    for r in rows {
        let asked = base(r.base).and_then(|(to, mut obj)| {
            r.edits.iter().try_for_each(|e| apply(&mut obj, e))?;
            ask(to, &obj, r.answer)
        });
        if let Err(e) = asked {
            failed.push(format!("{:?} with {}: {e:#}", r.base, r.what));
        }
    }
    ensure!(
        failed.is_empty(),
        "{} of {} {table} answered otherwise:\n{}",
        failed.len(),
        rows.len(),
        failed.join("\n")
    );
    Ok(())
}

/// `ask` until it gives `answer` (the API server applies a new policy, or sees a new
/// PriorityClass, a moment after it is stored), for at most 30 s; then the last answer.
pub(super) fn ask_until(cp: &ControlPlane, kc: &Path, obj: &Value, answer: Answer) -> Result<()> {
    let _ = wait_for("the answer", Duration::from_secs(30), || {
        ask(cp, kc, obj, answer).is_ok()
    });
    ask(cp, kc, obj, answer)
}

/// The chart as rendered into `deploy/`, the job's namespaces, and the operator's
/// ServiceAccount kubeconfig; returned once the chart's policies refuse `refused` (an
/// object the policies have always refused).
pub(super) fn install(cp: &ControlPlane, refused: &Value, why: &'static str) -> Result<PathBuf> {
    cp.install_rendered(NS, "ferry.yaml")?;
    for ns in [TEAM, "team-b"] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    let kc = cp.service_account_kubeconfig(NS, "ferry-operator", None)?;
    ask_until(cp, &kc, refused, Answer::Refused(why)).context("the chart's policies in force")?;
    Ok(kc)
}

/// `obj` in namespace `ns`.
fn moved(obj: &Value, ns: &str) -> Result<Value> {
    let mut obj = obj.clone();
    apply(&mut obj, &set("/metadata/namespace", json!(ns)))?;
    Ok(obj)
}

#[test]
fn holder_policy_admits_exactly_the_pod_holder_rs_builds_and_refuses_it_with_any_field_added_or_changed(
) -> Result<()> {
    let image = holder_image()?;
    let job = job("move", UID, None)?;
    let pod = |destination, claim, node, block| {
        serde_json::to_value(holder::pod(&job, destination, claim, &image, node, block))
    };
    let source = pod(false, "data", None, false)?;
    let destination = pod(true, "copy", Some("node-b"), false)?;
    // The other holders the code makes: each end with and without a preferred node.
    let also = [
        pod(false, "data", Some("node-b"), false)?,
        pod(true, "copy", None, false)?,
        pod(false, "disk", Some("node-b"), true)?,
        pod(true, "disk-copy", None, true)?,
    ];
    let block_bases = [
        (Base::BlockSource, pod(false, "disk", None, true)?),
        (
            Base::BlockDestination,
            pod(true, "disk-copy", Some("node-b"), true)?,
        ),
    ];
    let bases = [
        (Base::Source, source.clone()),
        (Base::Destination, destination.clone()),
    ];
    let rows = holder_rows(&image);
    check_coverage(&bases, &rows, HOLDER_WHOLE)?;
    // A block holder's rows with the filesystem holder's (what they share is tried there).
    let block_rows: Vec<Row> = block_holder_rows()
        .into_iter()
        .chain(holder_rows(&image))
        .collect();
    let all_bases = [&bases[..], &block_bases[..]].concat();
    check_coverage(&all_bases, &block_rows, BLOCK_HOLDER_WHOLE)?;
    // An export's holder, with a job's source holder's rows (what they share is tried
    // there).
    let export: ferry_crds::CopyExport = serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "CopyExport",
        "metadata": {"name": "db", "namespace": TEAM, "uid": UID},
        "spec": {"source": {"pvc": "data"}, "readers": [{"peer": "west", "namespace": "shop"}], "ttl": "24h"}
    }))?;
    let export_bases = [(
        Base::Export,
        serde_json::to_value(holder::export_pod(&export, "data", &image))?,
    )];
    let export_rows: Vec<Row> = export_holder_rows()
        .into_iter()
        .chain(holder_rows(&image))
        .collect();
    check_coverage(
        &[&bases[..], &export_bases[..]].concat(),
        &export_rows,
        HOLDER_WHOLE,
    )?;

    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": TEAM},
        "spec": {"containers": [{"name": "c", "image": image}]}});
    let kc = install(&cp, &plain, NOT_A_HOLDER)?;
    // What the rows name must exist, so that the refusal is the policy's, not a lookup's.
    cp.apply("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: ferry-e2e}\nhandler: runc\n")?;
    cp.apply("apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: ferry-e2e-high}\nvalue: 1000000\n")?;
    for exact in all_bases
        .iter()
        .chain(&export_bases)
        .map(|(_, v)| v)
        .chain(&also)
    {
        ask(&cp, &kc, exact, Answer::Admitted)
            .with_context(|| format!("the holder the code builds: {exact}"))?;
    }
    // It meets the `restricted` Pod Security level; and where a LimitRange gives containers
    // a default CPU limit and ephemeral storage, the API server's additions are admitted.
    cp.kubectl_ok(&["create", "namespace", "restricted"])?;
    cp.kubectl_ok(&[
        "label",
        "namespace",
        "restricted",
        "pod-security.kubernetes.io/enforce=restricted",
    ])?;
    ask(&cp, &kc, &moved(&source, "restricted")?, Answer::Admitted)
        .context("the holder in a restricted namespace")?;
    cp.kubectl_ok(&["create", "namespace", "limited"])?;
    cp.apply(concat!(
        "apiVersion: v1\nkind: LimitRange\nmetadata: {name: defaults, namespace: limited}\n",
        "spec:\n  limits:\n  - type: Container\n",
        "    default: {cpu: 500m, ephemeral-storage: 1Gi}\n",
        "    defaultRequest: {ephemeral-storage: 64Mi}\n",
    ))?;
    ask_until(&cp, &kc, &moved(&source, "limited")?, Answer::Admitted)
        .context("the holder in a namespace with a LimitRange")?;
    ask_all(&cp, &kc, &all_bases, &block_rows)?;
    ask_all(&cp, &kc, &export_bases, &export_holder_rows())?;

    // And for real: created, then deleted, on the operator's token.
    let kcs = kc.to_string_lossy();
    let out = cp.kubectl_stdin(
        &["--kubeconfig", &kcs, "create", "-f", "-"],
        &source.to_string(),
    )?;
    ensure!(
        out.status.success(),
        "creating the holder: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let name = source["metadata"]["name"].as_str().context("a name")?;
    cp.kubectl_ok(&[
        "--kubeconfig",
        &kcs,
        "delete",
        "pod",
        name,
        "-n",
        TEAM,
        "--wait=false",
    ])?;

    // A cluster whose default PriorityClass every pod gets: holders are refused until the
    // chart lists it in operator.holderPriorityClassNames.
    cp.apply("apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: ferry-e2e-default}\nvalue: 1000\nglobalDefault: true\n")?;
    ask_until(&cp, &kc, &source, Answer::Refused("spec.priorityClassName"))
        .context("a holder given the cluster's default PriorityClass")?;
    let Some(helm) = ferry_e2e::helm_or_skip()? else {
        return Ok(());
    };
    let out = std::process::Command::new(helm)
        .current_dir(repo_root())
        .args(["template", "ferry", "charts/ferry", "--namespace", NS])
        .args(["--show-only", "templates/admission.yaml"])
        .args([
            "--set",
            "operator.holderPriorityClassNames={ferry-e2e-default}",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cp.kubectl_stdin(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &String::from_utf8_lossy(&out.stdout),
    )?;
    ensure!(
        out.status.success(),
        "applying the policies with the class listed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ask_until(&cp, &kc, &source, Answer::Admitted)
        .context("a holder of the listed default PriorityClass")?;
    ask(
        &cp,
        &kc,
        &with_class(&source, "ferry-e2e-high")?,
        Answer::Refused("spec.priorityClassName"),
    )
    .context("a holder of a class not listed")
}

/// `obj` with PriorityClass `class`.
fn with_class(obj: &Value, class: &str) -> Result<Value> {
    let mut obj = obj.clone();
    apply(&mut obj, &set("/spec/priorityClassName", json!(class)))?;
    Ok(obj)
}

#[test]
fn snapshot_sources_policy_admits_exactly_the_claim_and_snapshot_snapshot_rs_builds() -> Result<()>
{
    let job = job("move", UID, Some("csi-snapshots"))?;
    let taken = ferry_operator::resolve::taken_snapshot(UID);
    let claim = serde_json::to_value(snapshot::claim_for(&job, &taken, "csi", "1Gi", false))?;
    let block = serde_json::to_value(snapshot::claim_for(&job, &taken, "csi", "1Gi", true))?;
    let snap = serde_json::to_value(snapshot::snapshot_of_claim(&job, "data", None))?;
    // The destination claim it is kept for.
    let backup = serde_json::from_value(json!({"metadata":
        {"name": "backup", "uid": "5a7e0c3d-1b2a-4c5d-8e9f-0a1b2c3d4e5f"}}))?;
    let kept = serde_json::to_value(snapshot::snapshot_of_claim(&job, "data", Some(&backup)))?;
    let bases = [
        (Base::Claim, claim.clone()),
        (Base::Snapshot, snap),
        (Base::KeptSnapshot, kept),
    ];
    let rows: Vec<Row> = snapshot_rows()
        .into_iter()
        .chain(kept_snapshot_rows())
        .collect();
    // Each kind on its own rows.
    for base in &bases {
        check_coverage(std::slice::from_ref(base), &rows, SNAPSHOT_WHOLE)?;
    }

    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    // A restored claim's name owned by no CopyJob: this policy's refusal, not -migrations'.
    let mut grab = claim;
    apply(
        &mut grab,
        &set("/metadata/ownerReferences/0/kind", json!("CopySchedule")),
    )?;
    let kc = install(&cp, &grab, NOT_OURS)?;
    // The VolumeSnapshot API, as far as admission needs it: the kind, its fields kept as sent.
    cp.apply(concat!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n",
        "metadata:\n  name: volumesnapshots.snapshot.storage.k8s.io\n",
        "  annotations: {api-approved.kubernetes.io: \"https://github.com/kubernetes-csi/external-snapshotter/pull/419\"}\n",
        "spec:\n  group: snapshot.storage.k8s.io\n  scope: Namespaced\n",
        "  names: {kind: VolumeSnapshot, plural: volumesnapshots, singular: volumesnapshot, listKind: VolumeSnapshotList}\n",
        "  versions:\n  - name: v1\n    served: true\n    storage: true\n",
        "    schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object, x-kubernetes-preserve-unknown-fields: true}}}}\n",
    ))?;
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/volumesnapshots.snapshot.storage.k8s.io",
    ])?;
    for exact in bases.iter().map(|(_, b)| b).chain([&block]) {
        ask_until(&cp, &kc, exact, Answer::Admitted)
            .with_context(|| format!("what the code builds: {exact}"))?;
    }
    ask_all(&cp, &kc, &bases, &rows)
}
