//! A shard between two raw block claims: the destination's device (and, on one node, the
//! source's) taken from the job's holder pods ([`crate::daemon::devices`]), then copied by
//! the engine's block copy ([`ferry_engine::block::copy_from`]: chunks at queue depth,
//! hashes, zeros punched, read back, resume by chunk from a journal the agent keeps).
//! Between nodes the source is the sender's device, read by range over the transfer
//! (`ReadRange`): on a re-run its hashes cross first and only differing chunks' data does,
//! and a lost connection is dialled again and resumes from the journal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferry_crds::{Compare, Compression, Overwrite, Reason, ShardState, Verify};
use ferry_engine::block::{
    copy_from, BlockOptions, BlockSummary, Cache, Device, Rerun, Source, Zeros,
};
use ferry_engine::{Progress, Strategy};
use ferry_resolve::block as claims;
use kube::ResourceExt;

use super::copy::publish_until;
use super::delta;
use super::node::{Active, Node};
use super::sender::{connect, dial_until, Link, MAX_REDIALS};
use super::witness::{self, Snapshot};
use crate::daemon::devices::{self, take};
use crate::daemon::error::ShardError;
use crate::daemon::publish::{Live, Target};

/// Whether the operator assigned this shard to block claims: both its roots are holder
/// socket directories. (What they are is proved in [`run`]; this only picks the path.)
pub(super) fn is_block(target: Target<'_>) -> bool {
    let kubelet = ferry_resolve::volume::kubelet_dir();
    let shard = target.shard;
    [&shard.source_root, &shard.destination_root]
        .iter()
        .any(|p| claims::holder_of_fd_dir(p, &kubelet).is_some())
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
        // Full: every chunk read back, the punched ones too, from the device itself, never
        // from the page cache.
        verify_punched: spec.verify == Verify::Full,
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

/// Where this shard's source is read: the device on this node, or the sender's.
enum Origin {
    Local(Arc<Device>),
    Remote { link: Link, size: u64, zstd: bool },
}

impl Origin {
    fn size(&self) -> u64 {
        match self {
            Origin::Local(d) => d.size(),
            Origin::Remote { size, .. } => *size,
        }
    }
}

/// One run's source, owned by its copy thread: the device, or this run's connection to the
/// sender (a new one after a redial).
enum RunSource {
    Local(Arc<Device>),
    Remote {
        conn: Arc<ferry_engine::recv::Connection>,
        size: u64,
        zstd: bool,
    },
}

impl RunSource {
    fn source(&self) -> Source<'_> {
        match self {
            RunSource::Local(d) => Source::Local(d),
            RunSource::Remote { conn, size, zstd } => Source::Remote {
                conn,
                size: *size,
                zstd: *zstd,
            },
        }
    }
}

