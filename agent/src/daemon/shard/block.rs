//! A shard between two raw block claims: each end's device taken from the job's holder pod
//! on this node (`ferry-agent hold-block` hands the descriptor over its emptyDir's socket,
//! [`crate::handoff`]) and proved to be the claim's before any I/O, then copied by the
//! engine's block copy ([`ferry_engine::block::copy_device`]: chunks at queue depth,
//! hashes, zeros punched, read back, resume by chunk from a journal the agent keeps).
//!
//! Nothing here comes from the job's status but the holders' pod uids, and those only as
//! names: the socket directory must be a holder's emptyDir under the kubelet's pod
//! directory, and the descriptor it hands over must have the `st_rdev` of the node the
//! kubelet made for *this claim's volume* and that pod. A forged status can name another
//! pod, but no pod's device passes the check unless it is the claim's.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_crds::{Compare, Overwrite, Reason, ShardState, Verify};
use ferry_engine::block::{copy_device, BlockOptions, BlockSummary, Cache, Device, Rerun, Zeros};
use ferry_engine::{Progress, Strategy};
use ferry_resolve::{block as claims, Reach};
use kube::ResourceExt;

use super::copy::publish_until;
use super::node::{Active, Node};
use super::witness;
use crate::daemon::error::ShardError;
use crate::daemon::publish::{Live, Target};
use crate::handoff::{claim_rdev, fetch_at, Expect, HandoffError};

/// How long a holder that runs may take to open its device and listen.
const HOLDER_WAIT: Duration = Duration::from_secs(30);

/// Whether the operator assigned this shard to block claims: both its roots are holder
/// socket directories. (What they are is proved in [`run`]; this only picks the path.)
pub(super) fn is_block(target: Target<'_>) -> bool {
    let kubelet = ferry_resolve::volume::kubelet_dir();
    let shard = target.shard;
    [&shard.source_root, &shard.destination_root]
        .iter()
        .any(|p| claims::holder_of_fd_dir(p, &kubelet).is_some())
}

fn refused(reason: Reason, message: impl Into<String>) -> ShardError {
    ShardError::Refused {
        reason,
        message: message.into(),
    }
}

/// One end of the copy: which claim's volume, through which holder pod.
struct End {
    what: &'static str,
    pv: String,
    holder_uid: String,
    write: bool,
}

/// The two ends, as this agent resolves the job itself: both raw block claims bound to
/// their volumes, each reached through the holder pod whose uid the status names.
async fn ends(node: &Node, target: Target<'_>) -> Result<[End; 2], ShardError> {
    let (job, shard) = (target.job, target.shard);
    let ns = job.namespace().unwrap_or_default();
    let (src, dst) = match ferry_resolve::reach_both(&node.client, &ns, job).await {
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
        end("source", &src, &shard.source_root, false)?,
        end("destination", &dst, &shard.destination_root, true)?,
    ])
}

/// Whether volume `pv` may be attached to more than one node at once (`ReadWriteMany`):
/// then writes from another node are not counted on this one's device.
async fn shared(node: &Node, pv: &str) -> Result<bool, ShardError> {
    let pvs = kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(node.client.clone());
    let pv = pvs.get(pv).await.map_err(ShardError::Api)?;
    Ok(pv
        .spec
        .and_then(|s| s.access_modes)
        .is_some_and(|m| m.iter().any(|m| m == "ReadWriteMany")))
}

