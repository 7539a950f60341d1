//! Real TLS handshakes over loopback TCP (a server on 127.0.0.2, clients from 127.0.0.3):
//! which agents may connect to which, what each side learns of the other, and that a refused
//! peer never gets application bytes to the server. Each test writes a secret once the client
//! believes it is connected and checks what the server read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use ferry_link::{client_config, peer_node, server_config, Ca, NodeKey, Trust, ALPN};
use rustls::{CertificateError, ClientConfig, ProtocolVersion, ServerConfig};
use tokio::net::{TcpListener, TcpSocket};
use tokio::time::timeout;

mod common;
use common::{
    assert_client_got_nothing, assert_client_refused, assert_server_read_nothing,
    assert_server_refused, node, ours, raw_client, Identity, DAY, PATIENCE,
};

const SECRET: &[u8] = b"shard 7 of job tenant-a/nightly: the bytes of /data/payroll.db";

type ServerSaw = common::ServerSaw<String>;
type ClientSaw = common::ClientSaw<String>;

fn trust(cas: &[&Ca]) -> Result<Trust> {
    let bundle: String = cas.iter().map(|ca| ca.cert_pem()).collect();
    Ok(Trust::from_pem(&bundle)?)
}

fn server(trust: &Trust, who: &Identity) -> Result<Arc<ServerConfig>> {
    Ok(server_config(trust, &who.cert_pem, &who.key_pem)?)
}

fn client(trust: &Trust, who: &Identity, expect: &str) -> Result<Arc<ClientConfig>> {
    Ok(client_config(trust, &who.cert_pem, &who.key_pem, expect)?)
}

/// One connection from 127.0.0.3 to a server on 127.0.0.2 ([`common::serve`] and
/// [`common::connect`], each learning the other's node): the client writes [`SECRET`].
async fn exchange(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
) -> Result<(ServerSaw, ClientSaw)> {
    let listener = TcpListener::bind("127.0.0.2:0").await?;
    let addr = listener.local_addr()?;
    let serving = tokio::spawn(async move {
        let (tcp, from) = listener.accept().await?;
        anyhow::ensure!(
            from.ip().to_string() == "127.0.0.3",
            "a stray connection from {from}"
        );
        common::serve(server, tcp, peer_node).await
    });
    let client_saw = timeout(PATIENCE, connect(addr, client))
        .await
        .context("the client hung")??;
    let server_saw = timeout(PATIENCE, serving)
        .await
        .context("the server hung")???;
    Ok((server_saw, client_saw))
}

async fn connect(addr: SocketAddr, client: Arc<ClientConfig>) -> Result<ClientSaw> {
    let socket = TcpSocket::new_v4()?;
    socket.bind("127.0.0.3:0".parse()?)?;
    let tcp = socket.connect(addr).await?;
    common::connect(client, tcp, SECRET, peer_node).await
}

#[tokio::test]
async fn nodes_of_one_install_connect_and_each_learns_the_others_node() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let trust = trust(&[&ca])?;
    let (a, b) = (node(&ca, "node-a")?, node(&ca, "node-b")?);

    let (server_saw, client_saw) =
        exchange(server(&trust, &a)?, client(&trust, &b, "node-a")?).await?;

    let ServerSaw::Connected {
        peer,
        version,
        suite,
        read,
    } = server_saw
    else {
        bail!("the server refused: {server_saw:?}");
    };
    assert_eq!(peer, "node-b", "the server learns which node connected");
    assert_eq!(version, Some(ProtocolVersion::TLSv1_3));
    // The cheaper AES: every byte a copy moves between nodes is encrypted.
    assert_eq!(suite, Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256));
    assert_eq!(read?, SECRET);
    let ClientSaw::Connected { peer, alpn, echo } = client_saw else {
        bail!("the client refused: {client_saw:?}");
    };
    assert_eq!(peer, "node-a", "the client verified the node it dialled");
    assert_eq!(alpn.as_deref(), Some(ALPN));
    assert_eq!(echo?, SECRET, "bytes round-trip");
    Ok(())
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused_before_the_server_reads_a_byte() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let trust = trust(&[&ca])?;
    let a = node(&ca, "node-a")?;

    let (server_saw, client_saw) = exchange(
        server(&trust, &a)?,
        raw_client(&rustls::version::TLS13, None, ALPN)?,
    )
    .await?;

    assert_server_refused(&server_saw, |e| {
        matches!(e, rustls::Error::NoCertificatesPresented)
    });
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_certified_by_another_ca_is_refused_even_with_a_real_node_name() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let rogue = Ca::generate("ferry install CA")?;
    let trust = trust(&[&ca])?;
    let a = node(&ca, "node-a")?;
    let impostor = node(&rogue, "node-b")?;

    let (server_saw, client_saw) =
        exchange(server(&trust, &a)?, client(&trust, &impostor, "node-a")?).await?;

    assert_server_refused(&server_saw, |e| {
        matches!(e, rustls::Error::InvalidCertificate(_))
    });
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_that_dialled_node_c_refuses_a_server_that_is_node_a() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let trust = trust(&[&ca])?;
    let (a, b) = (node(&ca, "node-a")?, node(&ca, "node-b")?);

    let (server_saw, client_saw) =
        exchange(server(&trust, &a)?, client(&trust, &b, "node-c")?).await?;

    assert_client_refused(&client_saw, |e| {
        matches!(ours(e), Some(ferry_link::Error::WrongNode { expected, presented })
            if expected == "node-c" && presented == "node-a")
    });
    assert_server_read_nothing(&server_saw);
    Ok(())
}

