//! Spec validation in the controller. The CRD's CEL rules refuse most bad specs at
//! admission; this repeats them (a CRD installed without its rules, or an older version,
//! must not open a hole) and adds what CEL cannot express. Each refusal has a stable
//! reason for the `Accepted=False` condition and a message that says what to change.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, OnceLock};

use ferry_crds::{CopyJobSpec, CopyMethod, Endpoint, Reason, MAX_WORKERS, STATE_DIR};

/// A refused spec: the condition reason (PathEscape: a path is absolute, climbs out with
/// `..`, holds a NUL byte or reaches Ferry's state directory; InvalidEndpoint: not exactly one of root, pvc and snapshot (a snapshot, or copyMethod, on a destination);
/// InvalidSpec: a field is out of its range) and a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
}

fn refuse(reason: Reason, message: String) -> Result<(), Refusal> {
    Err(Refusal { reason, message })
}

/// Check a relative path: the components a tenant may name inside a root or volume.
pub fn check_relative_path(field: &str, path: &str) -> Result<(), Refusal> {
    if path.contains('\0') {
        return refuse(
            Reason::PathEscape,
            format!("{field} contains a NUL byte; remove it"),
        );
    }
    if path.starts_with('/') {
        return refuse(
            Reason::PathEscape,
            format!("{field} {path:?} is absolute; give a path relative to the root or volume"),
        );
    }
    if path.split('/').any(|c| c == "..") {
        return refuse(
            Reason::PathEscape,
            format!(
                "{field} {path:?} has a '..' component; paths cannot leave their root or volume"
            ),
        );
    }
    Ok(())
}