/// Take `end`'s device from its holder, checked against the claim's device node, on the
/// blocking pool's thread. A holder just started may not listen yet: tried again for
/// [`HOLDER_WAIT`].
fn take(host_root: &Path, end: &End) -> Result<Device, ShardError> {
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

/// The engine's options from the job's spec (the operator refused what means nothing for a
/// device: `ferry_resolve::block::check_pair`).
fn options(target: Target<'_>, active: &Active, journal: PathBuf) -> BlockOptions {
    let spec = &target.job.spec;
    let rerun = match (spec.overwrite, spec.compare) {
        (Overwrite::IfChanged, Compare::Checksum) => Rerun::OnlyChanged,
        _ => Rerun::WriteAll,
    };
    BlockOptions {
        rerun,
        verify: spec.verify != Verify::None,
        // Full: read back from the device itself, never from the page cache.
        cache: match spec.verify {
            Verify::Full => Cache::Direct,
            _ => Cache::Auto,
        },
        zeros: Zeros::Punch,
        cancel: Some(active.cancel.clone()),
        journal: Some(journal),
        delay_per_chunk: crate::block_cmd::fault_chunk_delay(),
        ..BlockOptions::default()
    }
}

/// The shard's progress as the device's bytes: written or found equal so far.
struct DeviceProgress(Arc<Live>);

impl Progress for DeviceProgress {
    fn bytes_copied(&self, bytes: u64, strategy: Strategy) {
        self.0.bytes.fetch_add(bytes, Ordering::Relaxed);
        crate::serve::metrics().bytes_copied(bytes, strategy);
    }
    fn bytes_verified(&self, bytes: u64) {
        crate::serve::metrics().bytes_verified.inc_by(bytes);
    }
    fn resumed(&self, size: u64) {
        self.0.count_resumed(size);
    }
}

/// Run a block shard to its end: both devices taken, the copy on its own thread while its
/// progress is published, the outcome published.
pub(super) async fn run(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
) -> Result<ShardState, ShardError> {
    let (job, shard) = (target.job, target.shard);
    if shard.between_nodes() {
        return Err(refused(Reason::NotForBlock, "copies of raw block claims between nodes are not built yet: use two claims that one node can reach"));
    }
    let [src_end, dst_end] = ends(node, target).await?;
    // The destination's kept manifest, from the agent's records of its volume: by the PV's
    // name, which this agent resolved itself.
    let record = node.journals.records("ferry-block", &dst_end.pv, "");
    let shared = shared(node, &dst_end.pv).await?;
    let host = node.settings.host_root.clone();
    let (src, dst) = tokio::task::spawn_blocking({
        let host = host.clone();
        move || Ok::<_, ShardError>((take(&host, &src_end)?, take(&host, &dst_end)?))
    })
    .await??;
    let uid = job.uid().unwrap_or_default();
    if job.spec.dry_run {
        let live = Live::default();
        node.publish(
            target,
            ShardState::Succeeded,
            &live,
            Some((1, src.size() as i64)),
        )
        .await?;
        return Ok(ShardState::Succeeded);
    }
    let name = |what: &str| format!("block-{}.{what}", shard.id);
    let journal = node
        .journals
        .path(&uid, &name("journal"))
        .map_err(|source| ShardError::Journal {
            path: PathBuf::from(name("journal")),
            source,
        })?;
    let mut opts = options(target, active, journal.clone());
    // A re-run by hashes takes the destination's from the manifest the last copy onto it
    // kept, if nothing wrote the device since (see `witness`); any run takes the record
    // away before it writes.
    let wanted = opts.rerun == Rerun::OnlyChanged;
    let (taken, mut dst) = tokio::task::spawn_blocking({
        let (record, host) = (record.clone(), host.clone());
        move || {
            let now = match (wanted, shared) {
                (true, false) => witness::of(&dst, &host),
                (true, true) => Err(
                    "the volume is ReadWriteMany: another node's writes are not counted here"
                        .into(),
                ),
                (false, _) => Err("not a re-run by checksums".into()),
            };
            (witness::take(&record, now), dst)
        }
    })
    .await?;
    match taken {
        Ok(kept) => opts.kept = Some(kept),
        Err(why) if wanted => {
            tracing::info!(job = %job.name_any(), shard = %shard.id, %why, "reading the destination for its hashes");
        }
        Err(_) => {}
    }
    let live = Arc::new(Live::default());
    live.set_planned(1, src.size() as i64);
    tracing::info!(job = %job.name_any(), %uid, shard = %shard.id, bytes = src.size(), "starting block shard");
    node.publish(target, ShardState::Running, &live, None)
        .await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = Arc::new(AtomicBool::new(false));
    {
        let (live, done) = (live.clone(), done.clone());
        std::thread::Builder::new()
            .name("ferry-block".into())
            .spawn(move || {
                let result = copy_device(&src, &mut dst, &opts, &DeviceProgress(live));
                // After the copy's flush: what the destination is now, to keep with its
                // manifest.
                let witness = match &result {
                    Ok(s) if !s.cancelled && !shared => Some(witness::of(&dst, &host)),
                    _ => None,
                };
                done.store(true, Ordering::Relaxed);
                let _ = tx.send(result.map(|s| (s, witness)));
            })
            .map_err(ShardError::Spawn)?;
    }
    let result = publish_until(node, target, active, &live, &done, rx, || {}).await?;
    if active.fenced.load(Ordering::Relaxed) {
        return Err(ShardError::Fenced);
    }
    let shown = format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any());
    let state = settle(&shown, &live, active, result, &journal, &record).await;
    node.publish(target, state, &live, None).await?;
    Ok(state)
}

