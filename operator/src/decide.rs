//! The reconcile's decisions, as one pure function of what `apply` gathered: the Accepted,
//! Resolved and Scheduled conditions, the shards (cut on first resolution, handed to live
//! agents, taken back from lost ones), the status they add up to, the events that explain
//! it, and when to look again. No API calls here: `apply` reads the cluster before and
//! writes the [`Decision`] after.

use std::time::Duration;

use ferry_crds::{ConditionType, CopyJob, CopyJobStatus, Phase, Reason, ShardStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event as KubeEvent, EventType};

use crate::resolve::{Blocked, Endpoints};
use crate::schedule;
use crate::status::{condition, failed_condition, summarize};
use crate::volume::Volume;

/// What a decision is made from, read from the cluster beforehand.
#[allow(missing_debug_implementations)] // lost_for is a closure
pub struct Inputs<'a> {
    /// The job as the watch saw it; its status is the previous decision.
    pub job: &'a CopyJob,
    /// The endpoints: resolved, refused, or not looked at (a finished job).
    pub endpoints: &'a Endpoints,
    /// Nodes with a live agent that have both volumes, sorted by name. Only read when
    /// [`needs_nodes`] says so (listing Nodes is not free).
    pub eligible: &'a [String],
    /// Where each endpoint is (source, destination), read with `eligible`: what says why
    /// no node has both.
    pub reachable: &'a [crate::resolve::Reachable; 2],
    /// `None` while the agent on this node is live, else how long ago its heartbeat
    /// expired.
    pub lost_for: &'a dyn Fn(&str) -> Option<Duration>,
    /// How long node-local work waits for a lost node before failing `NodeUnavailable`.
    pub node_deadline: Duration,
    /// Whether the node's agent serves a transfer port (only those are paired for a copy
    /// between nodes).
    pub transfers: &'a dyn Fn(&str) -> bool,
}

/// What the reconcile decided.
#[allow(missing_debug_implementations)] // KubeEvent is not Debug
pub struct Decision {
    /// The status the operator's field manager owns (its shard entries carry only the
    /// assignment, and the state of shards the operator failed).
    pub status: CopyJobStatus,
    /// The status differs from the job's: write it.
    pub write: bool,
    /// A shard's node, epoch or part changed: write only on the version it was decided on.
    pub assignment_changed: bool,
    /// Events to publish, in order, once the status that explains them is written.
    pub events: Vec<KubeEvent>,
    /// A dry run of a job that would be split: (shards, nodes) it would use.
    pub shape: Option<(i64, Vec<String>)>,
    /// When to look again, if no status change is bound to trigger it.
    pub requeue: Option<Duration>,
}

/// Rules are checked on every reconcile, not once: when a job that has shards is refused
/// with one of [`Reason::REVOKES`] (its root no longer admits its namespace or became
/// read-only, its claim is no longer its own, an endpoint is gone), its unfinished shards
/// fail with that reason at a new epoch. Their agents see the shard is no longer theirs
/// and stop at the next file, and could not publish for the old epoch if they tried.
/// Other refusals (a CSI volume waiting for a pod to mount it) leave running shards alone.
///
/// A spec changed since the shards were cut ([`Reason::SpecChanged`]) fails finished
/// shards too: what they copied and verified was for another spec, and the status must
/// not say it was copied for this one.
fn revoke(shards: &mut [ShardStatus], b: &Blocked) {
    if !Reason::REVOKES.contains(&b.reason) {
        return;
    }
    let every = b.reason == Reason::SpecChanged;
    for s in shards
        .iter_mut()
        .filter(|s| !s.progress.state.finished() || (every && !s.failed_by_operator()))
    {
        s.progress.state = ferry_crds::ShardState::Failed;
        s.epoch += 1;
        s.progress.failures = vec![ferry_crds::FailedPath::whole_shard(
            b.reason,
            &format!("stopped: {} (files copied before are kept)", b.message),
        )];
    }
}

