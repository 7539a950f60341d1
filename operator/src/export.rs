//! The CopyExport controller: says in each export's status whether it is served
//! ([`decide`]), and writes the export Secret into the export's namespace when a credential
//! is made (the whole Secret, by server-side apply) or the expiry moves (that key, by a
//! merge patch). It never reads a Secret: the credential exists in the Secret it writes and
//! nowhere else, and the status carries its SHA-256 for the agents.
//!
//! The operator may create and patch Secrets in every namespace for this; the chart's
//! `-exports` admission policy admits only the export Secret's shape (type
//! `ferry.dev/export`, named after and controlled by its CopyExport, with exactly the keys
//! of `ferry_crds::EXPORT_SECRET_KEYS`). With peering off the controller still runs, and
//! says `PeeringOff`, writing no Secret.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ferry_crds::{
    CopyExport, CopyExportStatus, FerryPeer, EXPORT_ADDRESS_KEY, EXPORT_CA_KEY,
    EXPORT_CREDENTIAL_KEY, EXPORT_EXPIRES_KEY, EXPORT_INSTALL_KEY, EXPORT_LABEL,
    EXPORT_SECRET_TYPE, EXPORT_UID_KEY, OPERATOR_MANAGER, PEERING_ADDRESS_ANNOTATION,
};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::ByteString;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, reflector, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};

use crate::Error;

pub mod decide;

/// The chart's `peering.maxExportTtl`: the longest an export may last.
pub const MAX_TTL_ENV: &str = "FERRY_PEERING_MAX_EXPORT_TTL";
/// The chart's `peering.rotationGrace`: how long a rotated credential stays good.
pub const GRACE_ENV: &str = "FERRY_PEERING_ROTATION_GRACE";
const DEFAULT_MAX_TTL: Duration = Duration::from_secs(30 * 86_400);
const DEFAULT_GRACE: Duration = Duration::from_secs(600);
/// After a failed reconcile.
const RETRY: Duration = Duration::from_secs(5);

/// This install's peering, as the export controller needs it.
#[derive(Debug, Clone)]
pub struct Own {
    /// The release namespace (where the agents' heartbeat Leases are).
    pub namespace: String,
    pub install: String,
    pub ca_pem: String,
    pub max_ttl: Duration,
    pub grace: Duration,
}

impl Own {
    /// With the limits the chart sets (a duration such as `720h`); `Err` names the variable
    /// that does not parse.
    pub fn from_env(namespace: &str, install: &str, ca_pem: &str) -> Result<Own, String> {
        Ok(Own {
            namespace: namespace.into(),
            install: install.into(),
            ca_pem: ca_pem.into(),
            max_ttl: duration_env(MAX_TTL_ENV, DEFAULT_MAX_TTL)?,
            grace: duration_env(GRACE_ENV, DEFAULT_GRACE)?,
        })
    }
}

fn duration_env(var: &str, default: Duration) -> Result<Duration, String> {
    match std::env::var(var).ok().filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => positive_duration(&v)
            .ok_or_else(|| format!("{var}={v:?} is not a positive duration such as 720h")),
    }
}

/// A chart duration (Go's spelling, as the chart checks it: `720h`, `10m`, `1h30m`).
fn positive_duration(v: &str) -> Option<Duration> {
    v.parse::<k8s_openapi::jiff::SignedDuration>()
        .ok()
        .and_then(|d| Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
}

struct Context {
    client: Client,
    own: Option<Own>,
    peers: Store<FerryPeer>,
    /// The holder pods' image (the chart's `operator.holderPods`); `None`: a CSI claim
    /// is exported only while a pod of the tenant's mounts it.
    holder_image: Option<String>,
}

/// Run the controller until SIGTERM: `own` is `None` while peering is off.
pub async fn run(client: Client, own: Option<Own>) {
    let (peers, writer) = reflector::store::<FerryPeer>();
    let controller = Controller::new(
        Api::<CopyExport>::all(client.clone()),
        watcher::Config::default(),
    );
    let exports = controller.store();
    // A FerryPeer that changes may change whether any export's readers are trusted.
    let everyone = move |_: FerryPeer| {
        exports
            .state()
            .into_iter()
            .map(|e| ObjectRef::from_obj(e.as_ref()))
            .collect::<Vec<_>>()
    };
    let controller = if own.is_some() {
        let peer_changes = reflector(
            writer,
            watcher(
                Api::<FerryPeer>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .touched_objects();
        controller.watches_stream(peer_changes, everyone)
    } else {
        // Peering off: the operator may not list FerryPeers, and needs none.
        drop(writer);
        controller
    };
    let ctx = Arc::new(Context {
        client,
        own,
        peers,
        holder_image: crate::holder::image(),
    });
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::warn!(error = %crate::error_chain(&e), "CopyExport reconcile failed");
            }
        })
        .await;
}

