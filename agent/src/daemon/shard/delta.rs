//! Changed-block tracking for a block shard: which snapshot the source is (so the record of
//! the destination can say what it now holds), and, when the destination holds an earlier
//! snapshot of the same volume, which chunks changed since, as the driver's
//! snapshot-metadata sidecar says ([`ferry_cbt`]). The agent asks itself, with a token of
//! its own ServiceAccount for the sidecar's audience; the sidecar lets it read only what
//! that account may `get` (the VolumeSnapshots of the job's namespace).
//!
//! The answer is believed as the snapshot itself is: it is the driver's account of its own
//! snapshots. Anything short of a clean answer (no sidecar, a refusal, a deadline, too
//! many ranges, another driver or volume) is a reason to compare every chunk instead, never
//! a failure of the copy.

use std::time::Duration;

use ferry_cbt::{Limits, Query, Service};
use ferry_crds::CopyJob;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use super::witness::Snapshot;

/// The whole question to the sidecar, resumes included.
const DEADLINE: Duration = Duration::from_secs(60);
/// Ranges accepted in one answer: past this, comparing every chunk is as cheap.
const MAX_RANGES: usize = 1 << 20;
/// How long the agent's token for the sidecar lasts.
const TOKEN_TTL: Duration = Duration::from_secs(600);

/// The job's source as a snapshot: its VolumeSnapshot's name in the job's namespace, and
/// what its content says it is.
#[derive(Debug, Clone)]
pub(super) struct Source {
    pub name: String,
    pub snapshot: Snapshot,
    /// Its content's `status.restoreSize`, if said.
    pub size: Option<u64>,
}

fn api(client: &Client, ns: Option<&str>, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// The snapshot the job's source is restored from (`source.snapshot`, or the one the
/// operator took for `copyMethod: Snapshot`), if it is one: read from its content, and only
/// from a content bound to it both ways (only the snapshot controller or an admin writes
/// a content), as the operator checks it. `Ok(None)`: not a snapshot source.
pub(super) async fn source(client: &Client, job: &CopyJob) -> Result<Option<Source>, String> {
    let src = &job.spec.source;
    if !ferry_resolve::from_snapshot(src) {
        return Ok(None);
    }
    let ns = job.namespace().unwrap_or_default();
    let name = match &src.snapshot {
        Some(name) => name.clone(),
        None => ferry_resolve::taken_snapshot(&job.uid().unwrap_or_default()),
    };
    let vs = api(client, Some(&ns), "VolumeSnapshot", "volumesnapshots")
        .get(&name)
        .await
        .map_err(|e| format!("VolumeSnapshot {ns}/{name}: {e}"))?;
    let content_name = ferry_resolve::snapshot::bound_content(&vs.data)
        .ok_or_else(|| format!("VolumeSnapshot {ns}/{name} is bound to no content"))?;
    let content = api(
        client,
        None,
        "VolumeSnapshotContent",
        "volumesnapshotcontents",
    )
    .get(content_name)
    .await
    .map_err(|e| format!("VolumeSnapshotContent {content_name}: {e}"))?;
    let uid = vs.metadata.uid.as_deref();
    if !ferry_resolve::snapshot::names_snapshot(&content.data, &ns, &name, uid) {
        return Err(format!(
            "VolumeSnapshotContent {content_name} is not bound to VolumeSnapshot {ns}/{name}"
        ));
    }
    let field = |pointer: &str| {
        str_at(&content.data, pointer)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let (Some(driver), Some(handle)) = (field("/spec/driver"), field("/status/snapshotHandle"))
    else {
        return Err(format!(
            "VolumeSnapshotContent {content_name} names no driver or snapshot handle yet"
        ));
    };
    Ok(Some(Source {
        name,
        snapshot: Snapshot {
            driver,
            handle,
            volume: field("/spec/source/volumeHandle"),
        },
        size: content
            .data
            .pointer("/status/restoreSize")
            .and_then(Value::as_u64),
    }))
}

/// The chunks (of `chunk` bytes, over `size` bytes) that may differ between `base`, which
/// the destination holds, and the source snapshot `now`: one flag each. `Err`: why every
/// chunk is to be compared instead.
pub(super) async fn changed(
    client: &Client,
    (agent_ns, account): (&str, &str),
    job_ns: &str,
    base: &Snapshot,
    now: &Source,
    (chunk, size): (u64, u64),
) -> Result<Vec<bool>, String> {
    if base.driver != now.snapshot.driver {
        return Err(format!(
            "the destination holds a snapshot of driver {}, the source is one of {}",
            base.driver, now.snapshot.driver
        ));
    }
    if let (Some(a), Some(b)) = (&base.volume, &now.snapshot.volume) {
        if a != b {
            return Err(format!(
                "the destination holds a snapshot of volume {a}, the source is one of {b}"
            ));
        }
    }
    let driver = &base.driver;
    let service = Service::of_driver(client, driver)
        .await
        .map_err(|e| crate::with_causes(&e))?
        .ok_or_else(|| format!("driver {driver} advertises no SnapshotMetadataService"))?;
    let token = ferry_cbt::token(client, agent_ns, account, &service.audience, TOKEN_TTL)
        .await
        .map_err(|e| crate::with_causes(&e))?;
    let query = Query::Delta {
        base_handle: &base.handle,
        snapshot: &now.name,
    };
    let limits = Limits {
        deadline: DEADLINE,
        ranges: MAX_RANGES,
    };
    let mut ranges = ferry_cbt::ranges(&service, &token, job_ns, query, limits)
        .await
        .map_err(|e| crate::with_causes(&e))?;
    if ranges.capacity == 0 {
        // No message: nothing changed, and the volume's size is the snapshot's (unknown:
        // then every chunk past 0, all of them, is read).
        ranges.capacity = now.size.unwrap_or(0);
    }
    Ok(ranges.chunks(chunk, size))
}