/// Run a block shard to its end: the devices taken (and the sender dialled, between
/// nodes), the copy on its own thread while its progress is published, run again over a
/// new connection when one is lost, the outcome published.
pub(super) async fn run(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
) -> Result<ShardState, ShardError> {
    let (job, shard) = (target.job, target.shard);
    let between = shard.between_nodes();
    let [src_end, dst_end] = devices::ends(
        &node.client,
        job,
        &shard.source_root,
        &shard.destination_root,
    )
    .await?;
    // The destination's kept manifest, from the agent's records of its volume: by the PV's
    // name, which this agent resolved itself.
    let record = node.journals.records("ferry-block", &dst_end.pv, "");
    let shared = devices::shared(&node.client, &dst_end.pv).await?;
    let host = node.settings.host_root.clone();
    // Between nodes the source's holder is on the sender's node: only the destination's
    // device is taken here.
    let (src, dst) = tokio::task::spawn_blocking({
        let host = host.clone();
        move || {
            let src = match between {
                true => None,
                false => Some(take(&host, &src_end)?),
            };
            Ok::<_, ShardError>((src, take(&host, &dst_end)?))
        }
    })
    .await??;
    let from = match src {
        Some(d) => Origin::Local(Arc::new(d)),
        None => {
            let link = connect(node, target, active).await?;
            let conn = link.current();
            let size = tokio::task::spawn_blocking(move || conn.count(false))
                .await?
                .map_err(|e| {
                    devices::refused(
                        Reason::IOError,
                        format!(
                            "the size of the source's device on node {}: {e}",
                            shard.sender.as_deref().unwrap_or_default()
                        ),
                    )
                })?
                .bytes;
            let zstd = job.spec.transfer.compression == Compression::Zstd;
            Origin::Remote { link, size, zstd }
        }
    };
    let uid = job.uid().unwrap_or_default();
    if job.spec.dry_run {
        let live = Live::default();
        node.publish(
            target,
            ShardState::Succeeded,
            &live,
            Some((1, from.size() as i64)),
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
    // The snapshot the source is, kept in the destination's record after the copy; and
    // the one the destination holds now, if its record says, for changed-block tracking.
    let origin = match node.settings.changed_blocks_account {
        None => Ok(None),
        Some(_) => delta::source(&node.client, job).await,
    };
    let origin = match origin {
        Ok(origin) => origin,
        Err(why) => {
            tracing::info!(job = %job.name_any(), shard = %shard.id, %why, "the source's snapshot is not known: the destination's record will not name one");
            None
        }
    };
    let mut held = None;
    match taken {
        Ok((kept, copied_from)) => {
            opts.kept = Some(kept);
            held = copied_from;
        }
        Err(why) if wanted => {
            tracing::info!(job = %job.name_any(), shard = %shard.id, %why, "reading the destination for its hashes");
        }
        Err(_) => {}
    }
    opts.changed = changed_chunks(
        node,
        target,
        held.as_ref(),
        origin.as_ref(),
        &opts,
        from.size(),
    )
    .await;
    let live = Arc::new(Live::default());
    live.set_planned(1, from.size() as i64);
    tracing::info!(job = %job.name_any(), %uid, shard = %shard.id, bytes = from.size(), sender = ?shard.sender, "starting block shard");
    node.publish(target, ShardState::Running, &live, None)
        .await?;
    let opts = Arc::new(opts);
    let mut redials = 0;
    let result = loop {
        let (result, back) = copy_once(
            node,
            target,
            active,
            &live,
            &from,
            dst,
            &opts,
            (&host, shared),
        )
        .await?;
        dst = back;
        let Origin::Remote { link, .. } = &from else {
            break result;
        };
        let Some(why) = link.current().lost() else {
            break result;
        };
        let stopped =
            active.cancel.load(Ordering::Relaxed) || active.fenced.load(Ordering::Relaxed);
        if stopped || redials >= MAX_REDIALS {
            break result;
        }
        redials += 1;
        crate::serve::metrics().redials.inc();
        tracing::warn!(shard = %shard.id, sender = ?shard.sender, %why, redials, "the connection to the sender was lost: dialling again to resume from the journal");
        let fresh = dial_until(node, target, active).await?;
        *crate::lock(&link.conn) = fresh;
        // The chunks the lost run finished are in the journal: counted again as resumed.
        live.restart();
    };
    if active.fenced.load(Ordering::Relaxed) {
        return Err(ShardError::Fenced);
    }
    let shown = format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any());
    let copied_from = origin.map(|o| o.snapshot);
    let state = settle(
        &shown,
        &live,
        active,
        result,
        (&journal, &record),
        copied_from,
    )
    .await;
    node.publish(target, state, &live, None).await?;
    Ok(state)
}

/// The chunks that may differ between the snapshot the destination holds (`held`, from its
/// record) and the source's snapshot, by the driver's changed-block tracking; `None`
/// (compare every chunk) unless this agent may ask, the destination's manifest is kept,
/// and the job does not ask to read everything (`verify: Full`). Why not is logged.
async fn changed_chunks(
    node: &Node,
    target: Target<'_>,
    held: Option<&Snapshot>,
    origin: Option<&delta::Source>,
    opts: &BlockOptions,
    size: u64,
) -> Option<Vec<bool>> {
    let (job, shard) = (target.job, target.shard);
    let account = node.settings.changed_blocks_account.as_deref()?;
    let (Some(held), Some(origin), true) = (held, origin, opts.kept.is_some()) else {
        return None;
    };
    if job.spec.verify == Verify::Full {
        tracing::info!(job = %job.name_any(), shard = %shard.id, "verify Full reads the whole source: changed-block tracking is not used");
        return None;
    }
    let job_ns = job.namespace().unwrap_or_default();
    let asked = delta::changed(
        &node.client,
        (&node.settings.namespace, account),
        &job_ns,
        held,
        origin,
        (opts.chunk, size),
    )
    .await;
    match asked {
        Ok(flags) => {
            let n = flags.iter().filter(|&&c| c).count();
            tracing::info!(job = %job.name_any(), shard = %shard.id, base = %held.handle, snapshot = %origin.name, changed = n, chunks = flags.len(), "changed-block tracking: reading only the chunks changed since the snapshot the destination holds");
            Some(flags)
        }
        Err(why) => {
            tracing::info!(job = %job.name_any(), shard = %shard.id, %why, "changed-block tracking not used: comparing every chunk");
            None
        }
    }
}

/// One run of the engine's block copy, on its own thread, to its end; `dst` is handed back
/// with the result so that a run over a new connection writes the same device.
#[allow(clippy::too_many_arguments)]
async fn copy_once(
    node: &Node,
    target: Target<'_>,
    active: &Active,
    live: &Arc<Live>,
    from: &Origin,
    mut dst: Device,
    opts: &Arc<BlockOptions>,
    (host, shared): (&Path, bool),
) -> Result<(Result<Copied, ferry_engine::Error>, Device), ShardError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = Arc::new(AtomicBool::new(false));
    let run = match from {
        Origin::Local(d) => RunSource::Local(d.clone()),
        Origin::Remote { link, size, zstd } => RunSource::Remote {
            conn: link.current(),
            size: *size,
            zstd: *zstd,
        },
    };
    let conn = match &run {
        RunSource::Remote { conn, .. } => Some(conn.clone()),
        RunSource::Local(_) => None,
    };
    {
        let (live, done, opts, host) =
            (live.clone(), done.clone(), opts.clone(), host.to_path_buf());
        std::thread::Builder::new()
            .name("ferry-block".into())
            .spawn(move || {
                let result = copy_from(&run.source(), &mut dst, &opts, &DeviceProgress(live));
                // After the copy's flush: what the destination is now, to keep with its
                // manifest.
                let witness = match &result {
                    Ok(s) if !s.cancelled && !shared => Some(witness::of(&dst, &host)),
                    _ => None,
                };
                done.store(true, Ordering::Relaxed);
                let _ = tx.send((result.map(|s| (s, witness)), dst));
            })
            .map_err(ShardError::Spawn)?;
    }
    // Between nodes, what crossed is counted as it goes (for the network rate).
    let tick = super::copy::count_received(target, conn);
    publish_until(node, target, active, live, &done, rx, tick).await
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
    (journal, record): (&Path, &Path),
    copied_from: Option<Snapshot>,
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
            *crate::lock(&live.block) = Some(ferry_crds::BlockProgress {
                chunks: s.chunks as i64,
                chunk_bytes: s.chunk as i64,
                written: s.written as i64,
                punched: s.punched as i64,
                unchanged: s.unchanged as i64,
                source_bytes_read: s.bytes_read_source as i64,
                changed_blocks_only: s.delta_used,
            });
            tracing::info!(
                job,
                bytes = s.size,
                written = s.written,
                punched = s.punched,
                unchanged = s.unchanged,
                resumed = s.resumed,
                verified = s.verified,
                kept = s.kept_used,
                delta = s.delta_used,
                read_source = s.bytes_read_source,
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
                    (Some(m), Some(Ok(w))) => witness::keep(&path, &w, &m, copied_from.as_ref())
                        .map_err(|e| e.to_string()),
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
