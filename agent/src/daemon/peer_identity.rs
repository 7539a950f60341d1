//! The agent's peering identity (chart `peering.enabled`): a key made here, a certificate
//! from the operator's `ferry.dev/peering` signer naming this install and this node, and
//! the installs whose agents may connect (the FerryPeers with `exports: Allow`), read every
//! [`PEERS_EVERY`]. Whoever waits for it sees the newest on a watch channel; until there is
//! one, the peering port closes every connection unanswered.
//!
//! Which FerryPeers count is decided here by the agent's own rules, not by their status:
//! each bundle must make a `ferry_link::PeerSet` with the ones before it (the oldest first,
//! then by name, as the operator's `DuplicatePeer` has it), so a second peer for an install,
//! or one holding another install's CA, is left out rather than breaking the others.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{FerryPeer, PeerAccess};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::certs::{obtain_from, LIFETIME, RETRY_FIRST, RETRY_MOST};

/// The signer of peering certificates.
const SIGNER: &str = "ferry.dev/peering";
/// How often the FerryPeers are read again.
pub const PEERS_EVERY: Duration = Duration::from_secs(30);

/// This node's peering identity: who it is and whom it lets in.
pub struct PeeringTls {
    /// This install and node, as the certificate names them.
    pub id: ferry_link::PeerId,
    /// The installs whose agents may connect, each with the FerryPeer that trusts it (the
    /// name an export's readers give).
    pub peers: BTreeMap<String, String>,
    /// The peering port's configuration.
    pub server: Arc<rustls::ServerConfig>,
    /// The certificate and key, to dial other installs' peering ports with.
    chain_pem: String,
    key_pem: String,
}

impl PeeringTls {
    /// The configuration to dial an agent of `install` with, whose certificate must chain
    /// to `ca_pem` (an export's CA, which a FerryPeer here holds: the operator checked).
    pub fn client_for(
        &self,
        ca_pem: &str,
        install: &str,
    ) -> Result<Arc<rustls::ClientConfig>, ferry_link::Error> {
        ferry_link::peering_client_config(ca_pem, install, &self.chain_pem, &self.key_pem)
    }
}

impl std::fmt::Debug for PeeringTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeeringTls")
            .field("id", &self.id)
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

/// The newest peering identity, once there is one.
pub type PeerIdentity = watch::Receiver<Option<Arc<PeeringTls>>>;

/// Keep this node's peering identity current, from now on.
pub fn start(client: Client, node: String) -> PeerIdentity {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(keep(client, node, tx));
    rx
}

async fn keep(client: Client, node: String, tx: watch::Sender<Option<Arc<PeeringTls>>>) {
    let mut retry = RETRY_FIRST;
    loop {
        let (cert, key) = match obtain_from(&client, &node, SIGNER, "ferry-peering").await {
            Ok(x) => x,
            Err(why) => {
                tracing::warn!(%why, retry_s = retry.as_secs(), "no peering certificate yet");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MOST);
                continue;
            }
        };
        retry = RETRY_FIRST;
        let id = match ferry_link::peer_of_pem(&cert) {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(error = %e, "the peering certificate issued is not one");
                tokio::time::sleep(RETRY_MOST).await;
                continue;
            }
        };
        tracing::info!(install = %id.install, node = %id.node, "peering certificate issued");
        let renew_at = tokio::time::Instant::now() + LIFETIME * 2 / 3;
        let mut last: Option<BTreeMap<String, String>> = None;
        while tokio::time::Instant::now() < renew_at {
            match trusted(&client).await.and_then(|(set, peers)| {
                ferry_link::peering_server_config(&set, &cert, &key)
                    .map(|server| (peers, server))
                    .map_err(|e| e.to_string())
            }) {
                Ok((peers, server)) => {
                    if last.as_ref() != Some(&peers) {
                        tracing::info!(installs = ?peers.keys().collect::<Vec<_>>(), "peering: the installs whose agents may connect");
                        last = Some(peers.clone());
                    }
                    tx.send_replace(Some(Arc::new(PeeringTls {
                        id: id.clone(),
                        peers,
                        server,
                        chain_pem: cert.clone(),
                        key_pem: key.clone(),
                    })));
                }
                // The identity in use stays.
                Err(why) => tracing::warn!(%why, "peering: reading the FerryPeers"),
            }
            tokio::time::sleep(PEERS_EVERY.min(renew_at - tokio::time::Instant::now())).await;
        }
    }
}

