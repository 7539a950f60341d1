//! The rustls configurations of agent-to-agent connections: TLS 1.3 only, the ring provider,
//! both sides presenting a node certificate and verifying the other's against the trust
//! bundle; the client also requires the server to be the node it dialled.

use std::net::Ipv4Addr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, Resumption};
use rustls::crypto::{
    verify_tls12_signature, verify_tls13_signature, CryptoProvider, WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, OtherError, RootCertStore, ServerConfig,
    SignatureScheme,
};

use crate::identity::{node_of, validate_node_name};
use crate::{pem, Error, Result, Trust};

/// The one application protocol spoken on these connections, offered and required by both
/// sides so that a client of some other protocol fails at the handshake, not in the middle.
pub const ALPN: &[u8] = b"ferry-transfer/1";

/// The server name a client passes to rustls (`connect`). A placeholder: the server is
/// identified by the node URI in its certificate, which [`client_config`] checks against the
/// expected node, never by this name; and it is not sent (SNI is off).
pub const SERVER_NAME: &str = "peer.ferry.invalid";

/// [`SERVER_NAME`] as rustls takes it, for `connect(server_name(), stream)`.
pub fn server_name() -> ServerName<'static> {
    // The fallback is never taken (`SERVER_NAME` is a DNS name, tested below); it is there
    // because rustls cannot build the name in a constant, and any name would do.
    ServerName::try_from(SERVER_NAME).unwrap_or(ServerName::IpAddress(Ipv4Addr::UNSPECIFIED.into()))
}

/// The largest certificate chain or key PEM read for a node's own identity.
const MAX_IDENTITY_PEM: usize = 64 * 1024;

/// The server side: presents `cert_chain_pem` (the node's certificate first) with `key_pem`,
/// and requires every client to present a certificate that chains to `trust`. Which node
/// connected is then [`crate::peer_node`]. No session tickets: every connection authenticates
/// in full, so a peer whose certificate expired cannot come back on an old session.
pub fn server_config(
    trust: &Trust,
    cert_chain_pem: &str,
    key_pem: &str,
) -> Result<Arc<ServerConfig>> {
    let (chain, key) = own_identity(cert_chain_pem, key_pem)?;
    let provider = provider();
    let clients =
        WebPkiClientVerifier::builder_with_provider(trust.roots.clone(), provider.clone())
            .build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// The client side, for one connection's worth of intent: presents `cert_chain_pem` with
/// `key_pem`, and accepts the server only if its chain verifies against `trust` (signatures,
/// validity, serverAuth: rustls' webpki checks) and its certificate names
/// `expected_server_node`. Connect with [`server_name`]. No resumption, for the same reason
/// as the server.
pub fn client_config(
    trust: &Trust,
    cert_chain_pem: &str,
    key_pem: &str,
    expected_server_node: &str,
) -> Result<Arc<ClientConfig>> {
    validate_node_name(expected_server_node)?;
    let (chain, key) = own_identity(cert_chain_pem, key_pem)?;
    let provider = provider();
    let verifier = NodeServerVerifier {
        roots: trust.roots.clone(),
        algorithms: provider.signature_verification_algorithms,
        expected_node: expected_server_node.to_owned(),
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.resumption = Resumption::disabled();
    config.enable_sni = false;
    Ok(Arc::new(config))
}

/// ring: aws-lc-rs would need cmake and a C toolchain to build. AES-128-GCM first (both
/// ends use this order, and a server follows the client's): a copy between nodes encrypts
/// every byte it moves, and AES-128 does it in 10 rounds where AES-256 takes 14, with no
/// practical difference in strength.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// A node's own certificate chain and key, read and checked to be a node certificate, so that
/// passing the CA certificate by mistake fails here rather than at every peer's handshake.
fn own_identity(
    cert_chain_pem: &str,
    key_pem: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    pem::bounded("node certificate chain", cert_chain_pem, MAX_IDENTITY_PEM)?;
    pem::bounded("node private key", key_pem, MAX_IDENTITY_PEM)?;
    let chain = pem::certificates("node certificate chain", cert_chain_pem)?;
    let Some(leaf) = chain.first() else {
        return Err(Error::Pem {
            what: "node certificate chain",
            label: "CERTIFICATE",
            why: "no CERTIFICATE block found".into(),
        });
    };
    node_of(leaf)?;
    let key = pem::private_key("node private key", key_pem)?;
    Ok((chain, key))
}

/// The client's check of the server: rustls' webpki chain verification, then the node URI in
/// place of the DNS-name check. It does not wrap `WebPkiServerVerifier` itself because that
/// one's `verify_server_cert` ends in a DNS/IP name check that a URI-only certificate cannot
/// pass, and telling its name error from the others would rest on the order of its checks;
/// the public functions it is built from are called here instead, the same code.
#[derive(Debug)]
struct NodeServerVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
    expected_node: String,
}

impl ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _placeholder: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        let refuse = |e: Error| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
        };
        let node = node_of(end_entity).map_err(refuse)?;
        if node != self.expected_node {
            return Err(refuse(Error::WrongNode {
                expected: self.expected_node.clone(),
                presented: node,
            }));
        }
        Ok(ServerCertVerified::assertion())
    }

    // Never reached (TLS 1.2 is not offered); delegated all the same, so that it is correct
    // if it ever were.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_server_name_is_the_dns_name() {
        assert_eq!(server_name().to_str(), SERVER_NAME);
    }
}
