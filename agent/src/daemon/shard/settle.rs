//! Step 4 of a shard's run: how the copy ended, as the shard's state: a full destination
//! explained, the manifest exported (a split job's parts joined), the mirror pass, the
//! flush, and the records kept for the next job into the destination.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::Ordering;

use ferry_crds::{CopyJobSpec, ManifestPart, Reason, ShardState};
use ferry_engine::{Part, Summary};

use super::copy::PUBLISH_EVERY;
use super::count::mirror;
use super::count::plan;
use super::node::{Active, Node};
use super::open::{Roots, StateDir};
use crate::daemon::error::engine_reason;
use crate::daemon::job_options::prune_options;
use crate::daemon::journal;
use crate::daemon::manifest::join_manifests;
use crate::daemon::publish::{Live, Target};
use crate::with_causes;

/// How a copy ended: the engine's result, and the journal it wrote on this node.
pub(super) struct Settled<'a> {
    pub(super) result: &'a Result<Summary, ferry_engine::Error>,
    pub(super) journal: Option<&'a Path>,
    /// The copy's fence, which the mirror pass asks before each removal.
    pub(super) fence: Option<ferry_engine::Fence>,
}

/// How the copy ended, as the shard's state: a full destination explained, the manifest
/// exported to the tenant's `.ferry/` (a split job's parts joined), the final numbers taken
/// from the summary, and a success flushed.
pub(super) async fn settle(
    node: &Node,
    target: Target<'_>,
    active: &Active,
    live: &Live,
    roots: &Roots,
    state_dir: &StateDir,
    settled: Settled<'_>,
) -> ShardState {
    let (job, select) = (target.job, target.shard.part);
    let result = settled.result;
    let mut state = match result {
        Ok(summary) if summary.cancelled => {
            if active.deleting.load(Ordering::Relaxed) {
                ShardState::Stopped
            } else {
                ShardState::Suspended
            }
        }
        Ok(summary) if summary.failed == 0 && summary.aborted.is_none() => ShardState::Succeeded,
        Ok(summary) => {
            live.keep_failures(&summary.failures);
            ShardState::Failed
        }
        Err(e) => {
            tracing::warn!(error = %with_causes(e), "copy could not start");
            live.set_start_error(engine_reason(e), with_causes(e));
            ShardState::Failed
        }
    };
    // A full destination stops the copy (or, at its end, the manifest's last lines).
    let full = match result {
        Ok(summary) => summary
            .failures
            .iter()
            .any(|f| f.kind == ferry_engine::Reason::DestinationFull),
        Err(ferry_engine::Error::Io { source, .. }) => {
            ferry_engine::reason_of_io(source) == ferry_engine::Reason::DestinationFull
        }
        Err(_) => false,
    };
    if full {
        let message = destination_full(live, roots, select, &job.spec).await;
        live.set_start_error(Reason::DestinationFull, message);
    }
    if state == ShardState::Succeeded {
        if let Err(e) = manifest_out(target, live, state_dir, settled.journal).await {
            let reason = match ferry_engine::reason_of_io(&e) {
                Reason::DestinationFull => Reason::DestinationFull,
                _ => Reason::CannotStart,
            };
            let what = match select {
                Part::Directories => "joining the parts' manifests",
                _ => "writing the manifest to the destination's .ferry/",
            };
            live.set_start_error(reason, format!("{what}: {}", with_causes(&e)));
            state = ShardState::Failed;
        }
    }
    if let Ok(summary) = result {
        // Final numbers from the summary, not the live counters.
        live.set_final(summary);
    }
    // The mirror, after a copy without failures (as rsync skips deletions after an I/O
    // error): by the one shard that sees the whole tree (a split job's directories pass).
    let whole = matches!(select, Part::All | Part::Directories);
    if state == ShardState::Succeeded && job.spec.delete_extraneous && whole {
        state = prune_after(target, active, live, roots, settled.fence).await;
    }
    if state == ShardState::Succeeded {
        state = flush(node, target, live, roots).await;
    }
    state
}

/// A copy that ran to its end (failures or not, but not cancelled or stopped) recorded
/// every file it listed: its records become the destination's, for the next job into it.
/// Records are only ever a help: failing to keep them is logged, not the job's failure.
pub(super) async fn keep_records(
    records: Option<ferry_engine::Records>,
    result: &Result<ferry_engine::Summary, ferry_engine::Error>,
) {
    let Some(r) = records else { return };
    let ended = matches!(result, Ok(s) if !s.cancelled && s.aborted.is_none());
    let kept = tokio::task::spawn_blocking(move || match ended {
        true => std::fs::rename(&r.write, &r.earlier),
        false => Ok(()),
    })
    .await
    .map_err(std::io::Error::other);
    if let Err(e) | Ok(Err(e)) = kept {
        tracing::warn!(error = %e, "keeping the records of this copy failed");
    }
}

