//! The signer of the agents' transfer certificates (signerName [`SIGNER_NAME`]), on the
//! leading replica: its CA, generated at start and held in memory only (a new leader makes
//! a new one); the CA's certificate published in the ConfigMap [`TRUST_CONFIGMAP`] beside
//! the CAs of earlier leaders until their certificates have expired ([`trust_data`]);
//! CertificateSigningRequests from the agents' ServiceAccount for the node its token is
//! bound to approved and issued, every other one denied with what was wrong ([`issue`]);
//! finished requests deleted after an hour.
//!
//! The decisions are pure functions over the objects (tested below without a cluster); `run`
//! does the I/O. Approval and the certificate are written with `update` (PUT) at the
//! resourceVersion that was decided on, so that a request changed meanwhile (approved or
//! denied by someone else, or issued by this signer a moment ago) is looked at again rather
//! than written over.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_link::{Ca, Trust};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::Error;

/// The signerName of the agents' transfer certificates.
pub const SIGNER_NAME: &str = "ferry.dev/transfer";
/// The signerName of the agents' peering certificates (chart `peering.enabled`), signed
/// with the install's peering CA and naming the install and the node.
pub const PEERING_SIGNER_NAME: &str = "ferry.dev/peering";
/// The ConfigMap, in the operator's namespace, whose `<unix seconds>.crt` keys are the CA
/// certificates agents trust.
pub const TRUST_CONFIGMAP: &str = "ferry-transfer-trust";
/// Where the API server records the node a node-bound ServiceAccount token belongs to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// A node certificate's longest life (an agent renews at two thirds of it).
pub const MAX_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest life granted, whatever `spec.expirationSeconds` asks (the API's minimum).
pub const MIN_VALIDITY: Duration = Duration::from_secs(10 * 60);
/// How long a CA stays in the bundle after a newer one joined it: longer than a node
/// certificate lives, so every certificate the old CA signed has expired by then.
pub const SUPERSEDED_KEPT: Duration = Duration::from_secs(48 * 60 * 60);
/// The most CAs the bundle holds (a bound on what a crash-looping leader can add).
pub const MAX_TRUST_KEYS: usize = 16;
/// The condition reasons this signer writes.
pub const APPROVED_REASON: &str = "FerryNodeVerified";
pub const REFUSED_REASON: &str = "FerryRefused";
/// Issued or denied requests older than this are deleted...
const CLEANUP_AGE: Duration = Duration::from_secs(60 * 60);
/// ...looked for this often.
const CLEANUP_EVERY: Duration = Duration::from_secs(10 * 60);
/// Between attempts to publish the CA.
const PUBLISH_RETRY: Duration = Duration::from_secs(5);
/// A condition message's longest length (messages quote the requester's names).
const MAX_MESSAGE: usize = 1024;

/// What a signer issues, and with which CA: the agents' transfer certificates (this
/// leader's in-memory CA, [`SIGNER_NAME`]), or their peering certificates (the install's
/// peering CA, [`PEERING_SIGNER_NAME`], naming the install too).
pub struct Issuer {
    /// The signerName it answers for; requests for any other are not its business.
    pub signer_name: &'static str,
    pub ca: Ca,
    /// For peering certificates: the install they name.
    pub install: Option<String>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("signer_name", &self.signer_name)
            .field("install", &self.install)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// The transfer certificates' issuer, with `ca`.
    pub fn transfer(ca: Ca) -> Self {
        Issuer {
            signer_name: SIGNER_NAME,
            ca,
            install: None,
        }
    }

    /// The peering certificates' issuer of `install`, with its peering CA.
    pub fn peering(ca: Ca, install: &str) -> Self {
        Issuer {
            signer_name: PEERING_SIGNER_NAME,
            ca,
            install: Some(install.to_owned()),
        }
    }

    /// The certificate for `node`'s CSR `pem`.
    fn sign(&self, pem: &str, node: &str, validity: Duration) -> ferry_link::Result<String> {
        match &self.install {
            None => self.ca.sign_node(pem, node, validity),
            Some(install) => self.ca.sign_peer(pem, install, node, validity),
        }
    }
}

/// What the signer needs for every request.
struct Signer {
    issuer: Issuer,
    requests: Api<CertificateSigningRequest>,
    /// The operator's namespace: the agents' ServiceAccount is in it.
    namespace: String,
    /// The agents' ServiceAccount name.
    agent_sa: String,
}

/// Sign the agents' transfer certificates until SIGTERM: generate this leader's CA, publish
/// its certificate in [`TRUST_CONFIGMAP`] in `namespace` (retrying until that succeeds: a
/// certificate from a CA that agents do not trust yet is no use), then decide every pending
/// request for [`SIGNER_NAME`] and delete old finished ones. `agent_sa` is the agents'
/// ServiceAccount, in `namespace`.
pub async fn run(client: Client, namespace: &str, agent_sa: &str) {
    let created = unix_seconds(SystemTime::now());
    // A name of its own (to the nanosecond): two CAs made in the same second by leaders
    // in quick succession must not share a subject, or a verifier looking for a
    // certificate's issuer by name finds the other one.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let ca = match Ca::generate(&format!("ferry transfer CA {nanos}")) {
        Ok(ca) => ca,
        Err(e) => {
            tracing::error!(
                error = %e,
                "cannot generate the transfer CA; no certificates are signed"
            );
            return;
        }
    };
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    tokio::select! {
        () = publish_until_done(&configmaps, ca.cert_pem(), created) => {}
        () = terminated() => return,
    }
    serve(client, namespace, agent_sa, Issuer::transfer(ca)).await;
}