/// The installs whose agents may connect: the FerryPeers with `exports: Allow`, each kept
/// only if its bundle makes a set with those kept before it ([`admit`]).
async fn trusted(
    client: &Client,
) -> Result<(ferry_link::PeerSet, BTreeMap<String, String>), String> {
    let list = Api::<FerryPeer>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing FerryPeers: {e}"))?;
    Ok(admit(list.items))
}

/// [`trusted`]'s decision over `peers`: oldest first (then by name), each with `exports:
/// Allow` kept if it still makes a valid set with those kept before it, at most
/// `ferry_link::MAX_PEERS`; with the name of the FerryPeer kept for each install.
pub fn admit(mut peers: Vec<FerryPeer>) -> (ferry_link::PeerSet, BTreeMap<String, String>) {
    peers.sort_by_key(|p| (p.creation_timestamp().map(|t| t.0), p.name_any()));
    let mut set = ferry_link::PeerSet::default();
    let mut names = BTreeMap::new();
    for p in peers.iter().filter(|p| p.spec.exports == PeerAccess::Allow) {
        // Refused (the set left as it was): a second of an install or of a CA, a bad
        // bundle, or more than ferry_link::MAX_PEERS.
        match set.insert(p.spec.install.clone(), &p.spec.ca_bundle) {
            Ok(()) => {
                names.insert(p.spec.install.clone(), p.name_any());
            }
            Err(e) => tracing::debug!(peer = %p.name_any(), error = %e, "FerryPeer left out"),
        }
    }
    (set, names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_crds::FerryPeerSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;

    fn peer(
        name: &str,
        install: &str,
        bundle: &str,
        created: i64,
        exports: PeerAccess,
    ) -> FerryPeer {
        FerryPeer {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(Time(Timestamp::from_second(created).expect("a time"))),
                ..ObjectMeta::default()
            },
            spec: FerryPeerSpec {
                install: install.into(),
                ca_bundle: bundle.into(),
                exports,
                imports: PeerAccess::Allow,
                namespaces: None,
            },
            status: None,
        }
    }

    #[test]
    fn the_first_peer_of_an_install_or_a_ca_is_let_in_and_denied_or_broken_ones_are_not() {
        let ca = |n: &str| ferry_link::Ca::generate(n).expect("a CA");
        let (west, south, north) = (ca("west"), ca("south"), ca("north"));
        let (set, names) = admit(vec![
            // Newer, same install: left out, whatever its order in the list.
            peer(
                "west-again",
                "west",
                south.cert_pem(),
                300,
                PeerAccess::Allow,
            ),
            peer("west", "west", west.cert_pem(), 100, PeerAccess::Allow),
            // West's CA for another install: left out.
            peer("copycat", "east", west.cert_pem(), 200, PeerAccess::Allow),
            peer("north", "north", north.cert_pem(), 400, PeerAccess::Deny),
            peer("garbled", "garbled", "not PEM", 50, PeerAccess::Allow),
            peer("south", "south", south.cert_pem(), 500, PeerAccess::Allow),
        ]);
        let installs: Vec<&str> = set.installs().collect();
        // South's CA was first claimed by west-again, which was left out: south is in.
        assert_eq!(installs, ["south", "west"]);
        // Each install with the FerryPeer that let it in (an export's readers name it).
        let named: Vec<(&str, &str)> = names
            .iter()
            .map(|(i, n)| (i.as_str(), n.as_str()))
            .collect();
        assert_eq!(named, [("south", "south"), ("west", "west")]);
    }
}
