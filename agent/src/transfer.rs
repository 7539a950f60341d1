//! Copies between nodes, the agent's side: the transfer port, where an agent serves the
//! source of the shards it was made the sender of, and the dialer, with which the agent
//! that owns a shard's destination (the receiver) reaches the sender.
//!
//! Who may connect is decided in two steps, both before anything of a volume is opened:
//! 1. mutual TLS 1.3 (`ferry-link`): only a peer with a certificate from this install's CA
//!    completes the handshake, and the certificate names the peer's node;
//! 2. the hello: the receiver names the shard (job, shard, epoch) and presents the shard's
//!    ticket; the sender serves it only if it holds a grant for exactly that shard at that
//!    epoch, for that receiver's node, with that ticket (compared in constant time).
//!
//! Then the connection carries the engine's protocol (`ferry_engine::send` on this side,
//! `ferry_engine::recv` on the other), on blocking threads bridged to the TLS stream.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ferry_engine::recv::Connection;
use ferry_engine::send::{SendOptions, SourceTop};
use ferry_transfer::frame::{Frame, HEADER, VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::io::SyncIoBridge;

/// How long each step of reaching a sender may take on the receiver's side (connecting, the
/// TLS handshake, the sender's answer), and on the sender's the hello of a peer that has
/// completed its handshake and the lookup of its grant.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Authenticated connections (TLS handshake done with this install's certificate) served at
/// once; one beyond waits for a slot for up to [`HANDSHAKE_TIMEOUT`]. No slot is taken
/// before the handshake is done, so no peer without a certificate ever holds one.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a connection has from its accept to a completed TLS handshake. Such a handshake
/// takes milliseconds (on a loaded node, well under a second); anyone on the network can
/// open a connection, so one that has not shown a certificate is held only this long.
pub const UNAUTHENTICATED_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections one peer address may hold before completing its handshake; its next one
/// evicts its oldest. A receiver dials a shard's streams one after another, so an agent
/// with `--max-shards` at its default of 4 has at most 4 handshakes in flight here; a
/// hostile pod has one address and only ever evicts its own connections.
pub const UNAUTHENTICATED_PER_PEER: usize = 16;
/// Connections held before completing their handshake, in all (each a descriptor, a task and
/// a TLS state of tens of KiB). When full, a newcomer evicts the oldest of the peer that
/// holds the most, rather than being refused: a flood never keeps an agent's handshake,
/// which completes in milliseconds, from starting (see `ferry_serve::gate`).
pub const UNAUTHENTICATED_TOTAL: usize = 128;

/// Poked when a TLS handshake with a peer failed: this node's trust bundle may lack a CA a
/// new operator leader added after it was read (an agent that started or renewed since
/// holds a certificate of that CA), so `daemon/certs.rs` reads the bundle again soon
/// rather than at its next turn, at most once per its minimum interval whoever pokes.
static TRUST_STALE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Say that the trust bundle may be stale (see [`TRUST_STALE`]).
pub fn trust_may_be_stale() {
    TRUST_STALE.notify_one();
}

/// Wait until a handshake failed since the last wait.
pub async fn trust_stale() {
    TRUST_STALE.notified().await
}

/// Why a transfer connection failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("the TLS material: {0}")]
    Tls(#[from] ferry_link::Error),
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS handshake with {addr}: {closed}")]
    Unauthenticated {
        addr: SocketAddr,
        #[source]
        closed: ferry_serve::gate::Closed,
    },
    #[error("the sender refused the shard: {0}")]
    Refused(String),
    #[error("the hello: {0}")]
    Hello(String),
    #[error("{what} took longer than {}s", HANDSHAKE_TIMEOUT.as_secs())]
    Timeout { what: &'static str },
}

/// This node's TLS identity and the CAs it trusts.
pub struct Tls {
    node: String,
    trust: ferry_link::Trust,
    chain_pem: String,
    key_pem: String,
    server: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("node", &self.node).finish()
    }
}

impl Tls {
    /// From PEM: the trust bundle, this node's certificate chain and its key.
    pub fn new(trust_pem: &str, chain_pem: &str, key_pem: &str) -> Result<Self, TransferError> {
        let trust = ferry_link::Trust::from_pem(trust_pem)?;
        let server = ferry_link::server_config(&trust, chain_pem, key_pem)?;
        let node = ferry_link::node_of_pem(chain_pem)?;
        Ok(Self {
            node,
            trust,
            chain_pem: chain_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            server,
        })
    }

    /// The node this identity names.
    pub fn node(&self) -> &str {
        &self.node
    }
}

/// Opens the source a grant serves, on a blocking thread, once the receiver is let in.
pub type OpenSource = Arc<dyn Fn() -> Result<SourceTop, String> + Send + Sync>;

/// A source at a host path the caller resolved and trusts (tests, the `copy` CLI).
pub fn open_path(path: PathBuf) -> OpenSource {
    Arc::new(move || {
        SourceTop::open(&path).map_err(|e| format!("opening the source {}: {e}", path.display()))
    })
}

/// What a sender may serve: one shard, at one epoch, to one receiver node, with its ticket.
#[derive(Clone)]
pub struct Grant {
    /// The CopyJob's UID.
    pub job: String,
    pub shard: u32,
    pub epoch: u64,
    /// The node whose agent may receive it (the one its certificate must name).
    pub receiver: String,
    pub ticket: [u8; 32],
    /// The shard's source on this node, resolved by this agent itself.
    pub open: OpenSource,
    /// How it is served (threads, the reserved name, xattrs, the bandwidth limit, the filter
    /// a count applies).
    pub options: SendOptions,
    /// The CopyJob's namespace and name, for the metrics.
    pub named: (String, String),
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("job", &self.job)
            .field("shard", &self.shard)
            .field("epoch", &self.epoch)
            .field("receiver", &self.receiver)
            .finish_non_exhaustive()
    }
}

