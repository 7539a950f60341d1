//! Real TLS handshakes over loopback TCP (a server on 127.0.0.2, clients from 127.0.0.3):
//! which agents may connect to which, what each side learns of the other, and that a refused
//! peer never gets application bytes to the server. Each test writes a secret once the client
//! believes it is connected and checks what the server read.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use ferry_link::{client_config, peer_node, server_config, server_name, Ca, NodeKey, Trust, ALPN};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{CertificateError, ClientConfig, ProtocolVersion, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tokio::time::timeout;
use tokio_rustls::{TlsAcceptor, TlsConnector};

#[path = "common/any_server.rs"]
mod any_server;
use any_server::AnyServer;

const SECRET: &[u8] = b"shard 7 of job tenant-a/nightly: the bytes of /data/payroll.db";
const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// Every wait in these tests; a handshake on loopback takes milliseconds.
const PATIENCE: Duration = Duration::from_secs(20);

/// A node's certificate and key, as an agent holds them.
struct Identity {
    cert_pem: String,
    key_pem: String,
}

/// `node`'s identity, signed by `ca` for a day from now, by the real CSR path.
fn node(ca: &Ca, node: &str) -> Result<Identity> {
    let key = NodeKey::generate(node)?;
    let cert_pem = ca.sign_node(&key.csr_pem, node, DAY)?;
    Ok(Identity {
        cert_pem,
        key_pem: key.key_pem,
    })
}

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

/// What the server got from one connection.
#[derive(Debug)]
enum ServerSaw {
    /// The handshake completed: the client's node, and every byte read before end of stream.
    Connected {
        peer: String,
        version: Option<ProtocolVersion>,
        suite: Option<rustls::CipherSuite>,
        read: io::Result<Vec<u8>>,
    },
    /// The handshake failed: no application byte was read.
    Refused(io::Error),
}

/// What the client got.
#[derive(Debug)]
enum ClientSaw {
    /// The client's handshake completed and it wrote the secret: the server's node, whether
    /// the write went through, and what came back.
    Connected {
        peer: String,
        alpn: Option<Vec<u8>>,
        echo: io::Result<Vec<u8>>,
    },
    /// The client's handshake failed.
    Refused(io::Error),
}

/// One connection from 127.0.0.3 to a server on 127.0.0.2: the server echoes what it reads;
/// the client writes [`SECRET`], ends its side, and reads the echo.
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
        let mut tls = match TlsAcceptor::from(server).accept(tcp).await {
            Ok(tls) => tls,
            Err(e) => return Ok(ServerSaw::Refused(e)),
        };
        let peer = peer_node(tls.get_ref().1)?;
        let version = tls.get_ref().1.protocol_version();
        let suite = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
        let mut read = Vec::new();
        let read = match tls.read_to_end(&mut read).await {
            Ok(_) => {
                tls.write_all(&read).await?;
                tls.shutdown().await?;
                Ok(read)
            }
            Err(e) => Err(e),
        };
        Ok(ServerSaw::Connected {
            peer,
            version,
            suite,
            read,
        })
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
    let mut tls = match TlsConnector::from(client).connect(server_name(), tcp).await {
        Ok(tls) => tls,
        Err(e) => return Ok(ClientSaw::Refused(e)),
    };
    let peer = peer_node(tls.get_ref().1)?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let echo = async {
        tls.write_all(SECRET).await?;
        tls.shutdown().await?;
        let mut echo = Vec::new();
        tls.read_to_end(&mut echo).await?;
        Ok(echo)
    }
    .await;
    Ok(ClientSaw::Connected { peer, alpn, echo })
}

/// The rustls error inside an I/O error from tokio-rustls.
fn tls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// The server refused the handshake, for a reason `why` accepts, and so read nothing.
fn assert_server_refused(saw: &ServerSaw, why: impl Fn(&rustls::Error) -> bool) {
    match saw {
        ServerSaw::Refused(e) => assert!(
            tls_error(e).is_some_and(&why),
            "the server refused for another reason: {e:?}"
        ),
        ServerSaw::Connected { read, .. } => {
            panic!("the server accepted the client and read {read:?}")
        }
    }
}

/// The client got nothing back: refused at its handshake, or its connection was cut.
fn assert_client_got_nothing(saw: &ClientSaw) {
    if let ClientSaw::Connected { echo: Ok(echo), .. } = saw {
        panic!("the client got {} bytes back", echo.len());
    }
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
    let anonymous = ClientConfig::builder_with_provider(ring())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_no_client_auth();

    let (server_saw, client_saw) = exchange(server(&trust, &a)?, alpn(anonymous)).await?;

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

    let ClientSaw::Refused(e) = &client_saw else {
        bail!("the client accepted node-a for node-c: {client_saw:?}");
    };
    let Some(rustls::Error::InvalidCertificate(CertificateError::Other(other))) = tls_error(e)
    else {
        bail!("the client refused for another reason: {e:?}");
    };
    assert!(
        matches!(
            other.0.downcast_ref::<ferry_link::Error>(),
            Some(ferry_link::Error::WrongNode { expected, presented })
                if expected == "node-c" && presented == "node-a"
        ),
        "the refusal names both nodes: {other:?}"
    );
    assert!(
        !matches!(&server_saw, ServerSaw::Connected { read: Ok(read), .. } if !read.is_empty()),
        "the secret reached the server: {server_saw:?}"
    );
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

    let ClientSaw::Refused(e) = &client_saw else {
        bail!("the client accepted an expired server: {client_saw:?}");
    };
    assert!(
        tls_error(e).is_some_and(is_expired),
        "refused for another reason: {e:?}"
    );
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
    let chain = CertificateDer::pem_slice_iter(b.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(b.key_pem.as_bytes())?;
    let old_client = ClientConfig::builder_with_provider(ring())
        .with_protocol_versions(&[&rustls::version::TLS12])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_client_auth_cert(chain, key)?;

    let (server_saw, client_saw) = exchange(server(&trust, &a)?, alpn(old_client)).await?;

    assert_server_refused(&server_saw, |e| {
        matches!(e, rustls::Error::PeerIncompatible(_))
    });
    assert!(
        matches!(client_saw, ClientSaw::Refused(_)),
        "the TLS 1.2 client connected: {client_saw:?}"
    );
    Ok(())
}

fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn alpn(mut config: ClientConfig) -> Arc<ClientConfig> {
    config.alpn_protocols = vec![ALPN.to_vec()];
    Arc::new(config)
}
