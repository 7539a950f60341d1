//! One run of one shard: open its roots inside the node's filesystem, build the engine's
//! options, copy on an OS thread while publishing progress, then settle the outcome
//! (a full destination, the split job's manifests, the flush) and publish it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::{CopyJobSpec, Filter, ManifestName, ManifestPart, Reason, ShardState, STATE_DIR};
use ferry_engine::{Part, Summary};
use ferry_resolve::Reach;
use kube::{Api, Client, ResourceExt};

use super::error::{engine_reason, ShardError, MEMORY_MARGIN};
use super::fence::Fence;
use super::journal::{self, Journals};
use super::manifest::join_manifests;
use super::network;
use super::publish::{publish, Live, PublishError, Target};
use super::settings::Settings;
use crate::with_causes;

/// A copy still running after this long gets its totals counted, for the ETA.
const PLAN_AFTER: Duration = Duration::from_secs(2);
/// How often running shards publish progress: bounded, whatever the copy rate.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// What every run on this node shares.
pub(super) struct Node {
    pub(super) client: Client,
    pub(super) settings: Settings,
    pub(super) fence: Arc<Fence>,
    /// The syncfs that shards finishing together share.
    pub(super) flushes: Arc<crate::flush::Flushes>,
    /// What each shard's runs on this node committed (the trusted resume state).
    pub(super) journals: Arc<Journals>,
    /// This node's transfer certificate, if it serves a transfer port: what it receives
    /// a copy between nodes with.
    pub(super) identity: Option<super::network::Identity>,
}

impl Node {
    async fn publish(
        &self,
        target: Target<'_>,
        state: ShardState,
        live: &Live,
        planned: Option<(i64, i64)>,
    ) -> Result<(), PublishError> {
        publish(
            &self.client,
            &self.settings.node,
            target,
            state,
            live,
            planned,
        )
        .await
    }
}

/// A shard this agent is running, and how to stop it.
#[derive(Default)]
pub(super) struct Active {
    /// The assignment it runs for.
    pub(super) epoch: i64,
    /// Read by the engine at every file boundary.
    pub(super) cancel: Arc<AtomicBool>,
    /// The job is being deleted (rather than suspended).
    pub(super) deleting: AtomicBool,
    /// The shard is no longer this agent's to run (given to another node or epoch, as the
    /// watch or the API server says): it stops without publishing anything more.
    pub(super) fenced: AtomicBool,
}

/// Run the shard to its end and publish how it ended, unless it is fenced. `None`: fenced
/// (the shard moved, or the heartbeat lapsed while it ran).
pub(super) async fn run(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
) -> Option<ShardState> {
    let (job, shard) = (target.job, target.shard);
    match run_shard(node, target, active).await {
        Ok(state) => Some(state),
        // Said where it was noticed.
        Err(ShardError::Fenced) => None,
        // Not the job's fault: a rescan tries again (None, not fenced, is not finished).
        Err(ShardError::Api(e)) => {
            tracing::warn!(job = %job.name_any(), shard = %shard.id, error = %with_causes(&e), "looking up the job's endpoints failed; trying again");
            None
        }
        Err(ShardError::Publish(PublishError::Fenced(_))) => {
            tracing::warn!(job = %job.name_any(), shard = %shard.id, "the API server refused our update: the shard was given to another node or epoch");
            None
        }
        Err(e) => {
            tracing::warn!(job = %job.name_any(), error = %with_causes(&e), "shard failed to start");
            let live = Live::default();
            live.set_start_error(e.reason(), with_causes(&e));
            live.failed.store(1, Ordering::Relaxed);
            let _ = node.publish(target, ShardState::Failed, &live, None).await;
            Some(ShardState::Failed)
        }
    }
}

