//! Copies between nodes, the daemon's two roles. The operator pairs a sender (a node with
//! the source) with a receiver (the node with the destination, which runs the shard) and
//! writes the pairing and a ticket into the job's ticket Secret (`ferry_crds::Ticket`):
//!
//! - as a sender, this agent serves a receiver's hello only as that Secret says (this node
//!   the sender, the peer's certificate the receiver's node, the epoch, the ticket), and
//!   serves the source it resolves itself, from the job's spec and objects only admins
//!   write, beneath its root (never from the job's status, which an agent token can write);
//! - as a receiver, it finds the sender's transfer port in the sender's heartbeat Lease
//!   (the annotation [`ADDRESS_ANNOTATION`]), reads its ticket, and dials; the sender's
//!   certificate must name the sender's node, so a wrong address only fails.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{ticket_secret, CopyJob, ShardStatus, Ticket};
use ferry_engine::recv::Connection;
use ferry_engine::send::{SendOptions, SourceTop};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use super::fence::lease_name;
use super::settings::Settings;
use crate::transfer::{self, Grant, Grants, Hello, Tls};

pub use ferry_crds::TRANSFER_ADDRESS_ANNOTATION as ADDRESS_ANNOTATION;

/// The newest TLS identity of this node, as `certs` renews it.
pub(super) type Identity = tokio::sync::watch::Receiver<Option<Arc<Tls>>>;

/// The ticket Secret's entry for `shard` of the job with `uid`, or why there is none.
async fn ticket(
    client: &Client,
    namespace: &str,
    uid: &str,
    shard: &str,
) -> Result<Ticket, String> {
    let name = ticket_secret(uid);
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&name)
        .await
        .map_err(|e| format!("reading the ticket Secret {namespace}/{name}: {e}"))?
        .ok_or_else(|| {
            format!("the operator has written no ticket for job {uid} (Secret {namespace}/{name})")
        })?;
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(shard))
        .ok_or_else(|| {
            format!("the ticket Secret {namespace}/{name} has no entry for shard {shard}")
        })?;
    // Written by the operator, but bounded like any input.
    // An export's entry carries its CA bundle (at most 64 KiB).
    if raw.0.len() > 80 << 10 {
        return Err(format!(
            "shard {shard}'s entry in {namespace}/{name} is {} bytes",
            raw.0.len()
        ));
    }
    serde_json::from_slice(&raw.0)
        .map_err(|e| format!("shard {shard}'s entry in {namespace}/{name}: {e}"))
}

/// The sender's grants: looked up when a receiver says hello.
pub(super) struct SenderGrants {
    pub(super) client: Client,
    pub(super) settings: Settings,
    pub(super) jobs: Store<CopyJob>,
}

impl Grants for SenderGrants {
    fn grant<'a>(
        &'a self,
        job: &'a str,
        shard: u32,
        epoch: u64,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Grant, String>> + Send + 'a>> {
        Box::pin(self.lookup(job, shard, epoch))
    }
}

impl SenderGrants {
    async fn lookup(&self, uid: &str, shard: u32, epoch: u64) -> Result<Grant, String> {
        let me = &self.settings.node;
        let job = self
            .jobs
            .state()
            .into_iter()
            .find(|j| j.uid().as_deref() == Some(uid))
            .ok_or_else(|| format!("no CopyJob with uid {uid} is known to the agent on {me}"))?;
        let name = format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any());
        if job.metadata.deletion_timestamp.is_some() || job.spec.suspend {
            return Err(format!("job {name} is being deleted or is suspended"));
        }
        let t = ticket(
            &self.client,
            &self.settings.ticket_namespace,
            uid,
            &shard.to_string(),
        )
        .await?;
        if &t.sender != me {
            return Err(format!(
                "shard {shard} of job {name} is node {}'s to send, not node {me}'s",
                t.sender
            ));
        }
        if t.epoch != epoch as i64 {
            return Err(format!(
                "shard {shard} of job {name} is at epoch {}, not {epoch}",
                t.epoch
            ));
        }
        let ticket = t.bytes().ok_or_else(|| {
            format!("shard {shard} of job {name}: the ticket is not 64 hex digits")
        })?;
        // The status's account of the source root is used only for a CSI volume's pod
        // mount, and only if it is the kubelet's mount of that very volume.
        let entry = job
            .status
            .iter()
            .flat_map(|s| &s.shards)
            .find(|s| s.id == shard.to_string());
        // Served only for the spec the shard was cut for (see the daemon's consider).
        if entry.is_some_and(|s| !s.spec_digest.is_empty() && s.spec_digest != job.spec.digest()) {
            return Err(format!(
                "job {name}'s spec changed since shard {shard} was cut: not serving it"
            ));
        }
        let assigned = entry.map(|s| s.source_root.clone()).unwrap_or_default();
        let spec = &job.spec;
        let options = send_options(&self.settings, spec)?;
        let named = (job.namespace().unwrap_or_default(), job.name_any());
        let kubelet = ferry_resolve::volume::kubelet_dir();
        let open: transfer::OpenSource =
            match ferry_resolve::block::holder_of_fd_dir(&assigned, &kubelet) {
                // A raw block claim: its device, from the job's holder on this node (the status
                // names only the holder; the claim and its volume are resolved here, and the
                // device must be the one the kubelet made for that volume and pod).
                Some(_) => {
                    let destination = entry
                        .map(|s| s.destination_root.clone())
                        .unwrap_or_default();
                    let [end, _] =
                        super::devices::ends(&self.client, &job, &assigned, &destination)
                            .await
                            .map_err(|e| {
                                format!("the source on node {me}: {}", crate::with_causes(&e))
                            })?;
                    let host = self.settings.host_root.clone();
                    Arc::new(move || {
                        super::devices::take(&host, &end)
                            .map(SourceTop::Device)
                            .map_err(|e| crate::with_causes(&e))
                    })
                }
                None => self.tree(&job, &assigned).await?,
            };
        Ok(Grant {
            job: uid.to_string(),
            shard,
            epoch,
            receiver: t.receiver,
            ticket,
            open,
            options,
            named,
        })
    }

    /// How a tree's source is opened: the root this agent resolves for the job (the
    /// status's account of it only for a CSI volume's pod mount), then the job's path.
    async fn tree(&self, job: &CopyJob, assigned: &str) -> Result<transfer::OpenSource, String> {
        let me = &self.settings.node;
        let root = super::roots::own_root(&self.client, me, job, true, assigned)
            .await
            .map_err(|e| format!("the source on node {me}: {}", crate::with_causes(&e)))?;
        let (host, node, path) = (
            self.settings.host_root.clone(),
            me.clone(),
            PathBuf::from(&job.spec.source.path),
        );
        Ok(Arc::new(move || {
            open_source(&host, &node, &root, &path, false)
        }))
    }
}

