//! The reconcile's decisions without a cluster: jobs, volumes, live and lost agents built
//! here, checked for what a user would see in the status and the events.

use super::*;
use crate::volume::Nodes;
use ferry_crds::{FailedPath, Part, Plan, ShardProgress, ShardState};

const DEADLINE: Duration = Duration::from_secs(300);

/// A CopyJob `team-a/copy` with these extra spec fields.
fn job(spec: serde_json::Value) -> CopyJob {
    let mut s = serde_json::json!({
        "source": {"root": "src", "path": "a"},
        "destination": {"root": "dst", "path": "b"},
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        s[k] = v.clone();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "CopyJob",
        "metadata": {"name": "copy", "namespace": "team-a", "uid": "6f1c2a9e-0d1b-4c55-9a43-2b7d1f0e8c11", "generation": 1, "resourceVersion": "7"},
        "spec": s,
    }))
    .expect("a CopyJob")
}

/// `job` as it is after `decision` was written (and agents reported `shards`).
fn after(mut job: CopyJob, status: CopyJobStatus) -> CopyJob {
    job.status = Some(status);
    job
}

fn volumes(shared: bool) -> Endpoints {
    let volume = |path: &str| Volume {
        block: false,
        host_path: path.into(),
        nodes: if shared {
            Nodes::All
        } else {
            Nodes::Named("node-a".into())
        },
        shared,
    };
    Endpoints::Resolved {
        source: volume("/data/src"),
        destination: volume("/data/dst"),
    }
}

fn names(nodes: &[&str]) -> Vec<String> {
    nodes.iter().map(|n| n.to_string()).collect()
}

/// Decide with these eligible nodes and these agents lost (for how long); every other
/// agent is live.
fn decide_with(
    job: &CopyJob,
    endpoints: &Endpoints,
    eligible: &[&str],
    lost: &[(&str, u64)],
) -> Decision {
    decide_in(job, endpoints, eligible, &Default::default(), lost)
}

/// [`decide_with`], with where each endpoint's volume is.
fn decide_in(
    job: &CopyJob,
    endpoints: &Endpoints,
    eligible: &[&str],
    reachable: &[crate::resolve::Reachable; 2],
    lost: &[(&str, u64)],
) -> Decision {
    let lost_for = |node: &str| {
        lost.iter()
            .find(|(n, _)| *n == node)
            .map(|(_, secs)| Duration::from_secs(*secs))
    };
    decide(&Inputs {
        job,
        endpoints,
        eligible: &names(eligible),
        reachable,
        lost_for: &lost_for,
        node_deadline: DEADLINE,
        transfers: &|_: &str| true,
    })
}

fn condition_of(d: &Decision, type_: ConditionType) -> Option<&Condition> {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_.as_str())
}

