//! Whether an export hello may be served, decided without a cluster: the credential is one
//! the export's status lists and still good (constant time), the asking install's FerryPeer
//! and the stated namespace are among the export's readers, the export is not being
//! deleted, is Ready for its current spec, and has not expired; then a reader slot is free
//! or this job holds one ([`Holders`]). Only the CopyExport as the agent watches it is consulted (its
//! status only the source's operator writes); nothing the peer says is believed but the
//! credential it proves.

use std::collections::BTreeMap;

use ferry_crds::{CopyExport, ExportReason, EXPORT_READY};
use ferry_transfer::ExportHello;
use k8s_openapi::jiff::Timestamp;

/// Why a hello is refused: the reason the reader's job will show, and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Why,
    pub message: String,
}

/// The refusal reasons of the peering port (the reader's `ExportRefused` says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    ExportNotFound,
    BadCredential,
    NotAReader,
    Deleted,
    NotReady,
    Expired,
    InUse,
    PathOutsideExport,
}

impl Refusal {
    /// As the Refused frame says it: `<reason>: <message>`.
    pub fn said(&self) -> String {
        format!("{:?}: {}", self.reason, self.message)
    }
}

fn refuse(reason: Why, message: String) -> Refusal {
    Refusal { reason, message }
}

/// Check `hello` from an agent of install `install` (its FerryPeer here: `peer`, if any
/// trusts it) against `export`, at `now`. Its reader slot is [`Holders::take`]'s.
pub fn check(
    export: &CopyExport,
    hello: &ExportHello,
    install: &str,
    peer: Option<&str>,
    now: Timestamp,
) -> Result<(), Refusal> {
    let name = format!(
        "{}/{}",
        export.metadata.namespace.as_deref().unwrap_or_default(),
        export.metadata.name.as_deref().unwrap_or_default()
    );
    let status = export.status.clone().unwrap_or_default();
    // The credential first: whoever does not hold it learns nothing else of the export.
    let good = status
        .credentials
        .iter()
        .filter(|c| c.until.as_ref().is_none_or(|u| u.0 > now))
        .any(|c| ferry_link::credential_matches(&hello.credential, &c.sha256));
    if !good {
        return Err(refuse(
            Why::BadCredential,
            "the credential is not this export's current one (rotated, or its grace ended): read the export's Secret again".into(),
        ));
    }
    let namespace = String::from_utf8_lossy(&hello.namespace);
    let listed = peer.is_some_and(|p| {
        export
            .spec
            .readers
            .iter()
            .any(|r| r.peer == p && r.namespace == namespace)
    });
    if !listed {
        return Err(refuse(
            Why::NotAReader,
            format!(
                "export {name} names no reader {}/{namespace} (install {install}); its owner adds one to spec.readers",
                peer.unwrap_or("<no FerryPeer>")
            ),
        ));
    }
    if export.metadata.deletion_timestamp.is_some() {
        return Err(refuse(
            Why::Deleted,
            format!("export {name} is being deleted"),
        ));
    }
    let ready = status.conditions.iter().find(|c| c.type_ == EXPORT_READY);
    let current = status.observed_generation == export.metadata.generation;
    match ready {
        Some(c) if c.status == "True" && current => {}
        Some(c) if c.reason == ExportReason::Expired.as_str() => {
            return Err(refuse(
                Why::Expired,
                format!("export {name}: {}", c.message),
            ))
        }
        Some(c) if current => {
            return Err(refuse(
                Why::NotReady,
                format!("export {name} is not Ready ({}: {})", c.reason, c.message),
            ))
        }
        _ => {
            return Err(refuse(
                Why::NotReady,
                format!("export {name}'s source has not judged its current spec yet; try again"),
            ))
        }
    }
    match status.expires_at {
        Some(t) if t.0 > now => {}
        _ => {
            return Err(refuse(
                Why::Expired,
                format!("export {name} has expired; its owner renews it (spec.renew, or a later spec.expires)"),
            ))
        }
    }
    Ok(())
}

