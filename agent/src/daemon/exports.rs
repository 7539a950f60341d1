//! The exports this agent serves on the peering port (chart `peering.enabled`): the
//! CopyExports it watches, each hello judged by `peering::check` against the export as
//! watched (never anything the peer says but the credential it proves), and the export's
//! source resolved by this agent itself, from the export's spec and objects only admins or
//! Kubernetes write, as a job's source between nodes is: a StorageRoot that admits the
//! export's namespace and selects this node, or a claim bound to a local or hostPath volume
//! whose affinity includes this node. Served beneath the export's path and the reader's
//! sub-path with `openat2` (no `..`, no symlinks), `.ferry` never.
//!
//! Not served yet: a claim of a CSI volume (it needs a pod mounting it on this node, which
//! reachability will arrange); the hello is refused saying so.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use ferry_crds::CopyExport;
use ferry_engine::send::SendOptions;
use ferry_resolve::Reach;
use ferry_transfer::ExportHello;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use super::settings::Settings;
use super::PeerIdentity;
use crate::peering::check::{self, Holders, Refusal, Why};
use crate::peering::{ExportGrant, Exports};

/// The daemon's exports.
pub(super) struct ExportGrants {
    pub(super) client: Client,
    pub(super) settings: Settings,
    pub(super) exports: Store<CopyExport>,
    /// Which FerryPeer names each trusted install.
    pub(super) identity: PeerIdentity,
    pub(super) holders: Arc<Holders>,
}

impl Exports for ExportGrants {
    fn grant<'a>(
        &'a self,
        hello: &'a ExportHello,
        peer: &'a ferry_link::PeerId,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<ExportGrant, Refusal>> + Send + 'a>> {
        Box::pin(self.lookup(hello, peer))
    }

    fn recheck(&self, hello: &ExportHello, peer: &ferry_link::PeerId) -> Result<(), Refusal> {
        let export = self.find(hello)?;
        let peer_name = self.peer_name(peer);
        // The job holds its slot: only the export's own state can refuse it now.
        check::check(
            &export,
            hello,
            &peer.install,
            peer_name.as_deref(),
            Timestamp::now(),
        )
    }
}

fn refusal(reason: Why, message: String) -> Refusal {
    Refusal { reason, message }
}

impl ExportGrants {
    async fn lookup(
        &self,
        hello: &ExportHello,
        peer: &ferry_link::PeerId,
    ) -> Result<ExportGrant, Refusal> {
        let export = self.find(hello)?;
        let peer_name = self.peer_name(peer);
        check::check(
            &export,
            hello,
            &peer.install,
            peer_name.as_deref(),
            Timestamp::now(),
        )?;
        let bandwidth_limit = check::served_rate(&export, hello)?;
        let held = self.holders.take(&export, hello)?;
        let path = check::served_path(&export.spec.source.path, &hello.path)?;
        let root = self.root(&export).await?;
        let reserved_top = super::job_options::reserved_top(&path);
        let path = PathBuf::from(path);
        let (host, node) = (self.settings.host_root.clone(), self.settings.node.clone());
        let open: crate::transfer::OpenSource =
            Arc::new(move || super::network::open_source(&host, &node, &root, &path));
        Ok(ExportGrant {
            open,
            options: SendOptions {
                workers: self.settings.workers,
                reserved_top,
                // Sent; the reader's preserve decides what it keeps.
                xattrs: true,
                bandwidth_limit,
                corrupt_in_flight: None,
                filter: ferry_crds::Filter::default(),
                sent: None,
            },
            named: (export.namespace().unwrap_or_default(), export.name_any()),
            held,
        })
    }

    /// The export a hello names, as watched.
    fn find(&self, hello: &ExportHello) -> Result<Arc<CopyExport>, Refusal> {
        let uid = String::from_utf8_lossy(&hello.export);
        self.exports
            .state()
            .into_iter()
            .find(|e| e.uid().as_deref() == Some(uid.as_ref()))
            .ok_or_else(|| {
                refusal(
                    Why::ExportNotFound,
                    format!("no export with uid {uid} in this install (deleted, or another install's Secret)"),
                )
            })
    }

    /// The FerryPeer that trusts `peer`'s install, now.
    fn peer_name(&self, peer: &ferry_link::PeerId) -> Option<String> {
        self.identity
            .borrow()
            .as_ref()
            .and_then(|tls| tls.peers.get(&peer.install).cloned())
    }

    /// The export's root on this node, resolved here.
    async fn root(&self, export: &CopyExport) -> Result<String, Refusal> {
        let me = &self.settings.node;
        let ns = export.namespace().unwrap_or_default();
        let not_here = |why: String| refusal(Why::NotReady, why);
        let reach = ferry_resolve::export_reach(&self.client, &ns, &export.spec.source)
            .await
            .map_err(|e| not_here(format!("resolving the export's source on node {me}: {e}")))?
            .map_err(not_here)?;
        match reach {
            Reach::Direct(v) => {
                let labels = Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
                    .get(me)
                    .await
                    .map_err(|e| not_here(format!("reading node {me}: {e}")))?
                    .metadata
                    .labels
                    .unwrap_or_default();
                if !v.nodes.matches(me, &labels) {
                    return Err(not_here(format!(
                        "the export's source is not on node {me}; dial a node that has it"
                    )));
                }
                Ok(v.host_path)
            }
            Reach::Csi { .. } => Err(not_here(
                "the export is a claim of a CSI volume, which the peering port does not serve yet (a root, or a local or hostPath volume, is)".into(),
            )),
        }
    }
}
