//! Cutting a job into shards and handing them to agents. Pure functions: the reconciler
//! supplies the live agents and writes the result to status.
//!
//! A job between node-local volumes is one shard on the node that has them. A job between
//! shared roots (the same filesystem on every node, e.g. NFS) with `maxAgents > 1` is cut
//! into more parts than agents; each idle agent is given the next part as soon as it is
//! free, so a fast agent takes more parts and a slow one fewer. After the parts, one agent
//! runs the `directories` shard: directory metadata (which every part touches) and the
//! joined manifest.

use std::collections::BTreeSet;
use std::time::Duration;

use ferry_crds::{FailedPath, Part, Reason, ShardState, ShardStatus};
/// Parts per agent a split job is cut into: enough that a slow agent holds up little.
const PARTS_PER_AGENT: i32 = 4;
/// Every part walks the whole tree's directories, so their number is bounded.
const MAX_PARTS: i32 = 64;

/// How many parts a job split across `max_agents` agents is cut into.
pub fn parts_for(max_agents: i32) -> i32 {
    (max_agents * PARTS_PER_AGENT).clamp(2, MAX_PARTS)
}

/// The shards of a new job, none assigned yet: one for the whole tree, or `parts` parts
/// and the directories pass.
pub fn initial(parts: Option<i32>, source_root: &str, destination_root: &str) -> Vec<ShardStatus> {
    let shard = |id: String, part: Part| ShardStatus {
        id,
        part,
        source_root: source_root.into(),
        destination_root: destination_root.into(),
        ..Default::default()
    };
    match parts {
        None => vec![shard("0".into(), Part::All)],
        Some(n) => (0..n as u32)
            .map(|index| {
                let count = n as u32;
                shard(index.to_string(), Part::Slice { index, count })
            })
            .chain(std::iter::once(shard(
                Part::Directories.to_string(),
                Part::Directories,
            )))
            .collect(),
    }
}

/// Give unassigned shards to idle agents among `eligible` (at most one unfinished shard
/// per node, at most `max_agents` nodes busy at once); the directories pass waits until
/// every part has finished. Returns whether anything was assigned.
pub fn assign(shards: &mut [ShardStatus], eligible: &[String], max_agents: usize) -> bool {
    let mut busy: BTreeSet<String> = shards
        .iter()
        .filter(|s| !s.node.is_empty() && !s.progress.state.finished())
        .map(|s| s.node.clone())
        .collect();
    let parts_done = shards
        .iter()
        .filter(|s| s.part != Part::Directories)
        .all(|s| s.progress.state.finished());
    let mut changed = false;
    for s in shards.iter_mut().filter(|s| s.node.is_empty()) {
        if s.part == Part::Directories && !parts_done {
            continue;
        }
        if busy.len() >= max_agents.max(1) {
            break;
        }
        let Some(node) = eligible.iter().find(|n| !busy.contains(*n)) else {
            break;
        };
        s.node = node.clone();
        // A new epoch for every assignment: the agent that held it before, should it come
        // back, is refused when it publishes for its old one.
        s.epoch += 1;
        busy.insert(node.clone());
        changed = true;
    }
    changed
}

/// Give the unassigned whole-tree shard of a job whose volumes no live node has both of to
/// a pair of agents: the receiver (on a node with the destination) runs it, and the sender
/// (on a node with the source) serves the source to it over the transfer port. A new epoch,
/// as for any assignment: the pair that held it before cannot publish or serve for it.
/// Returns whether anything was assigned.
pub fn assign_pair(shards: &mut [ShardStatus], sender: &str, receiver: &str) -> bool {
    let mut changed = false;
    for s in shards
        .iter_mut()
        .filter(|s| s.node.is_empty() && s.part == Part::All)
    {
        s.node = receiver.into();
        s.sender = Some(sender.into());
        s.epoch += 1;
        changed = true;
    }
    changed
}

