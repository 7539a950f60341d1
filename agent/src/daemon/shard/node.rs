//! What a shard's run works with: the node's shared parts ([`Node`]: the API client, the
//! settings, the heartbeat fence, the journals, the transfer certificate) and the handle
//! that stops one run ([`Active`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ferry_crds::ShardState;
use kube::Client;

use crate::daemon::fence::Fence;
use crate::daemon::journal::Journals;
use crate::daemon::publish::{publish, Live, PublishError, Target};
use crate::daemon::settings::Settings;

/// What every run on this node shares.
pub(crate) struct Node {
    pub(crate) client: Client,
    pub(crate) settings: Settings,
    pub(crate) fence: Arc<Fence>,
    /// The syncfs that shards finishing together share.
    pub(crate) flushes: Arc<crate::flush::Flushes>,
    /// What each shard's runs on this node committed (the trusted resume state).
    pub(crate) journals: Arc<Journals>,
    /// This node's transfer certificate, if it serves a transfer port: what it receives
    /// a copy between nodes with.
    pub(crate) identity: Option<crate::daemon::network::Identity>,
    /// This node's peering identity, if it serves a peering port: what it reads another
    /// install's export with.
    pub(crate) peering: Option<crate::daemon::PeerIdentity>,
}

impl Node {
    pub(super) async fn publish(
        &self,
        target: Target<'_>,
        state: ShardState,
        live: &Live,
        planned: Option<(i64, i64)>,
    ) -> Result<(), PublishError> {
        publish(
            &self.client,
            &self.settings.node,
            target,
            state,
            live,
            planned,
        )
        .await
    }
}

/// A shard this agent is running, and how to stop it.
#[derive(Default)]
pub(crate) struct Active {
    /// The assignment it runs for.
    pub(crate) epoch: i64,
    /// Read by the engine at every file boundary.
    pub(crate) cancel: Arc<AtomicBool>,
    /// The job is being deleted (rather than suspended).
    pub(crate) deleting: AtomicBool,
    /// The shard is no longer this agent's to run (given to another node or epoch, as the
    /// watch or the API server says): it stops without publishing anything more.
    pub(crate) fenced: AtomicBool,
}
