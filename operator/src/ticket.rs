//! The tickets of shards copied between nodes (see `ferry_crds::Ticket`): one Secret per job
//! in the tickets namespace (`<release>-tickets`), written before the assignment that needs
//! it lands in the status, deleted when the job finishes or is deleted. The agents only
//! read it.

use std::collections::BTreeMap;

use ferry_crds::{ticket_secret, CopyJob, ExportTicket, ShardStatus, Ticket, OPERATOR_MANAGER};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

/// Type of the ticket Secrets (what `kubectl get secrets` shows).
pub const SECRET_TYPE: &str = "ferry.dev/transfer-ticket";
/// Label on every ticket Secret: the job's uid.
pub const JOB_UID_LABEL: &str = "ferry.dev/job-uid";

/// What each running job reading an export last had written into its ticket (a hash of it,
/// by job uid), so that a Secret carried again (rotated, moved) is written into the ticket
/// at the same epoch, and the receiver's next dial uses it. Kept from [`issue`] to
/// [`revoke`]; empty after a restart (each such job's ticket is then written once more).
#[derive(Debug, Default)]
pub struct Issued(std::sync::Mutex<BTreeMap<String, u64>>);

impl Issued {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether job `uid`'s ticket was last written with another export than `export`
    /// (`None`: the job reads no export, and nothing is stale).
    pub fn stale(&self, uid: &str, export: Option<&ExportTicket>) -> bool {
        export.is_some_and(|t| self.lock().get(uid) != Some(&export_hash(t)))
    }
}

/// Whether these shards need tickets: some unfinished shard is copied between nodes.
pub fn needed(shards: &[ShardStatus]) -> bool {
    shards.iter().any(|s| paired(&s))
}

/// An unfinished shard given to a pair of agents: what a ticket is for.
fn paired(s: &&ShardStatus) -> bool {
    s.between_nodes() && !s.node.is_empty() && !s.progress.state.finished()
}

/// Write a fresh ticket for every unfinished shard of `job` that is copied between nodes, at
/// the pairing and epoch `shards` give it, replacing the Secret's entries (an older epoch's
/// ticket no longer opens anything).
pub async fn issue(
    client: &Client,
    namespace: &str,
    job: &CopyJob,
    shards: &[ShardStatus],
    export: Option<&ExportTicket>,
    issued: &Issued,
) -> Result<(), crate::Error> {
    let uid = job.uid().unwrap_or_default();
    let mut data = BTreeMap::new();
    for s in shards.iter().filter(paired) {
        let bytes = ferry_link::random_ticket().map_err(crate::Error::Ticket)?;
        let mut t = Ticket::new(
            s.epoch,
            s.sender.as_deref().unwrap_or_default(),
            &s.node,
            bytes,
        );
        // A shard read from another install's export: what its receiver dials and says.
        if s.sender.as_deref() == Some(ferry_crds::EXPORT_SENDER) {
            t.export = export.cloned();
        }
        let json = serde_json::to_vec(&t).unwrap_or_default();
        data.insert(s.id.clone(), ByteString(json));
    }
    let name = ticket_secret(&uid);
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                JOB_UID_LABEL: uid,
                "app.kubernetes.io/managed-by": "ferry",
            },
            "annotations": {
                "ferry.dev/job": format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any()),
            },
        },
        "type": SECRET_TYPE,
        "data": data,
    });
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(
            &name,
            &PatchParams::apply(OPERATOR_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await?;
    if let Some(t) = export {
        issued.lock().insert(uid, export_hash(t));
    }
    Ok(())
}

/// What tells one export's ticket from another (a rotated credential, a new address): a
/// hash of all of it, to compare with what was written last.
fn export_hash(t: &ExportTicket) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(t).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// Delete a job's ticket Secret, if it has one.
pub async fn revoke(
    client: &Client,
    namespace: &str,
    job: &CopyJob,
    issued: &Issued,
) -> Result<(), crate::Error> {
    let uid = job.uid().unwrap_or_default();
    issued.lock().remove(&uid);
    let name = ticket_secret(&uid);
    match Api::<Secret>::namespaced(client.clone(), namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