/// What became of the shards of agents that stopped heartbeating.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// (shard id, node) taken from a lost agent, to be given to another: the roots are
    /// shared, so any agent reaches the same files and resumes where it stopped.
    pub moved: Vec<(String, String)>,
    /// (shard id, node) failed with `NodeUnavailable`: its volumes are only on that node,
    /// and it stayed away past the deadline.
    pub failed: Vec<(String, String)>,
    /// Nodes being waited for, and the least time left before one of them is given up.
    pub waiting: Vec<String>,
    pub next_deadline: Option<Duration>,
}

/// Deal with unfinished shards whose node's agent is lost (`lost_for` says for how long):
/// on shared roots they are unassigned (the next [`assign`] gives them a new epoch on a
/// live agent); on node-local volumes they wait for the node, then fail after `deadline`
/// (with a new epoch, so the agent cannot publish for them should it return). A
/// suspended job waits without a deadline.
pub fn handle_lost(
    shards: &mut [ShardStatus],
    lost_for: impl Fn(&str) -> Option<Duration>,
    shared: bool,
    suspended: bool,
    deadline: Duration,
) -> Lost {
    let mut out = Lost::default();
    for s in shards
        .iter_mut()
        .filter(|s| !s.node.is_empty() && !s.progress.state.finished())
    {
        // A copy between nodes needs both of its agents (another install's agent, which
        // serves an export, has no heartbeat here).
        let sender = s.sender.clone().filter(|n| n != ferry_crds::EXPORT_SENDER);
        let Some((node, lost)) = lost_for(&s.node)
            .map(|l| (s.node.clone(), l))
            .or_else(|| sender.and_then(|n| lost_for(&n).map(|l| (n, l))))
        else {
            continue;
        };
        if shared {
            s.sender = None;
            out.moved.push((s.id.clone(), std::mem::take(&mut s.node)));
        } else if suspended {
            out.waiting.push(node);
        } else if lost >= deadline {
            s.progress.state = ShardState::Failed;
            s.epoch += 1;
            s.progress.failures = vec![FailedPath::whole_shard(
                Reason::NodeUnavailable,
                &format!(
                    "the agent on node {node} stopped heartbeating and did not come back within {}s; \
                     the volumes are only reachable from that node. Files already copied are \
                     kept: bring the node back and re-create the job to copy the rest",
                    deadline.as_secs()
                ),
            )];
            out.failed.push((s.id.clone(), node));
        } else {
            out.waiting.push(node);
            let left = deadline - lost;
            out.next_deadline = Some(out.next_deadline.map_or(left, |d: Duration| d.min(left)));
        }
    }
    out.waiting.sort();
    out.waiting.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn by_node(shards: &[ShardStatus]) -> Vec<(String, String)> {
        shards
            .iter()
            .filter(|s| !s.node.is_empty())
            .map(|s| (s.id.clone(), s.node.clone()))
            .collect()
    }

    #[test]
    fn a_whole_tree_is_one_shard_on_the_first_eligible_node() {
        let mut shards = initial(None, "/a", "/b");
        assert_eq!(shards.len(), 1);
        assert!(assign(&mut shards, &nodes(&["n1", "n2"]), 1));
        assert_eq!(by_node(&shards), vec![("0".into(), "n1".into())]);
        assert_eq!(shards[0].epoch, 1);
        // Nothing more to give.
        assert!(!assign(&mut shards, &nodes(&["n1", "n2"]), 1));
    }

    #[test]
    fn parts_go_one_at_a_time_to_idle_agents_and_the_directories_pass_comes_last() {
        let mut shards = initial(Some(parts_for(2)), "/s", "/d");
        assert_eq!(shards.len(), 9);
        assert_eq!(shards[3].part.to_string(), "3/8");
        let agents = nodes(&["a", "b", "c"]);
        assign(&mut shards, &agents, 2);
        assert_eq!(
            by_node(&shards),
            vec![("0".into(), "a".into()), ("1".into(), "b".into())],
            "two agents at most, one part each"
        );
        // b finishes first and gets the next part; a is still busy.
        shards[1].progress.state = ShardState::Succeeded;
        assign(&mut shards, &agents, 2);
        assert_eq!(shards[2].node, "b");
        assert!(shards[3].node.is_empty());
        // Every part done except one: the directories pass waits.
        for s in shards.iter_mut().take(8) {
            s.progress.state = ShardState::Succeeded;
            if s.node.is_empty() {
                s.node = "a".into();
            }
        }
        shards[7].progress.state = ShardState::Running;
        assign(&mut shards, &agents, 2);
        assert!(
            shards[8].node.is_empty(),
            "directories before the last part"
        );
        shards[7].progress.state = ShardState::Failed;
        assert!(assign(&mut shards, &agents, 2));
        assert_eq!(shards[8].part, Part::Directories);
        assert!(!shards[8].node.is_empty());
    }

    #[test]
    fn no_eligible_agent_assigns_nothing() {
        let mut shards = initial(Some(4), "/s", "/d");
        assert!(!assign(&mut shards, &[], 2));
        assert!(shards.iter().all(|s| s.node.is_empty()));
    }

    #[test]
    fn a_lost_agents_shards_move_on_shared_roots_with_a_new_epoch() {
        let mut shards = initial(Some(2), "/s", "/d");
        assign(&mut shards, &nodes(&["a", "b"]), 2);
        shards[0].progress.state = ShardState::Running;
        shards[1].progress.state = ShardState::Succeeded;
        let lost = |n: &str| (n == "a" || n == "b").then_some(Duration::from_secs(1));
        let out = handle_lost(&mut shards, lost, true, false, Duration::from_secs(60));
        // The finished shard stays where it ran; the running one is free again.
        assert_eq!(out.moved, vec![("0".to_string(), "a".to_string())]);
        assert_eq!(shards[1].node, "b");
        assert!(assign(&mut shards, &nodes(&["c"]), 2));
        assert_eq!((shards[0].node.as_str(), shards[0].epoch), ("c", 2));
    }

    #[test]
    fn node_local_work_waits_for_its_node_then_fails_node_unavailable() {
        let mut shards = initial(None, "/s", "/d");
        assign(&mut shards, &nodes(&["a"]), 1);
        shards[0].progress.state = ShardState::Running;
        let deadline = Duration::from_secs(300);
        let out = handle_lost(
            &mut shards,
            |_| Some(Duration::from_secs(100)),
            false,
            false,
            deadline,
        );
        assert_eq!(out.waiting, vec!["a".to_string()]);
        assert_eq!(out.next_deadline, Some(Duration::from_secs(200)));
        assert_eq!(
            (shards[0].progress.state, shards[0].epoch),
            (ShardState::Running, 1)
        );
        // Suspended: no deadline.
        let out = handle_lost(
            &mut shards,
            |_| Some(Duration::from_secs(400)),
            false,
            true,
            deadline,
        );
        assert!(out.failed.is_empty() && out.next_deadline.is_none());
        let out = handle_lost(
            &mut shards,
            |_| Some(Duration::from_secs(400)),
            false,
            false,
            deadline,
        );
        assert_eq!(out.failed, vec![("0".to_string(), "a".to_string())]);
        assert_eq!(shards[0].progress.state, ShardState::Failed);
        assert_eq!(shards[0].epoch, 2, "the returning agent's epoch is stale");
        assert!(shards[0].failed_by_operator());
        assert!(shards[0].progress.failures[0].message.contains("node a"));
        // A live node's shards are left alone.
        let mut shards = initial(None, "/s", "/d");
        assign(&mut shards, &nodes(&["a"]), 1);
        let out = handle_lost(&mut shards, |_| None, false, false, deadline);
        assert_eq!(out, Lost::default());
    }

    #[test]
    fn parts_are_bounded() {
        assert_eq!(parts_for(1), 4);
        assert_eq!(parts_for(64), MAX_PARTS);
    }
}