/// The refusal of a job whose spec is no longer the one its shards were cut for (the
/// CRD's rule refuses such a change; this holds without the rule too): a shard runs and is
/// reported only for the spec it was cut for.
pub fn spec_changed(job: &CopyJob) -> Option<Blocked> {
    let shards = job.status.as_ref().map_or(&[][..], |s| s.shards.as_slice());
    if shards.iter().all(|s| s.spec_digest.is_empty()) {
        return None;
    }
    let digest = job.spec.digest();
    shards
        .iter()
        .any(|s| !s.spec_digest.is_empty() && s.spec_digest != digest)
        .then(|| Blocked {
            condition: ConditionType::Accepted,
            reason: Reason::SpecChanged,
            message: "the spec changed after the copy started (its shards were cut for another spec; what they copied is where that spec said): restore the spec, or create a new CopyJob for the new one".into(),
        })
}

/// No node has both volumes (as read with the eligible nodes): a copy between nodes.
fn apart([src_at, dst_at]: &[crate::resolve::Reachable; 2]) -> bool {
    !src_at.nodes.is_empty() && !dst_at.nodes.iter().any(|n| src_at.nodes.contains(n))
}

/// The refusal of a job that is (or is about to be paired as) a copy between nodes for
/// what such a copy cannot do ([`ferry_resolve::validate::between_nodes`]): decided when
/// the operator pairs the nodes, so before any shard or ticket exists.
fn refused_apart(input: &Inputs, wants_nodes: bool) -> Option<Blocked> {
    let job = input.job;
    if !matches!(input.endpoints, Endpoints::Resolved { .. }) {
        return None;
    }
    let shards = job.status.as_ref().map_or(&[][..], |s| s.shards.as_slice());
    let paired = shards.iter().any(ShardStatus::between_nodes);
    let pairing = !paired && wants_nodes && (apart(input.reachable) || from_export(job));
    if !(paired || pairing) {
        return None;
    }
    let refusal = ferry_resolve::validate::between_nodes(&job.spec).err()?;
    Some(Blocked {
        condition: ConditionType::Accepted,
        reason: refusal.reason,
        message: refusal.message,
    })
}

/// A job reading another install's export: its source is on no node of this cluster, and
/// its one shard is received from that install's agent ([`ferry_crds::EXPORT_SENDER`]).
fn from_export(job: &CopyJob) -> bool {
    job.spec.source.export.is_some()
}

/// Whether [`decide`] will read the eligible nodes: there are shards to hand out (a new
/// job, an unassigned shard, a lost agent's shard on shared roots), or a dry run of a
/// splittable job reports where it would run.
pub fn needs_nodes(
    job: &CopyJob,
    endpoints: &Endpoints,
    lost_for: &dyn Fn(&str) -> Option<Duration>,
) -> bool {
    let Endpoints::Resolved {
        source,
        destination,
    } = endpoints
    else {
        return false;
    };
    let shared = source.shared && destination.shared;
    let splittable = job.spec.parallelism.max_agents.max(1) > 1 && shared;
    let shards = job.status.as_ref().map_or(&[][..], |s| s.shards.as_slice());
    shards.is_empty()
        || (job.spec.dry_run && splittable)
        || shards.iter().any(|s| {
            s.node.is_empty()
                || (shared && !s.progress.state.finished() && lost_for(&s.node).is_some())
        })
}

