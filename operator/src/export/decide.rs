//! What the operator says of a CopyExport, decided without a cluster: whether it may be
//! served (peering on, its time within the install's longest, not expired, every reader a
//! trusted peer admitting this namespace, its source there), when it expires, which
//! credentials the source's agents accept (the current one, and the previous one until its
//! grace ends), and whether a new credential must be made and the export Secret written.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use ferry_crds::{
    export_secret_name, CopyExport, CopyExportStatus, ExportCredential, ExportReason, FerryPeer,
    PeerAccess, EXPORT_ADDRESS_KEY, EXPORT_EXPIRES_KEY, EXPORT_READY, MAX_EXPORT_NAME, PEER_VALID,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

/// The longest an export waits before it is looked at again: a peer's certificate
/// expiring, or the clock passing a deadline the watch does not see, is noticed within this.
pub const RECHECK: Duration = Duration::from_secs(60 * 60);
/// How soon an export that is not Ready is looked at again (a claim made, a root opened to
/// the namespace: nothing this controller watches says so).
pub const NOT_READY_RECHECK: Duration = Duration::from_secs(30);

/// This install's peering, as exports need it; `None` in [`Inputs::peering`] while peering
/// is off.
#[derive(Debug, Clone, Copy)]
pub struct Peering<'a> {
    /// This install's name.
    pub install: &'a str,
    /// Its peering CA certificate (PEM), which readers check the source's agents against.
    pub ca_pem: &'a str,
    /// The longest an export may last (`peering.maxExportTtl`).
    pub max_ttl: Duration,
    /// How long a previous credential stays good after a rotation (`peering.rotationGrace`).
    pub grace: Duration,
}

/// What the decision reads.
#[derive(Debug)]
pub struct Inputs<'a> {
    pub export: &'a CopyExport,
    pub peering: Option<Peering<'a>>,
    /// Every FerryPeer of this cluster.
    pub peers: &'a [&'a FerryPeer],
    /// The labels of the export's namespace (for the peers' `namespaces`).
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// Whether the source resolved, or why not (the message).
    pub source: Result<(), String>,
    /// The node whose agent serves it and that agent's peering address, or why there is
    /// none.
    pub serving: Result<Serving, String>,
    pub now: SystemTime,
}

/// Where an export is served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    pub node: String,
    /// `host:port`, as the agent advertises its peering port.
    pub address: String,
}

/// The export Secret's content, when a new credential was made.
#[derive(Debug, PartialEq, Eq)]
pub struct NewSecret {
    pub name: String,
    pub credential: [u8; 32],
    /// RFC 3339.
    pub expires: String,
    pub address: String,
}

/// What to do.
#[derive(Debug)]
pub struct Decision {
    pub status: CopyExportStatus,
    /// Write the whole Secret (a new credential), before the status.
    pub secret: Option<NewSecret>,
    /// Keys of the Secret that changed without a new credential (`expires` on a renewal,
    /// `address` when another agent serves it): patched, before the status.
    pub changed_keys: BTreeMap<&'static str, String>,
    pub requeue: Duration,
}