/// How fast a reader is served, in bytes a second: the lower of the export's
/// `bandwidthLimit` and the reader's own (its hello's; 0 is none), never under the least a
/// limit may be (1 MiB/s); `None`: neither limits it.
pub fn served_rate(export: &CopyExport, hello: &ExportHello) -> Result<Option<u64>, Refusal> {
    let own = match &export.spec.bandwidth_limit {
        Some(q) => Some(ferry_crds::parse_rate(q).map_err(|e| Refusal {
            reason: Why::NotReady,
            message: format!(
                "export {}: spec.bandwidthLimit: {e}",
                kube::ResourceExt::name_any(export)
            ),
        })?),
        None => None,
    };
    let theirs = (hello.bandwidth_limit > 0).then_some(hello.bandwidth_limit);
    Ok(own
        .into_iter()
        .chain(theirs)
        .min()
        .map(|r| r.max(ferry_resolve::validate::MIN_BANDWIDTH)))
}

/// What is served for a reader asking for `asked` beneath an export of `export_path`: the
/// two joined (the frame's decoder already refused `..`, absolute paths and NUL), never
/// Ferry's state directory at the top of the root, which a reader of a whole root could
/// otherwise name.
pub fn served_path(export_path: &str, asked: &[u8]) -> Result<String, Refusal> {
    let asked = std::str::from_utf8(asked).map_err(|_| {
        refuse(
            Why::PathOutsideExport,
            "the path asked for is not UTF-8".into(),
        )
    })?;
    let joined: Vec<&str> = export_path
        .split('/')
        .chain(asked.split('/'))
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let joined = joined.join("/");
    if ferry_crds::in_state_dir(&joined) || joined.split('/').any(|c| c == "..") {
        return Err(refuse(
            Why::PathOutsideExport,
            format!(
                "{asked:?} is not beneath the export (Ferry's state directory is never served)"
            ),
        ));
    }
    Ok(joined)
}

/// The jobs reading each export on this node (export uid → job uid → connections), so that
/// `maxReaders` counts jobs, not connections (a job opens several).
#[derive(Debug, Default)]
pub struct Holders(std::sync::Mutex<BTreeMap<String, BTreeMap<String, usize>>>);

impl Holders {
    /// A reader slot of `export` for the job `hello` names, or its connection's share of
    /// the one the job holds, until the guard drops; `InUse` when `maxReaders` other jobs
    /// hold it. Checked and taken under one lock, so two jobs cannot both take the last.
    pub fn take(
        self: &std::sync::Arc<Self>,
        export: &CopyExport,
        hello: &ExportHello,
    ) -> Result<Held, Refusal> {
        let uid = String::from_utf8_lossy(&hello.export).into_owned();
        let job = String::from_utf8_lossy(&hello.job).into_owned();
        let slots = usize::try_from(export.spec.max_readers).unwrap_or(1).max(1);
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let jobs = held.entry(uid.clone()).or_default();
        if !jobs.contains_key(&job) && jobs.len() >= slots {
            return Err(refuse(
                Why::InUse,
                format!(
                    "export {}/{} is held by {} other job(s), its maxReaders; try again when they finish",
                    export.metadata.namespace.as_deref().unwrap_or_default(),
                    export.metadata.name.as_deref().unwrap_or_default(),
                    jobs.len()
                ),
            ));
        }
        *jobs.entry(job.clone()).or_default() += 1;
        Ok(Held {
            holders: self.clone(),
            export: uid,
            job,
        })
    }
}

/// A connection's hold on an export's reader slot.
#[derive(Debug)]
pub struct Held {
    holders: std::sync::Arc<Holders>,
    export: String,
    job: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.holders.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(jobs) = held.get_mut(&self.export) {
            if let Some(n) = jobs.get_mut(&self.job) {
                *n -= 1;
                if *n == 0 {
                    jobs.remove(&self.job);
                }
            }
            if jobs.is_empty() {
                held.remove(&self.export);
            }
        }
    }
}

#[cfg(test)]
mod tests;
