//! A VolumeSnapshot and the VolumeSnapshotContent it is bound to, as both the operator
//! (before it restores a snapshot source) and an agent (before it trusts which snapshot a
//! block source is) check them: bound both ways. A tenant's VolumeSnapshot may name any
//! content; only the content, which the tenant cannot write, says whose it is.

use serde_json::Value;

/// The content a VolumeSnapshot (its JSON) says it is bound to; `None` for none, or for an
/// empty name, whose GET would list every content.
pub fn bound_content(snapshot: &Value) -> Option<&str> {
    snapshot
        .pointer("/status/boundVolumeSnapshotContentName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

/// Whether a content (its JSON) names VolumeSnapshot `ns/name`, of uid `uid`, back.
pub fn names_snapshot(content: &Value, ns: &str, name: &str, uid: Option<&str>) -> bool {
    content.pointer("/spec/volumeSnapshotRef").is_some_and(|r| {
        r.get("namespace").and_then(Value::as_str) == Some(ns)
            && r.get("name").and_then(Value::as_str) == Some(name)
            && r.get("uid").and_then(Value::as_str) == uid
    })
}

/// The claim a snapshot source of job `job_uid` is restored to, in the job's namespace: the
/// operator makes it (owned by the job), and operator and agents copy from it.
pub fn restore_claim(job_uid: &str) -> String {
    format!("ferry-restore-{job_uid}")
}

/// How the names of [`taken_snapshot`] begin.
pub const TAKEN_SNAPSHOT_PREFIX: &str = "ferry-snapshot-";

/// The VolumeSnapshot the operator takes of a `copyMethod: Snapshot` source of job `job_uid`.
pub fn taken_snapshot(job_uid: &str) -> String {
    format!("{TAKEN_SNAPSHOT_PREFIX}{job_uid}")
}

/// Whether an endpoint is read from a snapshot (one named, or one the operator takes).
pub fn from_snapshot(e: &ferry_crds::Endpoint) -> bool {
    e.snapshot.is_some() || e.copy_method == Some(ferry_crds::CopyMethod::Snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_content_must_name_the_snapshot_back_by_namespace_name_and_uid() {
        let content =
            json!({"spec": {"volumeSnapshotRef": {"namespace": "a", "name": "s", "uid": "u"}}});
        assert!(names_snapshot(&content, "a", "s", Some("u")));
        assert!(!names_snapshot(&content, "b", "s", Some("u")));
        assert!(!names_snapshot(&content, "a", "t", Some("u")));
        assert!(!names_snapshot(&content, "a", "s", Some("v")));
        assert!(!names_snapshot(&json!({}), "a", "s", None));
        let bound = |n: &str| json!({"status": {"boundVolumeSnapshotContentName": n}});
        assert_eq!(bound_content(&bound("c")), Some("c"));
        assert_eq!(bound_content(&bound("")), None);
        assert_eq!(bound_content(&json!({})), None);
    }
}
