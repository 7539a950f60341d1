//! Peering, the operator's part, when the chart turns it on (`peering.enabled`, which sets
//! `FERRY_PEERING=true`): this install's peering CA and name, kept in the Secret
//! [`PEERING_CA_SECRET`] of the release namespace (made at the first start unless the admin
//! supplied one), published for the admins of other installs in the ConfigMap
//! [`PEERING_CONFIGMAP`]; the FerryPeer controller, which says in each FerryPeer's status
//! whether the agents can trust its bundle ([`decide`]); and the signer of the agents'
//! peering certificates (`ferry.dev/peering`, the signer module's checks with this CA).
//!
//! Why a CA of its own, kept in a Secret, when the transfer CA between nodes lives only in
//! the leader's memory: another cluster's admin puts this CA in a FerryPeer by hand, so it
//! must outlive leaders; a new in-memory CA at each leader change would break every peering.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ferry_crds::{
    FerryPeer, FerryPeerStatus, OPERATOR_MANAGER, PEERING_CA_SECRET, PEERING_CONFIGMAP,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::Error;

pub mod decide;

/// The environment variable the chart sets to `true` with `peering.enabled`.
pub const ENABLED_ENV: &str = "FERRY_PEERING";
/// The chart's `peering.installName`: this install's name, when the admin gives one.
pub const INSTALL_ENV: &str = "FERRY_PEERING_INSTALL";
/// The chart's `peering.caSecret`: a Secret the admin made with the peering CA's
/// `tls.crt` and `tls.key`, instead of the one the operator makes.
pub const CA_SECRET_ENV: &str = "FERRY_PEERING_CA_SECRET";
/// The Secret's keys.
const CERT_KEY: &str = "tls.crt";
const KEY_KEY: &str = "tls.key";
const INSTALL_KEY: &str = "install";
/// Between attempts to read or make the CA, or to publish it.
const RETRY: Duration = Duration::from_secs(5);

/// This install's peering identity: its name and its CA.
pub struct Own {
    pub install: String,
    pub ca: ferry_link::Ca,
}

impl std::fmt::Debug for Own {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Own")
            .field("install", &self.install)
            .finish_non_exhaustive()
    }
}

