//! A raw block claim's device, taken from the job's holder pod on this node (`ferry-agent
//! hold-block` hands the descriptor over its emptyDir's socket, [`crate::handoff`]) and
//! proved to be the claim's before any I/O. Used by the block shard (both ends on one node,
//! or the destination of a copy between nodes) and by the sender of a copy between nodes
//! (the source).
//!
//! Nothing here comes from the job's status but the holders' pod uids, and those only as
//! names: the socket directory must be a holder's emptyDir under the kubelet's pod
//! directory, and the descriptor it hands over must have the `st_rdev` of the node the
//! kubelet made for *this claim's volume* and that pod. A forged status can name another
//! pod, but no pod's device passes the check unless it is the claim's.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use ferry_crds::{CopyJob, Reason};
use ferry_engine::block::Device;
use ferry_resolve::{block as claims, Reach};
use kube::{Client, ResourceExt};

use super::error::ShardError;
use crate::handoff::{claim_rdev, fetch_at, Expect, HandoffError};

/// How long a holder that runs may take to open its device and listen.
const HOLDER_WAIT: Duration = Duration::from_secs(30);

pub(super) fn refused(reason: Reason, message: impl Into<String>) -> ShardError {
    ShardError::Refused {
        reason,
        message: message.into(),
    }
}

/// One end of the copy: which claim's volume, through which holder pod.
#[derive(Clone, Debug)]
pub(super) struct End {
    what: &'static str,
    pub(super) pv: String,
    holder_uid: String,
    write: bool,
}

/// The two ends, as this agent resolves the job itself: both raw block claims bound to
/// their volumes, each reached through the holder pod whose uid the status names at
/// `source_root` and `destination_root` (the holders' fd directories).
pub(super) async fn ends(
    client: &Client,
    job: &CopyJob,
    source_root: &str,
    destination_root: &str,
) -> Result<[End; 2], ShardError> {
    let ns = job.namespace().unwrap_or_default();
    let (src, dst) = match ferry_resolve::reach_both(client, &ns, job).await {
        Err(e) => return Err(ShardError::Api(e)),
        Ok(Err(b)) => return Err(refused(b.reason, b.message)),
        Ok(Ok(pair)) => pair,
    };
    let kubelet = ferry_resolve::volume::kubelet_dir();
    let end = |what: &'static str, reach: &Reach, assigned: &str, write: bool| {
        let not_it = |pv: &str| ShardError::NotTheVolume {
            what,
            path: assigned.to_string(),
            pv: pv.to_string(),
        };
        let Reach::Csi {
            pv_name: Some(pv),
            block: true,
            ..
        } = reach
        else {
            return Err(not_it(""));
        };
        let uid = claims::holder_of_fd_dir(assigned, &kubelet).ok_or_else(|| not_it(pv))?;
        Ok(End {
            what,
            pv: pv.clone(),
            holder_uid: uid.to_string(),
            write,
        })
    };
    Ok([
        end("source", &src, source_root, false)?,
        end("destination", &dst, destination_root, true)?,
    ])
}

/// Whether volume `pv` may be attached to more than one node at once (`ReadWriteMany`):
/// then writes from another node are not counted on this one's device.
pub(super) async fn shared(client: &Client, pv: &str) -> Result<bool, ShardError> {
    let pvs = kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone());
    let pv = pvs.get(pv).await.map_err(ShardError::Api)?;
    Ok(pv
        .spec
        .and_then(|s| s.access_modes)
        .is_some_and(|m| m.iter().any(|m| m == "ReadWriteMany")))
}

/// Take `end`'s device from its holder, checked against the claim's device node; blocking
/// (call it on the blocking pool). A holder just started may not listen yet: tried again
/// for [`HOLDER_WAIT`].
pub(super) fn take(host_root: &Path, end: &End) -> Result<Device, ShardError> {
    let kubelet = ferry_resolve::volume::kubelet_dir();
    let host = std::fs::File::open(host_root).map_err(|source| ShardError::HostRoot {
        path: host_root.to_path_buf(),
        source,
    })?;
    let open = |path: &str| {
        ferry_engine::open_host_path(host.as_fd(), path).map_err(|e| {
            refused(Reason::CannotStart, format!("the {} claim's holder pod {} on this node: {}: {e}; is the holder running here?", end.what, end.holder_uid, path))
        })
    };
    let nodes = open(&claims::device_node_dir(&kubelet, &end.pv))?;
    let node_path = format!(
        "/proc/self/fd/{}/{}",
        std::os::fd::AsRawFd::as_raw_fd(&nodes),
        end.holder_uid
    );
    let rdev = claim_rdev(Path::new(&node_path)).map_err(|e| {
        refused(Reason::CannotStart, format!("the {} claim's device node for its holder pod {} (under {}): {e}; is the holder running on this node?", end.what, end.holder_uid, claims::device_node_dir(&kubelet, &end.pv)))
    })?;
    let dir_path = claims::fd_dir(&kubelet, &end.holder_uid);
    let dir = open(&dir_path)?;
    let expect = Expect {
        rdev,
        write: end.write,
    };
    let began = Instant::now();
    loop {
        match fetch_at(dir.as_fd(), Path::new(&dir_path), expect) {
            Ok(device) => return Ok(device),
            // Not listening yet (no socket, or nobody at it): a holder opens its device
            // first; one that cannot stays this way, and says why in its log.
            Err(e) if not_listening(&e) && began.elapsed() < HOLDER_WAIT => {
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => {
                let hint = if not_listening(&e) {
                    " (the holder pod did not hand its device over: if its log says permission denied, the container runtime must give a non-root pod its devices, containerd's device_ownership_from_security_context = true; see docs/install.md)"
                } else {
                    ""
                };
                return Err(refused(
                    Reason::CannotStart,
                    format!(
                        "the {} claim's device from its holder pod: {e}{hint}",
                        end.what
                    ),
                ));
            }
        }
    }
}

fn not_listening(e: &HandoffError) -> bool {
    match e {
        HandoffError::Io { source, .. } => matches!(
            source.raw_os_error(),
            Some(libc::ENOENT | libc::ECONNREFUSED)
        ),
        HandoffError::Refused(m) => m.contains("is not a socket"),
        _ => false,
    }
}
