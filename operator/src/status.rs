//! What the status says, as pure functions of the shards and the previous conditions: the
//! phase, progress and failures the shards add up to (`aggregate`), why a failed job failed
//! (`failed_reason`), one condition that keeps its transition time while unchanged
//! (`condition`), the whole status they make (`summarize`), the human columns (rate,
//! ETA), and the condition that tells a job's story (`story`).

use ferry_crds::{
    CheckCounts, ConditionType, CopyJob, CopyJobStatus, CopyMode, FailedPath, ManifestName,
    Overwrite, Part, Phase, Plan, Progress, Reason, ShardState, ShardStatus, Verify,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// The job's condition that explains where it is, as `reason: message`: its Failed
/// condition, else the first one that is False ("" when all are fine). What the populator
/// and claim migrations say of the CopyJobs they run.
pub fn story(job: &CopyJob) -> String {
    let conditions = job.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    failed_condition(conditions)
        .or_else(|| conditions.iter().find(|c| c.status == "False"))
        .map_or_else(String::new, |c| format!("{}: {}", c.reason, c.message))
}

/// The True Failed condition among `conditions`, if the job failed.
pub fn failed_condition(conditions: &[Condition]) -> Option<&Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Failed.as_str() && c.status == "True")
}

/// One condition; its `lastTransitionTime` is kept from `previous` while its type, status
/// and reason stay the same.
pub fn condition(
    type_: ConditionType,
    ok: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
) -> Condition {
    condition_of(
        type_.as_str(),
        ok,
        reason.as_str(),
        message,
        generation,
        previous,
    )
}