/// Decide a reconcile of `input.job`.
pub fn decide(input: &Inputs) -> Decision {
    let job = input.job;
    // Borrowed, not cloned: a status holds up to 65 shards with their failures.
    let unset = CopyJobStatus::default();
    let old = job.status.as_ref().unwrap_or(&unset);
    let previous = old.conditions.as_slice();
    let mut shards = old.shards.clone();
    // Decided on the shards as they were, before any is created or taken back.
    let wants_nodes = needs_nodes(job, input.endpoints, input.lost_for);
    // A changed spec wins over what the endpoints say, a finished job included; then what
    // a copy between nodes cannot do, once the endpoints say it is one.
    let changed = spec_changed(job)
        .or_else(|| refused_apart(input, wants_nodes))
        .map(Endpoints::Blocked);
    let endpoints = changed.as_ref().unwrap_or(input.endpoints);
    let (conditions, scheduled) = match endpoints {
        // A finished job keeps what was decided when it ran.
        Endpoints::Finished => (
            previous
                .iter()
                .filter(|c| {
                    [
                        ConditionType::Accepted,
                        ConditionType::Resolved,
                        ConditionType::Scheduled,
                    ]
                    .iter()
                    .any(|t| c.type_ == t.as_str())
                })
                .cloned()
                .collect(),
            Scheduled::default(),
        ),
        Endpoints::Blocked(b) => {
            revoke(&mut shards, b);
            let mut conditions = vec![accepted(job, Some(b), previous)];
            if b.condition != ConditionType::Accepted {
                conditions.push(condition(
                    ConditionType::Resolved,
                    false,
                    b.reason,
                    &b.message,
                    job.metadata.generation,
                    previous,
                ));
            }
            (conditions, Scheduled::default())
        }
        Endpoints::Resolved {
            source,
            destination,
        } => {
            let (scheduled, s) =
                schedule_shards(input, wants_nodes, [source, destination], &mut shards);
            let conditions = vec![
                accepted(job, None, previous),
                condition(
                    ConditionType::Resolved,
                    true,
                    Reason::Resolved,
                    "source and destination resolved",
                    job.metadata.generation,
                    previous,
                ),
                scheduled,
            ];
            (conditions, s)
        }
    };
    let blocked = match endpoints {
        Endpoints::Blocked(b) => Some(b),
        _ => None,
    };
    // A job whose shards were stopped for a refusal is not waiting for anything: it failed.
    let revoked = shards.iter().any(|s| s.failed_by_operator());
    let status = summarize(
        job,
        blocked.is_some() && !revoked,
        shards,
        conditions,
        scheduled.shape.clone(),
    );
    let mut events = scheduled.notes;
    let new_refusal = blocked.filter(|b| {
        !previous
            .iter()
            .any(|c| c.status == "False" && c.reason == b.reason.as_str())
    });
    if let Some(b) = new_refusal {
        // An event is a courtesy; the condition is the record.
        events.push(KubeEvent {
            type_: EventType::Warning,
            reason: b.reason.to_string(),
            note: Some(b.message.clone()),
            action: "Reconcile".into(),
            secondary: None,
        });
    }
    // A job that just failed says why, once, as its Failed condition does (a check's
    // Differs, a copy's first failing paths).
    let failed = failed_condition(&status.conditions);
    if let Some(c) = failed.filter(|_| old.phase != Some(Phase::Failed)) {
        events.push(KubeEvent {
            type_: EventType::Warning,
            reason: c.reason.clone(),
            note: Some(c.message.clone()),
            action: "Copy".into(),
            secondary: None,
        });
    }
    let assignment = |s: &[ShardStatus]| {
        s.iter()
            .map(|s| {
                (
                    s.id.clone(),
                    s.node.clone(),
                    s.sender.clone(),
                    s.epoch,
                    s.part,
                )
            })
            .collect::<Vec<_>>()
    };
    let assignment_changed = assignment(&old.shards) != assignment(&status.shards);
    let unchanged = old.phase == status.phase
        && old.conditions == status.conditions
        && old.progress == status.progress
        && old.failures == status.failures
        && old.finished_at == status.finished_at
        && old.manifest == status.manifest
        && old.plan == status.plan
        && old.mode == status.mode
        && !assignment_changed;
    // A refusal waits for the spec (or the StorageRoot, on the next resync) to change; a
    // CSI volume waits for a pod to mount it (or stop using it), a snapshot source for its
    // snapshot and restored claim, and an export for its Secret to be carried over (or
    // the admin's FerryPeer), none of which changes the CopyJob.
    let requeue = match blocked {
        Some(b)
            if matches!(
                b.reason,
                Reason::VolumeNotMounted
                    | Reason::VolumeInUse
                    | Reason::SnapshotNotReady
                    | Reason::ExportNotFound
                    | Reason::PeerNotTrusted
            ) =>
        {
            Some(Duration::from_secs(5))
        }
        Some(_) => Some(Duration::from_secs(60)),
        None => scheduled.requeue,
    };
    Decision {
        status,
        write: !unchanged,
        assignment_changed,
        events,
        shape: scheduled.shape,
        requeue,
    }
}

