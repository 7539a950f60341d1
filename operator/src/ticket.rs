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
    Ok(())
}

/// What tells one export's ticket from another (a rotated credential, a new address): a
/// hash of all of it, to compare with what was written last.
pub fn export_hash(t: &ExportTicket) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(t).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// Delete a job's ticket Secret, if it has one.
pub async fn revoke(client: &Client, namespace: &str, job: &CopyJob) -> Result<(), crate::Error> {
    let name = ticket_secret(&job.uid().unwrap_or_default());
    match Api::<Secret>::namespaced(client.clone(), namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
