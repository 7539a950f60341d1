//! What the operator says of a FerryPeer, decided without a cluster: whether its bundle is
//! one the agents can trust (the rules of `ferry_link::Trust`, the same ones the peering
//! port will apply), each certificate's fingerprint and expiry, and whether another, older
//! FerryPeer already names the same install or holds one of its CA certificates. Also what
//! this install publishes for the admins of its peers ([`published`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use ferry_crds::{
    FerryPeer, FerryPeerStatus, PeerCertificate, PeerReason, PEERING_CA_KEY,
    PEERING_FINGERPRINT_KEY, PEERING_INSTALL_KEY, PEERING_PEER_KEY, PEER_VALID,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// Most certificates a status lists (a bundle holds one, two during a rotation).
pub const MAX_LISTED: usize = 16;
/// The longest a valid peer waits before it is looked at again: a certificate expiring
/// is noticed within this, whatever else happens.
pub const RECHECK: Duration = Duration::from_secs(60 * 60);

/// The status `peer` should have, given every FerryPeer (`all`, itself among them), this
/// install's own name and the time. With the wait before it must be looked at again (the
/// earliest expiry, at most [`RECHECK`]).
pub fn judge(
    peer: &FerryPeer,
    all: &[&FerryPeer],
    own_install: &str,
    now: SystemTime,
) -> (FerryPeerStatus, Duration) {
    let generation = peer.metadata.generation;
    let previous = peer
        .status
        .as_ref()
        .map_or(&[][..], |s| s.conditions.as_slice());
    let (certificates, verdict) = bundle(&peer.spec.ca_bundle, now);
    let verdict = verdict.and_then(|()| {
        if peer.spec.install == own_install {
            return Err((
                PeerReason::OwnInstall,
                format!(
                    "install {own_install:?} is this install's own name; a FerryPeer names another install"
                ),
            ));
        }
        if let Some(first) = older(peer, all, |p| p.spec.install == peer.spec.install) {
            return Err((
                PeerReason::DuplicatePeer,
                format!(
                    "FerryPeer {first} already names install {:?}; delete one of the two",
                    peer.spec.install
                ),
            ));
        }
        // A client is held to the CAs of the install it names, which means nothing if the
        // CA of one install can sign for another (ferry_link::PeerSet refuses the pair).
        // Each other bundle as its spec says it now (a status may be behind); fingerprints
        // only, none of the trust checks, which that peer's own status reports.
        let ours: Vec<&str> = certificates.iter().map(|c| c.fingerprint.as_str()).collect();
        let shares = |p: &FerryPeer| {
            ferry_link::describe_bundle(&p.spec.ca_bundle)
                .is_ok_and(|theirs| theirs.iter().any(|c| ours.contains(&c.fingerprint.as_str())))
        };
        match older(peer, all, shares) {
            Some(first) => Err((
                PeerReason::DuplicatePeer,
                format!(
                    "FerryPeer {first} holds a CA certificate of this bundle too: one install's CA would vouch for the other; give each install its own peering CA, or delete one of the two"
                ),
            )),
            None => Ok(()),
        }
    });
    let (ok, reason, message) = match verdict {
        Ok(()) => (
            true,
            PeerReason::Valid,
            format!(
                "{} CA certificate(s) of install {:?} trusted; compare each fingerprint with what the peer's ferry-peering ConfigMap says",
                certificates.len(),
                peer.spec.install
            ),
        ),
        Err((reason, message)) => (false, reason, message),
    };
    let requeue = certificates
        .iter()
        .filter_map(|c| SystemTime::from(c.not_after.0).duration_since(now).ok())
        .fold(RECHECK, Duration::min);
    let status = FerryPeerStatus {
        observed_generation: generation,
        conditions: vec![valid_condition(ok, reason, &message, generation, previous)],
        certificates,
    };
    (status, requeue)
}

fn valid_condition(
    ok: bool,
    reason: PeerReason,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
) -> Condition {
    crate::status::condition_of(
        PEER_VALID,
        ok,
        reason.as_str(),
        &ferry_crds::shorten(message, 1024),
        generation,
        previous,
    )
}

type Verdict = Result<(), (PeerReason, String)>;