/// Where a sender looks up its grants (the agent: the ticket Secret the operator wrote for
/// the job, and the source it resolves itself). `Err`: why there is none, said to the
/// receiver (a peer with this install's certificate) in the refusal.
pub trait Grants: Send + Sync + 'static {
    fn grant<'a>(
        &'a self,
        job: &'a str,
        shard: u32,
        epoch: u64,
    ) -> Pin<Box<dyn Future<Output = Result<Grant, String>> + Send + 'a>>;
}

/// No grants: every hello is refused.
#[derive(Debug)]
pub struct NoGrants;

impl Grants for NoGrants {
    fn grant<'a>(
        &'a self,
        job: &'a str,
        shard: u32,
        epoch: u64,
    ) -> Pin<Box<dyn Future<Output = Result<Grant, String>> + Send + 'a>> {
        Box::pin(async move {
            Err(format!(
                "this node holds no grant for shard {shard} of job {job} at epoch {epoch}"
            ))
        })
    }
}

/// Serve the transfer port: every connection is authenticated (TLS with the newest
/// identity on `identity`, then its hello) and then served on a blocking thread, at most
/// [`MAX_CONNECTIONS`] at once. Until its handshake is done a connection is held in a
/// bounded pool ([`UNAUTHENTICATED_PER_PEER`], [`UNAUTHENTICATED_TOTAL`],
/// [`UNAUTHENTICATED_TIMEOUT`]), apart from the authenticated ones: a peer without this
/// install's certificate cannot keep an agent's copy from being served. Without an identity
/// yet, connections are closed unanswered.
pub async fn serve(
    listener: TcpListener,
    identity: tokio::sync::watch::Receiver<Option<Arc<Tls>>>,
    grants: Arc<dyn Grants>,
) {
    accept_loop(
        listener,
        "transfer",
        trust_may_be_stale,
        move || identity.borrow().as_ref().map(|tls| tls.server.clone()),
        move |acceptor, tcp, peer, entry, slots| {
            connection(acceptor, tcp, peer, entry, slots, grants.clone())
        },
    )
    .await
}