async fn reconcile(export: Arc<CopyExport>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = export
        .namespace()
        .ok_or_else(|| Error::NoNamespace(export.name_any()))?;
    // A CSI claim's source moves with the pod that mounts it: looked at again as often as
    // an export that is not Ready, so the Secret names the new node soon; sooner while
    // its holder pod starts.
    let mut moves = false;
    let mut holding = false;
    let (labels, source, serving) = match &ctx.own {
        // Nothing is looked at for an export that cannot be served.
        None => (BTreeMap::new(), Ok(()), Err(String::new())),
        Some(own) => {
            let labels = Api::<Namespace>::all(ctx.client.clone())
                .get_opt(&ns)
                .await?
                .map(|n| n.labels().clone())
                .unwrap_or_default();
            match crate::resolve::export_reach(&ctx.client, &ns, &export.spec.source).await? {
                Err(why) => (labels, Err(why), Err(String::new())),
                Ok(reach) => {
                    moves = matches!(reach, ferry_resolve::Reach::Csi { .. });
                    let at = match &reach {
                        ferry_resolve::Reach::Direct(v) => At::Volume(v),
                        ferry_resolve::Reach::Csi { block: true, .. } => At::Block,
                        ferry_resolve::Reach::Csi { claim, .. } => {
                            At::Mounted(claim, mounted_on(&ctx.client, &ns, claim).await?)
                        }
                    };
                    let serving = match (&at, &ctx.holder_image) {
                        // No pod mounts it: the export's holder pod will.
                        (At::Mounted(claim, None), Some(image)) if !expired(&export) => {
                            holding = true;
                            Err(
                                crate::holder::hold_export(&ctx.client, &ns, &export, claim, image)
                                    .await?,
                            )
                        }
                        _ => serving(&ctx.client, &own.namespace, &ns, &at).await?,
                    };
                    (labels, Ok(()), serving)
                }
            }
        }
    };
    let peers = ctx.peers.state();
    let peers: Vec<&FerryPeer> = peers.iter().map(Arc::as_ref).collect();
    let fresh = ferry_link::random_ticket().map_err(Error::Ticket)?;
    let mut decision = decide::decide(
        &decide::Inputs {
            export: &export,
            peering: ctx.own.as_ref().map(|o| decide::Peering {
                install: &o.install,
                ca_pem: &o.ca_pem,
                max_ttl: o.max_ttl,
                grace: o.grace,
            }),
            peers: &peers,
            namespace_labels: &labels,
            source,
            serving,
            now: SystemTime::now(),
        },
        fresh,
    );
    // The Secret first: a status naming a credential no Secret holds would refuse the
    // reader the tenant hands it to.
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    let written = match (&decision.secret, decision.changed_keys.is_empty(), &ctx.own) {
        (Some(new), _, Some(own)) => secrets
            .patch(
                &new.name,
                &PatchParams::apply(OPERATOR_MANAGER).force(),
                &Patch::Apply(&export_secret(&export, new, own)),
            )
            .await
            .map(drop),
        (None, false, Some(_)) => {
            let name = ferry_crds::export_secret_name(&export.name_any());
            let data: BTreeMap<&str, ByteString> = decision
                .changed_keys
                .iter()
                .map(|(k, v)| (*k, ByteString(v.clone().into_bytes())))
                .collect();
            let patch = serde_json::json!({ "data": data });
            secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop)
        }
        _ => Ok(()),
    };
    match written {
        Ok(()) => {}
        // Refused (the admission policy, a Secret of another type in the way, gone): the
        // export says so; anything else is retried.
        Err(kube::Error::Api(e)) if matches!(e.code, 403 | 404 | 409 | 422) => {
            let why = match e.code {
                404 => "it was deleted; bump spec.rotate for a new one".to_string(),
                _ => e.message.clone(),
            };
            decide::not_written(&export, &mut decision, &why);
        }
        Err(e) => return Err(e.into()),
    }
    if decide::changed(&export, &decision.status) {
        write_status(&export, &ns, &decision.status, &ctx.client).await?;
    }
    // An expired export's holder pod goes (a deleted export's goes with it).
    if ctx.holder_image.is_some() && moves && expired(&export) {
        crate::holder::release_export(&ctx.client, &ns, &export).await?;
    }
    let requeue = match (holding, moves) {
        (true, _) => decision.requeue.min(HOLDER_STARTING),
        (false, true) => decision.requeue.min(decide::NOT_READY_RECHECK),
        (false, false) => decision.requeue,
    };
    Ok(Action::requeue(requeue))
}