/// Remove what the destination has and the source lacks; a removal that fails is the
/// shard's failure (PartiallyFailed, with the path), the rest are still removed.
pub(super) async fn prune_after(
    target: Target<'_>,
    active: &Active,
    live: &Live,
    roots: &Roots,
    fence: Option<ferry_engine::Fence>,
) -> ShardState {
    let spec = &target.job.spec;
    let opts = ferry_engine::PruneOptions {
        fence,
        cancel: Some(active.cancel.clone()),
        ..prune_options(spec, &roots.filter)
    };
    match mirror(roots, spec, opts).await {
        Ok(pruned) => {
            live.deleted.store(pruned.deleted, Ordering::Relaxed);
            crate::serve::metrics().entries_deleted(pruned.deleted);
            for f in &pruned.failures {
                ferry_engine::Progress::failed(live, f);
            }
            if pruned.failed > 0 {
                ShardState::Failed
            } else if pruned.stopped {
                // Stopped by suspend or deletion, or fenced: the next run mirrors again.
                if active.deleting.load(Ordering::Relaxed) {
                    ShardState::Stopped
                } else {
                    ShardState::Suspended
                }
            } else {
                ShardState::Succeeded
            }
        }
        Err(e) => {
            live.set_start_error(
                Reason::CannotStart,
                format!("mirroring the destination: {}", with_causes(&e)),
            );
            ShardState::Failed
        }
    }
}

/// The tenant's copy of the manifest, on the blocking pool (it writes to the volume): the
/// journal exported under the job's name (a slice's under its part's name, and what it
/// wrote kept for the directories pass), or, for the directories pass, the parts joined.
pub(super) async fn manifest_out(
    target: Target<'_>,
    live: &Live,
    state_dir: &StateDir,
    journal: Option<&Path>,
) -> std::io::Result<()> {
    let (path, names) = (state_dir.path.clone(), state_dir.names.clone());
    let part = target.shard.part;
    let parts: Vec<(u32, ManifestPart)> = target
        .job
        .status
        .iter()
        .flat_map(|s| &s.shards)
        .filter_map(|s| match (s.part, &s.progress.manifest_part) {
            (Part::Slice { index, .. }, Some(p)) => Some((index, p.clone())),
            _ => None,
        })
        .collect();
    let slices = target
        .job
        .status
        .iter()
        .flat_map(|s| &s.shards)
        .filter(|s| matches!(s.part, Part::Slice { .. }))
        .count();
    let journal = journal.map(Path::to_path_buf);
    let written = tokio::task::spawn_blocking(move || match (part, journal) {
        (Part::Directories, _) if parts.len() < slices => Err(std::io::Error::other(format!(
            "{} of {slices} slices said what they wrote (an older agent ran them?)",
            parts.len()
        ))),
        (Part::Directories, _) => join_manifests(&path, &names, &parts).map(|()| None),
        (_, Some(journal)) => {
            let name = names.for_part(part).unwrap_or_else(|| names.joined());
            journal::export(&journal, &path, &names, &name).map(Some)
        }
        (_, None) => Ok(None),
    })
    .await
    .map_err(std::io::Error::other)??;
    if matches!(part, Part::Slice { .. }) {
        *crate::lock(&live.manifest_part) = written;
    }
    Ok(())
}

/// Succeeded means on stable storage: a syncfs of the destination volume, shared with
/// the shards that finish on it at the same time (see flush.rs), never retried. The
/// flush can take a while after a large copy: the final counts are then shown meanwhile.
pub(super) async fn flush(
    node: &Node,
    target: Target<'_>,
    live: &Live,
    roots: &Roots,
) -> ShardState {
    let (flushes, volume) = (node.flushes.clone(), roots.dst.clone());
    let mut flushing = tokio::task::spawn_blocking(move || {
        let dev = ferry_engine::volume::device(volume.as_fd()).map_err(|e| e.to_string())?;
        flushes.flush(dev, || ferry_engine::volume::syncfs(volume.as_fd()))
    });
    // Most flushes take milliseconds (and the final publish follows at once); a long one
    // shows the final counts while it runs.
    let flushed = tokio::select! {
        r = &mut flushing => r,
        _ = tokio::time::sleep(PUBLISH_EVERY) => {
            if let Err(e) = node.publish(target, ShardState::Running, live, None).await {
                tracing::warn!(error = %e, "progress update failed");
            }
            flushing.await
        }
    }
    .unwrap_or_else(|e| Err(e.to_string()));
    match flushed {
        Ok(()) => ShardState::Succeeded,
        Err(why) => {
            live.set_start_error(
                Reason::IOError,
                format!(
                    "flushing the destination volume failed ({why}): the files may not be on \
                     stable storage; check the device, then re-create the job"
                ),
            );
            ShardState::Failed
        }
    }
}

/// What a user whose destination filled up needs to know: how much was copied, about how
/// much more is needed, and how much is free.
pub(super) async fn destination_full(
    live: &Live,
    roots: &Roots,
    select: Part,
    spec: &CopyJobSpec,
) -> String {
    let done = live.bytes.load(Ordering::Relaxed);
    let files = live.files.load(Ordering::Relaxed);
    let planned = live.planned();
    let total = match planned {
        Some((_, bytes)) => Some(bytes.max(0) as u64),
        // Not counted while copying (a short copy): count it now, the walk is cheap next
        // to the copy that filled a volume.
        None => plan(roots, Path::new(&spec.source.path), select, spec)
            .await
            .ok()
            .map(|t| t.bytes),
    };
    let free = ferry_engine::volume::free_bytes(roots.dst.as_fd()).unwrap_or(0);
    let human = crate::copy_cmd::human;
    let copied = format!("{files} files ({}) were copied", human(done));
    let kept = "re-create the job: what was copied is kept and not copied again (unless overwrite: Always)";
    match total {
        Some(total) => {
            let needed = total.saturating_sub(done);
            format!(
                "the destination volume is full: {copied}; about {} more are needed and {} \
                 are free. Free or add at least {}, then {kept}",
                human(needed),
                human(free),
                human(needed.saturating_sub(free)),
            )
        }
        None => format!(
            "the destination volume is full: {copied} and {} are free. Free some space, then {kept}",
            human(free),
        ),
    }
}
