//! The pods of a namespace as the resolver reads them: the Running ones that have a claim
//! (listed a page at a time, trimmed to what says which claims they have), and which of
//! them are a job's own holder pods (by the labels the operator gives them).

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

/// The label naming the CopyJob (its uid) a holder pod is for.
pub const HOLDER_OF: &str = "ferry.dev/holder-of";
/// The label saying which end of its job a holder pod holds: `source` or `destination`.
pub const HOLDS: &str = "ferry.dev/holds";

/// The value of [`HOLDS`] for an end.
pub fn end(destination: bool) -> &'static str {
    match destination {
        true => "destination",
        false => "source",
    }
}

/// Whether `pod` is a holder of job `job_uid` (any end).
pub(crate) fn holder_of(pod: &Pod, job_uid: &str) -> bool {
    !job_uid.is_empty() && pod.labels().get(HOLDER_OF).map(String::as_str) == Some(job_uid)
}

/// Whether `pod` has `claim` among its volumes (mounted, or as a device).
pub fn uses_claim(pod: &Pod, claim: &str) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == claim)
        })
}

/// The running holder pod of job `job_uid` for its end that is `claim` (a raw block
/// claim's: the pod whose device the agent takes), among `pods` (Running ones).
pub(crate) fn block_holder<'a>(
    pods: &'a [Pod],
    claim: &str,
    job_uid: &str,
    destination: bool,
) -> Option<&'a Pod> {
    pods.iter().find(|p| {
        holder_of(p, job_uid)
            && p.labels().get(HOLDS).map(String::as_str) == Some(end(destination))
            && uses_claim(p, claim)
            && p.metadata.deletion_timestamp.is_none()
            && p.metadata.uid.is_some()
            && p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
    })
}

/// Pods listed a page at a time: what the operator holds of a namespace's pods at once.
const POD_PAGE: u32 = 100;

/// The Running pods of `ns` that mount a claim, with only what [`volume::mounting_pod`]
/// reads of them. A job waiting for a CSI claim's pod looks every 5 s: the API server
/// selects Running pods (a field selector), and [`pods_with_claims`] keeps what it needs.
pub(crate) async fn running_pods_with_claims(
    client: &Client,
    ns: &str,
) -> Result<Vec<Pod>, kube::Error> {
    pods_with_claims(client, ns, "status.phase=Running").await
}

/// The pods of `ns` that `phases` (a field selector on `status.phase`) selects and that
/// have a claim, with their metadata (no annotations or managed fields), their claim
/// volumes and their phase only: the list comes a page of [`POD_PAGE`] at a time, and a
/// pod with no claim, or the parts of one that say nothing about its claims (containers,
/// most of its status), are dropped as each page arrives, so a namespace of many pods costs
/// one page of them. Also the operator's claim migrations (the pods that have a claim and
/// have not ended).
pub async fn pods_with_claims(
    client: &Client,
    ns: &str,
    phases: &str,
) -> Result<Vec<Pod>, kube::Error> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let mut params = ListParams::default().fields(phases).limit(POD_PAGE);
    let mut kept = Vec::new();
    loop {
        let page = api.list(&params).await?;
        for mut pod in page.items {
            let mounts_a_claim = pod.spec.as_ref().is_some_and(|s| {
                s.volumes
                    .iter()
                    .flatten()
                    .any(|v| v.persistent_volume_claim.is_some())
            });
            if !mounts_a_claim {
                continue;
            }
            pod.metadata.managed_fields = None;
            pod.metadata.annotations = None;
            if let Some(spec) = pod.spec.as_mut() {
                spec.containers.clear();
                spec.init_containers = None;
                if let Some(volumes) = spec.volumes.as_mut() {
                    volumes.retain(|v| v.persistent_volume_claim.is_some());
                }
            }
            if let Some(status) = pod.status.as_mut() {
                *status = k8s_openapi::api::core::v1::PodStatus {
                    phase: status.phase.take(),
                    ..Default::default()
                };
            }
            kept.push(pod);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(kept),
        }
    }
}