async fn run_shard(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
) -> Result<ShardState, ShardError> {
    let (job, shard) = (target.job, target.shard);
    for (field, path) in [
        ("spec.source.path", &job.spec.source.path),
        ("spec.destination.path", &job.spec.destination.path),
    ] {
        if ferry_crds::in_state_dir(path) {
            let path = path.clone();
            return Err(ShardError::StatePath { field, path });
        }
    }
    // A copy between nodes: the source is served by the sender's agent, which resolves and
    // opens it itself; this agent has only the destination.
    let me = &node.settings.node;
    let sender = shard.sender.as_deref().filter(|s| s != me);
    let network = sender.is_some();
    // The operator refuses such a job when it pairs the nodes; a guard, should one get here.
    if network {
        ferry_resolve::validate::between_nodes(&job.spec).map_err(|r| ShardError::Refused {
            reason: r.reason,
            message: r.message,
        })?;
    }
    let wanted: &[(&'static str, &str)] = if network {
        &[("destination", &shard.destination_root)]
    } else {
        &[
            ("source", &shard.source_root),
            ("destination", &shard.destination_root),
        ]
    };
    let mut paths = own(&node.client, me, job, wanted).await?;
    let dst = paths.pop().unwrap_or_default();
    let src = paths.pop();
    // Opening a root can hang (an NFS server gone away): never on a runtime thread, where
    // it would stop the heartbeat and every other shard with it.
    let (src_fd, dst_fd) = {
        let (host, node_name) = (node.settings.host_root.clone(), node.settings.node.clone());
        let (src, dst) = (src.clone(), dst.clone());
        let state = node.journals.state_dir().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let src_fd = src
                .as_deref()
                .map(|p| open_root(&host, &node_name, "source", p))
                .transpose()?;
            let dst_fd = open_root(&host, &node_name, "destination", &dst)?;
            let roots = [
                ("source", src.as_ref(), src_fd.as_ref()),
                ("destination", Some(&dst), Some(&dst_fd)),
            ];
            for (what, path, fd) in roots {
                let (Some(path), Some(fd)) = (path, fd) else {
                    continue;
                };
                // Unreadable as a path (it is there: the agent made it) means no.
                if journal::is_within(&state, fd).unwrap_or(false) {
                    return Err(ShardError::RootHoldsAgentState {
                        what,
                        path: path.clone(),
                        node: node_name.clone(),
                        state: state.display().to_string(),
                    });
                }
            }
            Ok((src_fd, dst_fd))
        })
        .await??
    };
    let src = match src_fd {
        Some(fd) => Src::Local(Arc::new(fd)),
        None => Src::Remote(Arc::new(connect(node, target, active).await?)),
    };
    let roots = Roots {
        src,
        dst: Arc::new(dst_fd),
    };
    if job.spec.dry_run {
        return dry_run(node, target, &roots).await;
    }
    fits_in_memory(node, target, &roots, &dst).await?;
    // Nothing becomes visible once the shard is not ours (it moved, per the watch or the
    // API server) or may not be (the heartbeat lapsed since this run began).
    let state_dir = {
        let (dst, job) = (roots.dst.clone(), target.job);
        let names = ManifestName::new(&job.uid().unwrap_or_default());
        tokio::task::spawn_blocking(move || StateDir::open(&dst, names)).await??
    };
    let lapses = node.fence.lapses();
    let privileged = privileged_files(&node.client, job).await?;
    let opts = options(node, target, active, (&state_dir, &dst), lapses, privileged)?;
    let live = Arc::new(Live::default());
    let resume = opts.resume;
    let (uid, base) = (
        state_dir.names.base(),
        format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any()),
    );
    tracing::info!(job = %base, %uid, shard = %shard.id, epoch = shard.epoch, part = %shard.part, resume, "starting shard");
    let done = Arc::new(AtomicBool::new(false));
    let began = std::time::Instant::now();
    node.publish(target, ShardState::Running, &live, None)
        .await?;
    let published = began.elapsed();
    count_later(&live, &done, &roots, target);
    let journal = opts.manifest.clone();
    let records = opts.records.clone();
    let fence = opts.fence.clone();
    let result = copy(node, target, active, &live, &done, &roots, opts).await?;
    let settled = Settled {
        result: &result,
        journal: journal.as_deref(),
        fence,
    };
    let copied = began.elapsed();
    let state = settle(node, target, active, &live, &roots, &state_dir, settled).await;
    // Where a shard's time went: publishing Running, the copy, then the manifest, the
    // mirror and the flush.
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    tracing::info!(
        job = %base,
        shard = %shard.id,
        %state,
        start_ms = ms(published),
        copy_ms = ms(copied - published),
        settle_ms = ms(began.elapsed() - copied),
        "shard finished"
    );
    // Another agent (or epoch) owns the shard now, or may: say nothing more.
    if active.fenced.load(Ordering::Relaxed) {
        tracing::warn!(job = %base, shard = %shard.id, epoch = shard.epoch, "stopped: the shard was given to another node or epoch");
        return Err(ShardError::Fenced);
    }
    if !node.fence.holds_since(lapses) {
        tracing::warn!(job = %base, shard = %shard.id, epoch = shard.epoch, "stopped: the heartbeat not renewed in time while the shard ran (another agent may be given it)");
        return Err(ShardError::Fenced);
    }
    keep_records(records, &result).await;
    node.publish(target, state, &live, None).await?;
    Ok(state)
}

