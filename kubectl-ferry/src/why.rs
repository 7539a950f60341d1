//! `kubectl ferry why JOB`: where a CopyJob is and why, in words: its phase, each condition
//! with what to change for its reason (`Reason::remedy`, the one list), the first failed
//! paths, and the job's last events.

use std::fmt::Write;

use anyhow::Result;
use ferry_crds::{CopyJob, Reason};
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

/// Most events shown (the newest).
const EVENTS: usize = 10;
/// Most failed paths shown (the status keeps 20).
const FAILURES: usize = 10;

fn reason_of(name: &str) -> Option<Reason> {
    Reason::ALL.iter().copied().find(|r| r.as_str() == name)
}

/// What to change for `reason`, if Ferry knows the reason and something is to be changed.
fn remedy(reason: &str) -> Option<&'static str> {
    reason_of(reason)
        .map(Reason::remedy)
        .filter(|r| !r.is_empty())
}

/// The explanation of `job`, with `events` (the job's, any order).
pub fn explain(job: &CopyJob, events: &[Event]) -> String {
    let mut out = String::new();
    let status = job.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let _ = writeln!(out, "CopyJob {}: {phase:?}", job.name_any());
    for c in &status.conditions {
        let _ = writeln!(
            out,
            "  {} {}: {} {}",
            c.type_, c.status, c.reason, c.message
        );
        // A True Failed, or a False step the job waits at, is what to act on.
        let stuck = (c.type_ == "Failed" && c.status == "True")
            || (c.type_ != "Failed" && c.type_ != "Complete" && c.status == "False");
        if let Some(r) = remedy(&c.reason).filter(|_| stuck) {
            let _ = writeln!(out, "    what to change: {r}");
        }
    }
    if !status.failures.is_empty() {
        let _ = writeln!(out, "failed paths ({} listed):", status.failures.len());
        for f in status.failures.iter().take(FAILURES) {
            let _ = writeln!(out, "  {} {}: {}", f.reason, f.path, f.message);
        }
    }
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| {
        e.last_timestamp.clone().or(e
            .event_time
            .clone()
            .map(|t| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.0)))
    });
    if !events.is_empty() {
        let _ = writeln!(out, "events (newest last):");
        for e in events.iter().rev().take(EVENTS).rev() {
            let _ = writeln!(
                out,
                "  {} {}: {}",
                e.type_.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
                e.message.as_deref().unwrap_or("")
            );
        }
    }
    if phase == ferry_crds::Phase::Succeeded {
        if let Some(m) = &status.manifest {
            let _ = writeln!(
                out,
                "checksum manifest: {m} in the destination (xxh128sum -c checks it)"
            );
        }
    }
    out
}

/// The events whose object is CopyJob `name` in `events`' namespace.
pub async fn events_of(events: &Api<Event>, name: &str) -> Result<Vec<Event>> {
    let params = ListParams::default()
        .fields(&format!(
            "involvedObject.kind=CopyJob,involvedObject.name={name}"
        ))
        .limit(100);
    Ok(events.list(&params).await?.items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_job_is_explained_with_what_to_change() {
        let job: CopyJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob",
            "metadata": {"name": "j", "namespace": "team"},
            "spec": {"source": {"pvc": "a"}, "destination": {"pvc": "b"}},
            "status": {"phase": "Pending", "conditions": [
                {"type": "Accepted", "status": "True", "reason": "Valid", "message": "ok",
                 "lastTransitionTime": "2026-12-02T00:00:00Z"},
                {"type": "Resolved", "status": "False", "reason": "PVCNotFound",
                 "message": "no claim a", "lastTransitionTime": "2026-12-02T00:00:00Z"}
            ]}
        }))
        .expect("job");
        let text = explain(&job, &[]);
        assert!(
            text.contains("Resolved False: PVCNotFound no claim a"),
            "{text}"
        );
        assert!(
            text.contains(&format!("what to change: {}", Reason::PVCNotFound.remedy())),
            "{text}"
        );
        assert_eq!(text.matches("what to change").count(), 1, "{text}");
    }
}