#[tokio::test]
async fn a_client_whose_certificate_expired_is_refused() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let trust = trust(&[&ca])?;
    let a = node(&ca, "node-a")?;
    let expired = expired_node(&ca, "node-b")?;

    let (server_saw, client_saw) =
        exchange(server(&trust, &a)?, client(&trust, &expired, "node-a")?).await?;

    assert_server_refused(&server_saw, is_expired);
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_server_whose_certificate_expired_is_refused_by_the_client() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let trust = trust(&[&ca])?;
    let expired = expired_node(&ca, "node-a")?;
    let b = node(&ca, "node-b")?;

    let (_, client_saw) =
        exchange(server(&trust, &expired)?, client(&trust, &b, "node-a")?).await?;

    assert_client_refused(&client_saw, is_expired);
    Ok(())
}

/// Signed for two days ago to one day ago.
fn expired_node(ca: &Ca, name: &str) -> Result<Identity> {
    let key = NodeKey::generate(name)?;
    let now = SystemTime::now();
    let cert_pem = ca.sign_node_at(&key.csr_pem, name, now - 2 * DAY, now - DAY)?;
    Ok(Identity {
        cert_pem,
        key_pem: key.key_pem,
    })
}

fn is_expired(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. }
        )
    )
}

#[tokio::test]
async fn during_a_ca_rotation_peers_of_either_ca_connect_and_after_it_the_old_one_is_refused(
) -> Result<()> {
    // The same name, as a rotation by the operator would make: the trust bundle must tell
    // the two apart by key, not by name.
    let old = Ca::generate("ferry install CA")?;
    let new = Ca::generate("ferry install CA")?;
    let both = trust(&[&old, &new])?;
    assert_eq!(both.len(), 2);

    for (server_ca, client_ca) in [(&new, &old), (&old, &new)] {
        let a = node(server_ca, "node-a")?;
        let b = node(client_ca, "node-b")?;
        let (server_saw, client_saw) =
            exchange(server(&both, &a)?, client(&both, &b, "node-a")?).await?;
        assert!(
            matches!(&server_saw, ServerSaw::Connected { peer, read: Ok(read), .. }
                if peer == "node-b" && read == SECRET),
            "the server refused during the rotation: {server_saw:?}"
        );
        assert!(
            matches!(&client_saw, ClientSaw::Connected { peer, echo: Ok(echo), .. }
                if peer == "node-a" && echo == SECRET),
            "the client refused during the rotation: {client_saw:?}"
        );
    }

    let only_new = trust(&[&new])?;
    let a = node(&new, "node-a")?;
    let stale = node(&old, "node-b")?;
    let (server_saw, client_saw) =
        exchange(server(&only_new, &a)?, client(&only_new, &stale, "node-a")?).await?;
    assert_server_refused(&server_saw, |e| {
        matches!(e, rustls::Error::InvalidCertificate(_))
    });
    assert_client_got_nothing(&client_saw);
    Ok(())
}

#[tokio::test]
async fn a_tls_1_2_client_is_refused_even_with_a_valid_certificate() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let trust = trust(&[&ca])?;
    let (a, b) = (node(&ca, "node-a")?, node(&ca, "node-b")?);

    let (server_saw, client_saw) = exchange(
        server(&trust, &a)?,
        raw_client(&rustls::version::TLS12, Some(&b), ALPN)?,
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