/// The Accepted condition: refused by `refusal` when it is about acceptance.
fn accepted(job: &CopyJob, refusal: Option<&Blocked>, previous: &[Condition]) -> Condition {
    let generation = job.metadata.generation;
    match refusal {
        Some(b) if b.condition == ConditionType::Accepted => condition(
            ConditionType::Accepted,
            false,
            b.reason,
            &b.message,
            generation,
            previous,
        ),
        _ => condition(
            ConditionType::Accepted,
            true,
            Reason::Valid,
            "the spec is valid",
            generation,
            previous,
        ),
    }
}

/// What scheduling a resolved job adds besides the shards and the Scheduled condition.
#[derive(Default)]
struct Scheduled {
    notes: Vec<KubeEvent>,
    shape: Option<(i64, Vec<String>)>,
    requeue: Option<Duration>,
}

/// The shards, created on first resolution, then handed to idle agents (and taken back
/// from lost ones); the Scheduled condition that says where they are. `wants_nodes`:
/// [`needs_nodes`] of the job as it was.
fn schedule_shards(
    input: &Inputs,
    wants_nodes: bool,
    roots: [&Volume; 2],
    shards: &mut Vec<ShardStatus>,
) -> (Condition, Scheduled) {
    let job = input.job;
    let previous = job
        .status
        .as_ref()
        .map_or(&[][..], |s| s.conditions.as_slice());
    let mut notes = Vec::new();
    let mut shape = None;
    let max_agents = job.spec.parallelism.max_agents.max(1);
    // Split only where every agent sees the same files on both sides. A dry run counts
    // the whole tree on one agent and reports the split it would make.
    let splittable = max_agents > 1 && roots.iter().all(|r| r.shared);
    // A copy between nodes (no node has both volumes) is one shard: parts would each walk
    // the whole tree over the network.
    let [src_at, dst_at] = input.reachable;
    let apart = wants_nodes && (apart(input.reachable) || from_export(job));
    let split = splittable && !job.spec.dry_run && !apart;
    if shards.is_empty() {
        *shards = schedule::initial(
            split.then(|| schedule::parts_for(max_agents)),
            &roots[0].host_path,
            &roots[1].host_path,
        );
        // Cut for this spec, and run and reported for it alone (see spec_changed).
        let digest = job.spec.digest();
        for s in shards.iter_mut() {
            s.spec_digest.clone_from(&digest);
        }
    }
    let mut requeue = None;
    // Work held by agents that stopped heartbeating: moved on shared roots, waited for
    // (then failed) on node-local ones.
    let lost = schedule::handle_lost(
        shards,
        input.lost_for,
        roots.iter().all(|r| r.shared),
        job.spec.suspend,
        input.node_deadline,
    );
    for (id, node) in &lost.failed {
        notes.push(KubeEvent {
            type_: EventType::Warning,
            reason: Reason::NodeUnavailable.to_string(),
            note: Some(format!(
                "shard {id}: the agent on node {node} did not come back within {}s",
                input.node_deadline.as_secs()
            )),
            action: "Schedule".into(),
            secondary: None,
        });
    }
    if let Some(left) = lost.next_deadline {
        requeue = Some(left + Duration::from_millis(100));
    }
    if wants_nodes {
        let eligible = input.eligible;
        schedule::assign(shards, eligible, max_agents as usize);
        // No live node has both volumes: the first live node with the source serves it to
        // the first live node with the destination.
        if eligible.is_empty() {
            let first = |r: &crate::resolve::Reachable| {
                r.live.iter().find(|n| (input.transfers)(n)).cloned()
            };
            // Another install's export: the first live node with the destination and a
            // peering identity (`transfers` says so for such a job) receives it.
            let sender = match from_export(job) {
                true => Some(ferry_crds::EXPORT_SENDER.to_string()),
                false => first(src_at),
            };
            if let (Some(sender), Some(receiver)) = (sender, first(dst_at)) {
                schedule::assign_pair(shards, &sender, &receiver);
            }
        }
        for (id, from) in &lost.moved {
            let to = shards.iter().find(|s| &s.id == id).map(|s| s.node.as_str());
            let note = match to {
                Some(to) if !to.is_empty() => format!(
                    "shard {id}: the agent on node {from} stopped heartbeating; node {to} resumes it"
                ),
                _ => format!(
                    "shard {id}: the agent on node {from} stopped heartbeating; waiting for another agent"
                ),
            };
            notes.push(KubeEvent {
                type_: EventType::Warning,
                reason: Reason::Reassigned.to_string(),
                note: Some(note),
                action: "Schedule".into(),
                secondary: None,
            });
        }
        if job.spec.dry_run && splittable {
            let nodes: Vec<String> = eligible.iter().take(max_agents as usize).cloned().collect();
            shape = Some((i64::from(schedule::parts_for(max_agents)) + 1, nodes));
        }
        // Finishing shards trigger the next assignment; an agent coming up does not.
        if shards.iter().any(|s| s.node.is_empty()) {
            requeue = Some(Duration::from_secs(2));
        }
    }
    let mut nodes: Vec<&str> = shards
        .iter()
        .filter(|s| !s.node.is_empty())
        .map(|s| s.node.as_str())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let (reason, msg) = match (nodes.is_empty(), shards.len()) {
        _ if !lost.waiting.is_empty() => (
            Reason::WaitingForNode,
            format!(
                "the agent on {} stopped heartbeating; the volumes are only reachable there. \
                 Waiting for it (the job fails with NodeUnavailable after {}s)",
                lost.waiting.join(", "),
                input.node_deadline.as_secs()
            ),
        ),
        (true, _) if from_export(job) => (Reason::NoAgent, no_reader(dst_at, input.transfers)),
        (true, _) => (Reason::NoAgent, no_node(input.reachable, input.transfers)),
        (false, 1) => match shards.iter().find(|s| s.between_nodes()) {
            Some(s) if from_export(job) => (
                Reason::Assigned,
                format!(
                    "reading another cluster's export: node {} receives it from that cluster's agent",
                    s.node
                ),
            ),
            Some(s) => (
                Reason::Assigned,
                format!(
                    "copying between nodes: node {} serves the source to node {} over the network",
                    s.sender.as_deref().unwrap_or_default(),
                    s.node
                ),
            ),
            None => (
                Reason::Assigned,
                format!("assigned to node {} (a local copy)", nodes.join(", ")),
            ),
        },
        (false, n) => (
            Reason::Assigned,
            format!(
                "split into {} parts and a directories pass; nodes {}",
                n - 1,
                nodes.join(", ")
            ),
        ),
    };
    // What an agent waits for and keeps trying (said by it; shown, never acted upon).
    // Its export's Secret is read again soon meanwhile: carried again, it may say where
    // the export is now (no event tells the operator a tenant's Secret changed).
    let (reason, msg) = match waiting(shards) {
        Some(w) if lost.waiting.is_empty() => {
            requeue = Some(requeue.map_or(RECHECK_WAITING, |r| r.min(RECHECK_WAITING)));
            w
        }
        _ => (reason, msg),
    };
    // Waiting without a node is said once as an event too, each time the reason changes
    // (an agent gone, a node added), so `kubectl describe` shows why the job does not start.
    let said = previous
        .iter()
        .any(|c| c.type_ == ConditionType::Scheduled.as_str() && c.message == msg);
    if nodes.is_empty() && reason == Reason::NoAgent && !said {
        notes.push(KubeEvent {
            type_: EventType::Warning,
            reason: Reason::NoAgent.to_string(),
            note: Some(msg.clone()),
            action: "Schedule".into(),
            secondary: None,
        });
    }
    let scheduled = condition(
        ConditionType::Scheduled,
        !nodes.is_empty(),
        reason,
        &msg,
        job.metadata.generation,
        previous,
    );
    (
        scheduled,
        Scheduled {
            notes,
            shape,
            requeue,
        },
    )
}