/// How the source of a job is served: the job's workers, its xattrs, its bandwidth limit,
/// its include/exclude for a count, Ferry's state at the top of the root never served.
fn send_options(
    settings: &Settings,
    spec: &ferry_crds::CopyJobSpec,
) -> Result<SendOptions, String> {
    let bandwidth_limit = bandwidth_limit(spec)?;
    let filter =
        ferry_crds::Filter::new(&spec.include, &spec.exclude).map_err(|e| format!("spec.{e}"))?;
    Ok(SendOptions {
        workers: super::job_options::workers_of(spec, settings.workers),
        reserved_top: super::job_options::reserved_top(&spec.source.path),
        xattrs: spec.preserve.xattrs,
        bandwidth_limit,
        // `path` (from the source's top): once per connection; `path#n`: n times.
        corrupt_in_flight: settings.corrupt_in_flight.as_ref().map(|v| {
            match v
                .rsplit_once('#')
                .and_then(|(p, n)| Some((p, n.parse().ok()?)))
            {
                Some((path, times)) => (path.as_bytes().to_vec(), times),
                None => (v.as_bytes().to_vec(), 1),
            }
        }),
        filter,
        sent: None,
    })
}

/// The job's `transfer.bandwidthLimit` in bytes a second, never under the least a limit may
/// be; `None`: no limit.
fn bandwidth_limit(spec: &ferry_crds::CopyJobSpec) -> Result<Option<u64>, String> {
    spec.transfer
        .bandwidth_limit
        .as_ref()
        .map(|q| {
            ferry_crds::parse_rate(q)
                .map(|r| r.max(ferry_resolve::validate::MIN_BANDWIDTH))
                .map_err(|e| format!("spec.transfer.bandwidthLimit: {e}"))
        })
        .transpose()
}

/// Open the root inside the node's filesystem, then the job's path beneath it, as a local
/// copy opens its source. With `mounted` (a CSI volume's mount), refused unless the root
/// opened is still a mount's root: asked of the descriptor served, so a volume unmounted
/// since it was found is never read as the empty directory under it (a mirror would delete
/// the reader's copy to match).
pub(super) fn open_source(
    host: &std::path::Path,
    node: &str,
    root: &str,
    path: &std::path::Path,
    mounted: bool,
) -> Result<SourceTop, String> {
    let root_fd =
        super::roots::open_root(host, node, "source", root).map_err(|e| crate::with_causes(&e))?;
    if mounted {
        match ferry_engine::is_mount_root(root_fd.as_fd()) {
            Ok(true) => {}
            Ok(false) => return Err(format!(
                "the export's CSI volume is no longer mounted at {root} on node {node} (its pod ended); nothing was served"
            )),
            Err(e) => return Err(format!("is {root} on node {node} still mounted? {e}")),
        }
    }
    SourceTop::beneath(root_fd.as_fd(), path).map_err(|e| crate::with_causes(&e))
}