/// A copy that ran to its end (failures or not, but not cancelled or stopped) recorded
/// every file it listed: its records become the destination's, for the next job into it.
/// Records are only ever a help: failing to keep them is logged, not the job's failure.
async fn keep_records(
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

/// The host paths of a shard's roots (`wanted`: which, and the status's account of each),
/// as this agent resolves them itself from the job's spec and objects only admins (or
/// Kubernetes) write: a StorageRoot this namespace may use and that selects this node, a
/// claim bound to its volume whose affinity includes this node. Never from the job's
/// status, which an agent token can write: the status's paths are only the operator's
/// account of the same (a CSI volume's pod mount, which depends on a pod, is taken from it
/// only if it is the kubelet's mount of that very volume).
async fn own(
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
            Reach::Csi {
                pv_name: Some(pv), ..
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
fn is_csi_mount(path: &str, kubelet_dir: &str, pv: &str) -> bool {
    let Some(uid) = path
        .strip_prefix(kubelet_dir.trim_end_matches('/'))
        .and_then(|p| p.strip_prefix("/pods/"))
        .and_then(|p| p.strip_suffix(&format!("/volumes/kubernetes.io~csi/{pv}/mount")))
    else {
        return false;
    };
    uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The shard's source and destination roots, opened inside the node's filesystem (the
/// source: or reached through the sender's agent).
struct Roots {
    src: Src,
    dst: Arc<OwnedFd>,
}

/// Where a shard's source is.
#[derive(Clone)]
enum Src {
    /// On this node: its root's directory.
    Local(Arc<OwnedFd>),
    /// On the sender's node, through a connection to its agent.
    Remote(Arc<Link>),
}

/// The connection of a copy between nodes, dialled again when it is lost.
pub(super) struct Link {
    conn: std::sync::Mutex<Arc<ferry_engine::recv::Connection>>,
}

impl Link {
    fn current(&self) -> Arc<ferry_engine::recv::Connection> {
        crate::lock(&self.conn).clone()
    }
}

/// Reach the shard's sender, trying again while it cannot be reached (its agent starting,
/// its certificate not issued yet, the ticket not yet seen) for up to
/// [`network::DIAL_FOR`], unless the run is stopped meanwhile.
async fn connect(node: &Node, target: Target<'_>, active: &Active) -> Result<Link, ShardError> {
    let conn = dial_until(node, target, active).await?;
    receivers().inc();
    Ok(Link {
        conn: std::sync::Mutex::new(conn),
    })
}

fn receivers() -> prometheus::IntGauge {
    crate::serve::metrics()
        .connections
        .with_label_values(&["receiver"])
}

impl Drop for Link {
    fn drop(&mut self) {
        receivers().dec();
    }
}

async fn dial_until(
    node: &Node,
    target: Target<'_>,
    active: &Active,
) -> Result<Arc<ferry_engine::recv::Connection>, ShardError> {
    let (job, shard) = (target.job, target.shard);
    let began = std::time::Instant::now();
    let mut wait = Duration::from_millis(100);
    loop {
        match network::dial(
            &node.client,
            &node.settings,
            node.identity.as_ref(),
            job,
            shard,
        )
        .await
        {
            Ok(conn) => return Ok(conn),
            Err(why) if began.elapsed() >= network::DIAL_FOR => {
                return Err(ShardError::Sender {
                    node: shard.sender.clone().unwrap_or_default(),
                    secs: network::DIAL_FOR.as_secs(),
                    why,
                })
            }
            Err(why) => {
                tracing::info!(job = %job.name_any(), shard = %shard.id, sender = ?shard.sender, %why, "the sender cannot be reached yet; trying again");
            }
        }
        if active.cancel.load(Ordering::Relaxed) || active.fenced.load(Ordering::Relaxed) {
            return Err(ShardError::Fenced);
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
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

/// Count what the copy would carry; touch nothing on the destination.
async fn dry_run(node: &Node, target: Target<'_>, roots: &Roots) -> Result<ShardState, ShardError> {
    let spec = &target.job.spec;
    let path = Path::new(&spec.source.path);
    let totals = plan(&roots.src, path, Part::All, spec).await?;
    let planned = Some((totals.files as i64, totals.bytes as i64));
    let live = Live::default();
    if spec.delete_extraneous {
        let opts = ferry_engine::PruneOptions {
            dry_run: true,
            ..prune_options(spec)?
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

/// A copy into a memory-backed destination (tmpfs) is charged to the agent's memory
/// cgroup and cannot be reclaimed: refuse one that would not fit under the limit, before
/// writing anything, rather than be OOM-killed halfway (and again after each restart, as
/// the pages stay charged to the pod). The source is counted only when the tmpfs could
/// hold more than the limit allows. Counted as the whole copy: on a resumption, the
/// part already copied is counted twice, which errs on the side of a clear refusal.
async fn fits_in_memory(
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
    let need = plan(&roots.src, path, target.shard.part, spec).await?.bytes;
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

/// The state directory under the destination root, where the shard's manifest lives.
struct StateDir {
    /// Held open: `path` reaches the directory through this fd.
    _fd: OwnedFd,
    path: PathBuf,
    names: ManifestName,
}

impl StateDir {
    /// The manifest lives with the data it describes, under the destination root; each
    /// part of a split job writes its own, and the directories pass joins them.
    /// (Reached through /proc/self/fd: the directory itself, whatever its path does later.)
    fn open(dst: &OwnedFd, names: ManifestName) -> Result<Self, ShardError> {
        let fd = ferry_engine::state_dir(dst.as_fd(), STATE_DIR)?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok(Self {
            _fd: fd,
            path,
            names,
        })
    }
}

/// Whether this job's copy keeps a source's privileged files (device nodes, setuid/setgid
/// bits, file capabilities): as [`CopyJobSpec::keeps_privileged_files`] decides, from the
/// destination's StorageRoot as it is now (a root that is gone allows nothing).
async fn privileged_files(
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
fn options(
    node: &Node,
    target: Target<'_>,
    active: &Arc<Active>,
    (state_dir, dst_root): (&StateDir, &str),
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
    opts.filter = filter_of(&job.spec)?;
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
        xxhash_rust::xxh3::xxh3_64(format!("{base}/{}", shard.id).as_bytes()) >> 16
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

/// [`STATE_DIR`], the name reserved at the top of a root, when `path` (a job's relative
/// path) names the root itself.
pub(super) fn reserved_top(path: &str) -> Option<std::ffi::CString> {
    path.split('/')
        .all(|c| c.is_empty() || c == ".")
        .then(|| std::ffi::CString::new(STATE_DIR).unwrap_or_default())
}

/// The workers a shard runs (or a sender serves it with): the job's, else the agent's.
/// At most MAX_WORKERS whatever asks (a job the operator let through, a node with more
/// CPUs): with 1 MiB of buffer a worker, that bounds a shard's buffers. 0 stays 0: the
/// engine's default pool (at most 64) runs only as many workers as CPUs while the copy
/// does not wait on storage; a number asked for always runs.
pub(super) fn workers_of(spec: &CopyJobSpec, agent_workers: usize) -> usize {
    match spec.parallelism.workers_per_agent {
        n if n > 0 => n as usize,
        _ => agent_workers,
    }
    .min(ferry_crds::MAX_WORKERS as usize)
}

fn engine_options(
    spec: &CopyJobSpec,
    workers: usize,
    manifest: Option<PathBuf>,
) -> ferry_engine::Options {
    ferry_engine::Options {
        workers: workers_of(spec, workers),
        reflink: spec.reflink,
        verify: spec.verify,
        overwrite: spec.overwrite,
        compare: spec.compare,
        preserve: spec.preserve,
        manifest,
        ..ferry_engine::Options::default()
    }
}

/// What a copy of `path` inside `root` carries (`select`'s files that the job's
/// include/exclude select, hard links kept or not), counted on a blocking thread: for a dry
/// run, the ETA, and a full destination's message.
async fn plan(
    root: &Src,
    path: &Path,
    select: Part,
    spec: &CopyJobSpec,
) -> Result<ferry_engine::Totals, ShardError> {
    let filter = filter_of(spec)?;
    count(root, path, select, spec.preserve.hard_links, filter).await
}

async fn count(
    root: &Src,
    path: &Path,
    select: Part,
    links: bool,
    filter: Filter,
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

/// The job's include/exclude, compiled (the operator refuses a job whose patterns do not
/// compile; one that reached the agent anyway fails InvalidSpec, never copies everything).
fn filter_of(spec: &CopyJobSpec) -> Result<Filter, ShardError> {
    Filter::new(&spec.include, &spec.exclude).map_err(|e| ShardError::Refused {
        reason: Reason::InvalidSpec,
        message: format!("spec.{e}"),
    })
}

/// What the mirror pass of this job may remove (deleteExtraneous): its filter, and never
/// Ferry's state directory at the top of the destination.
fn prune_options(spec: &CopyJobSpec) -> Result<ferry_engine::PruneOptions, ShardError> {
    Ok(ferry_engine::PruneOptions {
        filter: filter_of(spec)?,
        delete_excluded: spec.delete_excluded,
        reserved_top: std::ffi::CString::new(STATE_DIR).ok(),
        ..ferry_engine::PruneOptions::default()
    })
}

/// Mirror the job's source path onto its destination path, on the blocking pool. A source
/// that is a single file, or a destination not made yet (a dry run), has nothing to mirror.
async fn mirror(
    roots: &Roots,
    spec: &CopyJobSpec,
    opts: ferry_engine::PruneOptions,
) -> Result<ferry_engine::Pruned, ShardError> {
    let Src::Local(src) = roots.src.clone() else {
        // Refused before the copy (see run_shard).
        return Err(ShardError::Refused {
            reason: Reason::InvalidSpec,
            message: "spec.deleteExtraneous: a copy between nodes cannot mirror yet".into(),
        });
    };
    let dst = roots.dst.clone();
    let (src_path, dst_path) = (
        PathBuf::from(&spec.source.path),
        PathBuf::from(&spec.destination.path),
    );
    let pruned = tokio::task::spawn_blocking(move || {
        ferry_engine::prune_beneath(src.as_fd(), &src_path, dst.as_fd(), &dst_path, &opts)
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

/// Totals for the job's PROGRESS and ETA: counted next to a copy that outlasts a few
/// seconds (a short one needs no estimate, and would pay for the extra walk).
fn count_later(live: &Arc<Live>, done: &Arc<AtomicBool>, roots: &Roots, target: Target<'_>) {
    let (live, done) = (live.clone(), done.clone());
    let spec = &target.job.spec;
    let (select, links) = (target.shard.part, spec.preserve.hard_links);
    let (root, path) = (roots.src.clone(), PathBuf::from(&spec.source.path));
    // (The copy itself compiled it already and would have failed.)
    let Ok(filter) = filter_of(spec) else {
        return;
    };
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

/// Connections of a copy between nodes dialled again after one was lost, at most, in one
/// run (each dial itself tries for up to [`network::DIAL_FOR`]).
const MAX_REDIALS: u32 = 1000;

/// The copy, on its own OS thread; the async side only publishes its progress, and stops
/// it the moment the API server says the shard is no longer ours. A copy between nodes
/// whose connection is lost dials the sender again and resumes from what this node
/// committed (finished files are not sent again).
async fn copy(
    node: &Node,
    target: Target<'_>,
    active: &Active,
    live: &Arc<Live>,
    done: &Arc<AtomicBool>,
    roots: &Roots,
    mut opts: ferry_engine::Options,
) -> Result<Result<Summary, ferry_engine::Error>, ShardError> {
    let shard = target.shard;
    let mut redials = 0;
    loop {
        let result = copy_once(node, target, active, live, done, roots, opts.clone()).await?;
        let Src::Remote(link) = &roots.src else {
            return Ok(result);
        };
        let conn = link.current();
        let Some(why) = conn.lost() else {
            return Ok(result);
        };
        let stopped =
            active.cancel.load(Ordering::Relaxed) || active.fenced.load(Ordering::Relaxed);
        if stopped || redials >= MAX_REDIALS {
            return Ok(result);
        }
        redials += 1;
        crate::serve::metrics().redials.inc();
        tracing::warn!(shard = %shard.id, sender = ?shard.sender, %why, redials, "the connection to the sender was lost: dialling again to resume");
        let fresh = dial_until(node, target, active).await?;
        *crate::lock(&link.conn) = fresh;
        // What the lost connection's run committed is kept (the journal): the next run
        // resumes, and counts the tree again from zero as any resumed run does.
        opts.resume = true;
        live.restart();
        done.store(false, Ordering::Relaxed);
    }
}

/// One run of the engine on the shard's source, to its end.
async fn copy_once(
    node: &Node,
    target: Target<'_>,
    active: &Active,
    live: &Arc<Live>,
    done: &Arc<AtomicBool>,
    roots: &Roots,
    opts: ferry_engine::Options,
) -> Result<Result<Summary, ferry_engine::Error>, ShardError> {
    let shard = target.shard;
    let (tx, rx) = tokio::sync::oneshot::channel();
    {
        let (live, done) = (live.clone(), done.clone());
        let (src, dst_root) = (roots.src.clone(), roots.dst.clone());
        let src_path = PathBuf::from(&target.job.spec.source.path);
        let dst_path = PathBuf::from(&target.job.spec.destination.path);
        std::thread::Builder::new()
            .name("ferry-shard".into())
            .spawn(move || {
                let result = match src {
                    Src::Local(src_root) => ferry_engine::copy_beneath(
                        src_root.as_fd(),
                        &src_path,
                        dst_root.as_fd(),
                        &dst_path,
                        &opts,
                        &*live,
                    ),
                    Src::Remote(link) => ferry_engine::copy_from_beneath(
                        &link.current(),
                        &src_path,
                        dst_root.as_fd(),
                        &dst_path,
                        &opts,
                        &*live,
                    ),
                };
                done.store(true, Ordering::Relaxed);
                let _ = tx.send(result);
            })
            .map_err(ShardError::Spawn)?;
    }
    // A copy between nodes counts what it received as it goes (for the network rate).
    let (ns, name) = (
        target.job.namespace().unwrap_or_default(),
        target.job.name_any(),
    );
    let conn = match &roots.src {
        Src::Remote(link) => Some(link.current()),
        Src::Local(_) => None,
    };
    let mut received = 0;
    let mut count_received = || {
        if let Some(conn) = &conn {
            let now = conn.bytes_received();
            crate::serve::metrics().network("received", &ns, &name, now.saturating_sub(received));
            received = now;
        }
    };
    let mut rx = rx;
    let result = loop {
        tokio::select! {
            r = &mut rx => {
                count_received();
                break r.map_err(ShardError::CopyThreadVanished)?
            }
            _ = tokio::time::sleep(PUBLISH_EVERY) => {
                count_received();
                if !done.load(Ordering::Relaxed) && !active.fenced.load(Ordering::Relaxed) {
                    match node.publish(target, ShardState::Running, live, None).await {
                        // Not ours any more: stop copying at once.
                        Err(PublishError::Fenced(_)) => {
                            active.fenced.store(true, Ordering::Relaxed);
                            active.cancel.store(true, Ordering::Relaxed);
                            tracing::warn!(shard = %shard.id, epoch = shard.epoch, "the API server refused our progress for this epoch: stopping");
                        }
                        Err(e) => tracing::warn!(error = %e, "progress update failed"),
                        Ok(()) => {}
                    }
                }
            }
        }
    };
    Ok(result)
}

/// How a copy ended: the engine's result, and the journal it wrote on this node.
struct Settled<'a> {
    result: &'a Result<Summary, ferry_engine::Error>,
    journal: Option<&'a Path>,
    /// The copy's fence, which the mirror pass asks before each removal.
    fence: Option<ferry_engine::Fence>,
}

/// How the copy ended, as the shard's state: a full destination explained, the manifest
/// exported to the tenant's `.ferry/` (a split job's parts joined), the final numbers taken
/// from the summary, and a success flushed.
async fn settle(
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

/// Remove what the destination has and the source lacks; a removal that fails is the
/// shard's failure (PartiallyFailed, with the path), the rest are still removed.
async fn prune_after(
    target: Target<'_>,
    active: &Active,
    live: &Live,
    roots: &Roots,
    fence: Option<ferry_engine::Fence>,
) -> ShardState {
    let spec = &target.job.spec;
    let opts = match prune_options(spec) {
        Ok(o) => ferry_engine::PruneOptions {
            fence,
            cancel: Some(active.cancel.clone()),
            ..o
        },
        Err(e) => {
            live.set_start_error(Reason::InvalidSpec, e.to_string());
            return ShardState::Failed;
        }
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
async fn manifest_out(
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
async fn flush(node: &Node, target: Target<'_>, live: &Live, roots: &Roots) -> ShardState {
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
async fn destination_full(live: &Live, roots: &Roots, select: Part, spec: &CopyJobSpec) -> String {
    let done = live.bytes.load(Ordering::Relaxed);
    let files = live.files.load(Ordering::Relaxed);
    let planned = live.planned();
    let total = match planned {
        Some((_, bytes)) => Some(bytes.max(0) as u64),
        // Not counted while copying (a short copy): count it now, the walk is cheap next
        // to the copy that filled a volume.
        None => plan(&roots.src, Path::new(&spec.source.path), select, spec)
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
