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

mod ca;
mod error;
mod identity;
mod pem;
mod tls;
mod trust;

pub use ca::{Ca, NodeKey, CLOCK_SKEW, MAX_CSR_PEM};
pub use error::{Error, Result};
pub use identity::{
    node_of, node_of_pem, node_uri, peer_node, validate_node_name, NODE_URI_PREFIX,
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
