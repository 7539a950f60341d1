//! What the handshake tests share, in-cluster (`handshake.rs`) and between installs
//! (`peering.rs`): an agent's identity, each side's half of one connection (the server echoes
//! what it reads; the client writes a secret, ends its side and reads the echo), what each
//! side saw, the assertions on it, and an outsider's hand-built client. The transport
//! (loopback TCP, an in-memory stream) and who a side learns is at the other end are each
//! file's own.

pub mod any_server;

use std::fmt::Debug;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use ferry_link::{server_name, Ca, NodeKey};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{CertificateError, ClientConfig, CommonState, ProtocolVersion, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use any_server::AnyServer;

pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// Every wait in these tests; a handshake takes milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// An agent's certificate (node or peering) and key, as it holds them.
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// `node`'s in-cluster node certificate, signed by `ca` for a day from now, by the real CSR
/// path.
pub fn node(ca: &Ca, node: &str) -> Result<Identity> {
    let key = NodeKey::generate(node)?;
    let cert_pem = ca.sign_node(&key.csr_pem, node, DAY)?;
    Ok(Identity {
        cert_pem,
        key_pem: key.key_pem,
    })
}

/// What the server got from one connection; `P` is who it learns connected.
#[derive(Debug)]
pub enum ServerSaw<P> {
    /// The handshake completed: who connected, and every byte read before end of stream.
    Connected {
        peer: P,
        version: Option<ProtocolVersion>,
        suite: Option<rustls::CipherSuite>,
        read: io::Result<Vec<u8>>,
    },
    /// The handshake failed: no application byte was read.
    Refused(io::Error),
}

/// What the client got; `P` is who it learns answered.
#[derive(Debug)]
pub enum ClientSaw<P> {
    /// The client's handshake completed and it wrote the secret: who answered, the protocol
    /// agreed, and what came back.
    Connected {
        peer: P,
        alpn: Option<Vec<u8>>,
        echo: io::Result<Vec<u8>>,
    },
    /// The client's handshake failed.
    Refused(io::Error),
}

/// The server's half of a connection over `stream`: the handshake, then who connected
/// (`who`), and an echo of every byte read. A refused handshake drops the stream, which the
/// client sees as the end of the connection.
pub async fn serve<S, P>(
    server: Arc<ServerConfig>,
    stream: S,
    who: impl FnOnce(&CommonState) -> ferry_link::Result<P>,
) -> Result<ServerSaw<P>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut tls = match TlsAcceptor::from(server).accept(stream).await {
        Ok(tls) => tls,
        Err(e) => return Ok(ServerSaw::Refused(e)),
    };
    let peer = who(tls.get_ref().1)?;
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
}

/// The client's half of a connection over `stream` (connecting to [`server_name`]): the
/// handshake, then who answered (`who`); it writes `secret`, ends its side, and reads the
/// echo.
pub async fn connect<S, P>(
    client: Arc<ClientConfig>,
    stream: S,
    secret: &[u8],
    who: impl FnOnce(&CommonState) -> ferry_link::Result<P>,
) -> Result<ClientSaw<P>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut tls = match TlsConnector::from(client)
        .connect(server_name(), stream)
        .await
    {
        Ok(tls) => tls,
        Err(e) => return Ok(ClientSaw::Refused(e)),
    };
    let peer = who(tls.get_ref().1)?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let echo = async {
        tls.write_all(secret).await?;
        tls.shutdown().await?;
        let mut echo = Vec::new();
        tls.read_to_end(&mut echo).await?;
        Ok(echo)
    }
    .await;
    Ok(ClientSaw::Connected { peer, alpn, echo })
}

/// The rustls error inside an I/O error from tokio-rustls.
pub fn tls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// The ferry-link error a verifier put in a rustls certificate error.
pub fn ours(e: &rustls::Error) -> Option<&ferry_link::Error> {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            other.0.downcast_ref::<ferry_link::Error>()
        }
        _ => None,
    }
}

/// The server refused the handshake, for a reason `why` accepts, and so read nothing.
pub fn assert_server_refused<P: Debug>(saw: &ServerSaw<P>, why: impl Fn(&rustls::Error) -> bool) {
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

/// The client refused the server, for a reason `why` accepts.
pub fn assert_client_refused<P: Debug>(saw: &ClientSaw<P>, why: impl Fn(&rustls::Error) -> bool) {
    match saw {
        ClientSaw::Refused(e) => assert!(
            tls_error(e).is_some_and(&why),
            "the client refused for another reason: {e:?}"
        ),
        ClientSaw::Connected { peer, .. } => panic!("the client accepted the server {peer:?}"),
    }
}

/// The client got nothing back: refused at its handshake, or its connection was cut.
pub fn assert_client_got_nothing<P>(saw: &ClientSaw<P>) {
    if let ClientSaw::Connected { echo: Ok(echo), .. } = saw {
        panic!("the client got {} bytes back", echo.len());
    }
}

/// The server read no application byte (it refused, or the client gave up first).
pub fn assert_server_read_nothing<P: Debug>(saw: &ServerSaw<P>) {
    if let ServerSaw::Connected { read: Ok(read), .. } = saw {
        assert!(read.is_empty(), "the secret reached the server: {saw:?}");
    }
}

/// A client config built by hand (not by ferry-link, which refuses what these tests present):
/// TLS `version`, any server ([`AnyServer`]), `who`'s certificate if any, offering `alpn`.
pub fn raw_client(
    version: &'static rustls::SupportedProtocolVersion,
    who: Option<&Identity>,
    alpn: &[u8],
) -> Result<Arc<ClientConfig>> {
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[version])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer));
    let mut config = match who {
        Some(who) => {
            let chain = CertificateDer::pem_slice_iter(who.cert_pem.as_bytes())
                .collect::<Result<_, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(who.key_pem.as_bytes())?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}
