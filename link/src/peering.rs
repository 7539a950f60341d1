//! Peering: connections between two installs (clusters). Owns the install name rules, the one
//! URI SAN of a peering certificate (`spiffe://ferry.dev/install/<install>/node/<node>`) and
//! reading it back, the set of installs this one trusts ([`PeerSet`]), the rustls
//! configurations of the peering listener and of a reader dialling another install's export,
//! and the description of a CA bundle that admins compare ([`describe_bundle`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DistinguishedName, RootCertStore, ServerConfig};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::identity::{
    describe, dns_label_rules, shorten, uri_san_of, validate_node_name, LabelFault,
};
use crate::tls::{
    own_identity, provider, refuse, signatures_by_algorithms, tls13_client, tls13_server,
    verify_server_chain, OwnIdentity,
};
use crate::{pem, Error, Result, Trust, MAX_BUNDLE_PEM};

/// What every peering URI begins with; `<install>/node/<node>` follows.
pub const PEER_URI_PREFIX: &str = "spiffe://ferry.dev/install/";

/// The application protocol of connections between installs. Not the in-cluster
/// [`crate::ALPN`]: a client of one listener offering its protocol to the other fails at the
/// handshake.
pub const PEERING_ALPN: &[u8] = b"ferry-peering/1";

/// The most installs a [`PeerSet`] holds: each is an admin's `FerryPeer`, and this bounds the
/// verifiers a listener builds from what is, in the end, cluster objects.
pub const MAX_PEERS: usize = 64;

/// RFC 1123's bound on a DNS label.
const MAX_INSTALL_NAME: usize = 63;

/// Who is at the other end of a peering connection: a node of an install.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerId {
    /// The install (cluster) the node belongs to.
    pub install: String,
    /// The node within that install.
    pub node: String,
}

/// The URI SAN that names `node` of `install` in a peering certificate. The names are not
/// checked here; signing and reading a certificate do check them.
pub fn peer_uri(install: &str, node: &str) -> String {
    format!("{PEER_URI_PREFIX}{install}/node/{node}")
}

/// Checks that `install` is an install name: an RFC 1123 DNS label (1 to 63 lowercase
/// alphanumerics and '-', beginning and ending with an alphanumeric). A label rather than a
/// subdomain because it sits in a URI path segment and in object names; a '/' or '.' would
/// make the URI ambiguous or the name unusable as a label.
pub fn validate_install_name(install: &str) -> Result<()> {
    let refuse = |why| Error::InstallName {
        name: shorten(install),
        why,
    };
    // The length first: an empty name passes it and is refused as empty below.
    if install.len() > MAX_INSTALL_NAME {
        return Err(refuse("it is longer than 63 bytes"));
    }
    dns_label_rules(install).map_err(|fault| {
        refuse(match fault {
            LabelFault::Empty => "it is empty",
            LabelFault::Character => {
                "it has a character other than a lowercase letter, a digit or '-'"
            }
            LabelFault::Hyphen => "it begins or ends with '-'",
        })
    })
}

/// The install and node a peering certificate names: its subject alternative names must be
/// exactly one URI, [`peer_uri`]`(install, node)` with a valid install and node name.
/// Anything more is refused rather than ignored, and an in-cluster node certificate
/// (`spiffe://ferry.dev/node/<node>`) is not a peering certificate, so that neither kind can
/// stand in for the other.
pub fn peer_of(cert_der: &CertificateDer<'_>) -> Result<PeerId> {
    uri_san_of(cert_der, |why| Error::NotAPeer { why }, peer_of_names)
}

/// The install and node the first certificate of a PEM chain names (an agent's own peering
/// certificate, as the signer issued it).
pub fn peer_of_pem(chain_pem: &str) -> Result<PeerId> {
    crate::identity::first_of_pem("peering certificate chain", chain_pem, peer_of)
}

