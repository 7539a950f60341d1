//! Reading another install's export, the reading operator's part: a CopyJob whose source is
//! `{export: <Secret>}` has its Secret read by the operator on the job's behalf (the agents
//! read no tenant's Secret), checked ([`judge`]: an export Secret's shape, each key bounded,
//! its CA one a FerryPeer of this cluster holds for that install with `imports: Allow` and
//! this namespace), and what the receiver needs is copied into the job's ticket. The
//! content never reaches the job's status.
//!
//! The operator has no grant on tenants' Secrets: a namespace lets it read its export
//! Secret with a Role of its own (the refusal gives the two commands), so no operator token
//! can read every Secret of the cluster.

use std::collections::BTreeMap;
use std::time::SystemTime;

use ferry_crds::{
    ConditionType, ExportTicket, FerryPeer, PeerAccess, Reason, EXPORT_ADDRESS_KEY, EXPORT_CA_KEY,
    EXPORT_CREDENTIAL_KEY, EXPORT_INSTALL_KEY, EXPORT_SECRET_TYPE, EXPORT_UID_KEY, PEER_VALID,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::resolve::Blocked;

/// The longest value of an export Secret's keys but the CA (a uid, an address, a name).
const MAX_VALUE: usize = 256;

/// The export Secret `name` of namespace `ns`, read and judged; `Ok(Err)`: why the job
/// cannot read it, for its condition.
pub async fn read(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Result<ExportTicket, Blocked>, kube::Error> {
    if !std::env::var(crate::peering::ENABLED_ENV).is_ok_and(|v| v == "true") {
        return Ok(Err(untrusted(
            "peering is off in this install (the chart's peering.enabled): a job here cannot read another cluster's export; ask the cluster's admin".into(),
        )));
    }
    let secret = match Api::<Secret>::namespaced(client.clone(), ns).get(name).await {
        Ok(s) => s,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Ok(Err(not_found(format!(
                "spec.source.export: no Secret {name:?} in namespace {ns:?}; carry the export's Secret from the source cluster (kubectl get secret <export>-ferry-export -o yaml there) into this namespace"
            ))))
        }
        Err(kube::Error::Api(e)) if e.code == 403 => {
            let who = operator_account(&e.message);
            return Ok(Err(not_found(format!(
                "spec.source.export: the Ferry operator may not read Secret {name:?} in namespace {ns:?} (nor tell whether it is there); carry the export's Secret from the source cluster into this namespace, and let the operator read that one Secret: \
                 kubectl -n {ns} create role ferry-reads-{name} --verb=get --resource=secrets --resource-name={name} && \
                 kubectl -n {ns} create rolebinding ferry-reads-{name} --role=ferry-reads-{name} --serviceaccount={who}"
            ))));
        }
        Err(e) => return Err(e),
    };
    let peers = Api::<FerryPeer>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let labels = Api::<Namespace>::all(client.clone())
        .get_opt(ns)
        .await?
        .map(|n| n.labels().clone())
        .unwrap_or_default();
    let peers: Vec<&FerryPeer> = peers.iter().collect();
    Ok(judge(name, &secret, &peers, &labels, SystemTime::now()))
}

/// `<namespace>:<name>` of the operator's ServiceAccount, from the API server's refusal
/// (`User "system:serviceaccount:<namespace>:<name>" cannot ...`).
fn operator_account(message: &str) -> String {
    message
        .split("system:serviceaccount:")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .filter(|who| who.contains(':') && who.len() < 320)
        .unwrap_or("<release namespace>:<operator service account>")
        .to_string()
}

fn not_found(message: String) -> Blocked {
    Blocked {
        condition: ConditionType::Resolved,
        reason: Reason::ExportNotFound,
        message,
    }
}

fn untrusted(message: String) -> Blocked {
    Blocked {
        condition: ConditionType::Resolved,
        reason: Reason::PeerNotTrusted,
        message,
    }
}

/// Secret `name` as an export Secret a job of a namespace labelled `labels` may read, given
/// the FerryPeers of this cluster: the receiver's part of it, or why not.
pub fn judge(
    name: &str,
    secret: &Secret,
    peers: &[&FerryPeer],
    labels: &BTreeMap<String, String>,
    now: SystemTime,
) -> Result<ExportTicket, Blocked> {
    let bad = |why: String| {
        not_found(format!(
            "spec.source.export: Secret {name:?} {why}; give the Secret the source cluster's CopyExport wrote, as it is"
        ))
    };
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    if kind != EXPORT_SECRET_TYPE {
        return Err(bad(format!(
            "is of type {kind:?}, not {EXPORT_SECRET_TYPE}"
        )));
    }
    let data = secret.data.clone().unwrap_or_default();
    let raw = |key: &str, max: usize| -> Result<Vec<u8>, Blocked> {
        let v = data
            .get(key)
            .ok_or_else(|| bad(format!("has no key {key}")))?;
        if v.0.is_empty() || v.0.len() > max {
            return Err(bad(format!(
                "key {key} is {} bytes, not 1 to {max}",
                v.0.len()
            )));
        }
        Ok(v.0.clone())
    };
    let text = |key: &str, max: usize| -> Result<String, Blocked> {
        String::from_utf8(raw(key, max)?).map_err(|_| bad(format!("key {key} is not text")))
    };
    let credential: [u8; 32] = raw(EXPORT_CREDENTIAL_KEY, 32)?
        .try_into()
        .map_err(|_| bad(format!("key {EXPORT_CREDENTIAL_KEY} is not 32 bytes")))?;
    let install = text(EXPORT_INSTALL_KEY, 63)?;
    ferry_link::validate_install_name(&install)
        .map_err(|e| bad(format!("key {EXPORT_INSTALL_KEY}: {e}")))?;
    let export = text(EXPORT_UID_KEY, 128)?;
    if !export
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(bad(format!("key {EXPORT_UID_KEY} is not a uid")));
    }
    let address = text(EXPORT_ADDRESS_KEY, MAX_VALUE)?;
    if address.parse::<std::net::SocketAddr>().is_err() {
        return Err(bad(format!(
            "key {EXPORT_ADDRESS_KEY} {address:?} is not an address:port"
        )));
    }
    let ca = text(EXPORT_CA_KEY, ferry_crds::MAX_PEER_BUNDLE)?;
    let theirs =
        ferry_link::describe_bundle(&ca).map_err(|e| bad(format!("key {EXPORT_CA_KEY}: {e}")))?;
    if theirs.is_empty() {
        return Err(bad(format!("key {EXPORT_CA_KEY} holds no certificate")));
    }
    // The CA must be one this cluster's admin trusts for that install: a tenant cannot
    // bring its own trust anchor in a Secret.
    let fingerprints: Vec<&str> = theirs.iter().map(|c| c.fingerprint.as_str()).collect();
    // The oldest FerryPeer naming the install is the one that counts (a later one is a
    // DuplicatePeer), as the agents and the FerryPeer controller have it.
    let Some(peer) = peers
        .iter()
        .filter(|p| p.spec.install == install)
        .min_by_key(|p| (p.creation_timestamp().map(|t| t.0), p.name_any()))
    else {
        return Err(untrusted(format!(
            "the export is of install {install:?} (CA {}), which no FerryPeer of this cluster names; ask the admin to pair with it",
            fingerprints.join(", ")
        )));
    };
    let peer_name = peer.name_any();
    let (status, _) = crate::peering::decide::judge(peer, peers, "", now);
    if let Some(c) = status
        .conditions
        .iter()
        .find(|c| c.type_ == PEER_VALID && c.status != "True")
    {
        return Err(untrusted(format!(
            "FerryPeer {peer_name:?} of install {install:?} is not Valid ({}: {})",
            c.reason, c.message
        )));
    }
    if peer.spec.imports == PeerAccess::Deny {
        return Err(untrusted(format!(
            "FerryPeer {peer_name:?} says imports: Deny (this cluster's admin closed reads from install {install:?})"
        )));
    }
    if let Some(sel) = &peer.spec.namespaces {
        if !ferry_resolve::selector_matches(sel, labels) {
            return Err(untrusted(format!(
                "FerryPeer {peer_name:?} does not admit this namespace (its spec.namespaces); ask the admin"
            )));
        }
    }
    let ours: Vec<String> = ferry_link::describe_bundle(&peer.spec.ca_bundle)
        .map(|b| b.into_iter().map(|c| c.fingerprint).collect())
        .unwrap_or_default();
    if let Some(stranger) = fingerprints.iter().find(|f| !ours.iter().any(|o| o == *f)) {
        return Err(untrusted(format!(
            "the export's CA {stranger} is not in FerryPeer {peer_name:?}'s caBundle for install {install:?}; compare fingerprints with the source's admin"
        )));
    }
    Ok(ExportTicket {
        address,
        install,
        ca,
        export,
        credential: ferry_crds::hex32(&credential),
    })
}

#[cfg(test)]
mod tests;