fn check_endpoint(field: &str, e: &Endpoint, source: bool) -> Result<(), Refusal> {
    let named: Vec<(&str, &str)> = [
        ("root", &e.root),
        ("pvc", &e.pvc),
        ("snapshot", &e.snapshot),
        ("export", &e.export),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
    .collect();
    let invalid = |message: String| refuse(Reason::InvalidEndpoint, message);
    match named.as_slice() {
        [] if source => invalid(format!("{field} sets none of root, pvc, snapshot and export; name a StorageRoot, a PersistentVolumeClaim, a VolumeSnapshot or an export's Secret")),
        [] => invalid(format!("{field} sets neither root nor pvc; name a StorageRoot or a PersistentVolumeClaim")),
        [(kind, "")] => invalid(format!("{field} names an empty {kind}")),
        [_] => Ok(()),
        [(a, _), (b, _), ..] => invalid(format!("{field} sets both {a} and {b}; keep one")),
    }?;
    let snapshot_method = e.copy_method == Some(CopyMethod::Snapshot);
    if !source && e.export.is_some() {
        return invalid(format!(
            "{field} cannot be an export: an export is read from another cluster; copy into a root or claim of this one"
        ));
    }
    if !source && (e.snapshot.is_some() || e.copy_method.is_some()) {
        return invalid(format!(
            "{field} is a root or a pvc: snapshot and copyMethod are for the source"
        ));
    }
    if snapshot_method && e.pvc.is_none() {
        return invalid(format!(
            "{field}.copyMethod Snapshot snapshots a claim: it needs {field}.pvc"
        ));
    }
    if e.volume_snapshot_class_name.is_some() && !snapshot_method {
        return invalid(format!(
            "{field}.volumeSnapshotClassName is for copyMethod Snapshot; set that or remove it"
        ));
    }
    check_relative_path(&format!("{field}.path"), &e.path)?;
    if ferry_crds::in_state_dir(&e.path) {
        return refuse(
            Reason::PathEscape,
            format!(
                "{field}.path {:?} is in {STATE_DIR}, the directory where Ferry keeps its state at the top of every root and volume; choose another path",
                e.path
            ),
        );
    }
    Ok(())
}

/// Validate a CopyJob spec; `Ok(())` when it may be scheduled.
pub fn validate(spec: &CopyJobSpec) -> Result<(), Refusal> {
    if let Some(check) = &spec.check {
        return validate_check(spec, check);
    }
    if spec.source.is_unset() {
        return refuse(
            Reason::InvalidEndpoint,
            "spec.source is not set: name what to copy (a root, pvc, snapshot or export), or set spec.check to check the destination against a manifest".into(),
        );
    }
    check_endpoint("spec.source", &spec.source, true)?;
    check_endpoint("spec.destination", &spec.destination, false)?;
    check_parallelism(spec)?;
    check_copy(spec)
}

/// A check job (`spec.check`): a destination and a manifest, and nothing a copy needs.
fn validate_check(spec: &CopyJobSpec, check: &ferry_crds::Check) -> Result<(), Refusal> {
    if !spec.source.is_unset() {
        return refuse(
            Reason::InvalidSpec,
            "spec.check copies nothing, so it has no source: remove spec.source (or spec.check, to copy)".into(),
        );
    }
    check_endpoint("spec.destination", &spec.destination, false)?;
    if check.file_name().is_none() {
        return refuse(
            Reason::InvalidSpec,
            format!(
                "spec.check.manifest {:?} is not a job's status.manifest: give .ferry/<job uid>.xxh128",
                ferry_crds::shorten(&check.manifest, 80)
            ),
        );
    }
    check_parallelism(spec)?;
    if spec.parallelism.max_agents != 1 {
        return refuse(
            Reason::InvalidSpec,
            "spec.parallelism.maxAgents: one agent checks a destination; remove it (workersPerAgent sets how many files are read at once)".into(),
        );
    }
    // Every field of a copy, at its default: anything else would be ignored, so it is
    // refused instead.
    let copying: [(&str, bool); 11] = [
        ("reflink", spec.reflink != Default::default()),
        ("verify", spec.verify != Default::default()),
        ("overwrite", spec.overwrite != Default::default()),
        ("compare", spec.compare != Default::default()),
        ("preserve", spec.preserve != Default::default()),
        ("include", !spec.include.is_empty()),
        ("exclude", !spec.exclude.is_empty()),
        ("deleteExtraneous", spec.delete_extraneous),
        ("deleteExcluded", spec.delete_excluded),
        ("dryRun", spec.dry_run),
        ("transfer", spec.transfer != Default::default()),
    ];
    let set: Vec<&str> = copying
        .iter()
        .filter(|(_, s)| *s)
        .map(|(f, _)| *f)
        .collect();
    if !set.is_empty() {
        return refuse(
            Reason::InvalidSpec,
            format!(
                "spec.check reads the destination against its manifest and copies nothing: remove spec.{} (they are for a copy)",
                set.join(", spec.")
            ),
        );
    }
    Ok(())
}

/// Workers, agents and the ttl, as every job has them.
fn check_parallelism(spec: &CopyJobSpec) -> Result<(), Refusal> {
    let p = &spec.parallelism;
    if !(0..=MAX_WORKERS).contains(&p.workers_per_agent) {
        return refuse(
            Reason::InvalidSpec,
            format!("spec.parallelism.workersPerAgent must be between 0 and {MAX_WORKERS}"),
        );
    }
    if !(1..=64).contains(&p.max_agents) {
        return refuse(
            Reason::InvalidSpec,
            "spec.parallelism.maxAgents must be between 1 and 64".into(),
        );
    }
    if spec.ttl_seconds_after_finished.is_some_and(|t| t < 0) {
        return refuse(
            Reason::InvalidSpec,
            "spec.ttlSecondsAfterFinished cannot be negative".into(),
        );
    }
    Ok(())
}

/// The copy's own fields: compare, the mirror, patterns, the bandwidth limit.
fn check_copy(spec: &CopyJobSpec) -> Result<(), Refusal> {
    if spec.compare == ferry_crds::Compare::Checksum
        && spec.overwrite != ferry_crds::Overwrite::IfChanged
    {
        return refuse(
            Reason::InvalidSpec,
            format!("spec.compare: Checksum decides what overwrite IfChanged replaces, and overwrite is {}: set spec.overwrite: IfChanged, or remove compare", spec.overwrite.as_str()),
        );
    }
    if spec.delete_excluded && !spec.delete_extraneous {
        return refuse(
            Reason::InvalidSpec,
            "spec.deleteExcluded removes excluded entries as part of a mirror: set spec.deleteExtraneous: true as well, or remove deleteExcluded".into(),
        );
    }
    // Patterns only ever match names the walk meets beneath the source path (they open
    // nothing), so a leading `/` anchors and is fine; what does not compile, or would not
    // mean what it says in gitignore syntax, is refused with the pattern and the fix.
    if let Err(e) = ferry_crds::Filter::new(&spec.include, &spec.exclude) {
        return refuse(Reason::InvalidSpec, format!("spec.{e}"));
    }
    if let Some(q) = &spec.transfer.bandwidth_limit {
        match ferry_crds::parse_rate(q) {
            Ok(r) if r >= MIN_BANDWIDTH => {}
            Ok(_) => {
                return refuse(
                    Reason::InvalidSpec,
                    format!("spec.transfer.bandwidthLimit {q:?} is below 1Mi (1 MiB/s); give at least 1Mi, or remove it for no limit"),
                )
            }
            Err(e) => return refuse(Reason::InvalidSpec, format!("spec.transfer.bandwidthLimit: {e}")),
        }
    }
    Ok(())
}

/// What a copy between nodes (no node has both volumes: one node's agent serves the source
/// to another's over the network) cannot do yet. The operator applies it when it pairs the
/// nodes, so such a job is refused `InvalidSpec` before any shard or ticket exists; the
/// agent and the engine keep it as a guard.
pub fn between_nodes(spec: &CopyJobSpec) -> Result<(), Refusal> {
    if spec.reflink == ferry_crds::Reflink::Always {
        return refuse(
            Reason::InvalidSpec,
            "spec.reflink: Always cannot be met between nodes (no node has both the source and the destination, and no blocks are shared across nodes); use Auto or Never".into(),
        );
    }
    Ok(())
}

/// Results computed from a stored object's spec, remembered by the object's uid and
/// generation (a spec does not change without its generation). A reconcile runs on every
/// status update, and compiling a job's patterns each time would cost the operator up to
/// ~80 ms of CPU a reconcile for a job at the pattern bounds; a cron expression that
/// never comes due costs ~100 ms to search. At most [`MEMO_ENTRIES`] are kept; past that
/// the memo starts over (it is a cache, never a record).
#[derive(Debug)]
pub struct Memo<V> {
    known: Mutex<Option<HashMap<MemoKey, V>>>,
    /// Keys of the spec's hash: random a process, so a tenant cannot aim at a collision.
    keys: OnceLock<RandomState>,
}

/// An object's uid and generation, and its spec's hash.
type MemoKey = (String, i64, u64);

/// At most this many results are remembered by a [`Memo`] (a refusal's message is at
/// most a few hundred bytes: well under a MiB in all).
pub const MEMO_ENTRIES: usize = 4096;

impl<V: Clone> Memo<V> {
    pub const fn new() -> Self {
        Self {
            known: Mutex::new(None),
            keys: OnceLock::new(),
        }
    }

    /// `compute()`'s result for `spec` of the object `uid` at `generation`, computed once;
    /// computed every time for an object not stored yet (no uid or generation). The spec's
    /// hash is part of the key too, so an object changed in memory without a new
    /// generation (a test's fixture) is not answered for its old spec.
    pub fn get<S: serde::Serialize>(
        &self,
        uid: Option<&str>,
        generation: Option<i64>,
        spec: &S,
        compute: impl FnOnce() -> V,
    ) -> V {
        let (Some(uid), Some(generation), Ok(text)) = (uid, generation, serde_json::to_vec(spec))
        else {
            return compute();
        };
        let hash = self.keys.get_or_init(RandomState::new).hash_one(&text);
        let key = (uid.to_string(), generation, hash);
        let lock = || self.known.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = lock().as_ref().and_then(|m| m.get(&key)) {
            return known.clone();
        }
        // Computed outside the lock: another object's validation does not wait for this.
        let value = compute();
        let mut known = lock();
        let known = known.get_or_insert_with(Default::default);
        if known.len() >= MEMO_ENTRIES {
            known.clear();
        }
        known.insert(key, value.clone());
        value
    }
}

impl<V: Clone> Default for Memo<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// [`validate`] of a stored object's spec (a CopyJob's, or a CopySchedule's template),
/// through a [`Memo`].
pub fn validate_memo(
    uid: Option<&str>,
    generation: Option<i64>,
    spec: &CopyJobSpec,
) -> Result<(), Refusal> {
    static MEMO: Memo<Result<(), Refusal>> = Memo::new();
    MEMO.get(uid, generation, spec, || validate(spec))
}

/// The least `spec.transfer.bandwidthLimit` taken (bytes a second), as the CRD's rule says.
pub const MIN_BANDWIDTH: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_crds::{Parallelism, Preserve};

    fn spec(src: Endpoint, dst: Endpoint) -> CopyJobSpec {
        CopyJobSpec {
            source: src,
            destination: dst,
            reflink: Default::default(),
            verify: Default::default(),
            overwrite: Default::default(),
            compare: Default::default(),
            preserve: Preserve::default(),
            include: vec![],
            exclude: vec![],
            delete_extraneous: false,
            delete_excluded: false,
            parallelism: Parallelism::default(),
            suspend: false,
            ttl_seconds_after_finished: None,
            dry_run: false,
            transfer: Default::default(),
            check: None,
        }
    }

    fn root(name: &str, path: &str) -> Endpoint {
        Endpoint {
            root: Some(name.into()),
            path: path.into(),
            ..Endpoint::default()
        }
    }

    #[test]
    fn relative_paths_inside_a_root_are_accepted() {
        for p in [
            "",
            ".",
            "data",
            "a/b/c",
            "a/./b",
            "dots..in..name",
            "..hidden",
        ] {
            assert_eq!(
                validate(&spec(root("r", p), root("r", "out"))),
                Ok(()),
                "{p:?}"
            );
        }
    }

    #[test]
    fn absolute_dotdot_and_nul_paths_are_refused_as_path_escape() {
        for p in ["/etc", "..", "../x", "a/../../b", "a/..", "a\0b"] {
            let err = validate(&spec(root("r", p), root("r", "out"))).expect_err(p);
            assert_eq!(err.reason, Reason::PathEscape, "{p:?}");
            assert!(
                err.message.contains("spec.source.path"),
                "message names the field: {}",
                err.message
            );
        }
    }

    #[test]
    fn paths_into_the_state_directory_are_refused_on_either_end() {
        for p in [".ferry", "./.ferry/x", ".ferry/"] {
            let err = validate(&spec(root("r", "in"), root("r", p))).expect_err(p);
            assert_eq!(err.reason, Reason::PathEscape, "{p:?}");
            assert!(
                err.message.contains("spec.destination.path"),
                "{}",
                err.message
            );
            let err = validate(&spec(root("r", p), root("r", "out"))).expect_err(p);
            assert!(err.message.contains("spec.source.path"), "{}", err.message);
        }
        validate(&spec(root("r", "a/.ferry"), root("r", "out/.ferry2"))).expect("not the top");
    }

    #[test]
    fn endpoint_needs_exactly_one_of_root_and_pvc() {
        let both = Endpoint {
            root: Some("r".into()),
            pvc: Some("c".into()),
            ..Endpoint::default()
        };
        let neither = Endpoint::default();
        for e in [both, neither] {
            let err = validate(&spec(root("r", "a"), e)).expect_err("refused");
            assert_eq!(err.reason, Reason::InvalidEndpoint);
            assert!(err.message.starts_with("spec.destination"));
        }
    }

    #[test]
    fn snapshots_are_for_the_source_and_copy_method_snapshot_for_a_claim() {
        let snapshot = Endpoint {
            snapshot: Some("s".into()),
            ..Endpoint::default()
        };
        let of_claim = Endpoint {
            pvc: Some("c".into()),
            copy_method: Some(CopyMethod::Snapshot),
            volume_snapshot_class_name: Some("fast".into()),
            ..Endpoint::default()
        };
        assert_eq!(validate(&spec(snapshot.clone(), root("r", "b"))), Ok(()));
        assert_eq!(validate(&spec(of_claim.clone(), root("r", "b"))), Ok(()));
        let refused = |src: Endpoint, dst: Endpoint, says: &str| {
            let err = validate(&spec(src, dst)).expect_err(says);
            assert_eq!(err.reason, Reason::InvalidEndpoint, "{says}");
            assert!(err.message.contains(says), "{}", err.message);
        };
        refused(root("r", "a"), snapshot.clone(), "are for the source");
        refused(root("r", "a"), of_claim.clone(), "are for the source");
        refused(
            Endpoint {
                pvc: Some("c".into()),
                ..snapshot.clone()
            },
            root("r", "b"),
            "sets both pvc and snapshot",
        );
        refused(
            Endpoint {
                pvc: None,
                root: Some("r".into()),
                volume_snapshot_class_name: None,
                ..of_claim.clone()
            },
            root("r", "b"),
            "copyMethod Snapshot snapshots a claim",
        );
        refused(
            Endpoint {
                copy_method: None,
                ..of_claim
            },
            root("r", "b"),
            "volumeSnapshotClassName is for copyMethod Snapshot",
        );
        refused(
            Endpoint {
                snapshot: Some(String::new()),
                ..Endpoint::default()
            },
            root("r", "b"),
            "names an empty snapshot",
        );
    }

    #[test]
    fn out_of_range_parallelism_is_refused_with_the_bounds() {
        let mut s = spec(root("r", "a"), root("r", "b"));
        s.parallelism.max_agents = 0;
        let err = validate(&s).expect_err("refused");
        assert_eq!(err.reason, Reason::InvalidSpec);
        assert!(err.message.contains("between 1 and 64"));
        // 64 workers of 1 MiB each is what one shard may hold; 256 was accepted before.
        let mut s = spec(root("r", "a"), root("r", "b"));
        s.parallelism.workers_per_agent = 65;
        let err = validate(&s).expect_err("refused");
        assert!(
            err.message
                .contains("workersPerAgent must be between 0 and 64"),
            "{}",
            err.message
        );
        s.parallelism.workers_per_agent = 64;
        validate(&s).expect("64 is allowed");
    }

    #[test]
    fn filter_lists_are_bounded_in_count_and_length() {
        let ok = spec(root("r", "a"), root("r", "out"));
        let mut many = ok.clone();
        many.exclude = vec!["a".into(); 257];
        let mut long = ok.clone();
        long.include = vec!["a".repeat(4097)];
        let mut invalid = ok.clone();
        invalid.exclude = vec!["cache/".into(), "a[z-a]".into()];
        let mut comment = ok.clone();
        comment.include = vec!["#draft".into()];
        let mut compare_alone = ok.clone();
        compare_alone.compare = ferry_crds::Compare::Checksum;
        let refused = validate(&compare_alone).expect_err("compare Checksum under Never");
        assert!(
            refused.message.contains("set spec.overwrite: IfChanged"),
            "{}",
            refused.message
        );
        compare_alone.overwrite = ferry_crds::Overwrite::IfChanged;
        assert!(validate(&compare_alone).is_ok());
        let mut excluded_alone = ok.clone();
        excluded_alone.delete_excluded = true;
        let refused = validate(&excluded_alone).expect_err("deleteExcluded alone");
        assert!(
            refused.message.contains("set spec.deleteExtraneous: true"),
            "{}",
            refused.message
        );
        let mut anchored = ok.clone();
        anchored.include = vec!["/top.txt".into(), "data/**/*.csv".into(), "!*.tmp".into()];
        assert!(validate(&anchored).is_ok(), "{:?}", validate(&anchored));
        for (bad, says) in [
            (many, "spec.exclude: has 257 patterns; at most 256"),
            (long, "4097 bytes"),
            (
                invalid,
                "spec.exclude: pattern \"a[z-a]\" is not a valid glob",
            ),
            (
                comment,
                "spec.include: pattern \"#draft\" would be a comment",
            ),
        ] {
            let refused = validate(&bad).expect_err("a bad filter list was accepted");
            assert_eq!(refused.reason, Reason::InvalidSpec);
            assert!(refused.message.contains(says), "{}", refused.message);
        }
    }

    #[test]
    fn a_bandwidth_limit_is_a_quantity_of_at_least_one_mebibyte_a_second() {
        let mut s = spec(root("r", "a"), root("r", "b"));
        for (q, ok) in [
            ("200Mi", true),
            ("1Mi", true),
            ("1.5G", true),
            ("1048575", false),
            ("fast", false),
            ("-1Mi", false),
            ("1m", false),
        ] {
            s.transfer.bandwidth_limit = Some(q.into());
            let r = validate(&s);
            assert_eq!(r.is_ok(), ok, "{q}: {r:?}");
            if let Err(e) = r {
                assert!(
                    e.message.contains("spec.transfer.bandwidthLimit"),
                    "{}",
                    e.message
                );
            }
        }
        assert_eq!(ferry_crds::parse_rate("200Mi"), Ok(200 << 20));
        assert_eq!(ferry_crds::parse_rate("1.5Gi"), Ok(3 << 29));
        assert_eq!(ferry_crds::parse_rate("2k"), Ok(2000));
        for bad in ["", "Mi", ".5Mi", "1..5Mi", "1e6", "99999999999Ei"] {
            assert!(ferry_crds::parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_copy_between_nodes_refuses_what_it_cannot_do_and_names_the_field() {
        let base = spec(root("a", "src"), root("b", "dst"));
        assert_eq!(between_nodes(&base), Ok(()));
        // A mirror is made from the sender's listings.
        let mirror = CopyJobSpec {
            delete_extraneous: true,
            ..base.clone()
        };
        assert_eq!(between_nodes(&mirror), Ok(()));
        let (field, s) = (
            "spec.reflink",
            CopyJobSpec {
                reflink: ferry_crds::Reflink::Always,
                ..base.clone()
            },
        );
        let r = between_nodes(&s).expect_err(field);
        assert_eq!(r.reason, Reason::InvalidSpec);
        assert!(r.message.starts_with(field), "{}", r.message);
        // Valid on one node: only the pairing refuses it.
        assert_eq!(validate(&s), Ok(()));
    }

    #[test]
    fn a_stored_spec_is_validated_once_a_generation() {
        let memo: Memo<usize> = Memo::new();
        let calls = std::cell::Cell::new(0);
        let count = || {
            calls.set(calls.get() + 1);
            calls.get()
        };
        let a = spec(root("r", "a"), root("r", "b"));
        assert_eq!(memo.get(Some("u1"), Some(1), &a, count), 1);
        assert_eq!(memo.get(Some("u1"), Some(1), &a, count), 1, "remembered");
        assert_eq!(
            memo.get(Some("u1"), Some(2), &a, count),
            2,
            "a new generation"
        );
        assert_eq!(
            memo.get(Some("u2"), Some(1), &a, count),
            3,
            "another object"
        );
        let b = spec(root("r", "c"), root("r", "b"));
        assert_eq!(memo.get(Some("u1"), Some(1), &b, count), 4, "another spec");
        assert_eq!(memo.get(None, Some(1), &a, count), 5, "not stored yet");
        assert_eq!(memo.get(None, Some(1), &a, count), 6, "not stored yet");
    }

    #[test]
    fn a_check_has_a_destination_a_manifest_and_nothing_a_copy_needs() {
        let manifest = ".ferry/0b6a2f0c-3d1e-4c55-9f3a-2b7d6e8c9a10.xxh128";
        let check = |dst: Endpoint, manifest: &str| CopyJobSpec {
            source: Endpoint::default(),
            check: Some(ferry_crds::Check {
                manifest: manifest.into(),
            }),
            ..spec(Endpoint::default(), dst)
        };
        assert_eq!(validate(&check(root("r", "out"), manifest)), Ok(()));
        let refused = |s: CopyJobSpec, reason: Reason, says: &str| {
            let err = validate(&s).expect_err(says);
            assert_eq!(err.reason, reason, "{says}: {}", err.message);
            assert!(err.message.contains(says), "{}", err.message);
        };
        refused(
            CopyJobSpec {
                source: root("r", "in"),
                ..check(root("r", "out"), manifest)
            },
            Reason::InvalidSpec,
            "remove spec.source",
        );
        for bad in ["x.xxh128", ".ferry/../etc/passwd", "/.ferry/a.xxh128", ""] {
            refused(
                check(root("r", "out"), bad),
                Reason::InvalidSpec,
                "give .ferry/<job uid>.xxh128",
            );
        }
        refused(
            check(root("r", "../up"), manifest),
            Reason::PathEscape,
            "spec.destination.path",
        );
        refused(
            CopyJobSpec {
                include: vec!["*.db".into()],
                dry_run: true,
                ..check(root("r", "out"), manifest)
            },
            Reason::InvalidSpec,
            "remove spec.include, spec.dryRun",
        );
        refused(
            CopyJobSpec {
                parallelism: Parallelism {
                    max_agents: 2,
                    ..Parallelism::default()
                },
                ..check(root("r", "out"), manifest)
            },
            Reason::InvalidSpec,
            "spec.parallelism.maxAgents",
        );
        refused(
            spec(Endpoint::default(), root("r", "out")),
            Reason::InvalidEndpoint,
            "spec.source is not set",
        );
    }
}
