//! The reconcile's decisions: the Accepted, Resolved and Scheduled conditions, the shards
//! (cut on first resolution, handed to live agents, taken back from lost ones), the events
//! that explain them, and when to look again.

use std::time::Duration;

use ferry_crds::{ConditionType, CopyJob, Reason, ShardStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::Client;

use crate::heartbeat::Heartbeats;
use crate::resolve::{self, Blocked};
use crate::schedule;
use crate::status::condition;
use crate::volume::Volume;

/// What `decide` adds to a reconcile besides the shards.
#[derive(Default)]
#[allow(missing_debug_implementations)] // KubeEvent is not Debug
pub struct Decided {
    pub conditions: Vec<Condition>,
    /// A dry run of a job that would be split: (shards, nodes) it would use.
    pub shape: Option<(i64, Vec<String>)>,
    /// Events to publish once the status that explains them is written.
    pub notes: Vec<KubeEvent>,
}

/// The Accepted, Resolved and Scheduled conditions, and the shards: created on first
/// resolution, then handed to idle agents. Returns when to look again, if no status
/// change is bound to trigger it.
#[allow(clippy::too_many_arguments)]
pub async fn decide(
    client: &Client,
    heartbeats: &Heartbeats,
    node_deadline: Duration,
    job: &CopyJob,
    blocked: &Option<Blocked>,
    roots: &[Volume],
    shards: &mut Vec<ShardStatus>,
    out: &mut Decided,
) -> Result<Option<Duration>, kube::Error> {
    let Decided {
        conditions,
        shape,
        notes,
    } = out;
    let generation = job.metadata.generation;
    let old = job.status.clone().unwrap_or_default();
    let previous = old.conditions.as_slice();
    conditions.push(match blocked {
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
    });
    match blocked {
        Some(b) if b.condition == ConditionType::Accepted => return Ok(None),
        Some(b) => {
            conditions.push(condition(
                ConditionType::Resolved,
                false,
                b.reason,
                &b.message,
                generation,
                previous,
            ));
            return Ok(None);
        }
        None => conditions.push(condition(
            ConditionType::Resolved,
            true,
            Reason::Resolved,
            "source and destination resolved",
            generation,
            previous,
        )),
    }
    let max_agents = job.spec.parallelism.max_agents.max(1);
    // Split only where every agent sees the same files on both sides. A dry run counts
    // the whole tree on one agent and reports the split it would make.
    let splittable = max_agents > 1 && roots.iter().all(|r| r.shared);
    let split = splittable && !job.spec.dry_run;
    if shards.is_empty() {
        *shards = schedule::initial(
            split.then(|| schedule::parts_for(max_agents)),
            &roots[0].host_path,
            &roots[1].host_path,
        );
    }
    let mut requeue = None;
    // Work held by agents that stopped heartbeating: moved on shared roots, waited for
    // (then failed) on node-local ones.
    let lost = schedule::handle_lost(
        shards,
        |node| heartbeats.lost_for(node),
        roots.iter().all(|r| r.shared),
        job.spec.suspend,
        node_deadline,
    );
    for (id, node) in &lost.failed {
        notes.push(KubeEvent {
            type_: EventType::Warning,
            reason: Reason::NodeUnavailable.to_string(),
            note: Some(format!(
                "shard {id}: the agent on node {node} did not come back within {}s",
                node_deadline.as_secs()
            )),
            action: "Schedule".into(),
            secondary: None,
        });
    }
    if let Some(left) = lost.next_deadline {
        requeue = Some(left + Duration::from_millis(100));
    }
    if shards.iter().any(|s| s.node.is_empty()) || (job.spec.dry_run && splittable) {
        let eligible = resolve::eligible_nodes(client, &heartbeats.live(), roots).await?;
        schedule::assign(shards, &eligible, max_agents as usize);
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
            let nodes: Vec<String> = eligible.into_iter().take(max_agents as usize).collect();
            *shape = Some((i64::from(schedule::parts_for(max_agents)) + 1, nodes));
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
                node_deadline.as_secs()
            ),
        ),
        (true, _) => (
            Reason::NoAgent,
            "no node with a live Ferry agent has both volumes; waiting for one".to_string(),
        ),
        (false, 1) => (
            Reason::Assigned,
            format!("assigned to node {}", nodes.join(", ")),
        ),
        (false, n) => (
            Reason::Assigned,
            format!(
                "split into {} parts and a directories pass; nodes {}",
                n - 1,
                nodes.join(", ")
            ),
        ),
    };
    conditions.push(condition(
        ConditionType::Scheduled,
        !nodes.is_empty(),
        reason,
        &msg,
        generation,
        previous,
    ));
    Ok(requeue)
}
