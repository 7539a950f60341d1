//! A CopyExport's source, resolved as a job's source is: the claim there and bound, or
//! the StorageRoot admitting the export's namespace (what the export's `SourceNotFound`
//! says when not).

use ferry_crds::Endpoint;
use kube::Client;

use crate::{reach, validate, Reach};

/// A CopyExport's source in namespace `ns`: `Ok(Ok(()))` when its claim is there and bound
/// (or waits for its first consumer) or its StorageRoot admits the namespace, as a job's
/// source would be reached; else why not, for the export's condition. The path is checked
/// by the CRD's rules and again by the agent that serves it.
pub async fn export_source(
    client: &Client,
    ns: &str,
    source: &ferry_crds::ExportSource,
) -> Result<Result<(), String>, kube::Error> {
    Ok(export_reach(client, ns, source).await?.map(|_| ()))
}

/// How a CopyExport's source in namespace `ns` is reached ([`crate::Reach`]), or why not:
/// what the agent serving it resolves for itself (from the export's spec and objects only
/// admins or Kubernetes write).
pub async fn export_reach(
    client: &Client,
    ns: &str,
    source: &ferry_crds::ExportSource,
) -> Result<Result<Reach, String>, kube::Error> {
    let e = Endpoint {
        root: source.root.clone(),
        pvc: source.pvc.clone(),
        path: source.path.clone(),
        ..Endpoint::default()
    };
    if let Err(r) = validate::check_relative_path("spec.source.path", &e.path) {
        return Ok(Err(r.message));
    }
    Ok(reach(client, ns, "spec.source", &e, false, "")
        .await?
        .map_err(|b| b.message))
}