/// A bundle's certificates as the status lists them, and whether agents can trust it.
fn bundle(pem: &str, now: SystemTime) -> (Vec<PeerCertificate>, Verdict) {
    let invalid = |why: String| {
        (
            PeerReason::InvalidBundle,
            format!("caBundle: {why}; put the peer's peering CA certificate (the ca.crt key of its ferry-peering ConfigMap) in it"),
        )
    };
    let summaries = match ferry_link::describe_bundle(pem) {
        Ok(s) => s,
        Err(e) => return (Vec::new(), Err(invalid(e.to_string()))),
    };
    let certificates: Vec<PeerCertificate> = summaries
        .iter()
        .take(MAX_LISTED)
        .map(|s| PeerCertificate {
            fingerprint: s.fingerprint.clone(),
            subject: ferry_crds::shorten(&s.subject, 256),
            not_after: Time(Timestamp::try_from(s.not_after).unwrap_or(Timestamp::UNIX_EPOCH)),
        })
        .collect();
    if summaries.len() > MAX_LISTED {
        return (
            certificates,
            Err(invalid(format!(
                "it holds {} certificates, more than {MAX_LISTED}",
                summaries.len()
            ))),
        );
    }
    // The agents' own rules: a CA, and nothing else.
    if let Err(e) = ferry_link::Trust::from_pem(pem) {
        return (certificates, Err(invalid(e.to_string())));
    }
    if let Some(expired) = summaries.iter().find(|s| s.not_after <= now) {
        return (
            certificates,
            Err((
                PeerReason::Expired,
                format!(
                    "the certificate {} ({}) expired; put the peer's current peering CA certificate in caBundle",
                    expired.fingerprint,
                    ferry_crds::shorten(&expired.subject, 256)
                ),
            )),
        );
    }
    (certificates, Ok(()))
}

/// The FerryPeer among `all` that `matches` (as `peer` must) and came first (created
/// earlier, then by name), if it is not `peer`: the first keeps its place, later ones are
/// refused.
fn older(
    peer: &FerryPeer,
    all: &[&FerryPeer],
    matches: impl Fn(&FerryPeer) -> bool,
) -> Option<String> {
    let key = |p: &FerryPeer| (p.creation_timestamp().map(|t| t.0), p.name_any());
    all.iter()
        .filter(|p| key(p) == key(peer) || matches(p))
        .min_by_key(|p| key(p))
        .filter(|first| key(first) != key(peer))
        .map(|first| first.name_any())
}

/// Whether `status` says something `peer`'s current status does not (so it is written).
pub fn changed(peer: &FerryPeer, status: &FerryPeerStatus) -> bool {
    peer.status.as_ref() != Some(status)
}

/// What this install publishes for the admins of its peers, in the ConfigMap
/// `ferry-peering`: its install name, its peering CA certificate, that certificate's
/// fingerprint, and a FerryPeer the other side can apply as it is.
pub fn published(install: &str, ca_pem: &str) -> Result<BTreeMap<String, String>, String> {
    let summary = ferry_link::describe_bundle(ca_pem)
        .map_err(|e| format!("the peering CA certificate: {e}"))?;
    let fingerprints: Vec<&str> = summary.iter().map(|s| s.fingerprint.as_str()).collect();
    let peer = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "FerryPeer",
        "metadata": {"name": install},
        "spec": {"install": install, "caBundle": ca_pem},
    });
    let peer = serde_yaml::to_string(&peer).map_err(|e| e.to_string())?;
    Ok(BTreeMap::from([
        (PEERING_INSTALL_KEY.to_string(), install.to_string()),
        (PEERING_CA_KEY.to_string(), ca_pem.to_string()),
        (PEERING_FINGERPRINT_KEY.to_string(), fingerprints.join("\n")),
        (PEERING_PEER_KEY.to_string(), peer),
    ]))
}

/// An install name made once for an install whose admin gave none: its namespace (cut to
/// 40 bytes, as a DNS label) and 8 random hex digits, so that two installs in namespaces of
/// the same name differ.
pub fn new_install_name(namespace: &str, random: [u8; 4]) -> String {
    let mut base: String = namespace
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
        .take(40)
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    let base = base.trim_start_matches('-');
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    if base.is_empty() {
        format!("ferry-{suffix}")
    } else {
        format!("{base}-{suffix}")
    }
}

#[cfg(test)]
pub(crate) mod tests;