/// The accept loop of a TLS port (the transfer port, the peering port): each connection
/// accepted at once, admitted to the gate's pool of unproven ones in accept order, and
/// handed to `serve_one` with a TLS acceptor of the newest configuration `config` gives
/// (none yet: closed unanswered) and the port's [`MAX_CONNECTIONS`] slots; its end logged,
/// a failed handshake only at debug (anyone on the network can fail one), and told to
/// `failed_handshake` (the transfer port's trust bundle may be stale).
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    port: &'static str,
    failed_handshake: fn(),
    config: impl Fn() -> Option<Arc<rustls::ServerConfig>>,
    serve_one: F,
) where
    F: Fn(
        tokio_rustls::TlsAcceptor,
        TcpStream,
        SocketAddr,
        ferry_serve::gate::Entry,
        Arc<tokio::sync::Semaphore>,
    ) -> Fut,
    Fut: Future<Output = Result<(), TransferError>> + Send + 'static,
{
    let gate = ferry_serve::gate::Gate::new(ferry_serve::gate::GateLimits {
        per_peer: UNAUTHENTICATED_PER_PEER,
        total: UNAUTHENTICATED_TOTAL,
        pending_timeout: UNAUTHENTICATED_TIMEOUT,
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // Accepted at once, whatever is open: a connection waiting in the listen backlog
        // behind others cannot evict them, and its peer's handshake times out there.
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, port, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(server) = config() else {
            tracing::info!(%peer, port, "connection closed: no certificate for this node yet");
            continue;
        };
        // Admitted in accept order, so that the eviction order is the arrival order.
        let entry = gate.admit(peer.ip());
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let serving = serve_one(acceptor, tcp, peer, entry, slots.clone());
        tokio::spawn(async move {
            match serving.await {
                Ok(()) => {}
                // Before its handshake is done a peer has shown nothing: a line at info for
                // each such connection would let anyone on the network fill the node's log.
                Err(e @ TransferError::Handshake { .. }) => {
                    failed_handshake();
                    tracing::debug!(%peer, port, error = %e, "connection closed before its handshake was done");
                }
                Err(e @ TransferError::Unauthenticated { .. }) => {
                    tracing::debug!(%peer, port, error = %e, "connection closed before its handshake was done");
                }
                Err(e) => {
                    tracing::info!(%peer, port, error = %e, "connection refused or failed");
                }
            }
        });
    }
}

/// A connection's TLS handshake, in the gate's pool (as `entry`) until it is done, then one
/// of the port's `slots` (waited for at most [`HANDSHAKE_TIMEOUT`]): the connection and its
/// slot.
pub(crate) async fn admitted(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
    mut entry: ferry_serve::gate::Entry,
    slots: Arc<tokio::sync::Semaphore>,
) -> Result<
    (
        tokio_rustls::server::TlsStream<TcpStream>,
        tokio::sync::OwnedSemaphorePermit,
    ),
    TransferError,
> {
    let _ = tcp.set_nodelay(true);
    notice_a_vanished_peer(&tcp);
    let tls = entry
        .run(acceptor.accept(tcp))
        .await
        .map_err(|closed| TransferError::Unauthenticated { addr, closed })?
        .map_err(|source| TransferError::Handshake { addr, source })?;
    drop(entry);
    let slot = timed("waiting for a free slot", slots.acquire_owned())
        .await?
        .map_err(|e| TransferError::Hello(format!("the connection slots: {e}")))?;
    Ok((tls, slot))
}

/// How long a transfer connection may go without the peer acknowledging what was sent, or
/// idle without answering keepalive probes, before it is given up: a peer whose node
/// vanished (no FIN, no RST) frees the other side's threads and descriptors within about a
/// minute instead of the kernel's fifteen; the receiver then dials again.
pub const PEER_GONE_AFTER: Duration = Duration::from_secs(60);

/// Keepalive probes and a user timeout on a transfer connection (see [`PEER_GONE_AFTER`]).
fn notice_a_vanished_peer(tcp: &TcpStream) {
    let sock = socket2::SockRef::from(tcp);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(20))
        .with_interval(Duration::from_secs(10))
        .with_retries(4);
    let set = sock
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| sock.set_tcp_user_timeout(Some(PEER_GONE_AFTER)));
    if let Err(e) = set {
        tracing::warn!(error = %e, "setting keepalive on a transfer connection");
    }
}

