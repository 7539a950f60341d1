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

/// What the signer needs for every request.
struct Signer {
    ca: Ca,
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
    let signer = Arc::new(Signer {
        ca,
        requests: Api::all(client),
        namespace: namespace.to_owned(),
        agent_sa: agent_sa.to_owned(),
    });
    let ours = watcher::Config::default().fields(&format!("spec.signerName={SIGNER_NAME}"));
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
        () = cleanup_loop(&requests, &store) => {}
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
    let spec = &csr.spec;
    if spec.signer_name != SIGNER_NAME {
        return Err(format!(
            "this signer signs only signerName {SIGNER_NAME}, not {:?}",
            spec.signer_name
        ));
    }
    let agent = format!("system:serviceaccount:{namespace}:{agent_sa}");
    let user = spec.username.as_deref().unwrap_or_default();
    if user != agent {
        return Err(format!(
            "the request was made by {user:?}, and {SIGNER_NAME} certificates are issued only \
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
    let pem = std::str::from_utf8(&csr.spec.request.0).map_err(|_| {
        "spec.request is not PEM text; put the PEM of the CSR in spec.request (base64 on the wire)"
            .to_string()
    })?;
    let cert_pem = ca
        .sign_node(pem, &node, validity(csr.spec.expiration_seconds))
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
fn expired(csr: &CertificateSigningRequest, now: Timestamp) -> bool {
    let old = csr.creation_timestamp().is_some_and(|t| {
        now.as_second() - t.0.as_second() > i64::try_from(CLEANUP_AGE.as_secs()).unwrap_or(0)
    });
    csr.spec.signer_name == SIGNER_NAME
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
        Stage::New => match issue(&s.ca, &csr, &s.namespace, &s.agent_sa) {
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
        Stage::ApprovedUnissued => match issue(&s.ca, &csr, &s.namespace, &s.agent_sa) {
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
    tracing::info!(csr = %name, node = cert.node, "issued a transfer certificate");
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
) {
    loop {
        tokio::time::sleep(CLEANUP_EVERY).await;
        let now = Timestamp::now();
        for csr in store.state().iter().filter(|c| expired(c, now)) {
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
mod tests {
    use super::*;
    use ferry_link::NodeKey;

    const NS: &str = "ferry-system";
    const SA: &str = "ferry-agent";
    const AGENT: &str = "system:serviceaccount:ferry-system:ferry-agent";

    fn request(user: &str, nodes: &[&str], csr_for: &str) -> CertificateSigningRequest {
        let key = NodeKey::generate(csr_for).expect("key");
        let mut csr = CertificateSigningRequest::default();
        csr.metadata.name = Some("req".into());
        csr.spec.signer_name = SIGNER_NAME.into();
        csr.spec.request = ByteString(key.csr_pem.into_bytes());
        csr.spec.username = Some(user.into());
        if !nodes.is_empty() {
            csr.spec.extra = Some(BTreeMap::from([(
                NODE_NAME_EXTRA.to_string(),
                nodes.iter().map(|n| (*n).to_string()).collect(),
            )]));
        }
        csr
    }

    fn ca() -> Ca {
        Ca::generate("test CA").expect("CA")
    }

    #[test]
    fn the_agents_service_account_gets_a_certificate_for_the_node_its_token_is_bound_to() {
        let csr = request(AGENT, &["node-a"], "node-a");
        assert_eq!(check(&csr, NS, SA), Ok("node-a".to_string()));
        let issued = issue(&ca(), &csr, NS, SA).expect("issued");
        assert_eq!(issued.node, "node-a");
        assert_eq!(
            ferry_link::node_of_pem(&issued.cert_pem).expect("node"),
            "node-a"
        );
    }

    #[test]
    fn another_service_account_is_refused_even_with_a_node_bound_token() {
        for user in [
            "system:serviceaccount:ferry-system:ferry-operator",
            "system:serviceaccount:team-a:ferry-agent",
            "system:serviceaccount:ferry-system:ferry-agent-x",
        ] {
            let why = check(&request(user, &["node-a"], "node-a"), NS, SA).expect_err(user);
            assert!(why.contains(user) && why.contains(AGENT), "{why}");
        }
    }

    #[test]
    fn the_admin_is_refused() {
        let why = check(&request("ferry-admin", &[], "node-a"), NS, SA).expect_err("admin");
        assert!(
            why.contains("\"ferry-admin\"") && why.contains(AGENT),
            "{why}"
        );
        let why =
            check(&request("kubernetes-admin", &["node-a"], "node-a"), NS, SA).expect_err("admin");
        assert!(why.contains("kubernetes-admin"), "{why}");
    }

    #[test]
    fn a_token_bound_to_no_node_is_refused() {
        let why = check(&request(AGENT, &[], "node-a"), NS, SA).expect_err("no node");
        assert!(why.contains(NODE_NAME_EXTRA), "{why}");
        let mut csr = request(AGENT, &[], "node-a");
        csr.spec.extra = Some(BTreeMap::from([(
            "authentication.kubernetes.io/credential-id".to_string(),
            vec!["JTI=x".to_string()],
        )]));
        assert!(check(&csr, NS, SA).is_err());
    }

    #[test]
    fn a_token_naming_two_nodes_is_refused() {
        let why = check(&request(AGENT, &["node-a", "node-b"], "node-a"), NS, SA).expect_err("two");
        assert!(why.contains("2 nodes (node-a, node-b)"), "{why}");
    }

    #[test]
    fn a_csr_for_another_node_than_the_tokens_is_refused_naming_both() {
        let csr = request(AGENT, &["node-a"], "node-b");
        assert_eq!(check(&csr, NS, SA), Ok("node-a".to_string()));
        let why = issue(&ca(), &csr, NS, SA).expect_err("another node");
        assert!(
            why.contains("bound to node node-a") && why.contains("spiffe://ferry.dev/node/node-b"),
            "{why}"
        );
    }

    #[test]
    fn another_signers_request_and_a_request_that_is_not_pem_are_refused() {
        let mut csr = request(AGENT, &["node-a"], "node-a");
        csr.spec.signer_name = "kubernetes.io/kube-apiserver-client".into();
        assert!(check(&csr, NS, SA).is_err());
        let mut csr = request(AGENT, &["node-a"], "node-a");
        csr.spec.request = ByteString(vec![0xff, 0xfe]);
        let why = issue(&ca(), &csr, NS, SA).expect_err("not PEM");
        assert!(why.contains("spec.request"), "{why}");
    }

    #[test]
    fn validity_is_the_requested_expiration_within_ten_minutes_and_a_day() {
        assert_eq!(validity(None), MAX_VALIDITY);
        assert_eq!(validity(Some(3600)), Duration::from_secs(3600));
        assert_eq!(validity(Some(60)), MIN_VALIDITY);
        assert_eq!(validity(Some(-5)), MIN_VALIDITY);
        assert_eq!(validity(Some(7 * 86400)), MAX_VALIDITY);
    }

    #[test]
    fn a_request_is_decided_once_and_issued_once() {
        let mut csr = request(AGENT, &["node-a"], "node-a");
        assert_eq!(stage(&csr), Stage::New);
        let approved = new_condition("Approved", APPROVED_REASON, "ok");
        csr = with_condition(&csr, approved);
        assert_eq!(stage(&csr), Stage::ApprovedUnissued);
        csr.status.as_mut().expect("status").certificate = Some(ByteString(b"x".to_vec()));
        assert_eq!(stage(&csr), Stage::Done);
        let by_admin = with_condition(
            &request(AGENT, &["node-a"], "node-a"),
            new_condition("Approved", "KubectlApprove", "ok"),
        );
        assert_eq!(stage(&by_admin), Stage::ApprovedElsewhere);
        let denied = with_condition(
            &request(AGENT, &["node-a"], "node-a"),
            new_condition("Denied", REFUSED_REASON, "no"),
        );
        assert_eq!(stage(&denied), Stage::Done);
    }

    #[test]
    fn finished_requests_are_deleted_after_an_hour_and_pending_ones_never() {
        let now = Timestamp::now();
        let at = |age_secs: i64, csr: CertificateSigningRequest| {
            let mut csr = csr;
            csr.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::from_second(now.as_second() - age_secs).expect("time"),
                ));
            csr
        };
        let mut issued = request(AGENT, &["node-a"], "node-a");
        issued.status = Some(Default::default());
        issued.status.as_mut().expect("status").certificate = Some(ByteString(b"x".to_vec()));
        let denied = with_condition(
            &request(AGENT, &["node-a"], "node-a"),
            new_condition("Denied", REFUSED_REASON, "no"),
        );
        let pending = request(AGENT, &["node-a"], "node-a");
        assert!(expired(&at(3601, issued.clone()), now));
        assert!(expired(&at(7200, denied.clone()), now));
        assert!(!expired(&at(3000, issued.clone()), now));
        assert!(!expired(&at(3000, denied), now));
        assert!(!expired(&at(86400, pending), now));
        let mut other = at(7200, issued);
        other.spec.signer_name = "example.com/other".into();
        assert!(!expired(&other, now));
    }

    const HOUR: u64 = 3600;
    const NOW: u64 = 1_800_000_000;

    fn cas(n: usize) -> Vec<String> {
        (0..n).map(|_| ca().cert_pem().to_owned()).collect()
    }

    fn data(entries: &[(u64, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(t, pem)| (key_of(*t), (*pem).to_owned()))
            .collect()
    }

    #[test]
    fn the_first_ca_makes_the_bundle_and_publishing_again_changes_nothing() {
        let pems = cas(1);
        let bundle = trust_data(&BTreeMap::new(), &pems[0], NOW, NOW);
        assert_eq!(bundle.data, data(&[(NOW, &pems[0])]));
        assert!(bundle.dropped.is_empty());
        // A retry an hour later keeps the key the CA already has.
        let again = trust_data(&bundle.data, &pems[0], NOW, NOW + HOUR);
        assert_eq!(again, bundle);
    }

    #[test]
    fn an_older_ca_stays_until_the_newer_one_is_48_hours_old() {
        let pems = cas(3);
        let (a, b) = (NOW - 100 * HOUR, NOW - 47 * HOUR);
        let existing = data(&[(a, &pems[0]), (b, &pems[1])]);
        // b joined 47 hours ago: a's certificates may still be trusted by someone; kept.
        let bundle = trust_data(&existing, &pems[2], NOW, NOW);
        assert_eq!(
            bundle.data,
            data(&[(a, &pems[0]), (b, &pems[1]), (NOW, &pems[2])])
        );
        // Two hours later b is 49 hours old: a goes, b (superseded only just now) stays.
        let bundle = trust_data(&bundle.data, &pems[2], NOW, NOW + 2 * HOUR);
        assert_eq!(bundle.data, data(&[(b, &pems[1]), (NOW, &pems[2])]));
        assert_eq!(
            bundle.dropped,
            vec![(key_of(a), "superseded more than 48 hours ago")]
        );
    }

    #[test]
    fn the_newest_ca_is_never_dropped_however_old() {
        let pems = cas(2);
        let old = NOW - 1000 * HOUR;
        // A clock far ahead of the CA's creation: still the newest, still kept.
        let bundle = trust_data(&data(&[(old, &pems[0])]), &pems[1], old + 1, NOW);
        assert_eq!(bundle.data, data(&[(old + 1, &pems[1])]));
        let bundle = trust_data(&BTreeMap::new(), &pems[1], old, NOW);
        assert_eq!(bundle.data, data(&[(old, &pems[1])]));
    }

    #[test]
    fn malformed_keys_are_dropped() {
        let pems = cas(3);
        let node = {
            let ca = ca();
            let key = NodeKey::generate("node-a").expect("key");
            ca.sign_node(&key.csr_pem, "node-a", MAX_VALIDITY)
                .expect("cert")
        };
        let two = format!("{}{}", pems[0], pems[1]);
        let mut existing = data(&[(NOW - 10, &pems[0])]);
        for (key, value) in [
            ("readme.txt", pems[0].as_str()),
            ("x.crt", pems[0].as_str()),
            ("-5.crt", pems[0].as_str()),
            ("99999999999999999999.crt", pems[0].as_str()),
            ("12.pem", pems[0].as_str()),
            ("13.crt", "not PEM"),
            ("14.crt", node.as_str()),
            ("15.crt", two.as_str()),
        ] {
            existing.insert(key.into(), value.into());
        }
        let bundle = trust_data(&existing, &pems[2], NOW, NOW);
        assert_eq!(bundle.data, data(&[(NOW - 10, &pems[0]), (NOW, &pems[2])]));
        assert_eq!(bundle.dropped.len(), 8, "{:?}", bundle.dropped);
    }

    #[test]
    fn a_ca_made_in_the_same_second_as_another_takes_the_next_free_second() {
        let pems = cas(3);
        let existing = data(&[(NOW, &pems[0]), (NOW + 1, &pems[1])]);
        let bundle = trust_data(&existing, &pems[2], NOW, NOW);
        assert_eq!(
            bundle.data,
            data(&[(NOW, &pems[0]), (NOW + 1, &pems[1]), (NOW + 2, &pems[2])])
        );
    }

    #[test]
    fn at_most_16_cas_are_kept_the_oldest_dropped_first() {
        let pems = cas(MAX_TRUST_KEYS + 2);
        // 17 CAs from the last hour (a crash-looping leader), and a new one.
        let existing: BTreeMap<String, String> = pems[..=MAX_TRUST_KEYS]
            .iter()
            .enumerate()
            .map(|(i, pem)| (key_of(NOW - 100 + i as u64), pem.clone()))
            .collect();
        let own = &pems[MAX_TRUST_KEYS + 1];
        let bundle = trust_data(&existing, own, NOW, NOW);
        assert_eq!(bundle.data.len(), MAX_TRUST_KEYS);
        assert_eq!(bundle.data.get(&key_of(NOW)), Some(own));
        assert_eq!(
            bundle.dropped,
            vec![
                (key_of(NOW - 100), "more than 16 CAs"),
                (key_of(NOW - 99), "more than 16 CAs")
            ]
        );
    }
}
