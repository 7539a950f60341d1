//! Who may talk to whom between Ferry agents: the install's certificate authority, the nodes'
//! certificates, and the rustls configurations of the mutually authenticated TLS 1.3
//! connections that carry data between nodes. No Kubernetes calls and no file I/O: callers
//! hand PEM text in and get PEM text or rustls configurations back.
//!
//! # Design
//!
//! **The CA.** Each install has its own certificate authority ([`Ca`]): a self-signed ECDSA
//! P-256 certificate with `CA:true, pathlen:0` (it signs node certificates and nothing that
//! signs further), `keyCertSign`, valid for ten years. Its private key exists only in the
//! memory of the leading operator replica (`operator/src/signer.rs`), never in a Secret: a new
//! leader makes a new CA and adds its certificate to the bundle beside the old ones (below).
//! Agents only ever see CA *certificates*, in the trust bundle.
//!
//! **A node's identity.** A node certificate names its node in exactly one SAN, the URI
//! `spiffe://ferry.dev/node/<node>` ([`node_uri`]), and nothing else: no DNS names or IPs,
//! because agents dial each other by pod IP and what matters is which node answered. At start
//! an agent generates a fresh key and a CSR for its own node ([`NodeKey::generate`]); the key
//! never leaves the agent. The CSR goes to Kubernetes as a CertificateSigningRequest with
//! signerName `ferry.dev/transfer`; the operator must check that the requester is the agent's
//! ServiceAccount and that the node in the CSR is the node that agent runs on, then signs with
//! [`Ca::sign_node`], which takes nothing from the CSR but its public key and its (checked)
//! node name: the CA alone decides the extensions (not a CA, `digitalSignature`,
//! serverAuth + clientAuth).
//!
//! **Connections.** Both sides present their node certificate and verify the other's chain
//! against the trust bundle ([`Trust`]); TLS 1.3 only. The server learns which node connected
//! from the client certificate ([`peer_node`]); the client dials a specific node and refuses a
//! server whose certificate names another ([`client_config`]), since a pod IP says nothing
//! trustworthy about who holds it.
//!
//! **Lifetimes and rotation.** Node certificates live 24 hours and an agent renews at 2/3 of
//! its certificate's lifetime (a new key and CSR), so a lost node key is useful for a day at
//! most and no revocation lists are needed. The CA is rotated by overlap, every time the
//! leader changes: the new leader publishes its CA certificate beside the old ones before it
//! signs anything, and an old CA leaves the bundle 48 hours after a newer one joined (every
//! node certificate it signed has expired by then). Each pair of agents keeps a trusted
//! issuer in common as long as agents reload the bundle before they renew.
//!
//! **Peering (between installs).** Copies between two clusters use a separate identity, so
//! that the in-cluster transfer port never accepts a certificate from outside
//! (`docs/design/between-clusters.md`, "Trust"). Each install has a stable *peering CA*, an
//! ordinary [`Ca`] kept in a Secret and loaded with [`Ca::from_pem`] (not the leader's
//! in-memory transfer CA, which the other cluster could not follow). It signs the same CSR an
//! agent already makes into a *peering certificate* ([`Ca::sign_peer`]) whose one URI SAN
//! is `spiffe://ferry.dev/install/<install>/node/<node>` ([`peer_uri`]); the two kinds of
//! certificate are never accepted for each other. An admin lists the installs this one
//! trusts with each one's peering CA bundle ([`PeerSet`]). The peering listener
//! ([`peering_server_config`]) reads the install a client's certificate names and verifies
//! its chain against *that install's* CAs alone, so one trusted install cannot speak for
//! another; the reader ([`peering_client_config`]) trusts only the CA that came with the
//! export and requires the server to be a node of the export's install. Both learn who is at
//! the other end with [`peer_id`]. [`describe_bundle`] gives each certificate's SHA-256
//! fingerprint, which is what admins compare when they pair.

mod ca;
mod error;
mod identity;
mod peering;
mod pem;
mod tls;
mod trust;

pub use ca::{Ca, NodeKey, CLOCK_SKEW, MAX_CSR_PEM};
pub use error::{Error, Result};
pub use identity::{
    node_of, node_of_pem, node_uri, peer_node, validate_node_name, NODE_URI_PREFIX,
};
pub use peering::{
    describe_bundle, peer_id, peer_of, peer_of_pem, peer_uri, peering_client_config,
    peering_server_config, validate_install_name, CaSummary, PeerId, PeerSet, MAX_PEERS,
    PEERING_ALPN, PEER_URI_PREFIX,
};
pub use tls::{client_config, server_config, server_name, ALPN, SERVER_NAME};
pub use trust::{Trust, MAX_BUNDLE_PEM};

/// 32 bytes from the operating system's CSPRNG (ring's `SystemRandom`): a shard's ticket.
pub fn random_ticket() -> Result<[u8; 32], Error> {
    use ring::rand::SecureRandom;
    let mut t = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut t)
        .map_err(|_| Error::Random)?;
    Ok(t)
}

/// SHA-256 of an export's credential, lowercase hex: what the export's status lists (the
/// operator writes it) and what the source's agents compare a presented credential with.
pub fn credential_hash(credential: &[u8; 32]) -> String {
    ring::digest::digest(&ring::digest::SHA256, credential)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `presented`'s [`credential_hash`] is `listed`, compared in time that does not
/// depend on where they differ.
pub fn credential_matches(presented: &[u8; 32], listed: &str) -> bool {
    let ours = credential_hash(presented);
    ours.len() == listed.len()
        && ours
            .bytes()
            .zip(listed.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod credential_tests {
    use super::*;

    #[test]
    fn a_credential_matches_its_own_hash_only() {
        let c = [5u8; 32];
        let h = credential_hash(&c);
        assert_eq!(h.len(), 64);
        assert!(credential_matches(&c, &h));
        assert!(!credential_matches(&[6u8; 32], &h));
        assert!(!credential_matches(&c, &h[..63]));
        assert!(!credential_matches(&c, &h.to_uppercase()));
    }
}
