//! The peering port (chart `peering.enabled`): where agents of other installs will read
//! this install's exports. Who may connect is decided before anything else: a connection
//! completes its TLS 1.3 handshake only with a peering certificate from the CA of the very
//! install it names, an install a FerryPeer trusts with `exports: Allow`
//! (`ferry_link::peering_server_config`); a plain TCP client, a client without a
//! certificate or with one from another CA gets a TLS alert and nothing else. Until it has
//! completed its handshake a connection is held in the same bounded pool as the transfer
//! port's ([`crate::transfer`]'s limits).
//!
//! Exports (`CopyExport`) are not built yet: a trusted peer's first frame is answered with
//! a refusal that says so, and the connection ends. The export's checks come here.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

use crate::daemon::PeerIdentity;
use crate::transfer::{
    accept_loop, admitted, read_frame, refuse, TransferError, HANDSHAKE_TIMEOUT,
};

/// What a trusted peer is told while this install serves no exports.
pub const NO_EXPORTS: &str =
    "ExportNotFound: this install serves no exports (CopyExport is not built yet)";

/// Serve the peering port until the process ends, with the newest identity on `identity`;
/// without one yet, connections are closed unanswered.
pub async fn serve(listener: TcpListener, identity: PeerIdentity) {
    accept_loop(
        listener,
        "peering",
        // The FerryPeers are read every 30 s whatever happens: a failed handshake, which
        // anyone can cause, reads nothing sooner.
        || {},
        move || identity.borrow().as_ref().map(|tls| tls.server.clone()),
        connection,
    )
    .await
}

/// One connection: handshake (in the gate's pool), a slot, the first frame, the refusal.
async fn connection(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
    entry: ferry_serve::gate::Entry,
    slots: Arc<tokio::sync::Semaphore>,
) -> Result<(), TransferError> {
    // rustls completes the handshake only with a peering certificate of a trusted install.
    let (mut tls, _slot) = admitted(&acceptor, tcp, addr, entry, slots).await?;
    let peer = ferry_link::peer_id(tls.get_ref().1)?;
    // Whatever it asks, bounded as the transfer port's first frame is.
    let _first = tokio::time::timeout(HANDSHAKE_TIMEOUT, read_frame(&mut tls))
        .await
        .map_err(|_| TransferError::Timeout { what: "the hello" })??;
    tracing::info!(install = %peer.install, node = %peer.node, "a peer asked for an export; none is served");
    Err(refuse(&mut tls, NO_EXPORTS.into()).await)
}
