//! Real TLS handshakes between two installs, "east" (the source, listening) and "west" (a
//! reader, dialling), each with its own peering CA: which certificates each side accepts,
//! what each learns of the other, and that a refused peer never gets application bytes to
//! the server. Also the peer set's and the bundle description's rules. The two ends are
//! joined by an in-memory duplex stream: nothing here depends on the network.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use ferry_link::{
    describe_bundle, peer_id, peering_client_config, peering_server_config, Ca, Error, NodeKey,
    PeerId, PeerSet, ALPN, MAX_PEERS, PEERING_ALPN,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{CertificateError, ClientConfig, ProtocolVersion, ServerConfig};
use tokio::time::timeout;

mod common;
use common::node as in_cluster;
use common::{
    assert_client_got_nothing, assert_client_refused, assert_server_read_nothing,
    assert_server_refused, ours, raw_client, Identity, DAY, PATIENCE,
};

const SECRET: &[u8] = b"export 4f1c of shop/db-data, shard 2: the bytes of /orders.db";

type ServerSaw = common::ServerSaw<PeerId>;
type ClientSaw = common::ClientSaw<PeerId>;

/// `node` of `install`, signed by `ca` for a day, by the real CSR path.
fn peer(ca: &Ca, install: &str, node: &str) -> Result<Identity> {
    let key = NodeKey::generate(node)?;
    let cert_pem = ca.sign_peer(&key.csr_pem, install, node, DAY)?;
    Ok(Identity {
        cert_pem,
        key_pem: key.key_pem,
    })
}

fn peers(list: &[(&str, &Ca)]) -> Result<PeerSet> {
    Ok(PeerSet::new(
        list.iter()
            .map(|(install, ca)| (install.to_string(), ca.cert_pem().to_owned()))
            .collect(),
    )?)
}

fn server(peers: &PeerSet, who: &Identity) -> Result<Arc<ServerConfig>> {
    Ok(peering_server_config(peers, &who.cert_pem, &who.key_pem)?)
}

fn client(export_ca: &Ca, expect: &str, who: &Identity) -> Result<Arc<ClientConfig>> {
    Ok(peering_client_config(
        export_ca.cert_pem(),
        expect,
        &who.cert_pem,
        &who.key_pem,
    )?)
}

/// The two installs of most tests, with east's listener trusting west.
struct Pair {
    east_ca: Ca,
    west_ca: Ca,
    east: Identity,
    west: Identity,
}

fn pair() -> Result<Pair> {
    let east_ca = Ca::generate("east peering CA")?;
    let west_ca = Ca::generate("west peering CA")?;
    let east = peer(&east_ca, "east", "node-e1")?;
    let west = peer(&west_ca, "west", "node-w1")?;
    Ok(Pair {
        east_ca,
        west_ca,
        east,
        west,
    })
}

impl Pair {
    /// east's listener, trusting west alone.
    fn east_listener(&self) -> Result<Arc<ServerConfig>> {
        server(&peers(&[("west", &self.west_ca)])?, &self.east)
    }

    /// A reader of an export of east (its CA and install) presenting `who`.
    fn east_reader(&self, who: &Identity) -> Result<Arc<ClientConfig>> {
        client(&self.east_ca, "east", who)
    }
}

/// One connection over an in-memory stream ([`common::serve`] and [`common::connect`], each
/// learning who is at the other end): the client writes [`SECRET`].
async fn exchange(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
) -> Result<(ServerSaw, ClientSaw)> {
    let (client_end, server_end) = tokio::io::duplex(64 * 1024);
    // An outsider's client (AnyServer) may face a server that is no peer; it is the server's
    // refusal that these tests are about.
    let answered = |conn: &rustls::CommonState| {
        Ok(peer_id(conn).unwrap_or(PeerId {
            install: String::new(),
            node: String::new(),
        }))
    };
    let both = async {
        tokio::join!(
            common::serve(server, server_end, peer_id),
            common::connect(client, client_end, SECRET, answered)
        )
    };
    let (server_saw, client_saw) = timeout(PATIENCE, both).await.context("a side hung")?;
    Ok((server_saw?, client_saw?))
}

/// The chain does not lead to a trusted CA: no CA of that name (`UnknownIssuer`), or one of
/// that name whose key did not sign it (`BadSignature`: an impostor CA copying the name).
fn is_not_vouched_for(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature
        )
    )
}