async fn timed<T>(
    what: &'static str,
    f: impl std::future::Future<Output = T>,
) -> Result<T, TransferError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, f)
        .await
        .map_err(|_| TransferError::Timeout { what })
}

/// One connection: handshake (in the gate's pool, as `entry`), then a slot of `slots`, the
/// hello, and the source half until the receiver closes.
async fn connection(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
    entry: ferry_serve::gate::Entry,
    slots: Arc<tokio::sync::Semaphore>,
    grants: Arc<dyn Grants>,
) -> Result<(), TransferError> {
    // rustls completes the handshake only with a client certificate from this install's CA.
    let (mut tls, _slot) = admitted(&acceptor, tcp, addr, entry, slots).await?;
    let peer = ferry_link::peer_node(tls.get_ref().1)?;
    let hello = timed("the hello", read_frame(&mut tls)).await??;
    let Frame::Hello {
        version,
        job,
        shard,
        epoch,
        ticket,
    } = hello
    else {
        return Err(TransferError::Hello(
            "the first frame was not a hello".into(),
        ));
    };
    let job = String::from_utf8_lossy(&job).into_owned();
    let found = match version {
        VERSION => timed("looking up the grant", grants.grant(&job, shard, epoch)).await?,
        _ => Err(format!(
            "protocol version {version}; this agent speaks {VERSION}: run one Ferry version on every node"
        )),
    };
    let refusal = match found {
        Err(why) => Err(why),
        Ok(g) if g.receiver != peer => Err(format!(
            "shard {shard} of job {job} is not node {peer}'s to receive"
        )),
        Ok(g) if !same(&g.ticket, &ticket) => {
            Err(format!("the ticket is not shard {shard}'s of job {job}"))
        }
        Ok(g) => Ok(g),
    };
    match refusal {
        Ok(g) => {
            let what = format!("shard {shard} of job {}", g.job);
            serve_source(tls, &peer, &what, g.open, g.options, g.named, None).await
        }
        Err(reason) => Err(refuse(&mut tls, reason).await),
    }
}

/// Serve `open`'s source to `peer` (a receiver let in: its hello checked) on `tls`: the
/// source opened (beneath its root, on a blocking thread: an NFS root can hang) before the
/// welcome, so that one that cannot be opened is a refusal that says why; then the source
/// half until the receiver closes, what is sent counted for the metrics under `named`
/// (namespace, name). `what` names it in the logs. When `cut` ends (with why), the
/// connection is shut down under the source half, which then stops at its next read or
/// write: an export deleted, expired or rotated away.
pub(crate) async fn serve_source(
    mut tls: tokio_rustls::server::TlsStream<TcpStream>,
    peer: &str,
    what: &str,
    open: OpenSource,
    options: SendOptions,
    named: (String, String),
    cut: Option<Pin<Box<dyn Future<Output = String> + Send>>>,
) -> Result<(), TransferError> {
    let top = match tokio::task::spawn_blocking(move || open()).await {
        Ok(Ok(top)) => top,
        Ok(Err(why)) => return Err(refuse(&mut tls, why).await),
        Err(e) => return Err(refuse(&mut tls, format!("opening the source: {e}")).await),
    };
    write_frame(&mut tls, &Frame::Welcome { version: VERSION })
        .await
        .map_err(|e| TransferError::Hello(e.to_string()))?;
    tracing::info!(%peer, what, "serving a shard's source");
    let metrics = crate::serve::metrics();
    let senders = metrics.connections.with_label_values(&["sender"]);
    senders.inc();
    let (ns, name) = named;
    // A second descriptor of the socket, to shut it down from here while the source half
    // owns the stream.
    let socket = std::os::fd::AsFd::as_fd(tls.get_ref().0)
        .try_clone_to_owned()
        .map_err(|e| TransferError::Hello(format!("the connection's socket: {e}")))?;
    let mut cut = cut.unwrap_or_else(|| Box::pin(std::future::pending()));
    let mut cut_for = None;
    let (r, w) = tokio::io::split(tls);
    let (r, w) = (SyncIoBridge::new(r), SyncIoBridge::new(w));
    // What is sent is counted as it goes (every second), for the network rate.
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut options = options;
    options.sent = Some(sent.clone());
    let mut serving = tokio::task::spawn_blocking(move || {
        ferry_engine::send::serve(&top, r, w, &options).map_err(|e| e.to_string())
    });
    let mut counted = 0;
    let mut count = || {
        let now = sent.load(std::sync::atomic::Ordering::Relaxed);
        metrics.network("sent", &ns, &name, now - counted);
        counted = now;
    };
    let served = loop {
        tokio::select! {
            r = &mut serving => break r,
            _ = tokio::time::sleep(Duration::from_secs(1)) => count(),
            why = &mut cut, if cut_for.is_none() => {
                tracing::info!(%peer, what, %why, "cutting the connection");
                let _ = socket2::SockRef::from(&socket).shutdown(std::net::Shutdown::Both);
                cut_for = Some(why);
            }
        }
    };
    count();
    senders.dec();
    if let Some(why) = cut_for {
        return Err(TransferError::Refused(why));
    }
    match served {
        Ok(Ok(summary)) => {
            tracing::info!(%peer, what, bytes = summary.bytes_sent, files = summary.files_sent, "shard's source served");
            Ok(())
        }
        Ok(Err(e)) => Err(TransferError::Hello(e)),
        Err(e) => Err(TransferError::Hello(format!(
            "the source half stopped: {e}"
        ))),
    }
}