/// What a copy thread sends back: the summary, and the destination's witness afterwards
/// (`None` when there is none to take: cancelled, or a ReadWriteMany volume).
type Copied = (BlockSummary, Option<Result<witness::Witness, String>>);

/// The shard's state from how the copy ended; what it leaves on the node: the journal
/// until the copy finishes, then the chunk manifest (the hashes of what the destination
/// now holds) with the destination's witness, in the agent's records of the volume.
async fn settle(
    job: &str,
    live: &Live,
    active: &Active,
    result: Result<Copied, ferry_engine::Error>,
    journal: &Path,
    record: &Path,
) -> ShardState {
    match result {
        Ok((s, _)) if s.cancelled => {
            if active.deleting.load(Ordering::Relaxed) {
                ShardState::Stopped
            } else {
                ShardState::Suspended
            }
        }
        Ok((mut s, witness)) => {
            live.files.store(1, Ordering::Relaxed);
            live.bytes.store(s.size, Ordering::Relaxed);
            tracing::info!(
                job,
                bytes = s.size,
                written = s.written,
                punched = s.punched,
                unchanged = s.unchanged,
                resumed = s.resumed,
                verified = s.verified,
                kept = s.kept_used,
                read_destination = s.bytes_read_destination,
                direct = s.direct,
                zeros = ?s.zeros,
                hash = %s.manifest.as_ref().map(|m| format!("{:032x}", m.digest())).unwrap_or_default(),
                secs = s.elapsed.as_secs_f64(),
                "block shard copied"
            );
            // The manifest kept with the destination's witness, the journal removed, on the
            // blocking pool.
            let (m, path, journal) = (
                s.manifest.take(),
                record.to_path_buf(),
                journal.to_path_buf(),
            );
            let kept = tokio::task::spawn_blocking(move || {
                let _ = std::fs::remove_file(journal);
                match (m, witness) {
                    (Some(m), Some(Ok(w))) => {
                        witness::keep(&path, &w, &m).map_err(|e| e.to_string())
                    }
                    (_, Some(Err(why))) => Err(format!("no witness of the destination: {why}")),
                    _ => Err("a ReadWriteMany volume: nothing to witness it by".into()),
                }
            })
            .await;
            match kept {
                Ok(Ok(())) => {}
                Ok(Err(why)) => {
                    tracing::info!(job, %why, "the chunk manifest is not kept: a re-run reads the destination")
                }
                Err(e) => tracing::warn!(job, error = %e, "could not keep the chunk manifest"),
            }
            ShardState::Succeeded
        }
        Err(e) => {
            let reason = match &e {
                ferry_engine::Error::Io { .. } => Reason::IOError,
                e => crate::daemon::error::engine_reason(e),
            };
            live.set_start_error(reason, crate::with_causes(&e));
            live.failed.store(1, Ordering::Relaxed);
            ShardState::Failed
        }
    }
}