/// How soon an export whose holder pod is starting is looked at again.
const HOLDER_STARTING: Duration = Duration::from_secs(3);

/// Whether the export's time is up, as its status says (its holder is then let go).
fn expired(export: &CopyExport) -> bool {
    export
        .status
        .as_ref()
        .and_then(|s| s.expires_at.as_ref())
        .is_some_and(|t| t.0 <= k8s_openapi::jiff::Timestamp::now())
}

/// Where an export's source is.
enum At<'a> {
    /// A root or a local or hostPath volume: on the nodes it names.
    Volume(&'a ferry_resolve::volume::Volume),
    /// A CSI claim: on the node of the running pod that mounts it, if one does.
    Mounted(&'a str, Option<String>),
    /// A raw block claim: not served.
    Block,
}

/// The node of a running pod of `ns` that mounts `claim` (the tenant's own, or the
/// export's holder).
async fn mounted_on(client: &Client, ns: &str, claim: &str) -> Result<Option<String>, kube::Error> {
    let pods = ferry_resolve::pods_with_claims(client, ns, "status.phase=Running").await?;
    Ok(ferry_resolve::volume::mounting_pod(&pods, claim)
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.clone()))
}

/// The export Secret for a new credential, every key and field the `-exports` policy
/// admits (e2e/tests/hostile/exports.rs asks the policy about this very object).
pub fn export_secret(export: &CopyExport, new: &decide::NewSecret, own: &Own) -> Secret {
    let uid = export.uid().unwrap_or_default();
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: ObjectMeta {
            name: Some(new.name.clone()),
            namespace: export.namespace(),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".into(),
                    OPERATOR_MANAGER.into(),
                ),
                (EXPORT_LABEL.into(), uid.clone()),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: CopyExport::api_version(&()).into(),
                kind: CopyExport::kind(&()).into(),
                name: export.name_any(),
                uid: uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        type_: Some(EXPORT_SECRET_TYPE.into()),
        data: Some(BTreeMap::from([
            (EXPORT_INSTALL_KEY.into(), bytes(&own.install)),
            (EXPORT_UID_KEY.into(), bytes(&uid)),
            (
                EXPORT_CREDENTIAL_KEY.into(),
                ByteString(new.credential.to_vec()),
            ),
            (EXPORT_CA_KEY.into(), bytes(&own.ca_pem)),
            (EXPORT_EXPIRES_KEY.into(), bytes(&new.expires)),
            (EXPORT_ADDRESS_KEY.into(), bytes(&new.address)),
        ])),
        ..Secret::default()
    }
}

