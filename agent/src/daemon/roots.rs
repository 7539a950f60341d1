//! The roots a job names, inside this node's filesystem: which host paths this agent may
//! open for a shard (the operator's assignment checked against the job and the StorageRoot
//! or claim it names: [`own`], [`own_root`]), and opening one beneath the host root,
//! refusing what is not a directory or leaves it ([`open_root`]). Shared by a shard's run
//! and the sender that serves a source to another node.

use std::os::fd::AsFd;
use std::os::fd::OwnedFd;
use std::path::Path;

use ferry_resolve::Reach;
use kube::ResourceExt;
use kube::{Api, Client};

use crate::daemon::error::ShardError;

/// The host paths of a shard's roots (`wanted`: which, and the status's account of each),
/// as this agent resolves them itself from the job's spec and objects only admins (or
/// Kubernetes) write: a StorageRoot this namespace may use and that selects this node, a
/// claim bound to its volume whose affinity includes this node. Never from the job's
/// status, which an agent token can write: the status's paths are only the operator's
/// account of the same (a CSI volume's pod mount, which depends on a pod, is taken from it
/// only if it is the kubelet's mount of that very volume).
pub(super) async fn own(
    client: &Client,
    me: &str,
    job: &ferry_crds::CopyJob,
    wanted: &[(&'static str, &str)],
) -> Result<Vec<String>, ShardError> {
    let ns = job.namespace().unwrap_or_default();
    let (src, dst) = match ferry_resolve::reach_both(client, &ns, job).await {
        Err(e) => return Err(ShardError::Api(e)),
        Ok(Err(blocked)) => {
            return Err(ShardError::Refused {
                reason: blocked.reason,
                message: blocked.message,
            })
        }
        Ok(Ok(pair)) => pair,
    };
    let labels = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(me)
        .await
        .map_err(ShardError::Api)?
        .metadata
        .labels
        .unwrap_or_default();
    let kubelet_dir = ferry_resolve::volume::kubelet_dir();
    let pick = |what: &'static str, assigned: &str| {
        let reach = if what == "source" { &src } else { &dst };
        match reach {
            Reach::Direct(v) if v.nodes.matches(me, &labels) => {
                if v.host_path != assigned {
                    tracing::warn!(job = %job.name_any(), %ns, what, status = assigned, resolved = %v.host_path, "the shard's status names another root than the job resolves to; using the job's");
                }
                Ok(v.host_path.clone())
            }
            Reach::Direct(_) => Err(ShardError::NotOnThisNode {
                what,
                node: me.to_string(),
            }),
            // A raw block claim is no root: its device is handed over (shard/block.rs).
            Reach::Csi {
                pv_name: Some(pv),
                block: false,
                ..
            } if is_csi_mount(assigned, &kubelet_dir, pv) => Ok(assigned.to_string()),
            // Not its volume's mount, or a claim not bound to a volume yet.
            Reach::Csi { pv_name, .. } => Err(ShardError::NotTheVolume {
                what,
                path: assigned.to_string(),
                pv: pv_name.clone().unwrap_or_default(),
            }),
        }
    };
    wanted
        .iter()
        .map(|(what, assigned)| pick(what, assigned))
        .collect()
}

/// One root of `job` on this node (`source`, or the destination), resolved as [`own`]
/// resolves a shard's: what a sender serves.
pub(super) async fn own_root(
    client: &Client,
    me: &str,
    job: &ferry_crds::CopyJob,
    source: bool,
    assigned: &str,
) -> Result<String, ShardError> {
    let what = if source { "source" } else { "destination" };
    let mut paths = own(client, me, job, &[(what, assigned)]).await?;
    Ok(paths.pop().unwrap_or_default())
}

/// Whether `path` is where the kubelet mounts CSI volume `pv` for some pod:
/// `<kubelet dir>/pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount`.
pub(super) fn is_csi_mount(path: &str, kubelet_dir: &str, pv: &str) -> bool {
    let Some(uid) = path
        .strip_prefix(kubelet_dir.trim_end_matches('/'))
        .and_then(|p| p.strip_prefix("/pods/"))
        .and_then(|p| p.strip_suffix(&format!("/volumes/kubernetes.io~csi/{pv}/mount")))
    else {
        return false;
    };
    uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Every path from here on is resolved from a directory fd: the roots (admin paths)
/// inside the node's filesystem, the job's paths (tenant paths) beneath the roots with
/// openat2 and no symlinks (ferry_engine::copy_beneath). A root is the admin's (or the
/// kubelet's) to create: a missing one is a mount that is not there, and writing into the
/// node's own disk below it would hide the data.
pub(super) fn open_root(
    host_root: &Path,
    node: &str,
    what: &'static str,
    path: &str,
) -> Result<OwnedFd, ShardError> {
    let host = std::fs::File::open(host_root).map_err(|source| ShardError::HostRoot {
        path: host_root.to_path_buf(),
        source,
    })?;
    if !path.starts_with('/') {
        return Err(ShardError::NoHostPath);
    }
    ferry_engine::open_host_path(host.as_fd(), path).map_err(|source| ShardError::Root {
        what,
        path: path.to_string(),
        node: node.to_string(),
        source,
    })
}