/// Decide, with `fresh` as the new credential's bytes if one must be made (the caller
/// draws them at random; tests give their own).
pub fn decide(input: &Inputs, fresh: [u8; 32]) -> Decision {
    let export = input.export;
    let generation = export.metadata.generation;
    let old = export.status.clone().unwrap_or_default();
    let now = Timestamp::try_from(input.now).unwrap_or(Timestamp::UNIX_EPOCH);
    // ttl counts from the last change of the spec, as first seen here.
    let renewed_at = match (&old.renewed_at, old.observed_generation) {
        (Some(t), g) if g == generation => t.0,
        _ => now,
    };
    let expires_at = expiry(export, renewed_at);
    let mut status = CopyExportStatus {
        observed_generation: generation,
        conditions: Vec::new(),
        renewed_at: Some(Time(renewed_at)),
        expires_at: expires_at.clone().ok().map(Time),
        secret_name: old.secret_name.clone(),
        address: old.address.clone(),
        node: old.node.clone(),
        // Kept while the export is not Ready (a renewal after a lapse, a source back after
        // a restore: the Secret the reader holds works again); the agents serve only a
        // Ready export before its expiry.
        credentials: current_credentials(&old.credentials, now),
    };
    let verdict = judge(input, now, expires_at);
    let (ok, reason, message) = match &verdict {
        Ok((expires, serving)) => (
            true,
            ExportReason::Ready,
            format!(
                "readable by {} until {expires} at {} (node {}); carry the Secret {} to the reading cluster, into the namespace of the job",
                readers(export),
                serving.address,
                serving.node,
                export_secret_name(&export.name_any())
            ),
        ),
        Err((reason, message)) => (false, *reason, message.clone()),
    };
    let mut secret = None;
    let mut changed_keys = BTreeMap::new();
    if let Ok((expires, serving)) = verdict {
        status.address = Some(serving.address.clone());
        status.node = Some(serving.node.clone());
        let rotation = export.spec.rotate;
        if status
            .credentials
            .iter()
            .any(|c| c.until.is_none() && c.rotation == rotation)
        {
            if old.expires_at.as_ref().map(|t| t.0) != Some(expires) {
                changed_keys.insert(EXPORT_EXPIRES_KEY, expires.to_string());
            }
            if old.address.as_deref() != Some(serving.address.as_str()) {
                changed_keys.insert(EXPORT_ADDRESS_KEY, serving.address.clone());
            }
        } else {
            let until = Some(Time(
                now + signed(input.peering.map_or(Duration::ZERO, |p| p.grace)),
            ));
            // The current one becomes the previous one; one previous at most (a second
            // rotation within the grace ends the first one's).
            let mut creds: Vec<ExportCredential> = status
                .credentials
                .iter()
                .filter(|c| c.until.is_none())
                .map(|c| ExportCredential {
                    until: until.clone(),
                    ..c.clone()
                })
                .collect();
            creds.insert(
                0,
                ExportCredential {
                    sha256: ferry_link::credential_hash(&fresh),
                    rotation,
                    until: None,
                },
            );
            status.credentials = creds;
            let name = export_secret_name(&export.name_any());
            status.secret_name = Some(name.clone());
            secret = Some(NewSecret {
                name,
                credential: fresh,
                expires: expires.to_string(),
                address: serving.address,
            });
        }
    }
    status.conditions = vec![crate::status::condition_of(
        EXPORT_READY,
        ok,
        reason.as_str(),
        &ferry_crds::shorten(&message, 1024),
        generation,
        &old.conditions,
    )];
    let requeue = deadlines(&status, now)
        .into_iter()
        .fold(if ok { RECHECK } else { NOT_READY_RECHECK }, Duration::min)
        .max(Duration::from_secs(1));
    Decision {
        status,
        secret,
        changed_keys,
        requeue,
    }
}

/// The status after the Secret of `decision` could not be written: not Ready, saying why,
/// and the credentials as they were (the new one exists nowhere).
pub fn not_written(export: &CopyExport, decision: &mut Decision, why: &str) {
    let old = export.status.clone().unwrap_or_default();
    decision.status.credentials = old.credentials;
    decision.status.secret_name = old.secret_name;
    decision.status.address = old.address;
    decision.status.node = old.node;
    decision.status.conditions = vec![crate::status::condition_of(
        EXPORT_READY,
        false,
        ExportReason::SecretNotWritten.as_str(),
        &ferry_crds::shorten(
            &format!(
                "the Secret {} could not be written: {why}. If a Secret of that name is not this export's, delete or rename it",
                export_secret_name(&export.name_any())
            ),
            1024,
        ),
        export.metadata.generation,
        &old.conditions,
    )];
    decision.secret = None;
    decision.changed_keys.clear();
}

/// Whether `status` says something the export's current status does not (so it is written).
pub fn changed(export: &CopyExport, status: &CopyExportStatus) -> bool {
    export.status.as_ref() != Some(status)
}

type Verdict = Result<(Timestamp, Serving), (ExportReason, String)>;

/// When the export ends, or why that cannot be said.
fn expiry(export: &CopyExport, renewed_at: Timestamp) -> Result<Timestamp, String> {
    if let Some(t) = &export.spec.expires {
        return Ok(t.0);
    }
    let ttl = export.spec.ttl.as_deref().unwrap_or_default();
    let d: SignedDuration = ttl
        .parse()
        .map_err(|e| format!("spec.ttl {ttl:?} is not a duration ({e}); write it as 24h or 90m"))?;
    renewed_at
        .checked_add(d)
        .map_err(|_| format!("spec.ttl {ttl:?} is too long"))
}