/// [`condition`] for the resources whose condition types and reasons are their own
/// (a FerryPeer's `Valid`).
pub fn condition_of(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time when nothing changed, so a re-reconcile writes the same bytes.
    let last = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status && c.reason == reason)
        .map_or_else(
            || Time(Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
    Condition {
        type_: type_.to_string(),
        status: status.into(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: last,
    }
}

/// 1536 -> "1.5 KiB": for the RATE column (negative counts as 0).
pub fn human_bytes(n: i64) -> String {
    ferry_crds::human_bytes(u64::try_from(n).unwrap_or(0))
}

/// 200 -> "3m20s": for the ETA column.
pub fn human_duration(secs: i64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The phase, progress and failures the shards add up to.
pub fn aggregate(shards: &[ShardStatus]) -> (Phase, Progress, Vec<FailedPath>) {
    let mut p = Progress::default();
    let mut failures = Vec::new();
    for s in shards {
        p.files_done += s.progress.files_done;
        p.skipped += s.progress.skipped;
        p.deleted += s.progress.deleted.max(0);
        p.unlisted += s.progress.unlisted.max(0);
        p.patched += s.progress.patched.max(0);
        p.bytes_done += s.progress.bytes_done;
        p.bytes_reflinked += s.progress.bytes_reflinked;
        p.bytes_per_second += s.progress.bytes_per_second;
        failures.extend(s.progress.failures.iter().cloned());
    }
    if p.bytes_per_second > 0 {
        p.rate = Some(format!("{}/s", human_bytes(p.bytes_per_second)));
    }
    // Totals once every copying shard has counted its part (the directories pass copies
    // no files); then the PROGRESS and ETA columns.
    let counted: Vec<&ShardStatus> = shards
        .iter()
        .filter(|s| s.part != Part::Directories)
        .collect();
    if !counted.is_empty() && counted.iter().all(|s| s.progress.planned_files.is_some()) {
        let files: i64 = counted
            .iter()
            .filter_map(|s| s.progress.planned_files)
            .sum();
        let bytes: i64 = counted
            .iter()
            .filter_map(|s| s.progress.planned_bytes)
            .sum();
        p.files_total = Some(files);
        p.bytes_total = Some(bytes);
        if bytes > 0 {
            let pct = (p.bytes_done as f64 * 100.0 / bytes as f64).min(100.0);
            p.percent = Some(format!("{pct:.0}%"));
        } else if files > 0 {
            let pct = (p.files_done as f64 * 100.0 / files as f64).min(100.0);
            p.percent = Some(format!("{pct:.0}%"));
        }
        if p.bytes_per_second > 0 && bytes > p.bytes_done {
            p.eta = Some(human_duration(
                (bytes - p.bytes_done) / p.bytes_per_second + 1,
            ));
        }
    }
    p.bytes_copied = p.bytes_done - p.bytes_reflinked;
    failures.truncate(20);
    // Agents wrote them (status is no trusted channel): bounded again before they are
    // copied into the job's own list.
    for f in &mut failures {
        *f = FailedPath::new(&f.path, f.reason, &f.message);
    }
    let done = |s: &&ShardStatus| s.progress.state.finished();
    let phase = if shards.is_empty() {
        Phase::Pending
    } else if shards
        .iter()
        .all(|s| s.progress.state == ShardState::Succeeded)
    {
        p.percent = Some("100%".into());
        p.eta = None;
        Phase::Succeeded
    } else if shards.iter().all(|s| done(&s)) {
        Phase::Failed
    } else if shards
        .iter()
        .any(|s| s.progress.state == ShardState::Running || done(&s))
    {
        Phase::Running
    } else {
        Phase::Pending
    };
    (phase, p, failures)
}

/// Why a failed job failed, and a message that says what to do: what stopped a shard (a
/// full destination, a lost node, a refused path), else `IOError` when the volume returned
/// read or write errors, else `PartiallyFailed`: some entries failed, the rest was copied.
fn failed_reason(shards: &[ShardStatus], failures: &[FailedPath]) -> (Reason, String) {
    let failed: i64 = shards.iter().map(|s| s.progress.failed).sum::<i64>().max(1);
    let files: i64 = shards.iter().map(|s| s.progress.files_done).sum();
    let first = |reason: Reason| failures.iter().find(|f| f.reason == reason);
    for reason in Reason::STOPS_SHARD {
        if let Some(f) = first(reason) {
            let at = if f.is_whole_shard() {
                String::new()
            } else {
                format!("{}: ", f.path)
            };
            return (reason, format!("{at}{}", f.message));
        }
    }
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for f in failures {
        *counts.entry(f.reason.as_str()).or_default() += 1;
    }
    let kinds = counts
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let paths = failures
        .iter()
        .take(3)
        .map(|f| f.path.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let reason = if first(Reason::IOError).is_some() {
        Reason::IOError
    } else {
        Reason::PartiallyFailed
    };
    let what = if reason == Reason::IOError {
        "the volume returned I/O errors (each file was read and written twice); check the device"
    } else {
        "fix them and re-create the job to copy the rest (what was copied is kept)"
    };
    (
        reason,
        format!(
            "{failed} entries failed ({kinds}), e.g. {paths}; {files} files were copied. \
             {what}; the failing paths are in status.failures"
        ),
    )
}

/// What a finished job did, for its Complete condition: what was copied (and checked), and
/// what was left as the destination had it, which this job neither copied nor verified.
fn copied_message(p: &Progress, verify: Verify, overwrite: Overwrite) -> String {
    let checked = match verify {
        Verify::None => "",
        Verify::Checksum | Verify::Full => ", each verified by checksum",
    };
    let mut msg = format!(
        "{} files ({}) copied{checked}",
        p.files_done,
        human_bytes(p.bytes_done)
    );
    if p.patched > 0 {
        msg.push_str(&format!(
            " ({} of them mended from the destination's copy: only their changed chunks were sent)",
            p.patched
        ));
    }
    if p.skipped > 0 {
        msg.push_str(&format!(
            "; {} entries the destination already had were kept as they were (overwrite: {}), not copied or verified",
            p.skipped,
            overwrite.as_str()
        ));
    }
    if p.deleted > 0 {
        msg.push_str(&format!(
            "; {} entries the source does not have were removed from the destination (deleteExtraneous)",
            p.deleted
        ));
    }
    if p.unlisted > 0 {
        msg.push_str(&format!(
            "; the manifest does not list {} of the kept files: no record says Ferry wrote them as they are (compare: Checksum reads and lists them)",
            p.unlisted
        ));
    }
    msg
}

/// A check's counts over its shards (one shard, unless a status says otherwise).
pub fn check_counts(shards: &[ShardStatus]) -> Option<CheckCounts> {
    shards
        .iter()
        .filter_map(|s| s.progress.check)
        .reduce(|a, b| CheckCounts {
            listed: a.listed.saturating_add(b.listed),
            matched: a.matched.saturating_add(b.matched),
            changed: a.changed.saturating_add(b.changed),
            missing: a.missing.saturating_add(b.missing),
            not_regular: a.not_regular.saturating_add(b.not_regular),
            unreadable: a.unreadable.saturating_add(b.unreadable),
        })
}

/// A check that ran to its end and found files that do not match (rather than one that
/// could not be made: no manifest, not one Ferry writes).
fn differs(job: &CopyJob, shards: &[ShardStatus]) -> bool {
    job.spec.check.is_some()
        && check_counts(shards).is_some_and(|c| c.matched < c.listed)
        && !shards
            .iter()
            .any(|s| s.progress.failures.iter().any(FailedPath::is_whole_shard))
}

/// What a finished check found, for its Complete (Verified) or Failed (Differs) condition.
fn checked_message(job: &CopyJob, shards: &[ShardStatus]) -> String {
    let c = check_counts(shards).unwrap_or_default();
    let manifest = job
        .spec
        .check
        .as_ref()
        .map(|c| c.manifest.as_str())
        .unwrap_or_default();
    let bytes: i64 = shards.iter().map(|s| s.progress.bytes_done).sum();
    if c.matched >= c.listed {
        return format!(
            "all {} files {manifest} lists match it ({}), each read and hashed on the destination",
            c.matched,
            human_bytes(bytes)
        );
    }
    let kinds = [
        (c.changed, "changed (ChecksumMismatch)"),
        (c.missing, "missing (NotFound)"),
        (
            c.not_regular,
            "not regular files or behind a symlink (DestinationConflict)",
        ),
        (c.unreadable, "unreadable"),
    ];
    let kinds = kinds
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect::<Vec<_>>()
        .join(", ");
    let paths = shards
        .iter()
        .flat_map(|s| &s.progress.failures)
        .take(3)
        .map(|f| f.path.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{} of the {} files {manifest} lists do not match the destination: {kinds}; e.g. {paths} (status.failures names the first 20). Copy again (overwrite: IfChanged, compare: Checksum rewrites only what differs), then check again",
        c.listed.saturating_sub(c.matched),
        c.listed
    )
}

/// How the shards move data: Network when one is served by another node's agent, Local
/// once one is assigned, else not decided yet.
pub fn mode_of(shards: &[ShardStatus]) -> Option<CopyMode> {
    if shards.iter().any(ShardStatus::between_nodes) {
        Some(CopyMode::Network)
    } else if shards.iter().any(|s| !s.node.is_empty()) {
        Some(CopyMode::Local)
    } else {
        None
    }
}

/// The status `shards` and the decided `conditions` add up to for `job`: its phase
/// (Pending while `refused`, Suspended while suspended), progress and failures, the
/// Complete or Failed condition, a finished dry run's plan (`shape`: the split it would
/// make, when it would be split), when it finished, and where its manifest is.
pub fn summarize(
    job: &CopyJob,
    refused: bool,
    shards: Vec<ShardStatus>,
    mut conditions: Vec<Condition>,
    shape: Option<(i64, Vec<String>)>,
) -> CopyJobStatus {
    let generation = job.metadata.generation;
    // Borrowed, not cloned: a status holds up to 65 shards with their failures.
    let unset = CopyJobStatus::default();
    let old = job.status.as_ref().unwrap_or(&unset);
    let previous = old.conditions.as_slice();
    let (phase, progress, failures) = aggregate(&shards);
    let phase = match (refused, job.spec.suspend) {
        (true, _) => Phase::Pending,
        (false, true) if !matches!(phase, Phase::Succeeded | Phase::Failed) => Phase::Suspended,
        _ => phase,
    };
    // A dry run's result is its plan: what each shard counted, where it would run.
    let plan = (job.spec.dry_run && phase == Phase::Succeeded).then(|| {
        let (count, nodes) = shape
            .or_else(|| old.plan.as_ref().map(|p| (p.shards, p.nodes.clone())))
            .unwrap_or_else(|| {
                // A copy between nodes: from the sender, to the receiver.
                let nodes = shards
                    .iter()
                    .flat_map(|s| s.sender.iter().chain([&s.node]).cloned())
                    .filter(|n| !n.is_empty())
                    .collect();
                (shards.len() as i64, nodes)
            });
        Plan {
            files: shards.iter().filter_map(|s| s.progress.planned_files).sum(),
            bytes: shards.iter().filter_map(|s| s.progress.planned_bytes).sum(),
            nodes,
            shards: count,
            mode: None,
            deletions: shards
                .iter()
                .filter_map(|s| s.progress.planned_deletions)
                .map(|n| n.max(0))
                .sum(),
            // Agents wrote them: bounded again, in number and length.
            to_delete: shards
                .iter()
                .flat_map(|s| &s.progress.to_delete)
                .take(20)
                .map(|p| ferry_crds::shorten(p, FailedPath::ENTRY_BYTES))
                .collect(),
        }
    });
    let mode = mode_of(&shards).or(old.mode);
    let plan = plan.map(|p| Plan { mode, ..p });
    match phase {
        Phase::Succeeded if job.spec.dry_run => {
            let p = plan.clone().unwrap_or_default();
            let where_ = match (mode, p.nodes.as_slice()) {
                (Some(CopyMode::Network), [from, to]) => {
                    format!("from node {from} to node {to} over the network")
                }
                _ => format!("on {}", p.nodes.join(", ")),
            };
            let mut msg = format!(
                "dry run: {} files, {} bytes would be copied {where_}",
                p.files, p.bytes,
            );
            if job.spec.delete_extraneous {
                msg.push_str(&format!(
                    "; {} entries would be removed from the destination (status.plan.toDelete names the first)",
                    p.deletions
                ));
            }
            conditions.push(condition(
                ConditionType::Complete,
                true,
                Reason::Planned,
                &msg,
                generation,
                previous,
            ))
        }
        Phase::Succeeded if job.spec.check.is_some() => conditions.push(condition(
            ConditionType::Complete,
            true,
            Reason::Verified,
            &checked_message(job, &shards),
            generation,
            previous,
        )),
        Phase::Failed if differs(job, &shards) => conditions.push(condition(
            ConditionType::Failed,
            true,
            Reason::Differs,
            &checked_message(job, &shards),
            generation,
            previous,
        )),
        Phase::Succeeded => conditions.push(condition(
            ConditionType::Complete,
            true,
            Reason::Copied,
            &copied_message(&progress, job.spec.verify, job.spec.overwrite),
            generation,
            previous,
        )),
        Phase::Failed => {
            let (reason, msg) = failed_reason(&shards, &failures);
            conditions.push(condition(
                ConditionType::Failed,
                true,
                reason,
                &msg,
                generation,
                previous,
            ));
        }
        _ => {}
    }
    let finished_at = match phase {
        Phase::Succeeded | Phase::Failed => old
            .finished_at
            .clone()
            .or_else(|| Some(Time(Timestamp::now()))),
        _ => None,
    };
    // A copy between raw block claims leaves no files on the device: its chunk manifest
    // stays with the agent (shard/block.rs), so none is named here.
    let kubelet = ferry_resolve::volume::kubelet_dir();
    let block = shards
        .iter()
        .any(|s| ferry_resolve::block::holder_of_fd_dir(&s.destination_root, &kubelet).is_some());
    let manifest = (!shards.is_empty() && !job.spec.dry_run && job.spec.check.is_none() && !block)
        .then(|| ManifestName::new(&job.uid().unwrap_or_default()).status_path());
    CopyJobStatus {
        phase: Some(phase),
        mode,
        conditions,
        progress: Some(progress),
        shards,
        failures,
        manifest,
        plan,
        finished_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(state: ShardState, files: i64) -> ShardStatus {
        ShardStatus {
            id: files.to_string(),
            progress: ferry_crds::ShardProgress {
                state,
                files_done: files,
                bytes_done: files * 10,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_finished_job_says_what_it_kept_apart_from_what_it_copied_and_checked() {
        let mut p = Progress {
            files_done: 3,
            bytes_done: 3 << 20,
            ..Default::default()
        };
        let msg = copied_message(&p, Verify::Checksum, Overwrite::IfChanged);
        assert_eq!(msg, "3 files (3.0 MiB) copied, each verified by checksum");
        p.skipped = 2;
        let msg = copied_message(&p, Verify::None, Overwrite::IfChanged);
        assert!(
            msg.starts_with("3 files (3.0 MiB) copied; 2 entries")
                && msg.contains("(overwrite: IfChanged), not copied or verified"),
            "{msg}"
        );
        assert!(!msg.contains("manifest"), "{msg}");
        p.unlisted = 1;
        let msg = copied_message(&p, Verify::Checksum, Overwrite::IfChanged);
        assert!(
            msg.ends_with("the manifest does not list 1 of the kept files: no record says Ferry wrote them as they are (compare: Checksum reads and lists them)"),
            "{msg}"
        );
    }

    #[test]
    fn phase_is_the_sum_of_the_shards() {
        assert_eq!(aggregate(&[]).0, Phase::Pending);
        assert_eq!(
            aggregate(&[shard(ShardState::Pending, 0)]).0,
            Phase::Pending
        );
        assert_eq!(
            aggregate(&[shard(ShardState::Running, 1), shard(ShardState::Pending, 0)]).0,
            Phase::Running
        );
        assert_eq!(
            aggregate(&[shard(ShardState::Failed, 1), shard(ShardState::Running, 2)]).0,
            Phase::Running
        );
        assert_eq!(
            aggregate(&[
                shard(ShardState::Failed, 1),
                shard(ShardState::Succeeded, 2)
            ])
            .0,
            Phase::Failed
        );
        let (phase, progress, _) = aggregate(&[
            shard(ShardState::Succeeded, 3),
            shard(ShardState::Succeeded, 4),
        ]);
        assert_eq!(phase, Phase::Succeeded);
        assert_eq!((progress.files_done, progress.bytes_done), (7, 70));
        assert_eq!(progress.percent.as_deref(), Some("100%"));
    }

    #[test]
    fn totals_percent_and_eta_appear_once_every_part_is_counted() {
        let mut a = shard(ShardState::Running, 1);
        a.progress.bytes_done = 50;
        a.progress.bytes_per_second = 10;
        a.progress.planned_files = Some(4);
        a.progress.planned_bytes = Some(100);
        let mut b = shard(ShardState::Running, 0);
        b.progress.bytes_done = 0;
        let dirs = ShardStatus {
            part: Part::Directories,
            ..Default::default()
        };
        // b has not counted its part yet: no totals, no guess.
        let (_, p, _) = aggregate(&[a.clone(), b.clone(), dirs.clone()]);
        assert_eq!(
            (p.bytes_total, p.percent.as_deref(), p.eta.as_deref()),
            (None, None, None)
        );
        b.progress.planned_files = Some(6);
        b.progress.planned_bytes = Some(100);
        let (phase, p, _) = aggregate(&[a, b, dirs]);
        assert_eq!(phase, Phase::Running);
        assert_eq!((p.files_total, p.bytes_total), (Some(10), Some(200)));
        assert_eq!(p.percent.as_deref(), Some("25%"));
        // 150 bytes left at 10 B/s.
        assert_eq!(p.eta.as_deref(), Some("16s"));
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(7300), "2h01m");
    }

    #[test]
    fn unchanged_condition_keeps_its_transition_time() {
        let first = condition(
            ConditionType::Accepted,
            true,
            Reason::Valid,
            "ok",
            Some(1),
            &[],
        );
        let again = condition(
            ConditionType::Accepted,
            true,
            Reason::Valid,
            "ok",
            Some(2),
            std::slice::from_ref(&first),
        );
        assert_eq!(first.last_transition_time, again.last_transition_time);
    }

    #[test]
    fn a_check_says_verified_when_all_match_and_differs_with_the_counts_when_not() {
        let job: CopyJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob",
            "metadata": {"name": "v", "namespace": "team", "uid": "u1", "generation": 1},
            "spec": {"destination": {"pvc": "b"},
                     "check": {"manifest": ".ferry/0b6a2f0c-3d1e-4c55-9f3a-2b7d6e8c9a10.xxh128"}},
        }))
        .expect("job");
        let of = |status: &CopyJobStatus, t: ConditionType| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == t.as_str())
                .map(|c| (c.reason.clone(), c.message.clone()))
        };
        let mut done = shard(ShardState::Succeeded, 3);
        done.progress.check = Some(CheckCounts {
            listed: 3,
            matched: 3,
            ..Default::default()
        });
        let status = summarize(&job, false, vec![done.clone()], vec![], None);
        let (reason, msg) = of(&status, ConditionType::Complete).expect("complete");
        assert_eq!(reason, "Verified");
        assert!(msg.starts_with("all 3 files .ferry/0b6a2f0c"), "{msg}");
        assert_eq!(status.manifest, None, "a check writes no manifest");

        let mut found = done.clone();
        found.progress.state = ShardState::Failed;
        found.progress.check = Some(CheckCounts {
            listed: 3,
            matched: 1,
            changed: 1,
            missing: 1,
            ..Default::default()
        });
        found.progress.failures = vec![FailedPath {
            path: "a/b".into(),
            reason: Reason::ChecksumMismatch,
            message: "changed".into(),
        }];
        let status = summarize(&job, false, vec![found.clone()], vec![], None);
        let (reason, msg) = of(&status, ConditionType::Failed).expect("failed");
        assert_eq!(reason, "Differs");
        assert!(
            msg.starts_with("2 of the 3 files")
                && msg.contains("1 changed (ChecksumMismatch), 1 missing (NotFound); e.g. a/b"),
            "{msg}"
        );

        // A check that could not be made is not a difference: its own reason stands.
        found.progress.failures = vec![FailedPath {
            path: ".".into(),
            reason: Reason::CannotStart,
            message: "no manifest".into(),
        }];
        let status = summarize(&job, false, vec![found], vec![], None);
        let (reason, _) = of(&status, ConditionType::Failed).expect("failed");
        assert_eq!(reason, "CannotStart");
    }
}