/// Run peering until SIGTERM, if the chart turned it on: the CA read or made in
/// `namespace` (retried until it is: nothing else of peering works without it), published,
/// then the FerryPeer controller and the peering signer, which issues only to the agents'
/// ServiceAccount `agent_sa` (in `namespace`).
pub async fn run(client: Client, namespace: &str, agent_sa: &str) {
    if !std::env::var(ENABLED_ENV).is_ok_and(|v| v == "true") {
        // Exports still get a status: PeeringOff.
        crate::export::run(client, None).await;
        return;
    }
    // The exports' limits are read before anything is made: a bad value is the chart's.
    let mut exports = match crate::export::Own::from_env(namespace, "", "") {
        Ok(limits) => limits,
        Err(why) => {
            tracing::error!(%why, "peering: the chart's peering values");
            std::process::exit(2);
        }
    };
    let own = loop {
        match own_identity(&client, namespace).await {
            Ok(own) => break own,
            Err(why) => {
                tracing::warn!(%why, "peering: this install's peering CA");
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    tracing::info!(install = %own.install, "peering: this install's CA is ready");
    while let Err(why) = publish(&client, namespace, &own).await {
        tracing::warn!(%why, "peering: publishing {PEERING_CONFIGMAP}");
        tokio::time::sleep(RETRY).await;
    }
    let controller = Controller::new(
        Api::<FerryPeer>::all(client.clone()),
        watcher::Config::default(),
    );
    let peers = controller.store();
    // A peer that changes or goes may change what the others are (the first to name an
    // install, or to hold a CA, is the valid one): all are looked at again. Admins write a
    // handful.
    let everyone = {
        let peers = peers.clone();
        move |_changed: FerryPeer| {
            peers
                .state()
                .into_iter()
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    exports.install.clone_from(&own.install);
    exports.ca_pem = own.ca.cert_pem().to_string();
    let client_exports = client.clone();
    let ctx = Arc::new(Context {
        client: client.clone(),
        peers,
        install: own.install.clone(),
    });
    // The agents' peering certificates, signed with this CA for the node each agent's
    // token is bound to, naming this install.
    let signer = crate::signer::serve(
        client.clone(),
        namespace,
        agent_sa,
        crate::signer::Issuer::peering(own.ca, &own.install),
    );
    let peers = controller
        .watches(
            Api::<FerryPeer>::all(client),
            watcher::Config::default(),
            everyone,
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::warn!(error = %crate::error_chain(&e), "FerryPeer reconcile failed");
            }
        });
    tokio::join!(
        peers,
        signer,
        crate::export::run(client_exports, Some(exports))
    );
}

/// This install's name and CA: from the Secret (the admin's, `peering.caSecret`, or the one
/// an earlier start made), else made now and kept in a new Secret. `Err`: what is wrong, for
/// the log, and retried.
pub async fn own_identity(client: &Client, namespace: &str) -> Result<Own, String> {
    let given = std::env::var(CA_SECRET_ENV).ok().filter(|s| !s.is_empty());
    let name = given.clone().unwrap_or_else(|| PEERING_CA_SECRET.into());
    let install_given = std::env::var(INSTALL_ENV).ok().filter(|s| !s.is_empty());
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    loop {
        let found = secrets
            .get_opt(&name)
            .await
            .map_err(|e| format!("reading Secret {namespace}/{name}: {e}"))?;
        if let Some(secret) = found {
            return from_secret(&secret, install_given.as_deref())
                .map_err(|why| format!("Secret {namespace}/{name}: {why}"));
        }
        if given.is_some() {
            return Err(format!(
                "Secret {namespace}/{name} (peering.caSecret) does not exist: create it with the peering CA's tls.crt and tls.key, or leave peering.caSecret empty for the operator to make one"
            ));
        }
        let install = match &install_given {
            Some(i) => i.clone(),
            None => {
                let r = ferry_link::random_ticket().map_err(|e| e.to_string())?;
                decide::new_install_name(namespace, [r[0], r[1], r[2], r[3]])
            }
        };
        ferry_link::validate_install_name(&install)
            .map_err(|e| format!("peering.installName: {e}"))?;
        let ca = ferry_link::Ca::generate(&format!("Ferry peering CA {install}"))
            .map_err(|e| e.to_string())?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            data: Some(
                [
                    (CERT_KEY, ca.cert_pem().to_string()),
                    (KEY_KEY, ca.key_pem()),
                    (INSTALL_KEY, install.clone()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
            ),
            ..Secret::default()
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok(Own { install, ca }),
            // Made meanwhile (another replica, a restart): read it as it is.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(format!("creating Secret {namespace}/{name}: {e}")),
        }
    }
}

/// The identity a Secret holds; `install_given` (the chart's `peering.installName`) must
/// agree with what it says, since peers' FerryPeers name the install.
fn from_secret(secret: &Secret, install_given: Option<&str>) -> Result<Own, String> {
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &str| -> Result<Option<String>, String> {
        data.get(key)
            .map(|v| {
                String::from_utf8(v.0.clone()).map_err(|_| format!("its key {key} is not UTF-8"))
            })
            .transpose()
    };
    let (Some(cert), Some(key)) = (text(CERT_KEY)?, text(KEY_KEY)?) else {
        return Err(format!(
            "it needs the keys {CERT_KEY} and {KEY_KEY} (the peering CA's certificate and key, PEM)"
        ));
    };
    let install = match (text(INSTALL_KEY)?, install_given) {
        (Some(kept), Some(given)) if kept != given => {
            return Err(format!(
                "it names install {kept:?} and peering.installName says {given:?}: peers know this install by the first; set peering.installName to it"
            ))
        }
        (Some(kept), _) => kept,
        (None, Some(given)) => given.to_string(),
        (None, None) => {
            return Err(format!(
                "it has no key {INSTALL_KEY}: set peering.installName to this install's name"
            ))
        }
    };
    ferry_link::validate_install_name(&install).map_err(|e| e.to_string())?;
    let ca = ferry_link::Ca::from_pem(&cert, &key).map_err(|e| e.to_string())?;
    Ok(Own { install, ca })
}

/// The ConfigMap [`PEERING_CONFIGMAP`] as [`decide::published`] says, made or brought up to
/// date.
async fn publish(client: &Client, namespace: &str, own: &Own) -> Result<(), String> {
    let data = decide::published(&own.install, own.ca.cert_pem())?;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let err = |e: kube::Error| format!("ConfigMap {namespace}/{PEERING_CONFIGMAP}: {e}");
    match maps.get_opt(PEERING_CONFIGMAP).await.map_err(err)? {
        Some(map) if map.data.as_ref() == Some(&data) => Ok(()),
        Some(mut map) => {
            map.data = Some(data);
            maps.replace(PEERING_CONFIGMAP, &PostParams::default(), &map)
                .await
                .map_err(err)?;
            Ok(())
        }
        None => {
            let map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(PEERING_CONFIGMAP.into()),
                    namespace: Some(namespace.into()),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..ConfigMap::default()
            };
            maps.create(&PostParams::default(), &map)
                .await
                .map_err(err)?;
            Ok(())
        }
    }
}

/// Shared state of the FerryPeer reconciler.
struct Context {
    client: Client,
    peers: Store<FerryPeer>,
    install: String,
}

async fn reconcile(peer: Arc<FerryPeer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let all = ctx.peers.state();
    let all: Vec<&FerryPeer> = all.iter().map(Arc::as_ref).collect();
    let (status, requeue) = decide::judge(&peer, &all, &ctx.install, SystemTime::now());
    if decide::changed(&peer, &status) {
        write_status(&peer, &status, &ctx.client).await?;
    }
    Ok(Action::requeue(requeue))
}

/// The status by server-side apply, every field spelled out.
async fn write_status(
    peer: &FerryPeer,
    status: &FerryPeerStatus,
    client: &Client,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "FerryPeer",
        "status": status,
    });
    Api::<FerryPeer>::all(client.clone())
        .patch_status(
            &peer.name_any(),
            &PatchParams::apply(OPERATOR_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

fn error_policy(_peer: Arc<FerryPeer>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %crate::error_chain(error), "requeueing FerryPeer");
    Action::requeue(RETRY)
}