/// The peer that `names` (a certificate's SANs) name, or what they hold instead.
fn peer_of_names(names: &[GeneralName<'_>]) -> std::result::Result<PeerId, String> {
    let [GeneralName::URI(uri)] = names else {
        return Err(format!("its names are [{}]", describe(names)));
    };
    let rest = uri.strip_prefix(PEER_URI_PREFIX).ok_or_else(|| {
        format!(
            "its URI {:?} does not begin with {PEER_URI_PREFIX}",
            shorten(uri)
        )
    })?;
    // The install is a label (no '/'), so the first "/node/" is the separator; whatever a
    // second one would make of the node, node names have no '/' and refuse it.
    let (install, node) = rest.split_once("/node/").ok_or_else(|| {
        format!(
            "its URI {:?} is not {PEER_URI_PREFIX}<install>/node/<node>",
            shorten(uri)
        )
    })?;
    validate_install_name(install).map_err(|e| e.to_string())?;
    validate_node_name(node).map_err(|e| e.to_string())?;
    Ok(PeerId {
        install: install.to_owned(),
        node: node.to_owned(),
    })
}

/// The authenticated peer of a connection made with [`peering_server_config`] or
/// [`peering_client_config`], from its end-entity certificate: on the server, the install
/// and node that connected (its chain verified against that install's CAs alone); on the
/// client, the node of the expected install that answered. Valid once the handshake has
/// completed.
pub fn peer_id(conn: &rustls::CommonState) -> Result<PeerId> {
    let end_entity = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or(Error::NoPeerCertificate)?;
    peer_of(end_entity)
}

/// The installs this one trusts, each with its peering CA bundle: what the admins'
/// `FerryPeer` objects say. Each bundle obeys [`Trust::from_pem`]'s rules (bounded, CA
/// certificates only, not empty). An empty set is allowed (peering on, no peer yet); a
/// listener built from it refuses every client.
#[derive(Debug, Clone, Default)]
pub struct PeerSet {
    peers: BTreeMap<String, Trust>,
    /// Each CA's public key (its SPKI), and the install whose bundle holds it.
    keys: HashMap<Vec<u8>, String>,
}

impl PeerSet {
    /// Reads `(install name, bundle PEM)` pairs, each as [`PeerSet::insert`] takes it, and
    /// more than [`MAX_PEERS`] refused before any parsing.
    pub fn new(peers: Vec<(String, String)>) -> Result<PeerSet> {
        if peers.len() > MAX_PEERS {
            return Err(Error::TooManyPeers {
                count: peers.len(),
                max: MAX_PEERS,
            });
        }
        let mut set = PeerSet::default();
        for (install, bundle_pem) in peers {
            set.insert(install, &bundle_pem)?;
        }
        Ok(set)
    }

    /// Adds `install` with its bundle `bundle_pem`, or leaves the set as it was and says
    /// why not: the set already holds [`MAX_PEERS`], an install name that is not one, the
    /// same install twice, a bundle [`Trust::from_pem`] refuses, or a CA key found in the
    /// bundle of another install (a client is held to the CAs of the install it names,
    /// which means nothing if another install's CA can sign for it too).
    pub fn insert(&mut self, install: String, bundle_pem: &str) -> Result<()> {
        if self.peers.len() >= MAX_PEERS {
            return Err(Error::TooManyPeers {
                count: self.peers.len() + 1,
                max: MAX_PEERS,
            });
        }
        validate_install_name(&install)?;
        if self.peers.contains_key(&install) {
            return Err(Error::DuplicatePeer { install });
        }
        let trust = Trust::from_pem(bundle_pem).map_err(|e| Error::PeerBundle {
            install: install.clone(),
            source: Box::new(e),
        })?;
        let keys: Vec<Vec<u8>> = trust
            .roots
            .roots
            .iter()
            .map(|anchor| anchor.subject_public_key_info.as_ref().to_vec())
            .collect();
        if let Some(first) = keys.iter().find_map(|k| self.keys.get(k)) {
            return Err(Error::SharedPeerCa {
                first: first.clone(),
                second: install,
            });
        }
        for key in keys {
            self.keys.insert(key, install.clone());
        }
        self.peers.insert(install, trust);
        Ok(())
    }

    /// How many installs are trusted.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// True when no install is trusted.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Whether `install` is one of the trusted installs.
    pub fn contains(&self, install: &str) -> bool {
        self.peers.contains_key(install)
    }

    /// The trusted installs, in name order.
    pub fn installs(&self) -> impl Iterator<Item = &str> {
        self.peers.keys().map(String::as_str)
    }
}

/// The peering listener: presents `own_chain_pem` (a peering certificate of this install
/// first, as [`crate::Ca::sign_peer`] writes it) with `own_key_pem`, and requires every
/// client to present a peering certificate that chains to the CAs of the very install it
/// names, which must be in `peers`. Who connected is then [`peer_id`]. TLS 1.3 only,
/// [`PEERING_ALPN`], no session tickets or storage (as [`crate::server_config`]).
///
/// A client that offers no ALPN at all is not refused by rustls (only one offering other
/// protocols is); it still needs a trusted peering certificate, and a caller that must be
/// sure of the protocol checks `alpn_protocol()` after the handshake.
pub fn peering_server_config(
    peers: &PeerSet,
    own_chain_pem: &str,
    own_key_pem: &str,
) -> Result<Arc<ServerConfig>> {
    let identity = own_peer_identity(own_chain_pem, own_key_pem)?;
    let provider = provider();
    let mut by_install = BTreeMap::new();
    for (install, trust) in &peers.peers {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(trust.roots.clone(), provider.clone())
                // The hints would list every peer's CA names to any client; rustls clients
                // pick their one certificate regardless.
                .clear_root_hint_subjects()
                .build()?;
        by_install.insert(install.clone(), verifier);
    }
    let clients = PeerClientVerifier {
        by_install,
        algorithms: provider.signature_verification_algorithms,
    };
    tls13_server(provider, Arc::new(clients), identity, PEERING_ALPN)
}

/// A reader's side, dialling another install's export: presents `own_chain_pem` (a peering
/// certificate of this install) with `own_key_pem`, and accepts the server only if its chain
/// verifies against the CA(s) of `export_ca_pem` alone ([`Trust::from_pem`]'s rules; nothing
/// else is trusted, whatever other peers exist) and its certificate is a peering certificate
/// of `expected_install` (any of its nodes: the export's address may lead to any). TLS 1.3,
/// [`PEERING_ALPN`], no resumption, no SNI; connect with [`crate::server_name`].
pub fn peering_client_config(
    export_ca_pem: &str,
    expected_install: &str,
    own_chain_pem: &str,
    own_key_pem: &str,
) -> Result<Arc<ClientConfig>> {
    validate_install_name(expected_install)?;
    let trust = Trust::from_pem(export_ca_pem).map_err(|e| Error::ExportCa(Box::new(e)))?;
    let identity = own_peer_identity(own_chain_pem, own_key_pem)?;
    let provider = provider();
    let verifier = PeerServerVerifier {
        roots: trust.roots,
        algorithms: provider.signature_verification_algorithms,
        expected_install: expected_install.to_owned(),
    };
    tls13_client(provider, Arc::new(verifier), identity, PEERING_ALPN)
}

/// An agent's own peering chain and key, read and checked to be a peering certificate
/// ([`own_identity`]), so that passing the in-cluster node certificate (or a CA) by mistake
/// fails here rather than at every peer's handshake.
fn own_peer_identity(chain_pem: &str, key_pem: &str) -> Result<OwnIdentity> {
    own_identity(
        "peering certificate chain",
        "peering private key",
        chain_pem,
        key_pem,
        peer_of,
    )
}

/// The listener's check of a client. The install is read from the client's (not yet
/// verified) end-entity certificate only to choose whose CAs to verify against; the chain is
/// then verified by that install's own `WebPkiClientVerifier`, delegated to. Delegating
/// rather than calling webpki's `verify_for_usage` here: it is rustls' own client check
/// (signatures, validity, clientAuth, errors mapped to rustls') with nothing to get wrong,
/// and building one per install is what confines each install to its CAs. One verifier over
/// all the peers' CAs would not do: a CA of install X would vouch for a certificate naming Y.
#[derive(Debug)]
struct PeerClientVerifier {
    by_install: BTreeMap<String, Arc<dyn ClientCertVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for PeerClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let peer = peer_of(end_entity).map_err(refuse)?;
        let Some(verifier) = self.by_install.get(&peer.install) else {
            return Err(refuse(Error::UnknownPeer {
                install: peer.install,
            }));
        };
        verifier.verify_client_cert(end_entity, intermediates, now)
    }

    signatures_by_algorithms!();
}