#[tokio::test]
async fn a_west_reader_connects_to_east_and_each_learns_the_others_install_and_node() -> Result<()>
{
    let p = pair()?;

    let (server_saw, client_saw) = exchange(p.east_listener()?, p.east_reader(&p.west)?).await?;

    let ServerSaw::Connected {
        peer,
        version,
        suite,
        read,
    } = server_saw
    else {
        bail!("the server refused: {server_saw:?}");
    };
    assert_eq!(
        peer,
        PeerId {
            install: "west".into(),
            node: "node-w1".into()
        },
        "the server learns which install and node connected"
    );
    assert_eq!(version, Some(ProtocolVersion::TLSv1_3));
    // The cheaper AES, as between nodes of one install.
    assert_eq!(suite, Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256));
    assert_eq!(read?, SECRET);
    let ClientSaw::Connected { peer, alpn, echo } = client_saw else {
        bail!("the client refused: {client_saw:?}");
    };
    assert_eq!(
        peer,
        PeerId {
            install: "east".into(),
            node: "node-e1".into()
        },
        "the client learns which node of east answered"
    );
    assert_eq!(alpn.as_deref(), Some(PEERING_ALPN));
    assert_eq!(echo?, SECRET, "bytes round-trip");
    Ok(())
}

#[tokio::test]
async fn a_client_from_a_ca_not_in_the_set_is_refused_even_naming_a_trusted_install() -> Result<()>
{
    let p = pair()?;
    let rogue_ca = Ca::generate("west peering CA")?;
    let impostor = peer(&rogue_ca, "west", "node-w1")?;

    let (server_saw, client_saw) = exchange(p.east_listener()?, p.east_reader(&impostor)?).await?;

    assert_server_refused(&server_saw, is_not_vouched_for);
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_signed_by_west_naming_south_is_refused_though_south_is_trusted() -> Result<()> {
    let p = pair()?;
    let south_ca = Ca::generate("south peering CA")?;
    let trusted = peers(&[("west", &p.west_ca), ("south", &south_ca)])?;
    let spoof = peer(&p.west_ca, "south", "node-s1")?;

    let (server_saw, client_saw) =
        exchange(server(&trusted, &p.east)?, p.east_reader(&spoof)?).await?;

    // Verified against south's CA alone, which did not sign it.
    assert_server_refused(&server_saw, is_not_vouched_for);
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_signed_by_west_naming_east_itself_is_refused() -> Result<()> {
    let p = pair()?;
    let spoof = peer(&p.west_ca, "east", "node-e1")?;

    let (server_saw, client_saw) = exchange(p.east_listener()?, p.east_reader(&spoof)?).await?;

    assert_server_refused(
        &server_saw,
        |e| matches!(ours(e), Some(Error::UnknownPeer { install }) if install == "east"),
    );
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_of_an_install_not_in_the_set_is_refused() -> Result<()> {
    let p = pair()?;
    let north_ca = Ca::generate("north peering CA")?;
    let north = peer(&north_ca, "north", "node-n1")?;

    let (server_saw, client_saw) = exchange(p.east_listener()?, p.east_reader(&north)?).await?;

    assert_server_refused(
        &server_saw,
        |e| matches!(ours(e), Some(Error::UnknownPeer { install }) if install == "north"),
    );
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() -> Result<()> {
    let p = pair()?;

    let (server_saw, client_saw) = exchange(
        p.east_listener()?,
        raw_client(&rustls::version::TLS13, None, PEERING_ALPN)?,
    )
    .await?;

    assert_server_refused(&server_saw, |e| {
        matches!(e, rustls::Error::NoCertificatesPresented)
    });
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_presenting_an_in_cluster_node_certificate_of_a_trusted_ca_is_refused(
) -> Result<()> {
    let p = pair()?;
    let node = in_cluster(&p.west_ca, "node-w1")?;
    // The reader's own configuration refuses it before any connection.
    assert!(matches!(
        peering_client_config(p.east_ca.cert_pem(), "east", &node.cert_pem, &node.key_pem),
        Err(Error::NotAPeer { .. })
    ));

    let (server_saw, client_saw) = exchange(
        p.east_listener()?,
        raw_client(&rustls::version::TLS13, Some(&node), PEERING_ALPN)?,
    )
    .await?;

    assert_server_refused(&server_saw, |e| {
        matches!(ours(e), Some(Error::NotAPeer { .. }))
    });
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_reader_refuses_a_server_of_another_install_than_the_export_names() -> Result<()> {
    let p = pair()?;

    let (server_saw, client_saw) =
        exchange(p.east_listener()?, client(&p.east_ca, "south", &p.west)?).await?;

    assert_client_refused(&client_saw, |e| {
        matches!(ours(e), Some(Error::WrongInstall { expected, presented })
            if expected == "south" && presented == "east")
    });
    assert_server_read_nothing(&server_saw);
    Ok(())
}

#[tokio::test]
async fn a_reader_refuses_a_server_certified_by_another_ca_than_the_exports() -> Result<()> {
    let p = pair()?;
    let trusted = peers(&[("west", &p.west_ca)])?;
    let rogue_ca = Ca::generate("east peering CA")?;
    let impostor = peer(&rogue_ca, "east", "node-e1")?;

    let (server_saw, client_saw) =
        exchange(server(&trusted, &impostor)?, p.east_reader(&p.west)?).await?;

    assert_client_refused(&client_saw, is_not_vouched_for);
    assert_server_read_nothing(&server_saw);
    Ok(())
}

#[tokio::test]
async fn a_tls_1_2_client_is_refused_even_with_a_trusted_certificate() -> Result<()> {
    let p = pair()?;

    let (server_saw, client_saw) = exchange(
        p.east_listener()?,
        raw_client(&rustls::version::TLS12, Some(&p.west), PEERING_ALPN)?,
    )
    .await?;

    assert_server_refused(&server_saw, |e| {
        matches!(e, rustls::Error::PeerIncompatible(_))
    });
    assert!(
        matches!(client_saw, ClientSaw::Refused(_)),
        "the TLS 1.2 client connected: {client_saw:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_client_offering_the_in_cluster_protocol_is_refused() -> Result<()> {
    let p = pair()?;

    let (server_saw, client_saw) = exchange(
        p.east_listener()?,
        raw_client(&rustls::version::TLS13, Some(&p.west), ALPN)?,
    )
    .await?;

    assert_server_refused(&server_saw, |e| {
        matches!(e, rustls::Error::NoApplicationProtocol)
    });
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[test]
fn a_listener_refuses_an_own_certificate_that_is_not_a_peering_one() -> Result<()> {
    let p = pair()?;
    let trusted = peers(&[("west", &p.west_ca)])?;
    let node = in_cluster(&p.east_ca, "node-e1")?;
    assert!(matches!(
        peering_server_config(&trusted, &node.cert_pem, &node.key_pem),
        Err(Error::NotAPeer { .. })
    ));
    assert!(matches!(
        peering_server_config(&trusted, p.east_ca.cert_pem(), &p.east.key_pem),
        Err(Error::NotAPeer { .. })
    ));
    Ok(())
}

#[test]
fn a_reader_refuses_an_export_ca_that_is_not_a_ca() -> Result<()> {
    let p = pair()?;
    let refused =
        peering_client_config(&p.east.cert_pem, "east", &p.west.cert_pem, &p.west.key_pem);
    assert!(
        matches!(&refused, Err(Error::ExportCa(inner)) if matches!(**inner, Error::NotCa { .. })),
        "{refused:?}"
    );
    Ok(())
}

#[test]
fn a_peering_certificate_names_its_install_and_node_and_keeps_the_node_extensions() -> Result<()> {
    let p = pair()?;
    let der = CertificateDer::from_pem_slice(p.west.cert_pem.as_bytes())?;
    assert_eq!(
        ferry_link::peer_of(&der)?,
        PeerId {
            install: "west".into(),
            node: "node-w1".into()
        }
    );
    // Not an in-cluster node certificate.
    assert!(matches!(
        ferry_link::node_of(&der),
        Err(Error::NotANode { .. })
    ));
    let (_, cert) = x509_parser::parse_x509_certificate(&der)?;
    assert!(!cert.is_ca());
    let usage = cert.key_usage()?.context("no key usage")?.value;
    assert!(usage.digital_signature() && !usage.key_cert_sign());
    let eku = cert
        .extended_key_usage()?
        .context("no extended key usage")?
        .value;
    assert!(eku.server_auth && eku.client_auth);
    Ok(())
}

#[test]
fn sign_peer_checks_the_csr_and_the_install_name() -> Result<()> {
    let ca = Ca::generate("west peering CA")?;
    let key = NodeKey::generate("node-w1")?;
    assert!(matches!(
        ca.sign_peer(&key.csr_pem, "west", "node-w2", DAY),
        Err(Error::CsrNames { .. })
    ));
    assert!(matches!(
        ca.sign_peer(&key.csr_pem, "West", "node-w1", DAY),
        Err(Error::InstallName { .. })
    ));
    assert!(matches!(
        ca.sign_peer(&key.csr_pem, "west", "node-w1", Duration::ZERO),
        Err(Error::Validity { .. })
    ));
    Ok(())
}

#[test]
fn describe_bundle_gives_each_certificates_sha256_fingerprint_as_openssl_prints_it() -> Result<()> {
    let p = pair()?;
    let bundle = format!("{}{}", p.east_ca.cert_pem(), p.west.cert_pem);
    let summaries = describe_bundle(&bundle)?;
    let blocks = pem::parse_many(&bundle)?;
    assert_eq!(summaries.len(), 2);
    assert_eq!(blocks.len(), 2);
    for (summary, block) in summaries.iter().zip(&blocks) {
        let digest = ring::digest::digest(&ring::digest::SHA256, block.contents());
        let expected: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(summary.fingerprint, expected.join(":"));
        assert_eq!(summary.fingerprint.len(), 32 * 3 - 1);
        assert!(summary.fingerprint.split(':').all(|pair| pair.len() == 2
            && pair
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())));
    }
    let (ca, leaf) = (&summaries[0], &summaries[1]);
    assert!(ca.is_ca && !leaf.is_ca);
    assert_eq!(ca.subject, "CN=east peering CA");
    assert_eq!(leaf.subject, "CN=node-w1");
    let now = SystemTime::now();
    assert!(ca.not_after > now + 9 * 365 * DAY, "{:?}", ca.not_after);
    assert!(
        leaf.not_after > now && leaf.not_after <= now + DAY,
        "{:?}",
        leaf.not_after
    );
    assert!(describe_bundle("")?.is_empty());
    assert!(matches!(
        describe_bundle(&"x".repeat(ferry_link::MAX_BUNDLE_PEM + 1)),
        Err(Error::TooLarge { .. })
    ));
    Ok(())
}

#[test]
fn a_peer_bundle_holding_a_non_ca_certificate_is_refused() -> Result<()> {
    let p = pair()?;
    let bundle = format!("{}{}", p.west_ca.cert_pem(), p.west.cert_pem);
    let refused = PeerSet::new(vec![("west".into(), bundle)]);
    assert!(
        matches!(&refused, Err(Error::PeerBundle { install, source })
            if install == "west" && matches!(**source, Error::NotCa { .. })),
        "{refused:?}"
    );
    Ok(())
}

#[test]
fn an_install_listed_twice_is_refused() -> Result<()> {
    let p = pair()?;
    let refused = PeerSet::new(vec![
        ("west".into(), p.west_ca.cert_pem().into()),
        ("west".into(), p.east_ca.cert_pem().into()),
    ]);
    assert!(
        matches!(&refused, Err(Error::DuplicatePeer { install }) if install == "west"),
        "{refused:?}"
    );
    Ok(())
}

#[test]
fn two_installs_with_one_ca_are_refused() -> Result<()> {
    let p = pair()?;
    let refused = PeerSet::new(vec![
        ("west".into(), p.west_ca.cert_pem().into()),
        (
            "south".into(),
            format!("{}{}", p.east_ca.cert_pem(), p.west_ca.cert_pem()),
        ),
    ]);
    assert!(
        matches!(&refused, Err(Error::SharedPeerCa { first, second })
            if first == "west" && second == "south"),
        "{refused:?}"
    );
    Ok(())
}

#[test]
fn an_install_refused_by_insert_leaves_the_set_as_it_was() -> Result<()> {
    let p = pair()?;
    let mut set = PeerSet::default();
    set.insert("west".into(), p.west_ca.cert_pem())?;
    // East's CA with west's: refused whole, so east's own CA is not taken either.
    let both = format!("{}{}", p.east_ca.cert_pem(), p.west_ca.cert_pem());
    assert!(set.insert("east".into(), &both).is_err());
    assert_eq!(set.installs().collect::<Vec<_>>(), ["west"]);
    set.insert("east".into(), p.east_ca.cert_pem())?;
    assert_eq!(set.installs().collect::<Vec<_>>(), ["east", "west"]);
    Ok(())
}

#[test]
fn a_peer_set_is_bounded_and_its_names_checked() -> Result<()> {
    let p = pair()?;
    let one = |install: &str| (install.to_owned(), p.west_ca.cert_pem().to_owned());
    let many: Vec<_> = (0..=MAX_PEERS).map(|i| one(&format!("p{i}"))).collect();
    assert!(matches!(
        PeerSet::new(many),
        Err(Error::TooManyPeers { count, max }) if count == MAX_PEERS + 1 && max == MAX_PEERS
    ));
    assert!(matches!(
        PeerSet::new(vec![one("West")]),
        Err(Error::InstallName { .. })
    ));
    assert!(matches!(
        PeerSet::new(vec![("west".into(), String::new())]),
        Err(Error::PeerBundle { .. })
    ));
    let set = PeerSet::new(vec![one("west")])?;
    assert_eq!(set.installs().collect::<Vec<_>>(), ["west"]);
    assert!(set.contains("west") && !set.contains("east"));
    Ok(())
}