/// Decide every pending request for `issuer`'s signerName until SIGTERM, and delete old
/// finished ones: for the transfer certificates ([`run`]) and the peering ones
/// (`crate::peering`) alike.
pub async fn serve(client: Client, namespace: &str, agent_sa: &str, issuer: Issuer) {
    let signer_name = issuer.signer_name;
    let signer = Arc::new(Signer {
        issuer,
        requests: Api::all(client),
        namespace: namespace.to_owned(),
        agent_sa: agent_sa.to_owned(),
    });
    let ours = watcher::Config::default().fields(&format!("spec.signerName={signer_name}"));
    let controller = Controller::new(signer.requests.clone(), ours);
    let store = controller.store();
    let requests = signer.requests.clone();
    let decide = controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, signer)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::warn!(error = %crate::error_chain(&e), "certificate request failed");
            }
        });
    // The controller ends on SIGTERM; the cleanup loop (which never ends) with it.
    tokio::select! {
        () = decide => {}
        () = cleanup_loop(&requests, &store, signer_name) => {}
    }
}

/// SIGTERM or SIGINT, as the controllers stop on (`shutdown_on_signal`).
async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn publish_until_done(configmaps: &Api<ConfigMap>, ca_pem: &str, created: u64) {
    loop {
        match publish(configmaps, ca_pem, created).await {
            Ok(bundle) => {
                tracing::info!(
                    configmap = TRUST_CONFIGMAP,
                    keys = ?bundle.data.keys().collect::<Vec<_>>(),
                    "published the transfer CA"
                );
                return;
            }
            // Someone else wrote it between our read and write: read again at once.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                tracing::warn!(
                    error = %crate::error_chain(&e),
                    configmap = TRUST_CONFIGMAP,
                    "cannot publish the transfer CA; retrying"
                );
                tokio::time::sleep(PUBLISH_RETRY).await;
            }
        }
    }
}

/// One read and one write of the trust ConfigMap (create, or update at the resourceVersion
/// read). Returns what it holds now.
async fn publish(
    configmaps: &Api<ConfigMap>,
    ca_pem: &str,
    created: u64,
) -> Result<Bundle, kube::Error> {
    let now = unix_seconds(SystemTime::now());
    let current = configmaps.get_opt(TRUST_CONFIGMAP).await?;
    let unset = BTreeMap::new();
    let existing = current
        .as_ref()
        .and_then(|cm| cm.data.as_ref())
        .unwrap_or(&unset);
    let bundle = trust_data(existing, ca_pem, created, now);
    for (key, why) in &bundle.dropped {
        tracing::info!(
            configmap = TRUST_CONFIGMAP,
            key,
            why,
            "dropped from the trust bundle"
        );
    }
    let params = PostParams {
        field_manager: Some(ferry_crds::OPERATOR_MANAGER.into()),
        ..Default::default()
    };
    match current {
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(TRUST_CONFIGMAP.into()),
                    ..Default::default()
                },
                data: Some(bundle.data.clone()),
                ..Default::default()
            };
            configmaps.create(&params, &cm).await?;
        }
        Some(mut cm) if cm.data.as_ref() != Some(&bundle.data) || cm.binary_data.is_some() => {
            // The resourceVersion read makes this a compare-and-swap.
            cm.data = Some(bundle.data.clone());
            cm.binary_data = None;
            configmaps.replace(TRUST_CONFIGMAP, &params, &cm).await?;
        }
        Some(_) => {}
    }
    Ok(bundle)
}