/// Tell a peer why it is refused, close the connection, and say so.
pub(crate) async fn refuse(
    tls: &mut tokio_rustls::server::TlsStream<TcpStream>,
    reason: String,
) -> TransferError {
    let _ = write_frame(
        tls,
        &Frame::Refused {
            reason: reason.clone(),
        },
    )
    .await;
    let _ = tls.shutdown().await;
    TransferError::Refused(reason)
}

/// Constant-time comparison of two tickets.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Frame, TransferError> {
    let bad = |e: &dyn std::fmt::Display| TransferError::Hello(e.to_string());
    let mut header = [0u8; HEADER];
    r.read_exact(&mut header).await.map_err(|e| bad(&e))?;
    let (kind, len) = ferry_transfer::stream::check_header(header).map_err(|e| bad(&e))?;
    // A hello or its answer is small: nothing near a listing's size is read before one.
    if len > 64 << 10 {
        return Err(TransferError::Hello(format!(
            "a first frame of {len} bytes"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.map_err(|e| bad(&e))?;
    Frame::decode(kind, &payload).map_err(|e| bad(&e))
}

async fn write_frame<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    f: &Frame,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    f.encode(&mut buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    w.write_all(&buf).await?;
    w.flush().await
}

/// What a receiver says in its hello.
#[derive(Debug, Clone)]
pub struct Hello {
    pub job: String,
    pub shard: u32,
    pub epoch: u64,
    pub ticket: [u8; 32],
}

/// Reach the sender `sender_node` at `addr` for the shard in `hello`: a connection the
/// engine's `copy_from` copies over, once the sender has accepted the shard. Must be called
/// from within a tokio runtime; the connection is then used from blocking threads.
pub async fn dial(
    addr: SocketAddr,
    tls: &Tls,
    sender_node: &str,
    hello: &Hello,
) -> Result<Arc<Connection>, TransferError> {
    let config = ferry_link::client_config(&tls.trust, &tls.chain_pem, &tls.key_pem, sender_node)?;
    let frame = Frame::Hello {
        version: VERSION,
        job: hello.job.as_bytes().to_vec(),
        shard: hello.shard,
        epoch: hello.epoch,
        ticket: hello.ticket,
    };
    dial_with(addr, config, &frame).await
}

/// Reach the peering port of another install's agent at `addr` for the export in `hello`,
/// with `config` (`ferry_link::peering_client_config`: the export's CA and install, and
/// this node's peering certificate): a connection the engine's `copy_from` copies over,
/// as [`dial`]'s.
pub async fn dial_export(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    hello: &ferry_transfer::ExportHello,
) -> Result<Arc<Connection>, TransferError> {
    dial_with(addr, config, &Frame::ExportHello(hello.clone())).await
}

/// Several TLS connections with `config`, each past its own `hello`, one engine connection
/// over them.
async fn dial_with(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    hello: &Frame,
) -> Result<Arc<Connection>, TransferError> {
    let connector = tokio_rustls::TlsConnector::from(config);
    let mut streams = Vec::new();
    for _ in 0..streams_per_shard() {
        streams.push(dial_stream(addr, &connector, hello).await?);
    }
    Connection::start_streams(streams).map_err(|e| TransferError::Hello(e.to_string()))
}

/// TLS connections a receiver opens to its sender for one shard: `FERRY_TRANSFER_STREAMS`
/// (1 to 8), else [`STREAMS`].
fn streams_per_shard() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("FERRY_TRANSFER_STREAMS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|n| (1..=8).contains(n))
            .unwrap_or(STREAMS)
    })
}

/// The default of [`streams_per_shard`]: the decryption, encryption and socket copies of a
/// large file spread over two threads on each node (one connection left the receiver's one
/// reader thread doing all of them for 2 GiB while the machine was 20% idle).
pub const STREAMS: usize = 2;

/// One TLS connection to the sender, its hello answered with a welcome.
async fn dial_stream(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    hello: &Frame,
) -> Result<ferry_engine::recv::Stream, TransferError> {
    let tcp = timed("connecting", TcpStream::connect(addr))
        .await?
        .map_err(|source| TransferError::Connect { addr, source })?;
    let _ = tcp.set_nodelay(true);
    notice_a_vanished_peer(&tcp);
    let mut stream = timed(
        "the TLS handshake",
        connector.connect(ferry_link::server_name(), tcp),
    )
    .await?
    .map_err(|source| {
        trust_may_be_stale();
        TransferError::Handshake { addr, source }
    })?;
    write_frame(&mut stream, hello)
        .await
        .map_err(|e| TransferError::Hello(e.to_string()))?;
    match timed("the sender's answer", read_frame(&mut stream)).await?? {
        Frame::Welcome { version } if version == VERSION => {}
        Frame::Welcome { version } => {
            return Err(TransferError::Hello(format!(
                "the sender speaks protocol version {version}, this agent {VERSION}"
            )))
        }
        Frame::Refused { reason } => return Err(TransferError::Refused(reason)),
        _ => {
            return Err(TransferError::Hello(
                "the sender answered the hello with something else".into(),
            ))
        }
    }
    let (r, w) = tokio::io::split(stream);
    let w = CloseOnDrop(Some(SyncIoBridge::new(w)));
    Ok((Box::new(SyncIoBridge::new(r)), Box::new(w)))
}

/// The write half of a receiver's connection. Dropped with the connection (the copy is
/// over), it shuts the TLS stream down: close_notify, then the TCP write side, so the sender
/// reads the end, stops serving and closes, and this side's reader thread, blocked reading,
/// sees that end and exits. Without it a finished copy's connection, the sender's threads and
/// the reader thread stayed for the life of both agents. The shutdown runs on a thread of its
/// own: the drop may happen on a runtime thread, where blocking on it is not allowed.
struct CloseOnDrop(
    Option<SyncIoBridge<tokio::io::WriteHalf<tokio_rustls::client::TlsStream<TcpStream>>>>,
);

impl std::io::Write for CloseOnDrop {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.0 {
            Some(w) => w.write(buf),
            None => Err(std::io::ErrorKind::NotConnected.into()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.0 {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let Some(mut w) = self.0.take() {
            let _ = std::thread::Builder::new()
                .name("ferry-close".into())
                .spawn(move || {
                    let _ = w.shutdown();
                });
        }
    }
}
