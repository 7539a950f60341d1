//! Counting what a shard carries: a dry run's plan (what it would copy and remove), the
//! totals behind the ETA of a copy that outlasts a few seconds, and a full destination's
//! numbers.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{CopyJobSpec, Filter, ShardState};
use ferry_engine::Part;

use super::node::Node;
use super::open::{Roots, Src};
use crate::daemon::error::ShardError;
use crate::daemon::job_options::prune_options;
use crate::daemon::publish::{Live, Target};

/// A copy still running after this long gets its totals counted, for the ETA.
pub(super) const PLAN_AFTER: Duration = Duration::from_secs(2);

/// Count what the copy would carry; touch nothing on the destination.
pub(super) async fn dry_run(
    node: &Node,
    target: Target<'_>,
    roots: &Roots,
) -> Result<ShardState, ShardError> {
    let spec = &target.job.spec;
    let path = Path::new(&spec.source.path);
    let totals = plan(roots, path, Part::All, spec).await?;
    let planned = Some((totals.files as i64, totals.bytes as i64));
    let live = Live::default();
    if spec.delete_extraneous {
        let opts = ferry_engine::PruneOptions {
            dry_run: true,
            ..prune_options(spec, &roots.filter)
        };
        let pruned = mirror(roots, spec, opts).await?;
        let paths = pruned
            .listed
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        live.set_planned_deletions(pruned.deleted, paths);
    }
    node.publish(target, ShardState::Succeeded, &live, planned)
        .await?;
    Ok(ShardState::Succeeded)
}

/// What a copy of `path` inside `root` carries (`select`'s files that the job's
/// include/exclude select, hard links kept or not), counted on a blocking thread: for a dry
/// run, the ETA, and a full destination's message.
pub(super) async fn plan(
    roots: &Roots,
    path: &Path,
    select: Part,
    spec: &CopyJobSpec,
) -> Result<ferry_engine::Totals, ShardError> {
    let filter = roots.filter.clone();
    count(&roots.src, path, select, spec.preserve.hard_links, filter).await
}

pub(super) async fn count(
    root: &Src,
    path: &Path,
    select: Part,
    links: bool,
    filter: Arc<Filter>,
) -> Result<ferry_engine::Totals, ShardError> {
    let (root, path) = (root.clone(), path.to_path_buf());
    let totals = tokio::task::spawn_blocking(move || match root {
        Src::Local(root) => ferry_engine::plan_beneath(root.as_fd(), &path, select, links, &filter),
        // Counted by the sender, with the job's include/exclude as it compiles them (a copy
        // between nodes is never split: `select` is the whole tree).
        Src::Remote(link) => link.current().count(links).map_err(|e| {
            ferry_engine::Error::io("count the source on the sender's node", &path, e)
        }),
    })
    .await??;
    Ok(totals)
}

/// Totals for the job's PROGRESS and ETA: counted next to a copy that outlasts a few
/// seconds (a short one needs no estimate, and would pay for the extra walk).
pub(super) fn count_later(
    live: &Arc<Live>,
    done: &Arc<AtomicBool>,
    roots: &Roots,
    target: Target<'_>,
) {
    let (live, done) = (live.clone(), done.clone());
    let spec = &target.job.spec;
    let (select, links) = (target.shard.part, spec.preserve.hard_links);
    let (root, path) = (roots.src.clone(), PathBuf::from(&spec.source.path));
    let filter = roots.filter.clone();
    tokio::spawn(async move {
        tokio::time::sleep(PLAN_AFTER).await;
        if done.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(t) = count(&root, &path, select, links, filter).await {
            live.set_planned(t.files as i64, t.bytes as i64);
        }
    });
}

/// Mirror the job's source path onto its destination path, on the blocking pool: the
/// source here, or as its sender lists it (a copy between nodes or clusters). A source
/// that is a single file, or a destination not made yet (a dry run), has nothing to mirror.
pub(super) async fn mirror(
    roots: &Roots,
    spec: &CopyJobSpec,
    opts: ferry_engine::PruneOptions,
) -> Result<ferry_engine::Pruned, ShardError> {
    let dst = roots.dst.clone();
    let (src_path, dst_path) = (
        PathBuf::from(&spec.source.path),
        PathBuf::from(&spec.destination.path),
    );
    let src = roots.src.clone();
    let pruned = tokio::task::spawn_blocking(move || match src {
        Src::Local(src) => {
            ferry_engine::prune_beneath(src.as_fd(), &src_path, dst.as_fd(), &dst_path, &opts)
        }
        Src::Remote(link) => {
            ferry_engine::prune_from(&link.current(), dst.as_fd(), &dst_path, &opts)
        }
    })
    .await?;
    match pruned {
        Err(ferry_engine::Error::Io { source, .. })
            if matches!(source.raw_os_error(), Some(libc::ENOTDIR | libc::ENOENT)) =>
        {
            Ok(ferry_engine::Pruned::default())
        }
        other => Ok(other?),
    }
}
