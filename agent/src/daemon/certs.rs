//! The agent's transfer identity: a key made here (it never leaves this process), a
//! certificate for this node from the operator's signer, and the install's trust bundle.
//!
//! The certificate is asked for with a CertificateSigningRequest (signer
//! `ferry.dev/transfer`) made with the agent's own token: the API server records the node
//! that token is bound to, and the signer issues a certificate only for that node. It lives
//! 24 hours and is renewed (a new key, a new request) at two thirds of that; the bundle (the
//! ConfigMap `ferry-transfer-trust`, one CA certificate per key) is read again every few
//! minutes, and within seconds of a handshake that failed: an agent that starts (or renews)
//! after a new operator leader added its CA holds a certificate of that CA at once, while
//! its peers read the bundle before.
//! Whoever waits for the identity sees the newest one on a watch channel; until there is
//! one (no signer yet, or a refusal), there is none, and nothing is served or dialled.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::transfer::Tls;

/// The signer the operator answers for.
const SIGNER: &str = "ferry.dev/transfer";
/// The ConfigMap of the CA certificates agents trust.
const TRUST: &str = "ferry-transfer-trust";
/// What a certificate is asked for (the signer grants at most this).
pub(crate) const LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// How long a request waits for its answer before it is asked again.
const ANSWER_WITHIN: Duration = Duration::from_secs(120);
/// How often the bundle is read again.
const BUNDLE_EVERY: Duration = Duration::from_secs(5 * 60);
/// How soon it is read again at the earliest when a handshake failed
/// ([`crate::transfer::trust_may_be_stale`]): any TCP peer can fail one, so it costs at
/// most one read per this interval; a receiver dials for a minute.
const BUNDLE_AGAIN_AFTER: Duration = Duration::from_secs(10);
/// Waits after a failure, doubling up to the last.
pub(crate) const RETRY_FIRST: Duration = Duration::from_secs(5);
pub(crate) const RETRY_MOST: Duration = Duration::from_secs(10 * 60);

/// The newest transfer identity, once there is one.
pub type Identity = watch::Receiver<Option<Arc<Tls>>>;

/// Keep this node's transfer identity current, from now on.
pub fn start(client: Client, node: String, namespace: String) -> Identity {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(keep(client, node, namespace, tx));
    rx
}

async fn keep(
    client: Client,
    node: String,
    namespace: String,
    tx: watch::Sender<Option<Arc<Tls>>>,
) {
    let mut retry = RETRY_FIRST;
    loop {
        let (cert, key) = match obtain(&client, &node).await {
            Ok(x) => x,
            Err(why) => {
                tracing::warn!(%why, retry_s = retry.as_secs(), "no transfer certificate yet");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MOST);
                continue;
            }
        };
        retry = RETRY_FIRST;
        tracing::info!(%node, "transfer certificate issued");
        let renew_at = tokio::time::Instant::now() + LIFETIME * 2 / 3;
        while tokio::time::Instant::now() < renew_at {
            match bundle(&client, &namespace)
                .await
                .and_then(|b| Tls::new(&b, &cert, &key).map_err(|e| e.to_string()))
            {
                Ok(tls) => {
                    tx.send_replace(Some(Arc::new(tls)));
                }
                // The identity in use stays (its certificate is still valid).
                Err(why) => tracing::warn!(%why, "reading the transfer trust bundle"),
            }
            let read = tokio::time::Instant::now();
            let next = (read + BUNDLE_EVERY).min(renew_at);
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                // A handshake failed: perhaps with a certificate of a CA added since.
                _ = crate::transfer::trust_stale() => {
                    tokio::time::sleep_until((read + BUNDLE_AGAIN_AFTER).min(renew_at)).await;
                }
            }
        }
    }
}

/// A new key and a transfer certificate for it: (certificate PEM, key PEM).
async fn obtain(client: &Client, node: &str) -> Result<(String, String), String> {
    obtain_from(client, node, SIGNER, "ferry-transfer").await
}

/// A new key and a certificate for it from the signer `signer` (`ferry.dev/transfer`, or
/// `ferry.dev/peering` for the peering port), asked for in a request named
/// `<prefix>-<node>-<time>`: (certificate PEM, key PEM).
pub(crate) async fn obtain_from(
    client: &Client,
    node: &str,
    signer: &str,
    prefix: &str,
) -> Result<(String, String), String> {
    let key = ferry_link::NodeKey::generate(node).map_err(|e| e.to_string())?;
    let api = Api::<CertificateSigningRequest>::all(client.clone());
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // (A node name is at most 253 bytes; the name's other parts fit the same bound.)
    let short: String = node.chars().take(200).collect();
    let name = format!("{prefix}-{short}-{stamp:x}");
    let request = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(key.csr_pem.clone().into_bytes()),
            signer_name: signer.into(),
            usages: Some(
                ["digital signature", "client auth", "server auth"]
                    .map(String::from)
                    .to_vec(),
            ),
            expiration_seconds: Some(LIFETIME.as_secs() as i32),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    api.create(&PostParams::default(), &request)
        .await
        .map_err(|e| format!("creating the certificate request {name}: {e}"))?;
    let deadline = tokio::time::Instant::now() + ANSWER_WITHIN;
    while tokio::time::Instant::now() < deadline {
        let got = api
            .get(&name)
            .await
            .map_err(|e| format!("reading the certificate request {name}: {e}"))?;
        let status = got.status.unwrap_or_default();
        let denied = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Denied" || c.type_ == "Failed");
        if let Some(c) = denied {
            return Err(format!(
                "the certificate request {name} was {}: {}",
                c.type_.to_lowercase(),
                c.message.unwrap_or_default()
            ));
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            let cert = String::from_utf8(cert.0)
                .map_err(|_| format!("the certificate of {name} is not PEM text"))?;
            return Ok((cert, key.key_pem));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!(
        "no answer to the certificate request {name} within {}s: is the operator running?",
        ANSWER_WITHIN.as_secs()
    ))
}

/// The trust bundle: every `*.crt` of the ConfigMap, read by name (the only way the
/// agent's RBAC lets it read a ConfigMap).
async fn bundle(client: &Client, namespace: &str) -> Result<String, String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get(TRUST)
        .await
        .map_err(|e| format!("reading ConfigMap {namespace}/{TRUST}: {e}"))?;
    let pems: Vec<String> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.ends_with(".crt"))
        .map(|(_, v)| v)
        .collect();
    match pems.is_empty() {
        true => Err(format!(
            "ConfigMap {namespace}/{TRUST} holds no CA certificate"
        )),
        false => Ok(pems.join("\n")),
    }
}