/// The trust ConfigMap's data once a CA joined it, and what was dropped on the way.
#[derive(Debug, PartialEq, Eq)]
pub struct Bundle {
    /// `<unix seconds>.crt` → one CA certificate, PEM.
    pub data: BTreeMap<String, String>,
    /// Each key dropped, and why.
    pub dropped: Vec<(String, &'static str)>,
}

/// `existing` (the ConfigMap's data) with the CA certificate `ca_pem`, created at unix
/// second `created`, added as of unix second `now`:
///
/// - keys that are not `<unix seconds>.crt` holding exactly one CA certificate are dropped;
/// - `ca_pem` keeps the key it already has, or gets `<created>.crt` (the next free second
///   if another CA took that one);
/// - a key is dropped once a newer key is itself older than [`SUPERSEDED_KEPT`]: every
///   certificate the superseded CA signed has expired by then, and agents have trusted the
///   newer CA for as long; the newest key is never dropped;
/// - beyond [`MAX_TRUST_KEYS`], the oldest other than `ca_pem`'s are dropped.
pub fn trust_data(
    existing: &BTreeMap<String, String>,
    ca_pem: &str,
    created: u64,
    now: u64,
) -> Bundle {
    let mut dropped = Vec::new();
    let mut cas: BTreeMap<u64, &str> = BTreeMap::new();
    for (key, pem) in existing {
        match (key_seconds(key), one_ca(pem)) {
            (Some(t), true) => {
                cas.insert(t, pem.as_str());
            }
            (None, _) => dropped.push((key.clone(), "not a <unix seconds>.crt key")),
            (Some(_), false) => dropped.push((key.clone(), "not exactly one CA certificate")),
        }
    }
    let own = match cas.iter().find(|(_, pem)| **pem == ca_pem) {
        Some((t, _)) => *t,
        None => {
            let mut t = created;
            while cas.contains_key(&t) {
                t += 1;
            }
            cas.insert(t, ca_pem);
            t
        }
    };
    let cutoff = now.saturating_sub(SUPERSEDED_KEPT.as_secs());
    // The newest key that is older than the cutoff: every key before it is superseded by
    // it for long enough.
    if let Some(&keep_from) = cas.keys().rev().find(|t| **t < cutoff) {
        let superseded: Vec<u64> = cas.range(..keep_from).map(|(t, _)| *t).collect();
        for t in superseded {
            cas.remove(&t);
            dropped.push((key_of(t), "superseded more than 48 hours ago"));
        }
    }
    while cas.len() > MAX_TRUST_KEYS {
        let Some(&oldest) = cas.keys().find(|t| **t != own) else {
            break;
        };
        cas.remove(&oldest);
        dropped.push((key_of(oldest), "more than 16 CAs"));
    }
    Bundle {
        data: cas
            .into_iter()
            .map(|(t, pem)| (key_of(t), pem.to_owned()))
            .collect(),
        dropped,
    }
}

fn key_of(t: u64) -> String {
    format!("{t}.crt")
}

/// The unix seconds a `<seconds>.crt` key names.
fn key_seconds(key: &str) -> Option<u64> {
    let digits = key.strip_suffix(".crt")?;
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `pem` is exactly one CA certificate (what an agent's trust bundle takes).
fn one_ca(pem: &str) -> bool {
    Trust::from_pem(pem).is_ok_and(|t| t.len() == 1)
}

/// The node a request may have a certificate for, or why it may have none: it must come from
/// the agents' ServiceAccount `agent_sa` in `namespace`, with a token bound to one node (the
/// API server records that node in `spec.extra`).
pub fn check(
    csr: &CertificateSigningRequest,
    namespace: &str,
    agent_sa: &str,
) -> Result<String, String> {
    check_for(csr, SIGNER_NAME, namespace, agent_sa)
}

/// [`check`] for the signer of `signer_name`.
pub fn check_for(
    csr: &CertificateSigningRequest,
    signer_name: &str,
    namespace: &str,
    agent_sa: &str,
) -> Result<String, String> {
    let spec = &csr.spec;
    if spec.signer_name != signer_name {
        return Err(format!(
            "this signer signs only signerName {signer_name}, not {:?}",
            spec.signer_name
        ));
    }
    let agent = format!("system:serviceaccount:{namespace}:{agent_sa}");
    let user = spec.username.as_deref().unwrap_or_default();
    if user != agent {
        return Err(format!(
            "the request was made by {user:?}, and {signer_name} certificates are issued only \
             to the Ferry agents' ServiceAccount {agent}; create the request with the token of \
             the agent's pod"
        ));
    }
    let nodes = spec
        .extra
        .as_ref()
        .and_then(|extra| extra.get(NODE_NAME_EXTRA))
        .map_or(&[][..], Vec::as_slice);
    match nodes {
        [node] => Ok(node.clone()),
        [] => Err(format!(
            "the requester's token is bound to no node (spec.extra has no {NODE_NAME_EXTRA}); \
             create the request with the token of the agent's pod, which is bound to its node"
        )),
        many => Err(format!(
            "the requester's token names {} nodes ({}), where one is expected; create the \
             request with the token of the agent's pod",
            many.len(),
            many.join(", ")
        )),
    }
}

/// How long a certificate for this request lives: `spec.expirationSeconds` within
/// [`MIN_VALIDITY`] and [`MAX_VALIDITY`], and the longest when it is not set.
pub fn validity(expiration_seconds: Option<i32>) -> Duration {
    expiration_seconds.map_or(MAX_VALIDITY, |s| {
        Duration::from_secs(u64::try_from(s).unwrap_or(0)).clamp(MIN_VALIDITY, MAX_VALIDITY)
    })
}

/// A certificate for a node.
#[derive(Debug)]
pub struct Issued {
    pub node: String,
    /// The certificate, PEM.
    pub cert_pem: String,
}

/// The certificate `ca` issues for `csr`, or why none: [`check`], then [`Ca::sign_node`],
/// which refuses a CSR that names anything but that one node.
pub fn issue(
    ca: &Ca,
    csr: &CertificateSigningRequest,
    namespace: &str,
    agent_sa: &str,
) -> Result<Issued, String> {
    let node = check(csr, namespace, agent_sa)?;
    signed(csr, &node, |pem, validity| {
        ca.sign_node(pem, &node, validity)
    })
}

/// The certificate `issuer` issues for `csr`, or why none: [`check_for`] its signerName,
/// then its CA signs, refusing a CSR that names anything but that one node.
pub fn issue_with(
    issuer: &Issuer,
    csr: &CertificateSigningRequest,
    namespace: &str,
    agent_sa: &str,
) -> Result<Issued, String> {
    let node = check_for(csr, issuer.signer_name, namespace, agent_sa)?;
    signed(csr, &node, |pem, validity| {
        issuer.sign(pem, &node, validity)
    })
}

/// `csr`'s request signed by `sign` for `node`, which its requester's token is bound to.
fn signed(
    csr: &CertificateSigningRequest,
    node: &str,
    sign: impl Fn(&str, Duration) -> ferry_link::Result<String>,
) -> Result<Issued, String> {
    let node = node.to_owned();
    let pem = std::str::from_utf8(&csr.spec.request.0).map_err(|_| {
        "spec.request is not PEM text; put the PEM of the CSR in spec.request (base64 on the wire)"
            .to_string()
    })?;
    let cert_pem = sign(pem, validity(csr.spec.expiration_seconds))
        .map_err(|e| format!("the requester's token is bound to node {node}, and {e}"))?;
    Ok(Issued { node, cert_pem })
}

/// Where a request stands for this signer.
#[derive(Debug, PartialEq, Eq)]
enum Stage {
    /// Neither approved nor denied: to decide.
    New,
    /// Approved by this signer, with no certificate yet (a leader stopped between the two
    /// writes): to issue.
    ApprovedUnissued,
    /// Approved by someone else: not signed (this signer decides by its own checks).
    ApprovedElsewhere,
    /// Issued, denied or failed.
    Done,
}

fn condition<'a>(
    csr: &'a CertificateSigningRequest,
    type_: &str,
) -> Option<&'a CertificateSigningRequestCondition> {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_ && c.status == "True"))
}

fn issued(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

fn stage(csr: &CertificateSigningRequest) -> Stage {
    if issued(csr) || condition(csr, "Denied").is_some() || condition(csr, "Failed").is_some() {
        return Stage::Done;
    }
    match condition(csr, "Approved") {
        None => Stage::New,
        Some(c) if c.reason.as_deref() == Some(APPROVED_REASON) => Stage::ApprovedUnissued,
        Some(_) => Stage::ApprovedElsewhere,
    }
}

/// Whether the hourly cleanup deletes `csr` at `now`: this signer's, issued or denied, and
/// created more than [`CLEANUP_AGE`] ago.
fn expired(csr: &CertificateSigningRequest, now: Timestamp, signer_name: &str) -> bool {
    let old = csr.creation_timestamp().is_some_and(|t| {
        now.as_second() - t.0.as_second() > i64::try_from(CLEANUP_AGE.as_secs()).unwrap_or(0)
    });
    csr.spec.signer_name == signer_name
        && old
        && (issued(csr) || condition(csr, "Denied").is_some())
}

fn new_condition(type_: &str, reason: &str, message: &str) -> CertificateSigningRequestCondition {
    CertificateSigningRequestCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(ferry_crds::shorten(message, MAX_MESSAGE)),
        // The API server sets both times.
        last_update_time: None,
        last_transition_time: None,
    }
}

fn with_condition(
    csr: &CertificateSigningRequest,
    condition: CertificateSigningRequestCondition,
) -> CertificateSigningRequest {
    let mut csr = csr.clone();
    csr.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(condition);
    csr
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, s: Arc<Signer>) -> Result<Action, Error> {
    let name = csr.name_any();
    let params = PostParams::default();
    let written = match stage(&csr) {
        Stage::Done => return Ok(Action::await_change()),
        Stage::ApprovedElsewhere => {
            tracing::info!(csr = %name, "approved by someone else; this signer does not sign it");
            return Ok(Action::await_change());
        }
        Stage::New => match issue_with(&s.issuer, &csr, &s.namespace, &s.agent_sa) {
            Ok(cert) => {
                let message = format!(
                    "requested by the Ferry agents' ServiceAccount with a token bound to node \
                     {}, for that node",
                    cert.node
                );
                let approved =
                    with_condition(&csr, new_condition("Approved", APPROVED_REASON, &message));
                match s
                    .requests
                    .replace_subresource("approval", &name, &params, &approved)
                    .await
                {
                    Ok(approved) => write_certificate(&s, &name, approved, cert).await,
                    Err(e) => Err(e),
                }
            }
            Err(why) => {
                let user = csr.spec.username.as_deref().unwrap_or_default();
                tracing::info!(csr = %name, user, why, "denied");
                let denied = with_condition(&csr, new_condition("Denied", REFUSED_REASON, &why));
                s.requests
                    .replace_subresource("approval", &name, &params, &denied)
                    .await
                    .map(drop)
            }
        },
        Stage::ApprovedUnissued => match issue_with(&s.issuer, &csr, &s.namespace, &s.agent_sa) {
            Ok(cert) => write_certificate(&s, &name, (*csr).clone(), cert).await,
            // Not expected (it was approved by the same checks), but said where users look.
            Err(why) => {
                let failed = with_condition(&csr, new_condition("Failed", REFUSED_REASON, &why));
                s.requests
                    .replace_status(&name, &params, &failed)
                    .await
                    .map(drop)
            }
        },
    };
    match written {
        Ok(()) => Ok(Action::await_change()),
        // Changed since it was read (our own earlier write, or someone else's): the watch
        // brings the new version; look again then.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Action::requeue(Duration::from_secs(1))),
        Err(e) => Err(e.into()),
    }
}

/// Write `cert` into the status of `approved` (the approval just written, or found).
async fn write_certificate(
    s: &Signer,
    name: &str,
    mut approved: CertificateSigningRequest,
    cert: Issued,
) -> Result<(), kube::Error> {
    approved
        .status
        .get_or_insert_with(Default::default)
        .certificate = Some(ByteString(cert.cert_pem.into_bytes()));
    s.requests
        .replace_status(name, &PostParams::default(), &approved)
        .await?;
    tracing::info!(csr = %name, node = cert.node, signer = s.issuer.signer_name, "issued a certificate");
    Ok(())
}

fn error_policy(_csr: Arc<CertificateSigningRequest>, error: &Error, _s: Arc<Signer>) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "certificate request: requeueing");
    Action::requeue(Duration::from_secs(5))
}

/// Every [`CLEANUP_EVERY`], delete the requests of the controller's cache that [`expired`].
async fn cleanup_loop(
    requests: &Api<CertificateSigningRequest>,
    store: &Store<CertificateSigningRequest>,
    signer_name: &str,
) {
    loop {
        tokio::time::sleep(CLEANUP_EVERY).await;
        let now = Timestamp::now();
        for csr in store
            .state()
            .iter()
            .filter(|c| expired(c, now, signer_name))
        {
            let name = csr.name_any();
            // The uid: never a request made since under the same name.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: csr.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match requests.delete(&name, &params).await {
                Ok(_) => tracing::info!(csr = %name, "deleted a finished certificate request"),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(
                        csr = %name,
                        error = %crate::error_chain(&e),
                        "cannot delete a finished certificate request"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
