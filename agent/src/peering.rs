//! The peering port (chart `peering.enabled`): where agents of other installs read this
//! install's exports. Who may connect is decided before anything else: a connection
//! completes its TLS 1.3 handshake only with a peering certificate from the CA of the very
//! install it names, an install a FerryPeer trusts with `exports: Allow`
//! (`ferry_link::peering_server_config`); a plain TCP client, a client without a
//! certificate or with one from another CA gets a TLS alert and nothing else. Until it has
//! completed its handshake a connection is held in the same bounded pool as the transfer
//! port's ([`crate::transfer`]'s limits).
//!
//! Then the first frame must be an [`ExportHello`]: the export is looked up and the hello
//! judged ([`check`]: the credential, the reader, the export's state, its reader slots) by
//! [`Exports`] (the daemon's, which also resolves the export's source on this node), and
//! a hello let in is served as a shard's source between nodes is, beneath the export's
//! path. Every refusal says `<reason>: <why>` and ends the connection.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use ferry_engine::send::SendOptions;
use ferry_transfer::frame::{Frame, VERSION};
use ferry_transfer::ExportHello;
use tokio::net::{TcpListener, TcpStream};

use crate::daemon::PeerIdentity;
use crate::transfer::{
    accept_loop, admitted, read_frame, refuse, serve_source, OpenSource, TransferError,
    HANDSHAKE_TIMEOUT,
};

pub mod check;

/// What serving an export hello takes: its source, opened beneath the export's path, how
/// it is sent, the names for the metrics, and the hold on a reader slot (released when the
/// connection ends).
pub struct ExportGrant {
    pub open: OpenSource,
    pub options: SendOptions,
    /// The export's namespace and name.
    pub named: (String, String),
    pub held: check::Held,
}

impl std::fmt::Debug for ExportGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportGrant")
            .field("named", &self.named)
            .finish_non_exhaustive()
    }
}

/// Where the peering port looks exports up: `Err` is the refusal, said to the peer.
pub trait Exports: Send + Sync + 'static {
    /// `hello` from an agent of `peer` (its certificate's install and node).
    fn grant<'a>(
        &'a self,
        hello: &'a ExportHello,
        peer: &'a ferry_link::PeerId,
    ) -> Pin<Box<dyn Future<Output = Result<ExportGrant, check::Refusal>> + Send + 'a>>;

    /// Whether a hello let in may still be served, now (its reader slot is its own).
    fn recheck(&self, hello: &ExportHello, peer: &ferry_link::PeerId)
        -> Result<(), check::Refusal>;
}

/// How often a served export is looked at again: a deletion, expiry or rotation cuts its
/// connections within this (and the watch's delay).
pub const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Serve the peering port until the process ends, with the newest identity on `identity`
/// (without one yet, connections are closed unanswered) and exports looked up in
/// `exports`.
pub async fn serve(listener: TcpListener, identity: PeerIdentity, exports: Arc<dyn Exports>) {
    accept_loop(
        listener,
        "peering",
        // The FerryPeers are read every 30 s whatever happens: a failed handshake, which
        // anyone can cause, reads nothing sooner.
        || {},
        move || identity.borrow().as_ref().map(|tls| tls.server.clone()),
        move |acceptor, tcp, addr, entry, slots| {
            connection(acceptor, tcp, addr, entry, slots, exports.clone())
        },
    )
    .await
}

/// One connection: handshake (in the gate's pool), a slot, the export hello, the grant,
/// then the source served.
async fn connection(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
    entry: ferry_serve::gate::Entry,
    slots: Arc<tokio::sync::Semaphore>,
    exports: Arc<dyn Exports>,
) -> Result<(), TransferError> {
    // rustls completes the handshake only with a peering certificate of a trusted install.
    let (mut tls, _slot) = admitted(&acceptor, tcp, addr, entry, slots).await?;
    let peer = ferry_link::peer_id(tls.get_ref().1)?;
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, read_frame(&mut tls))
        .await
        .map_err(|_| TransferError::Timeout { what: "the hello" })??;
    let Frame::ExportHello(hello) = first else {
        return Err(refuse(
            &mut tls,
            "the first frame on the peering port is an export hello".into(),
        )
        .await);
    };
    if hello.version != VERSION {
        let why = format!(
            "protocol version {}; this agent speaks {VERSION}: run one Ferry version in both clusters",
            hello.version
        );
        return Err(refuse(&mut tls, why).await);
    }
    let looked_up = tokio::time::timeout(HANDSHAKE_TIMEOUT, exports.grant(&hello, &peer))
        .await
        .map_err(|_| TransferError::Timeout {
            what: "looking up the export",
        })?;
    let grant = match looked_up {
        Ok(g) => g,
        Err(refusal) => {
            tracing::info!(install = %peer.install, node = %peer.node, ?hello, reason = ?refusal.reason, "export hello refused");
            return Err(refuse(&mut tls, refusal.said()).await);
        }
    };
    let what = format!(
        "export {}/{} for job {} of {}/{}",
        grant.named.0,
        grant.named.1,
        String::from_utf8_lossy(&hello.job),
        peer.install,
        String::from_utf8_lossy(&hello.namespace)
    );
    let _held = grant.held;
    // Looked at again every RECHECK while it is served: an export deleted, expired, no
    // longer Ready, a reader removed or the credential rotated past its grace cuts it.
    let cut = {
        let (exports, hello, peer) = (exports.clone(), hello.clone(), peer.clone());
        Box::pin(async move {
            loop {
                tokio::time::sleep(RECHECK).await;
                if let Err(refusal) = exports.recheck(&hello, &peer) {
                    return refusal.said();
                }
            }
        })
    };
    serve_source(
        tls,
        &peer.node,
        &what,
        grant.open,
        grant.options,
        grant.named,
        Some(cut),
    )
    .await
}