/// How soon a job whose agent waits (PeerUnreachable) is looked at again.
const RECHECK_WAITING: Duration = Duration::from_secs(5);

/// The first unfinished shard's account of what its agent waits for (PeerUnreachable): its
/// reason and message, bounded again (an agent token writes it).
fn waiting(shards: &[ShardStatus]) -> Option<(Reason, String)> {
    shards
        .iter()
        .filter(|s| !s.progress.state.finished() && !s.node.is_empty())
        .find_map(|s| {
            let w = &s.progress.waiting;
            w.reason.map(|r| {
                let message =
                    ferry_crds::shorten(&w.message, ferry_crds::FailedPath::SHARD_MESSAGE_BYTES);
                (r, format!("shard {}: {message}", s.id))
            })
        })
}

/// Why no node can receive another install's export: the destination's volume is on no
/// node, on none with a live agent, or on none whose agent has a peering identity.
fn no_reader(destination: &crate::resolve::Reachable, peering: &dyn Fn(&str) -> bool) -> String {
    if destination.nodes.is_empty() {
        return "spec.destination: no Node has this volume (its StorageRoot's nodeSelector, or its PersistentVolume's node affinity, matches no Node); waiting for one".into();
    }
    if destination.live.is_empty() {
        return format!(
            "spec.destination: no Ferry agent is running on {} (the nodes with this volume); waiting for one",
            destination.nodes.join(", ")
        );
    }
    let without: Vec<&str> = destination
        .live
        .iter()
        .map(String::as_str)
        .filter(|n| !peering(n))
        .collect();
    format!(
        "reading another cluster's export needs an agent with a peering port (the chart's peering.enabled) on a node with spec.destination; the agent on {} has none; waiting",
        without.join(", ")
    )
}

