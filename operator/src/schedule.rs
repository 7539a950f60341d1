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

use ferry_crds::ShardStatus;

/// `part` of the last shard of a split job.
pub const DIRECTORIES: &str = "directories";
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
    let shard = |id: String, part: String| ShardStatus {
        id,
        part,
        source_root: source_root.into(),
        destination_root: destination_root.into(),
        ..Default::default()
    };
    match parts {
        None => vec![shard("0".into(), String::new())],
        Some(n) => (0..n)
            .map(|i| shard(i.to_string(), format!("{i}/{n}")))
            .chain(std::iter::once(shard(
                DIRECTORIES.into(),
                DIRECTORIES.into(),
            )))
            .collect(),
    }
}

pub fn finished(s: &ShardStatus) -> bool {
    s.state == "Succeeded" || s.state == "Failed"
}

/// Give unassigned shards to idle agents among `eligible` (at most one unfinished shard
/// per node, at most `max_agents` nodes busy at once); the directories pass waits until
/// every part has finished. Returns whether anything was assigned.
pub fn assign(shards: &mut [ShardStatus], eligible: &[String], max_agents: usize) -> bool {
    let mut busy: BTreeSet<String> = shards
        .iter()
        .filter(|s| !s.node.is_empty() && !finished(s))
        .map(|s| s.node.clone())
        .collect();
    let parts_done = shards
        .iter()
        .filter(|s| s.part != DIRECTORIES)
        .all(finished);
    let mut changed = false;
    for s in shards.iter_mut().filter(|s| s.node.is_empty()) {
        if s.part == DIRECTORIES && !parts_done {
            continue;
        }
        if busy.len() >= max_agents.max(1) {
            break;
        }
        let Some(node) = eligible.iter().find(|n| !busy.contains(*n)) else {
            break;
        };
        s.node = node.clone();
        s.epoch = 1;
        busy.insert(node.clone());
        changed = true;
    }
    changed
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
        assert_eq!(shards[3].part, "3/8");
        let agents = nodes(&["a", "b", "c"]);
        assign(&mut shards, &agents, 2);
        assert_eq!(
            by_node(&shards),
            vec![("0".into(), "a".into()), ("1".into(), "b".into())],
            "two agents at most, one part each"
        );
        // b finishes first and gets the next part; a is still busy.
        shards[1].state = "Succeeded".into();
        assign(&mut shards, &agents, 2);
        assert_eq!(shards[2].node, "b");
        assert!(shards[3].node.is_empty());
        // Every part done except one: the directories pass waits.
        for s in shards.iter_mut().take(8) {
            s.state = "Succeeded".into();
            if s.node.is_empty() {
                s.node = "a".into();
            }
        }
        shards[7].state = "Running".into();
        assign(&mut shards, &agents, 2);
        assert!(
            shards[8].node.is_empty(),
            "directories before the last part"
        );
        shards[7].state = "Failed".into();
        assert!(assign(&mut shards, &agents, 2));
        assert_eq!(shards[8].part, DIRECTORIES);
        assert!(!shards[8].node.is_empty());
    }

    #[test]
    fn no_eligible_agent_assigns_nothing() {
        let mut shards = initial(Some(4), "/s", "/d");
        assert!(!assign(&mut shards, &[], 2));
        assert!(shards.iter().all(|s| s.node.is_empty()));
    }

    #[test]
    fn parts_are_bounded() {
        assert_eq!(parts_for(1), 4);
        assert_eq!(parts_for(64), MAX_PARTS);
    }
}