fn judge(input: &Inputs, now: Timestamp, expires_at: Result<Timestamp, String>) -> Verdict {
    let export = input.export;
    let Some(peering) = input.peering else {
        return Err((
            ExportReason::PeeringOff,
            "peering is off in this install (the chart's peering.enabled): no other cluster can read from it; ask the cluster's admin".into(),
        ));
    };
    let name = export.name_any();
    if name.len() > MAX_EXPORT_NAME {
        return Err((
            ExportReason::SecretNotWritten,
            format!("the export's name is {} characters long: its Secret's name (<name>-ferry-export) would be longer than 253; give it a name of at most {MAX_EXPORT_NAME}", name.len()),
        ));
    }
    let expires = expires_at.map_err(|why| (ExportReason::TooLong, why))?;
    let longest = signed(peering.max_ttl);
    let (field, from) = match export.spec.expires {
        Some(_) => ("expires", now),
        None => ("ttl", status_renewed(export).unwrap_or(now)),
    };
    if expires.duration_since(from) > longest {
        return Err((
            ExportReason::TooLong,
            format!(
                "spec.{field} reaches {expires}, more than this install's longest export ({}, the chart's peering.maxExportTtl) from {from}; ask less, and renew it (bump spec.renew) when it nears its end",
                human(peering.max_ttl)
            ),
        ));
    }
    if expires <= now {
        return Err((
            ExportReason::Expired,
            format!("the export ended at {expires}; set a later spec.expires, or bump spec.renew to count spec.ttl again from now"),
        ));
    }
    for r in &export.spec.readers {
        trusted(input, &r.peer, peering.install).map_err(|why| {
            (
                ExportReason::PeerNotTrusted,
                format!("reader {}/{}: {why}", r.peer, r.namespace),
            )
        })?;
    }
    input
        .source
        .clone()
        .map_err(|why| (ExportReason::SourceNotFound, why))?;
    let serving = input
        .serving
        .clone()
        .map_err(|why| (ExportReason::NoAddress, why))?;
    Ok((expires, serving))
}

/// When the spec last changed, as the status says (for a spec that did not change since).
fn status_renewed(export: &CopyExport) -> Option<Timestamp> {
    let s = export.status.as_ref()?;
    (s.observed_generation == export.metadata.generation)
        .then(|| s.renewed_at.as_ref().map(|t| t.0))
        .flatten()
}

/// Whether FerryPeer `name` lets this export's namespace export to it, or why not.
fn trusted(input: &Inputs, name: &str, own_install: &str) -> Result<(), String> {
    let Some(peer) = input.peers.iter().find(|p| p.name_any() == name) else {
        return Err(format!("no FerryPeer {name:?} in this cluster; name one `kubectl get ferrypeers` lists, or ask the admin to pair with the reading install"));
    };
    // Judged as the FerryPeer controller judges it, now (its status may be behind).
    let (status, _) = crate::peering::decide::judge(peer, input.peers, own_install, input.now);
    if let Some(c) = status
        .conditions
        .iter()
        .find(|c| c.type_ == PEER_VALID && c.status != "True")
    {
        return Err(format!(
            "FerryPeer {name:?} is not Valid ({}: {})",
            c.reason, c.message
        ));
    }
    if peer.spec.exports == PeerAccess::Deny {
        return Err(format!(
            "FerryPeer {name:?} says exports: Deny (this install's admin closed exports to it)"
        ));
    }
    if let Some(sel) = &peer.spec.namespaces {
        if !ferry_resolve::selector_matches(sel, input.namespace_labels) {
            return Err(format!("FerryPeer {name:?} does not admit this namespace (its spec.namespaces); ask the admin"));
        }
    }
    Ok(())
}

/// The credentials still good at `now`: the current ones, and previous ones in their grace.
fn current_credentials(creds: &[ExportCredential], now: Timestamp) -> Vec<ExportCredential> {
    creds
        .iter()
        .filter(|c| c.until.as_ref().is_none_or(|u| u.0 > now))
        .cloned()
        .collect()
}

/// The times after which the status changes with nothing else changing.
fn deadlines(status: &CopyExportStatus, now: Timestamp) -> Vec<Duration> {
    status
        .credentials
        .iter()
        .filter_map(|c| c.until.as_ref())
        .chain(status.expires_at.as_ref())
        .filter_map(|t| Duration::try_from(t.0.duration_since(now)).ok())
        .collect()
}

fn readers(export: &CopyExport) -> String {
    let names: Vec<String> = export
        .spec
        .readers
        .iter()
        .map(|r| format!("{}/{}", r.peer, r.namespace))
        .collect();
    names.join(", ")
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

fn human(d: Duration) -> String {
    crate::status::human_duration(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests;