/// The reader's check of the server: rustls' webpki chain verification against the export's
/// CA, then the install in place of the DNS-name check, for the reason `NodeServerVerifier`
/// in tls.rs gives (a URI-only certificate cannot pass `WebPkiServerVerifier`'s name check).
#[derive(Debug)]
struct PeerServerVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
    expected_install: String,
}

impl ServerCertVerifier for PeerServerVerifier {
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
                let peer = peer_of(cert)?;
                if peer.install != self.expected_install {
                    return Err(Error::WrongInstall {
                        expected: self.expected_install.clone(),
                        presented: peer.install,
                    });
                }
                Ok(())
            },
        )
    }

    signatures_by_algorithms!();
}

/// One certificate of a bundle, as an admin compares it with what the other install's admin
/// reads out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaSummary {
    /// SHA-256 of the certificate's DER, uppercase hex pairs joined by ':', as
    /// `openssl x509 -noout -fingerprint -sha256` prints it.
    pub fingerprint: String,
    /// The subject's distinguished name (cut to a readable length: it is whatever the
    /// bundle's author wrote).
    pub subject: String,
    /// When the certificate expires.
    pub not_after: SystemTime,
    /// Whether it is a CA certificate (basicConstraints CA:true); a bundle [`PeerSet`]
    /// accepts holds only these.
    pub is_ca: bool,
}