/// Dial the agent of another install that serves the export `shard` reads, with what the
/// operator copied from the job's export Secret into its ticket.
async fn dial_export(
    client: &Client,
    settings: &Settings,
    peering: Option<&super::PeerIdentity>,
    job: &CopyJob,
    shard: &ShardStatus,
) -> Result<Arc<Connection>, String> {
    let me = &settings.node;
    let tls = peering
        .and_then(|p| p.borrow().clone())
        .ok_or_else(|| format!("node {me} has no peering certificate (yet): reading another cluster's export needs the chart's peering.enabled"))?;
    let uid = job.uid().unwrap_or_default();
    let t = ticket(client, &settings.ticket_namespace, &uid, &shard.id).await?;
    if &t.receiver != me || t.epoch != shard.epoch {
        return Err(format!(
            "the ticket of shard {} is for {} at epoch {}, not {me} at epoch {} (reassigned?)",
            shard.id, t.receiver, t.epoch, shard.epoch
        ));
    }
    let export = t.export.ok_or(
        "the ticket names no export (the operator writes it once it has read the export's Secret)",
    )?;
    let credential = ferry_crds::unhex32(&export.credential)
        .ok_or("the ticket's export credential is not 64 hex digits")?;
    let addr: std::net::SocketAddr = export.address.parse().map_err(|_| {
        format!(
            "the export's address {:?} is not an address:port",
            export.address
        )
    })?;
    let config = tls
        .client_for(&export.ca, &export.install)
        .map_err(|e| format!("the export's CA: {e}"))?;
    let hello = ferry_transfer::ExportHello {
        version: ferry_transfer::frame::VERSION,
        export: export.export.into_bytes(),
        credential,
        job: uid.into_bytes(),
        namespace: job.namespace().unwrap_or_default().into_bytes(),
        shard: shard
            .id
            .parse()
            .map_err(|_| format!("shard id {:?} is not a number", shard.id))?,
        epoch: shard.epoch as u64,
        // The job's limit: the serving side sends no faster.
        bandwidth_limit: bandwidth_limit(&job.spec)?.unwrap_or(0),
        // Beneath the export: the job's path, its "" and "." components dropped.
        path: job
            .spec
            .source
            .path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/")
            .into_bytes(),
    };
    transfer::dial_export(addr, config, &hello)
        .await
        .map_err(|e| {
            format!(
                "{} ({}): {}",
                export.address,
                export.install,
                crate::with_causes(&e)
            )
        })
}

/// Why a receiver could not get a connection to its sender (it tries again until
/// [`DIAL_FOR`] has passed).
pub(super) const DIAL_FOR: Duration = Duration::from_secs(60);

/// Dial the sender of `shard` for this node, as its ticket says: another node's transfer
/// port, or another install's peering port for an export.
pub(super) async fn dial(
    client: &Client,
    settings: &Settings,
    (identity, peering): (Option<&Identity>, Option<&super::PeerIdentity>),
    job: &CopyJob,
    shard: &ShardStatus,
) -> Result<Arc<Connection>, String> {
    let me = &settings.node;
    let Some(sender) = shard.sender.as_deref() else {
        return Err(format!(
            "shard {} is not a copy between nodes: it has no sender",
            shard.id
        ));
    };
    if sender == ferry_crds::EXPORT_SENDER {
        return dial_export(client, settings, peering, job, shard).await;
    }
    let Some(identity) = identity else {
        return Err(format!(
            "the agent on node {me} serves no transfer port, so it has no certificate to receive with (chart value agent.transferPort, or --transfer-listen)"
        ));
    };
    let tls = identity.borrow().clone().ok_or_else(|| {
        format!("node {me} has no transfer certificate yet (the operator's signer issues it)")
    })?;
    let uid = job.uid().unwrap_or_default();
    let t = ticket(client, &settings.ticket_namespace, &uid, &shard.id).await?;
    if &t.receiver != me || t.sender != sender || t.epoch != shard.epoch {
        return Err(format!(
            "the ticket of shard {} pairs {} -> {} at epoch {}, not {} -> {me} at epoch {} (reassigned?)",
            shard.id, t.sender, t.receiver, t.epoch, sender, shard.epoch
        ));
    }
    let ticket = t.bytes().ok_or("the ticket is not 64 hex digits")?;
    let lease = Api::<Lease>::namespaced(client.clone(), &settings.namespace)
        .get_opt(&lease_name(sender))
        .await
        .map_err(|e| format!("reading node {}'s heartbeat Lease: {e}", sender))?
        .ok_or_else(|| {
            format!(
                "node {} has no heartbeat Lease (no agent runs there)",
                sender
            )
        })?;
    let addr = lease.annotations().get(ADDRESS_ANNOTATION).ok_or_else(|| {
        format!(
            "the agent on node {} serves no transfer port (chart value agent.transferPort)",
            sender
        )
    })?;
    let addr: std::net::SocketAddr = addr.parse().map_err(|_| {
        format!(
            "node {}'s transfer address {addr:?} is not an address:port",
            sender
        )
    })?;
    let hello = Hello {
        job: uid,
        shard: shard
            .id
            .parse()
            .map_err(|_| format!("shard id {:?} is not a number", shard.id))?,
        epoch: shard.epoch as u64,
        ticket,
    };
    transfer::dial(addr, &tls, sender, &hello)
        .await
        .map_err(|e| crate::with_causes(&e))
}
