//! The rustls configurations of agent-to-agent connections: TLS 1.3 only, the ring provider,
//! both sides presenting a node certificate and verifying the other's against the trust
//! bundle; the client also requires the server to be the node it dialled.

use std::net::Ipv4Addr;
use std::sync::Arc;

use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, Resumption};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, ClientConfig, OtherError, RootCertStore, ServerConfig};

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

/// An agent's own certificate chain (its certificate first) and private key, as rustls takes
/// them.
pub(crate) type OwnIdentity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The largest certificate chain or key PEM read for an agent's own identity (its node or
/// its peering certificate).
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
    let identity = own_node_identity(cert_chain_pem, key_pem)?;
    let provider = provider();
    let clients =
        WebPkiClientVerifier::builder_with_provider(trust.roots.clone(), provider.clone())
            .build()?;
    tls13_server(provider, clients, identity, ALPN)
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
    let identity = own_node_identity(cert_chain_pem, key_pem)?;
    let provider = provider();
    let verifier = NodeServerVerifier {
        roots: trust.roots.clone(),
        algorithms: provider.signature_verification_algorithms,
        expected_node: expected_server_node.to_owned(),
    };
    tls13_client(provider, Arc::new(verifier), identity, ALPN)
}

/// A TLS 1.3 server configuration over `provider`: presents `chain` with `key`, requires
/// every client to pass `clients`, and speaks `alpn` alone. No session tickets or storage.
pub(crate) fn tls13_server(
    provider: Arc<CryptoProvider>,
    clients: Arc<dyn ClientCertVerifier>,
    (chain, key): OwnIdentity,
    alpn: &[u8],
) -> Result<Arc<ServerConfig>> {
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// A TLS 1.3 client configuration over `provider`: presents `chain` with `key`, accepts a
/// server only if `server` does, and offers `alpn` alone. No resumption, no SNI.
pub(crate) fn tls13_client(
    provider: Arc<CryptoProvider>,
    server: Arc<dyn ServerCertVerifier>,
    (chain, key): OwnIdentity,
    alpn: &[u8],
) -> Result<Arc<ClientConfig>> {
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(server)
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![alpn.to_vec()];
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
fn own_node_identity(cert_chain_pem: &str, key_pem: &str) -> Result<OwnIdentity> {
    own_identity(
        "node certificate chain",
        "node private key",
        cert_chain_pem,
        key_pem,
        node_of,
    )
}

/// An agent's own certificate chain (`chain_what` in errors) and key (`key_what`): each PEM
/// bounded, the chain's first certificate checked by `leaf` (a node or a peering certificate's
/// reading), the key read. For the node and the peering configurations alike.
pub(crate) fn own_identity<T>(
    chain_what: &'static str,
    key_what: &'static str,
    chain_pem: &str,
    key_pem: &str,
    leaf: impl Fn(&CertificateDer<'_>) -> Result<T>,
) -> Result<OwnIdentity> {
    pem::bounded(chain_what, chain_pem, MAX_IDENTITY_PEM)?;
    pem::bounded(key_what, key_pem, MAX_IDENTITY_PEM)?;
    let chain = pem::certificates(chain_what, chain_pem)?;
    let Some(first) = chain.first() else {
        return Err(Error::Pem {
            what: chain_what,
            label: "CERTIFICATE",
            why: "no CERTIFICATE block found".into(),
        });
    };
    leaf(first)?;
    let key = pem::private_key(key_what, key_pem)?;
    Ok((chain, key))
}

/// A rustls certificate error carrying ours, for the log of the side that refused.
pub(crate) fn refuse(e: Error) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

/// A client's check of a server, shared by the node and the peering verifiers: rustls' webpki
/// chain verification of `end_entity` against `roots` (signatures, validity, serverAuth),
/// then `leaf` on the end-entity certificate in place of the DNS-name check, its refusal
/// [`refuse`]d.
pub(crate) fn verify_server_chain(
    roots: &RootCertStore,
    algorithms: &WebPkiSupportedAlgorithms,
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    now: UnixTime,
    leaf: impl FnOnce(&CertificateDer<'_>) -> Result<()>,
) -> Result<ServerCertVerified, rustls::Error> {
    let cert = ParsedCertificate::try_from(end_entity)?;
    verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, algorithms.all)?;
    leaf(end_entity).map_err(refuse)?;
    Ok(ServerCertVerified::assertion())
}

/// The three signature methods of a rustls verifier (`ServerCertVerifier` or
/// `ClientCertVerifier`) whose `self.algorithms` is its provider's
/// `WebPkiSupportedAlgorithms`, delegated to rustls' functions of the same names. The TLS 1.2
/// one is never reached (TLS 1.2 is not offered); delegated all the same, so that it is
/// correct if it ever were.
macro_rules! signatures_by_algorithms {
    () => {
        $crate::tls::signatures_by_algorithms!(verify_tls12_signature, verify_tls13_signature);

        fn supported_verify_schemes(&self) -> ::std::vec::Vec<::rustls::SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    };
    ($($verify:ident),+) => {
        $(
            fn $verify(
                &self,
                message: &[u8],
                cert: &::rustls::pki_types::CertificateDer<'_>,
                dss: &::rustls::DigitallySignedStruct,
            ) -> ::std::result::Result<
                ::rustls::client::danger::HandshakeSignatureValid,
                ::rustls::Error,
            > {
                ::rustls::crypto::$verify(message, cert, dss, &self.algorithms)
            }
        )+
    };
}
pub(crate) use signatures_by_algorithms;

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
        verify_server_chain(
            &self.roots,
            &self.algorithms,
            end_entity,
            intermediates,
            now,
            |cert| {
                let node = node_of(cert)?;
                if node != self.expected_node {
                    return Err(Error::WrongNode {
                        expected: self.expected_node.clone(),
                        presented: node,
                    });
                }
                Ok(())
            },
        )
    }

    signatures_by_algorithms!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_server_name_is_the_dns_name() {
        assert_eq!(server_name().to_str(), SERVER_NAME);
    }
}
