//! Step 2 of a shard's run, before anything is written: whether the copy fits in the
//! agent's memory, whether the destination's root keeps privileged files, and the
//! engine's options for this run.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_crds::ShardState;
use kube::{Api, Client};

use super::count::plan;
use super::node::{Active, Node};
use super::open::{Roots, StateDir};
use crate::daemon::error::{ShardError, MEMORY_MARGIN};
use crate::daemon::job_options::{engine_options, reserved_top};
use crate::daemon::publish::Target;

/// A copy into a memory-backed destination (tmpfs) is charged to the agent's memory
/// cgroup and cannot be reclaimed: refuse one that would not fit under the limit, before
/// writing anything, rather than be OOM-killed halfway (and again after each restart, as
/// the pages stay charged to the pod). The source is counted only when the tmpfs could
/// hold more than the limit allows. Counted as the whole copy: on a resumption, the
/// part already copied is counted twice, which errs on the side of a clear refusal.
pub(super) async fn fits_in_memory(
    node: &Node,
    target: Target<'_>,
    roots: &Roots,
    dst_root: &str,
) -> Result<(), ShardError> {
    // On the blocking pool, as the roots were opened: a statfs of a dead NFS server hangs.
    let dst = roots.dst.clone();
    let probe = tokio::task::spawn_blocking(move || {
        if !ferry_engine::volume::in_memory(dst.as_fd()).unwrap_or(false) {
            return None;
        }
        let memcg = crate::memcg::Memcg::own()?;
        let free = ferry_engine::volume::free_bytes(dst.as_fd()).unwrap_or(u64::MAX);
        Some((memcg, free))
    });
    let Some((memcg, free)) = probe.await? else {
        return Ok(());
    };
    // A copy larger than the tmpfs has room for stops at DestinationFull first: when the
    // limit leaves more than that, no count of the source (a walk of it) is needed.
    if free.saturating_add(MEMORY_MARGIN) <= memcg.headroom() {
        return Ok(());
    }
    let spec = &target.job.spec;
    let path = Path::new(&spec.source.path);
    let need = plan(roots, path, target.shard.part, spec).await?.bytes;
    if need.saturating_add(MEMORY_MARGIN) <= memcg.headroom() {
        return Ok(());
    }
    Err(ShardError::MemoryLimit {
        root: dst_root.to_string(),
        node: node.settings.node.clone(),
        need,
        memcg,
    })
}

/// Whether this job's copy keeps a source's privileged files (device nodes, setuid/setgid
/// bits, file capabilities): as [`CopyJobSpec::keeps_privileged_files`] decides, from the
/// destination's StorageRoot as it is now (a root that is gone allows nothing).
pub(super) async fn privileged_files(
    client: &Client,
    job: &ferry_crds::CopyJob,
) -> Result<ferry_engine::Privileged, ShardError> {
    let root = match &job.spec.destination.root {
        Some(name) => Api::<ferry_crds::StorageRoot>::all(client.clone())
            .get_opt(name)
            .await
            .map_err(ShardError::Api)?
            .map(|r| r.spec),
        None => None,
    };
    Ok(match job.spec.keeps_privileged_files(root.as_ref()) {
        true => ferry_engine::Privileged::Keep,
        false => ferry_engine::Privileged::Drop,
    })
}

/// The engine's options for this run: the job's policies, resumption, the staging tag
/// every run of the shard shares, the fence and the cancel flag, and whether privileged
/// files are kept.
pub(super) fn options(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
    (state_dir, dst_root, roots): (&StateDir, &str, &Roots),
    lapses: u64,
    privileged: ferry_engine::Privileged,
) -> Result<ferry_engine::Options, ShardError> {
    let (settings, job, shard) = (&node.settings, target.job, target.shard);
    let select = shard.part;
    let base = state_dir.names.base();
    // The manifest the engine writes, and a resumed run trusts, is the journal on this
    // node; the tenant's copy in `.ferry/` is exported from it when the shard succeeds.
    let manifest = state_dir
        .names
        .for_part(select)
        .map(|name| {
            node.journals
                .path(base, &name)
                .map_err(|source| ShardError::Journal {
                    path: name.into(),
                    source,
                })
        })
        .transpose()?;
    // Anything but a fresh shard is a resumption: suspended, left Running by an agent
    // process that died, or taken over from a lost agent (whose journal is on its node:
    // every file kept here is then compared with its source). Committed files are kept,
    // not copied again, and unfinished directories and staging are finished. A job
    // re-created under the same name is a new job (a new uid): it resumes nothing, and
    // what it keeps it reports as skipped.
    let resume = shard.progress.state != ShardState::Pending
        || manifest
            .as_ref()
            .is_some_and(|m| std::fs::symlink_metadata(m).is_ok());
    // What this job lists, recorded on the node for the next job into this destination,
    // which then lists the files it keeps without reading them (see journal.rs).
    let records = manifest.as_ref().map(|m| ferry_engine::Records {
        earlier: node
            .journals
            .records(dst_root, &job.spec.destination.path, &select.to_string()),
        write: m.with_extension("records"),
    });
    let mut opts = engine_options(&job.spec, settings.workers, manifest);
    opts.records = records;
    opts.filter = ferry_crds::Filter::clone(&roots.filter);
    opts.select = select;
    opts.resume = resume;
    // A copy between nodes asks its sender for zstd frames (ignored by a local copy).
    opts.compress = job.spec.transfer.compression == ferry_crds::Compression::Zstd;
    // Ferry's state at the top of a root is neither read nor written as data.
    opts.reserved_top =
        reserved_top(&job.spec.source.path).or_else(|| reserved_top(&job.spec.destination.path));
    // Staging names every run of this shard shares (on any node, at any epoch), so a
    // resumed run adopts what a killed one staged and sweeps its leftovers.
    opts.staging_tag = Some(format!(
        "{:012x}",
        twox_hash::XxHash3_64::oneshot(format!("{base}/{}", shard.id).as_bytes()) >> 16
    ));
    opts.fence = Some(ferry_engine::Fence(Arc::new({
        let (fence, mine) = (node.fence.clone(), active.clone());
        move || !mine.fenced.load(Ordering::Relaxed) && fence.holds_since(lapses)
    })));
    opts.cancel = Some(active.cancel.clone());
    opts.privileged = privileged;
    opts.faults.delay_per_file = settings.file_delay;
    opts.faults.corrupt_after_write = settings.corrupt_file.clone().map(String::into_bytes);
    opts.faults.change_source = settings
        .change_source
        .clone()
        .map(|name| (name.into_bytes(), u32::MAX));
    Ok(opts)
}