/// (status, reason, message) of a condition that must be there.
fn cond(d: &Decision, type_: ConditionType) -> (&str, &str, &str) {
    let c = condition_of(d, type_).unwrap_or_else(|| panic!("no {type_} condition"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn event_reasons(d: &Decision) -> Vec<&str> {
    d.events.iter().map(|e| e.reason.as_str()).collect()
}

fn running_on(node: &str, epoch: i64) -> ShardStatus {
    ShardStatus {
        id: "0".into(),
        node: node.into(),
        epoch,
        source_root: "/data/src".into(),
        destination_root: "/data/dst".into(),
        progress: ShardProgress {
            state: ShardState::Running,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn with_shards(shards: Vec<ShardStatus>) -> CopyJobStatus {
    CopyJobStatus {
        phase: Some(Phase::Running),
        shards,
        ..Default::default()
    }
}

#[test]
fn a_node_local_job_with_a_live_agent_gets_one_shard_on_that_node() {
    let d = decide_with(
        &job(serde_json::json!({})),
        &volumes(false),
        &["node-a"],
        &[],
    );
    assert_eq!(d.status.shards.len(), 1);
    assert_eq!(d.status.shards[0].node, "node-a");
    assert_eq!(d.status.shards[0].epoch, 1);
    assert_eq!(d.status.shards[0].part, Part::All);
    assert_eq!(cond(&d, ConditionType::Accepted).0, "True");
    assert_eq!(cond(&d, ConditionType::Resolved).0, "True");
    assert_eq!(
        cond(&d, ConditionType::Scheduled),
        ("True", "Assigned", "assigned to node node-a (a local copy)")
    );
    assert_eq!(d.status.mode, Some(ferry_crds::CopyMode::Local));
    assert!(d.write && d.assignment_changed);
    assert_eq!(d.requeue, None);
    assert!(d.events.is_empty());
}

fn reach(nodes: &[&str], live: &[&str]) -> crate::resolve::Reachable {
    crate::resolve::Reachable {
        nodes: names(nodes),
        live: names(live),
    }
}

#[test]
fn without_a_node_for_both_volumes_the_job_waits_and_says_which_endpoint_lacks_one() {
    let cases = [
        (
            [reach(&[], &[]), reach(&["node-b"], &["node-b"])],
            "spec.source: no Node has this volume",
        ),
        (
            [reach(&["node-a"], &["node-a"]), reach(&["node-b", "node-c"], &[])],
            "spec.destination: no Ferry agent is running on node-b, node-c (the nodes with this volume)",
        ),
        (
            [reach(&["node-a", "node-c"], &[]), reach(&["node-b"], &["node-b"])],
            "spec.source: no Ferry agent is running on node-a, node-c (the nodes with this volume)",
        ),
        (
            [reach(&["node-z"], &["node-z"]), reach(&["node-b"], &["node-b"])],
            "spec.source is on node-z, spec.destination on node-b, and no node reaches both; a copy between them needs a transfer port on both agents, and the agent on node-z serves none",
        ),
    ];
    for (reachable, says) in cases {
        let job = job(serde_json::json!({}));
        let lost_for = |_: &str| None;
        let endpoints = volumes(false);
        let inputs = |job| Inputs {
            job,
            endpoints: &endpoints,
            eligible: &[],
            reachable: &reachable,
            lost_for: &lost_for,
            node_deadline: DEADLINE,
            transfers: &|n: &str| n != "node-z",
        };
        let d = decide(&inputs(&job));
        let (status, reason, message) = cond(&d, ConditionType::Scheduled);
        assert_eq!((status, reason), ("False", "NoAgent"));
        assert!(message.starts_with(says), "{message}");
        assert!(d.status.shards.iter().all(|s| s.node.is_empty()));
        assert_eq!(d.status.phase, Some(Phase::Pending));
        // Nothing else would bring it back when an agent comes up.
        assert_eq!(d.requeue, Some(Duration::from_secs(2)));
        // Said once as a Warning event, not again while nothing changes.
        let warned: Vec<_> = d
            .events
            .iter()
            .filter(|e| e.reason == "NoAgent" && e.type_ == EventType::Warning)
            .collect();
        assert_eq!(warned.len(), 1, "{message}");
        assert_eq!(warned[0].note.as_deref(), Some(message));
        let mut again = job.clone();
        again.status = Some(d.status.clone());
        let d2 = decide(&inputs(&again));
        assert!(
            d2.events.iter().all(|e| e.reason != "NoAgent"),
            "{message}: warned twice"
        );
    }
}

/// Decide a job whose volumes are on the nodes `reachable` says, none on both.
fn decide_apart(
    job: &CopyJob,
    reachable: &[crate::resolve::Reachable; 2],
    lost: &[(&str, u64)],
) -> Decision {
    decide_in(job, &volumes(false), &[], reachable, lost)
}

#[test]
fn what_a_copy_between_nodes_cannot_do_is_refused_when_the_nodes_are_paired_before_any_shard() {
    let reachable = [
        reach(&["node-a"], &["node-a"]),
        reach(&["node-b"], &["node-b"]),
    ];
    let (spec, field) = (serde_json::json!({"reflink": "Always"}), "spec.reflink");
    let d = decide_apart(&job(spec.clone()), &reachable, &[]);
    let (status, reason, message) = cond(&d, ConditionType::Accepted);
    assert_eq!((status, reason), ("False", "InvalidSpec"), "{message}");
    assert!(message.starts_with(field), "{message}");
    assert!(
        d.status.shards.is_empty(),
        "no shard (so no ticket) for {field}"
    );
    assert_eq!(event_reasons(&d), ["InvalidSpec"]);
    // The same job where one node has both volumes copies.
    let d = decide_in(
        &job(spec),
        &volumes(false),
        &["node-a"],
        &[
            reach(&["node-a"], &["node-a"]),
            reach(&["node-a"], &["node-a"]),
        ],
        &[],
    );
    assert_eq!(cond(&d, ConditionType::Accepted).0, "True");
    assert_eq!(d.status.shards.len(), 1);
}

#[test]
fn raw_block_claims_held_on_two_nodes_are_copied_by_a_pair_of_agents() {
    let reachable = [
        reach(&["node-a"], &["node-a"]),
        reach(&["node-b"], &["node-b"]),
    ];
    let mut endpoints = volumes(false);
    if let Endpoints::Resolved {
        source,
        destination,
    } = &mut endpoints
    {
        source.block = true;
        destination.block = true;
    }
    let spec = serde_json::json!({"overwrite": "IfChanged", "compare": "Checksum"});
    let d = decide_in(&job(spec.clone()), &endpoints, &[], &reachable, &[]);
    assert_eq!(cond(&d, ConditionType::Accepted).0, "True");
    assert_eq!(d.status.shards.len(), 1);
    let s = &d.status.shards[0];
    // The source's holder node serves the device; the destination's runs the shard.
    assert_eq!(
        (s.sender.as_deref(), s.node.as_str()),
        (Some("node-a"), "node-b")
    );
    // What no copy between nodes can do is refused for block claims as for files.
    let always = serde_json::json!({"reflink": "Always"});
    let d = decide_in(&job(always), &endpoints, &[], &reachable, &[]);
    assert_eq!(cond(&d, ConditionType::Accepted).0, "False");
    assert!(d.status.shards.is_empty());
    // On one node, the same claims get a shard with no sender.
    let one = [
        reach(&["node-a"], &["node-a"]),
        reach(&["node-a"], &["node-a"]),
    ];
    let d = decide_in(&job(spec), &endpoints, &["node-a"], &one, &[]);
    assert_eq!(cond(&d, ConditionType::Accepted).0, "True");
    assert_eq!(d.status.shards.len(), 1);
    assert_eq!(d.status.shards[0].sender, None);
}

#[test]
fn volumes_on_two_nodes_are_copied_by_a_pair_of_agents_the_receiver_running_the_shard() {
    let reachable = [
        reach(&["node-a", "node-c"], &["node-c"]),
        reach(&["node-b"], &["node-b"]),
    ];
    let d = decide_apart(&job(serde_json::json!({})), &reachable, &[]);
    assert_eq!(
        d.status.shards.len(),
        1,
        "a copy between nodes is not split"
    );
    let s = &d.status.shards[0];
    // The live node with the source serves it; the destination's node runs the shard.
    assert_eq!(
        (s.sender.as_deref(), s.node.as_str(), s.epoch),
        (Some("node-c"), "node-b", 1)
    );
    assert_eq!(d.status.mode, Some(ferry_crds::CopyMode::Network));
    assert_eq!(
        cond(&d, ConditionType::Scheduled),
        (
            "True",
            "Assigned",
            "copying between nodes: node node-c serves the source to node node-b over the network"
        )
    );
    assert!(d.write && d.assignment_changed);
    // Split jobs too: shared roots mounted on different nodes make one shard.
    let split = job(serde_json::json!({"parallelism": {"maxAgents": 4}}));
    let d = decide_apart(&split, &reachable, &[]);
    assert_eq!(d.status.shards.len(), 1);

    // The sender's agent stops heartbeating: the shard waits for it, then fails naming it,
    // at a new epoch (neither agent can publish or serve the old one).
    let running = after(
        job(serde_json::json!({})),
        with_shards(vec![ShardStatus {
            sender: Some("node-c".into()),
            ..running_on("node-b", 1)
        }]),
    );
    let d = decide_apart(&running, &reachable, &[("node-c", 10)]);
    let (status, reason, message) = cond(&d, ConditionType::Scheduled);
    assert_eq!((status, reason), ("True", "WaitingForNode"), "{message}");
    assert!(message.contains("node-c"), "{message}");
    let d = decide_apart(&running, &reachable, &[("node-c", 400)]);
    let s = &d.status.shards[0];
    assert_eq!((s.progress.state, s.epoch), (ShardState::Failed, 2));
    assert!(
        s.progress.failures[0].message.contains("node node-c"),
        "{:?}",
        s.progress.failures
    );
    assert_eq!(event_reasons(&d), ["NodeUnavailable", "NodeUnavailable"]);
}

#[test]
fn a_dry_run_between_nodes_plans_from_the_sender_to_the_receiver() {
    let reachable = [
        reach(&["node-a"], &["node-a"]),
        reach(&["node-b"], &["node-b"]),
    ];
    let dry = job(serde_json::json!({"dryRun": true}));
    let d = decide_apart(&dry, &reachable, &[]);
    let mut done = d.status.shards.clone();
    done[0].progress.state = ShardState::Succeeded;
    done[0].progress.planned_files = Some(3);
    done[0].progress.planned_bytes = Some(30);
    let d = decide_apart(&after(dry, with_shards(done)), &reachable, &[]);
    let plan = d.status.plan.clone().expect("a plan");
    assert_eq!(plan.nodes, names(&["node-a", "node-b"]));
    assert_eq!(plan.mode, Some(ferry_crds::CopyMode::Network));
    let (_, reason, message) = cond(&d, ConditionType::Complete);
    assert_eq!(reason, "Planned");
    assert!(
        message.contains("from node node-a to node node-b over the network"),
        "{message}"
    );
}

#[test]
fn a_refused_spec_is_not_accepted_and_gets_no_shards() {
    let refusal = Blocked {
        condition: ConditionType::Accepted,
        reason: Reason::RootNotAllowed,
        message: "spec.source.root: namespace \"team-a\" may not use StorageRoot \"src\"".into(),
    };
    let j = job(serde_json::json!({}));
    let d = decide_with(&j, &Endpoints::Blocked(refusal.clone()), &["node-a"], &[]);
    assert_eq!(
        cond(&d, ConditionType::Accepted),
        ("False", "RootNotAllowed", refusal.message.as_str())
    );
    assert!(condition_of(&d, ConditionType::Resolved).is_none());
    assert!(condition_of(&d, ConditionType::Scheduled).is_none());
    assert!(d.status.shards.is_empty());
    assert_eq!(d.status.phase, Some(Phase::Pending));
    assert_eq!(event_reasons(&d), ["RootNotAllowed"]);
    assert_eq!(d.requeue, Some(Duration::from_secs(60)));
    // Said once: the same refusal again publishes nothing new.
    let again = decide_with(&after(j, d.status), &Endpoints::Blocked(refusal), &[], &[]);
    assert!(again.events.is_empty());
    assert!(!again.write);
}

#[test]
fn an_endpoint_that_does_not_resolve_is_accepted_but_not_resolved() {
    let refusal = Blocked {
        condition: ConditionType::Resolved,
        reason: Reason::PVCNotFound,
        message: "spec.source.pvc: no PersistentVolumeClaim \"data\"".into(),
    };
    let d = decide_with(
        &job(serde_json::json!({})),
        &Endpoints::Blocked(refusal.clone()),
        &["node-a"],
        &[],
    );
    assert_eq!(
        cond(&d, ConditionType::Accepted),
        ("True", "Valid", "the spec is valid")
    );
    assert_eq!(
        cond(&d, ConditionType::Resolved),
        ("False", "PVCNotFound", refusal.message.as_str())
    );
    assert!(d.status.shards.is_empty());
    assert_eq!(d.requeue, Some(Duration::from_secs(60)));
}

#[test]
fn a_csi_volume_waiting_for_a_pod_is_looked_at_again_soon() {
    let refusal = Blocked {
        condition: ConditionType::Resolved,
        reason: Reason::VolumeNotMounted,
        message: "start a pod".into(),
    };
    let d = decide_with(
        &job(serde_json::json!({})),
        &Endpoints::Blocked(refusal),
        &[],
        &[],
    );
    assert_eq!(d.requeue, Some(Duration::from_secs(5)));
}

#[test]
fn a_shared_root_job_is_split_into_parts_and_handed_to_at_most_max_agents_nodes() {
    let j = job(serde_json::json!({"parallelism": {"maxAgents": 3}}));
    let d = decide_with(
        &j,
        &volumes(true),
        &["node-a", "node-b", "node-c", "node-d"],
        &[],
    );
    let parts = schedule::parts_for(3) as usize;
    assert_eq!(d.status.shards.len(), parts + 1);
    assert_eq!(
        d.status.shards.last().map(|s| s.part),
        Some(Part::Directories)
    );
    let mut busy: Vec<&str> = d
        .status
        .shards
        .iter()
        .filter(|s| !s.node.is_empty())
        .map(|s| s.node.as_str())
        .collect();
    busy.sort_unstable();
    assert_eq!(busy, ["node-a", "node-b", "node-c"]);
    assert_eq!(
        cond(&d, ConditionType::Scheduled),
        (
            "True",
            "Assigned",
            format!(
                "split into {parts} parts and a directories pass; nodes node-a, node-b, node-c"
            )
            .as_str()
        )
    );
    // The other parts go out as agents finish theirs.
    assert_eq!(d.requeue, Some(Duration::from_secs(2)));
}

#[test]
fn a_dry_run_of_a_splittable_job_reports_the_split_it_would_make() {
    let j = job(serde_json::json!({"parallelism": {"maxAgents": 3}, "dryRun": true}));
    let d = decide_with(
        &j,
        &volumes(true),
        &["node-a", "node-b", "node-c", "node-d"],
        &[],
    );
    // Counted whole on one agent, not split.
    assert_eq!(d.status.shards.len(), 1);
    let shape = (
        i64::from(schedule::parts_for(3)) + 1,
        names(&["node-a", "node-b", "node-c"]),
    );
    assert_eq!(d.shape, Some(shape.clone()));
    assert_eq!(d.status.manifest, None);
    // Once the agent has counted, the plan says what the real run would do.
    let mut counted = d.status.shards[0].clone();
    counted.progress.state = ShardState::Succeeded;
    counted.progress.planned_files = Some(5);
    counted.progress.planned_bytes = Some(50);
    let done = decide_with(
        &after(j, with_shards(vec![counted])),
        &volumes(true),
        &["node-a", "node-b", "node-c", "node-d"],
        &[],
    );
    assert_eq!(done.status.phase, Some(Phase::Succeeded));
    assert_eq!(
        done.status.plan,
        Some(Plan {
            files: 5,
            bytes: 50,
            nodes: shape.1,
            shards: shape.0,
            mode: Some(ferry_crds::CopyMode::Local),
            ..Plan::default()
        })
    );
    assert_eq!(cond(&done, ConditionType::Complete).1, "Planned");
}

#[test]
fn a_lost_agents_shard_on_shared_roots_moves_to_another_node_with_a_new_epoch() {
    let j = after(
        job(serde_json::json!({})),
        with_shards(vec![running_on("node-a", 1)]),
    );
    let d = decide_with(&j, &volumes(true), &["node-b"], &[("node-a", 20)]);
    assert_eq!(d.status.shards[0].node, "node-b");
    assert_eq!(d.status.shards[0].epoch, 2);
    assert_eq!(event_reasons(&d), ["Reassigned"]);
    let note = d.events[0].note.as_deref().unwrap_or_default();
    assert!(note.contains("node node-b resumes it"), "{note}");
    assert!(d.write && d.assignment_changed);
}

#[test]
fn a_lost_agents_shard_on_node_local_volumes_waits_for_the_node_then_fails() {
    let j = after(
        job(serde_json::json!({})),
        with_shards(vec![running_on("node-a", 1)]),
    );
    let waiting = decide_with(&j, &volumes(false), &[], &[("node-a", 100)]);
    assert_eq!(waiting.status.shards[0].node, "node-a");
    assert_eq!(waiting.status.shards[0].progress.state, ShardState::Running);
    let (_, reason, message) = cond(&waiting, ConditionType::Scheduled);
    assert_eq!(reason, "WaitingForNode");
    assert!(message.contains("node-a stopped heartbeating"), "{message}");
    // Looked at again when the deadline is up.
    assert_eq!(
        waiting.requeue,
        Some(Duration::from_secs(200) + Duration::from_millis(100))
    );
    assert!(waiting.events.is_empty());

    let failed = decide_with(&j, &volumes(false), &[], &[("node-a", 300)]);
    let shard = &failed.status.shards[0];
    assert_eq!(shard.progress.state, ShardState::Failed);
    assert_eq!(shard.epoch, 2);
    assert!(shard.failed_by_operator());
    assert_eq!(failed.status.phase, Some(Phase::Failed));
    assert_eq!(cond(&failed, ConditionType::Failed).1, "NodeUnavailable");
    // The shard's event, then the job's.
    assert_eq!(
        event_reasons(&failed),
        ["NodeUnavailable", "NodeUnavailable"]
    );
}

#[test]
fn a_suspended_job_waits_for_a_lost_node_without_a_deadline() {
    let j = after(
        job(serde_json::json!({"suspend": true})),
        with_shards(vec![running_on("node-a", 1)]),
    );
    let d = decide_with(&j, &volumes(false), &[], &[("node-a", 100_000)]);
    assert_eq!(d.status.shards[0].progress.state, ShardState::Running);
    assert_eq!(cond(&d, ConditionType::Scheduled).1, "WaitingForNode");
    assert_eq!(d.status.phase, Some(Phase::Suspended));
    assert_eq!(d.requeue, None);
    assert!(d.events.is_empty());
}

#[test]
fn an_unchanged_decision_keeps_its_transition_times_and_writes_nothing() {
    let j = job(serde_json::json!({}));
    let first = decide_with(&j, &volumes(false), &["node-a"], &[]);
    std::thread::sleep(Duration::from_millis(10));
    let again = decide_with(&after(j, first.status.clone()), &volumes(false), &[], &[]);
    assert_eq!(again.status.conditions, first.status.conditions);
    assert!(!again.write);
    assert!(!again.assignment_changed);
}

#[test]
fn nodes_are_listed_only_when_there_is_something_to_hand_out() {
    let no_one_lost = |_: &str| None;
    let node_a_lost = |n: &str| (n == "node-a").then_some(Duration::from_secs(1));
    let new = job(serde_json::json!({}));
    let placed = after(new.clone(), with_shards(vec![running_on("node-a", 1)]));
    assert!(needs_nodes(&new, &volumes(false), &no_one_lost));
    assert!(!needs_nodes(&placed, &volumes(false), &no_one_lost));
    assert!(needs_nodes(&placed, &volumes(true), &node_a_lost));
    // On node-local volumes a lost agent's shard waits for it: nothing to hand out.
    assert!(!needs_nodes(&placed, &volumes(false), &node_a_lost));
    assert!(!needs_nodes(&new, &Endpoints::Finished, &no_one_lost));
}

fn failed_shard(failures: Vec<FailedPath>) -> ShardStatus {
    ShardStatus {
        progress: ShardProgress {
            state: ShardState::Failed,
            failed: failures.len() as i64,
            files_done: 10,
            failures,
            ..Default::default()
        },
        ..running_on("node-a", 1)
    }
}

fn failure(path: &str, reason: Reason) -> FailedPath {
    FailedPath {
        path: path.into(),
        reason,
        message: format!("{reason} at {path}"),
    }
}

#[test]
fn a_shard_stopped_by_a_full_destination_fails_the_job_with_destination_full() {
    let j = after(
        job(serde_json::json!({})),
        with_shards(vec![failed_shard(vec![
            failure("small.txt", Reason::PermissionDenied),
            failure("big.bin", Reason::DestinationFull),
        ])]),
    );
    let d = decide_with(&j, &volumes(false), &[], &[]);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    let (status, reason, message) = cond(&d, ConditionType::Failed);
    assert_eq!((status, reason), ("True", "DestinationFull"));
    assert!(message.starts_with("big.bin: "), "{message}");
    assert!(d.status.finished_at.is_some());
    assert_eq!(event_reasons(&d), ["DestinationFull"]);
}

#[test]
fn entries_that_failed_without_stopping_the_shard_fail_the_job_as_partially_failed() {
    let j = after(
        job(serde_json::json!({})),
        with_shards(vec![failed_shard(vec![failure(
            "secret",
            Reason::PermissionDenied,
        )])]),
    );
    let d = decide_with(&j, &volumes(false), &[], &[]);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    let (_, reason, message) = cond(&d, ConditionType::Failed);
    assert_eq!(reason, "PartiallyFailed");
    assert!(message.contains("PermissionDenied 1"), "{message}");
    assert_eq!(d.status.failures.len(), 1);
}

#[test]
fn the_manifest_is_named_after_the_job_uid() {
    let d = decide_with(
        &job(serde_json::json!({})),
        &volumes(false),
        &["node-a"],
        &[],
    );
    assert_eq!(
        d.status.manifest.as_deref(),
        Some(".ferry/6f1c2a9e-0d1b-4c55-9a43-2b7d1f0e8c11.xxh128")
    );
}

#[test]
fn a_running_job_that_stops_being_allowed_fails_with_the_reason_and_its_shards_move_epoch() {
    let j = after(
        job(serde_json::json!({})),
        with_shards(vec![running_on("node-a", 1)]),
    );
    let refusal = Blocked {
        condition: ConditionType::Accepted,
        reason: Reason::RootNotAllowed,
        message: "spec.source.root: namespace \"default\" may not use StorageRoot \"data\"".into(),
    };
    let d = decide_with(&j, &Endpoints::Blocked(refusal), &["node-a"], &[]);
    let shard = &d.status.shards[0];
    assert_eq!(shard.progress.state, ShardState::Failed);
    // A new epoch: the agent's run is fenced off, and stops.
    assert_eq!(shard.epoch, 2);
    assert!(shard.failed_by_operator());
    assert_eq!(shard.progress.failures[0].reason, Reason::RootNotAllowed);
    assert_eq!(d.status.phase, Some(Phase::Failed));
    let (_, reason, message) = cond(&d, ConditionType::Failed);
    assert_eq!(reason, "RootNotAllowed");
    assert!(message.contains("may not use StorageRoot"), "{message}");
    assert!(d.write && d.assignment_changed);
}

#[test]
fn a_running_job_waiting_for_a_csi_mount_keeps_its_shards() {
    let j = after(
        job(serde_json::json!({})),
        with_shards(vec![running_on("node-a", 1)]),
    );
    let refusal = Blocked {
        condition: ConditionType::Resolved,
        reason: Reason::VolumeNotMounted,
        message: "start a pod".into(),
    };
    let d = decide_with(&j, &Endpoints::Blocked(refusal), &["node-a"], &[]);
    assert_eq!(d.status.shards[0].progress.state, ShardState::Running);
    assert_eq!(d.status.shards[0].epoch, 1);
}

#[test]
fn a_spec_changed_after_its_shards_were_cut_fails_the_job_and_every_shard_even_a_finished_one() {
    // Cut for the spec as it was: the shards carry its digest.
    let first = job(serde_json::json!({}));
    let d = decide_with(&first, &volumes(false), &["node-a"], &[]);
    let digest = first.spec.digest();
    assert!(d.status.shards.iter().all(|s| s.spec_digest == digest));
    // The job went back to Pending (its volume unmounted) while the shard ran on, and the
    // destination path was changed; then the old shard finished, "verified".
    let mut changed = job(serde_json::json!({"destination": {"root": "dst", "path": "elsewhere"}}));
    changed.metadata.generation = Some(2);
    let mut done = d.status.shards[0].clone();
    done.progress.state = ShardState::Succeeded;
    done.progress.files_done = 40;
    let mut pending = with_shards(vec![done]);
    pending.phase = Some(Phase::Pending);
    let changed = after(changed, pending);
    for endpoints in [
        volumes(false),
        Endpoints::Finished,
        Endpoints::Blocked(Blocked {
            condition: ConditionType::Resolved,
            reason: Reason::VolumeNotMounted,
            message: "no pod mounts it".into(),
        }),
    ] {
        let d = decide_with(&changed, &endpoints, &["node-a"], &[]);
        assert_eq!(d.status.phase, Some(Phase::Failed), "{endpoints:?}");
        assert_eq!(
            cond(&d, ConditionType::Accepted),
            ("False", "SpecChanged", cond(&d, ConditionType::Accepted).2)
        );
        assert_eq!(cond(&d, ConditionType::Failed).1, "SpecChanged");
        let shard = &d.status.shards[0];
        assert_eq!(shard.progress.state, ShardState::Failed);
        assert!(shard.epoch > 1, "a new epoch stops its agent");
        assert!(
            condition_of(&d, ConditionType::Complete).is_none_or(|c| c.status != "True"),
            "never Complete for a spec it did not run"
        );
    }
    // The spec restored: the shards stand again for what they copied.
    let restored = after(first.clone(), changed.status.clone().expect("a status"));
    assert_eq!(spec_changed(&restored), None);
}

#[test]
fn a_shard_whose_agent_cannot_reach_the_export_says_so_in_scheduled_and_keeps_its_shard() {
    let mut shard = running_on("node-a", 1);
    shard.progress.waiting = ferry_crds::Waiting::new(
        Reason::PeerUnreachable,
        &format!("node node-a cannot reach the agent serving the export: 192.0.2.1:7451 (east): connection refused{}", "!".repeat(5000)),
    );
    let j = after(job(serde_json::json!({})), with_shards(vec![shard]));
    let d = decide_with(&j, &volumes(true), &["node-a"], &[]);
    let (status, reason, message) = cond(&d, ConditionType::Scheduled);
    assert_eq!((status, reason), ("True", "PeerUnreachable"));
    assert!(
        message.starts_with(
            "shard 0: node node-a cannot reach the agent serving the export: 192.0.2.1:7451 (east)"
        ),
        "{message}"
    );
    assert!(message.len() < 2200, "bounded: {} bytes", message.len());
    // Waiting is not failing: the shard stays where it runs, at its epoch.
    assert_eq!(
        (d.status.shards[0].node.as_str(), d.status.shards[0].epoch),
        ("node-a", 1)
    );
    assert_eq!(d.status.phase, Some(Phase::Running));
    // Looked at again soon: the export's Secret may be carried again with a new address.
    assert_eq!(d.requeue, Some(Duration::from_secs(5)));

    // Once it goes on (its next progress update clears waiting), so does the condition.
    let j = after(
        job(serde_json::json!({})),
        with_shards(vec![running_on("node-a", 1)]),
    );
    let d = decide_with(&j, &volumes(true), &["node-a"], &[]);
    assert_eq!(cond(&d, ConditionType::Scheduled).1, "Assigned");
}