/// Every certificate in `bundle_pem`, in order, summarized: for an operator to show admins
/// what a bundle holds, including what [`PeerSet::new`] would refuse (a non-CA is described
/// with `is_ca: false`, an empty bundle as no entry). Refused: a PEM over
/// [`MAX_BUNDLE_PEM`] (before parsing), a block that does not decode, a certificate that
/// does not parse.
pub fn describe_bundle(bundle_pem: &str) -> Result<Vec<CaSummary>> {
    const WHAT: &str = "CA bundle";
    pem::bounded(WHAT, bundle_pem, MAX_BUNDLE_PEM)?;
    pem::certificates(WHAT, bundle_pem)?
        .iter()
        .map(|der| {
            let (_, cert) = X509Certificate::from_der(der).map_err(|e| Error::Der {
                what: "CA bundle certificate",
                why: e.to_string(),
            })?;
            Ok(CaSummary {
                fingerprint: fingerprint(der),
                subject: shorten(&cert.subject().to_string()),
                not_after: system_time(cert.validity().not_after.timestamp()),
                is_ca: cert.is_ca(),
            })
        })
        .collect()
}

/// SHA-256 of `der` in openssl's notation.
fn fingerprint(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Seconds since the epoch, either side of it; a time beyond `SystemTime`'s range (a
/// certificate may say year 9999) is put at the epoch rather than failing the description.
fn system_time(seconds: i64) -> SystemTime {
    let magnitude = Duration::from_secs(seconds.unsigned_abs());
    let t = if seconds >= 0 {
        UNIX_EPOCH.checked_add(magnitude)
    } else {
        UNIX_EPOCH.checked_sub(magnitude)
    };
    t.unwrap_or(UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::node_uri;

    #[test]
    fn the_not_a_peer_message_names_the_uri_prefix() {
        let e = Error::NotAPeer { why: "none".into() }.to_string();
        assert!(
            e.contains(&format!("{PEER_URI_PREFIX}<install>/node/<node>")),
            "{e}"
        );
    }

    #[test]
    fn install_names_follow_dns_label_rules() {
        for good in ["east", "a", "0", "prod-eu-1", &"a".repeat(63)] {
            assert!(validate_install_name(good).is_ok(), "{good:?} should pass");
        }
        for bad in [
            "",
            "East",
            "east_1",
            "east.example",
            "a/b",
            "-a",
            "a-",
            "é",
            " east",
            &"a".repeat(64),
        ] {
            assert!(
                validate_install_name(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn an_install_name_refusal_says_what_to_change_and_is_cut_short() {
        let e = validate_install_name(&"A".repeat(10_000))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("DNS label"), "{e}");
        assert!(e.len() < 500, "{} bytes of message", e.len());
    }

    #[test]
    fn the_peer_uri_reads_back_as_its_install_and_node() {
        let uri = peer_uri("east", "ip-10-0-0-1.ec2.internal");
        assert_eq!(
            peer_of_names(&[GeneralName::URI(&uri)]),
            Ok(PeerId {
                install: "east".into(),
                node: "ip-10-0-0-1.ec2.internal".into(),
            })
        );
    }

    #[test]
    fn nothing_but_one_well_formed_peer_uri_is_a_peer() {
        let uri = peer_uri("east", "node-a");
        for bad in [
            // The in-cluster form is not a peer.
            node_uri("node-a"),
            "spiffe://other.dev/install/east/node/node-a".into(),
            format!("{PEER_URI_PREFIX}east"),
            format!("{PEER_URI_PREFIX}east/node/"),
            format!("{PEER_URI_PREFIX}/node/node-a"),
            format!("{PEER_URI_PREFIX}east/nodes/node-a"),
            format!("{PEER_URI_PREFIX}East/node/node-a"),
            format!("{PEER_URI_PREFIX}east.example/node/node-a"),
            format!("{PEER_URI_PREFIX}east/node/node-a/node/b"),
            format!("{PEER_URI_PREFIX}a/b/node/node-a"),
            format!("{PEER_URI_PREFIX}east/node/node-a#x"),
            format!("{uri}/"),
        ] {
            assert!(
                peer_of_names(&[GeneralName::URI(&bad)]).is_err(),
                "{bad:?} should be refused"
            );
        }
        assert!(peer_of_names(&[]).is_err());
        assert!(peer_of_names(&[GeneralName::DNSName("node-a")]).is_err());
        assert!(peer_of_names(&[GeneralName::URI(&uri), GeneralName::URI(&uri)]).is_err());
        assert!(peer_of_names(&[GeneralName::URI(&uri), GeneralName::DNSName("node-a")]).is_err());
    }

    #[test]
    fn a_peer_uri_is_not_a_node() {
        let uri = peer_uri("east", "node-a");
        assert!(crate::identity::node_of_names(&[GeneralName::URI(&uri)]).is_err());
    }

    #[test]
    fn a_refused_uri_is_cut_short_in_the_message() {
        let long = format!("{PEER_URI_PREFIX}{}", "x".repeat(10_000));
        let why = peer_of_names(&[GeneralName::URI(&long)])
            .err()
            .unwrap_or_default();
        assert!(why.len() < 500, "{} bytes of message", why.len());
    }

    #[test]
    fn fingerprints_are_uppercase_hex_pairs_joined_by_colons() {
        let f = fingerprint(b"");
        // SHA-256 of nothing.
        assert!(f.starts_with("E3:B0:C4:42:98:FC:1C:14"), "{f}");
        assert_eq!(f.len(), 32 * 3 - 1);
    }

    #[test]
    fn times_before_and_after_the_epoch_convert() {
        assert_eq!(system_time(0), UNIX_EPOCH);
        assert_eq!(system_time(60), UNIX_EPOCH + Duration::from_secs(60));
        assert_eq!(system_time(-60), UNIX_EPOCH - Duration::from_secs(60));
    }
}