/// Which node's agent serves an export (in namespace `ns`) reached as `reach`: of the
/// nodes that have it (by name; for a CSI claim, the node of a running pod that mounts it),
/// the first whose agent's heartbeat Lease (in `namespace`) is live and advertises
/// a peering port. `Err`: why none, for the export's `NoAddress`.
async fn serving(
    client: &Client,
    namespace: &str,
    ns: &str,
    at: &At<'_>,
) -> Result<Result<decide::Serving, String>, kube::Error> {
    // The nodes that have it, by name: all are listed only for a volume that names them
    // by labels or terms; a CSI claim's one node alone.
    let nodes = Api::<Node>::all(client.clone());
    let mut having: Vec<String> = match at {
        At::Volume(volume) => nodes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| volume.nodes.matches(&n.name_any(), n.labels()))
            .map(|n| n.name_any())
            .collect(),
        At::Block => {
            return Ok(Err(
                "the source is a raw block claim (volumeMode: Block), which agents do not serve to other installs; export a filesystem claim, a StorageRoot path, or a local or hostPath claim".into(),
            ))
        }
        // A CSI volume is on a node only while a pod there mounts it: that pod's node,
        // whose agent finds the kubelet's mount itself.
        At::Mounted(claim, None) => {
            return Ok(Err(format!(
                "claim {claim:?} is a CSI volume, which is on a node only while a pod mounts it, and no running pod mounts it (Ferry starts no holder pod for it: the chart's operator.holderPods is off, or the export has expired); start a pod in namespace {ns:?} that mounts it (a pause pod is enough, read-only will do) and the export is served from that pod's node"
            )))
        }
        // (Listed by its name: the operator may list Nodes, not get them.)
        At::Mounted(_, Some(node)) => nodes
            .list(&ListParams::default().fields(&format!("metadata.name={node}")))
            .await?
            .items
            .iter()
            .map(|n| n.name_any())
            .collect(),
    };
    having.sort();
    if having.is_empty() {
        return Ok(Err(
            "no node has the source (its StorageRoot's or volume's nodes match none)".into(),
        ));
    }
    let leases = Api::<Lease>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    for name in having.iter().cloned() {
        let lease = leases
            .items
            .iter()
            .find(|l| l.name_any() == format!("{}{name}", crate::heartbeat::LEASE_PREFIX));
        let Some(lease) = lease else { continue };
        let live = lease.spec.as_ref().is_some_and(|s| {
            let within = k8s_openapi::jiff::SignedDuration::from_secs(
                2 * i64::from(s.lease_duration_seconds.unwrap_or(15)),
            );
            s.renew_time.as_ref().is_some_and(|t| t.0 + within > now)
        });
        if let (true, Some(address)) = (live, lease.annotations().get(PEERING_ADDRESS_ANNOTATION)) {
            return Ok(Ok(decide::Serving {
                node: name,
                address: address.clone(),
            }));
        }
    }
    Ok(Err(format!(
        "no live agent with a peering port runs on the nodes that have the source ({}); the chart's peering.enabled gives each agent one",
        having[..having.len().min(8)].join(", ")
    )))
}

/// The status by server-side apply, every field spelled out.
async fn write_status(
    export: &CopyExport,
    ns: &str,
    status: &CopyExportStatus,
    client: &Client,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "CopyExport",
        "status": status,
    });
    Api::<CopyExport>::namespaced(client.clone(), ns)
        .patch_status(
            &export.name_any(),
            &PatchParams::apply(OPERATOR_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

fn error_policy(_export: Arc<CopyExport>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "requeueing CopyExport");
    Action::requeue(RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_durations_read_as_go_spells_them_and_nothing_else() {
        let secs = |v| positive_duration(v).map(|d| d.as_secs());
        assert_eq!(secs("720h"), Some(720 * 3600));
        assert_eq!(secs("10m"), Some(600));
        assert_eq!(secs("1h30m"), Some(5400));
        assert_eq!(secs("45s"), Some(45));
        for bad in ["0s", "-1h", "3d", "ten minutes", ""] {
            assert_eq!(secs(bad), None, "{bad}");
        }
    }
}