/// Why no node can take a job's shard: which endpoint's volume is on no node, or on nodes
/// without a live agent; or that they are on different nodes.
fn no_node(
    [source, destination]: &[crate::resolve::Reachable; 2],
    transfers: &dyn Fn(&str) -> bool,
) -> String {
    let endpoints = [("spec.source", source), ("spec.destination", destination)];
    for (field, r) in endpoints {
        if r.nodes.is_empty() {
            return format!(
                "{field}: no Node has this volume (its StorageRoot's nodeSelector, or its PersistentVolume's node affinity, matches no Node); waiting for one"
            );
        }
    }
    for (field, r) in endpoints {
        if r.live.is_empty() {
            return format!(
                "{field}: no Ferry agent is running on {} (the node{} with this volume); waiting for one",
                r.nodes.join(", "),
                if r.nodes.len() == 1 { "" } else { "s" }
            );
        }
    }
    let without: Vec<&str> = source
        .live
        .iter()
        .chain(&destination.live)
        .map(String::as_str)
        .filter(|n| !transfers(n))
        .collect();
    format!(
        "spec.source is on {}, spec.destination on {}, and no node reaches both; a copy between them needs a transfer port on both agents, and the agent on {} serves none (chart value agent.transferPort); waiting",
        source.live.join(", "),
        destination.live.join(", "),
        without.join(", ")
    )
}

#[cfg(test)]
mod tests;
