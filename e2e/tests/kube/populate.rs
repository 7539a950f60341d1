//! The volume populator on the real node (`operator.populator`, on by default): a claim
//! whose `spec.dataSourceRef` names a VolumeSource is filled by the operator's CopyJob into
//! a prime claim that csi-provisioner provisions, and bound by the PV controller once the
//! operator hands it the prime's volume; a WaitForFirstConsumer claim only once a pod that
//! uses it is scheduled; a source of another namespace is not used; a claim deleted
//! mid-copy leaves nothing behind. Each check deletes what it made.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use ferry_crds::{populate_job_name, prime_claim_name, STATE_DIR};
use ferry_e2e::kube::KubeTier;
use ferry_e2e::wait_for;

use super::csi::{all_let_go, claim, gone, holder_pods, snapshot, user_pod, volume_dir};
use super::{dated_tree, rich_tree, tree, upgrade_and_roll, SLOW_FILES};

/// The target: a claim is bound within this long of its copy finishing.
const BOUND_AFTER_COPY: f64 = 5.0;

/// A VolumeSource `name` in `ns` whose `spec.source` is `source` (a CopyJob source, flow YAML).
fn volume_source(tier: &KubeTier, ns: &str, name: &str, source: &str) -> Result<()> {
    tier.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: VolumeSource\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {source}\n"
    ))
}

/// A 1Gi ReadWriteOnce claim `name` in `default` of `class` whose dataSourceRef is a
/// VolumeSource, `reference` the rest of the reference (`name: x`, and maybe a namespace);
/// its uid.
fn populated_claim(tier: &KubeTier, name: &str, class: &str, reference: &str) -> Result<String> {
    tier.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  storageClassName: {class}\n  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: 1Gi}}}}\n  dataSourceRef: {{apiGroup: ferry.dev, kind: VolumeSource, {reference}}}\n"
    ))?;
    let uid = tier.get(&format!("pvc/{name}"), "default", "{.metadata.uid}")?;
    ensure!(!uid.is_empty(), "claim {name} has no uid");
    Ok(uid)
}

/// Until the claim `ns/claim` has an event with `reason`; every reason it has by then.
fn said(tier: &KubeTier, ns: &str, claim: &str, reason: &str) -> Result<String> {
    let mut reasons = String::new();
    wait_for(
        &format!("the event {reason} on claim {ns}/{claim}"),
        Duration::from_secs(30),
        || {
            reasons = tier.event_reasons(ns, claim).unwrap_or_default();
            reasons.split_whitespace().any(|r| r == reason)
        },
    )
    .with_context(|| format!("the events on {ns}/{claim}: {reasons:?}"))?;
    Ok(reasons)
}

/// Delete each of `objects` (`kind/name`) in `ns` that exists, waiting until it is gone;
/// all are tried, the first failure returned.
pub(super) fn remove(tier: &KubeTier, ns: &str, objects: &[&str]) -> Result<()> {
    let mut first = Ok(());
    for what in objects {
        let done = tier
            .kubectl_ok(&[
                "delete",
                what,
                "-n",
                ns,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=90s",
            ])
            .map(drop);
        first = first.and(done);
    }
    first
}

/// Now, in seconds since the epoch.
fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An API server timestamp (RFC 3339), in seconds since the epoch.
pub(super) fn epoch_of(time: &str) -> Result<f64> {
    let out = Command::new("date")
        .args(["-u", "-d", time, "+%s.%N"])
        .output()?;
    ensure!(out.status.success(), "date -d {time:?}: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// What the test saw of a population, polling the claims and CopyJobs of `default`.
struct Population {
    /// When the CopyJob was first seen Succeeded (seconds since the epoch).
    succeeded_seen: Option<f64>,
    /// When the claim was first seen Bound.
    bound_seen: f64,
    /// The volume the prime claim was last seen bound to.
    prime_volume: Option<String>,
    /// The claim's volume.
    volume: String,
}

/// Poll (every 150 ms, one kubectl call for the claims and CopyJobs of `default`) until
/// claim `name` (uid `uid`) is Bound.
fn until_bound(tier: &KubeTier, name: &str, uid: &str, timeout: Duration) -> Result<Population> {
    let (me, prime, job) = (
        format!("PersistentVolumeClaim/{name}"),
        format!("PersistentVolumeClaim/{}", prime_claim_name(uid)),
        format!("CopyJob/{}", populate_job_name(uid)),
    );
    let (mut succeeded_seen, mut prime_volume, mut last) = (None, None, String::new());
    let start = Instant::now();
    while start.elapsed() < timeout {
        last = tier.kubectl_ok(&[
            "get",
            "pvc,copyjobs",
            "-n",
            "default",
            "-o",
            "jsonpath={range .items[*]}{.kind}/{.metadata.name}|{.status.phase}|{.spec.volumeName}{\"\\n\"}{end}",
        ])?;
        // After the answer: a claim seen Bound is at most this late.
        let now = epoch_now();
        for line in last.lines() {
            let mut fields = line.split('|');
            let (what, phase, volume) = (
                fields.next().unwrap_or_default(),
                fields.next().unwrap_or_default(),
                fields.next().unwrap_or_default(),
            );
            if what == job && phase == "Succeeded" && succeeded_seen.is_none() {
                succeeded_seen = Some(now);
            }
            if what == prime && !volume.is_empty() {
                prime_volume = Some(volume.to_string());
            }
            if what == me && phase == "Bound" {
                return Ok(Population {
                    succeeded_seen,
                    bound_seen: now,
                    prime_volume,
                    volume: volume.to_string(),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    bail!(
        "claim {name} not Bound after {timeout:?}; claims and CopyJobs:\n{last}\nCopyJob status: {}\nevents on the claim: {}\noperator:\n{}",
        tier.get(&format!("copyjob/{}", populate_job_name(uid)), "default", "{.status}")
            .unwrap_or_default(),
        tier.event_reasons("default", name).unwrap_or_default(),
        operator_log(tier)
    )
}

/// The last lines of the leading operator's log, for failure messages.
fn operator_log(tier: &KubeTier) -> String {
    let holder = tier
        .get("lease/ferry-operator", super::NS, "{.spec.holderIdentity}")
        .unwrap_or_default();
    tier.kubectl_ok(&["logs", "-n", super::NS, &holder, "--tail=40"])
        .unwrap_or_else(|e| format!("{e:#}"))
}

/// The volume at `volume` holds exactly the tree `want` was snapshotted from (before the
/// copy): every entry with its metadata, xattrs, hard links, holes and bytes, but for
/// what is not the source's: the volume's own top directory (the driver made it) and the
/// state directory Ferry keeps at the top of every destination (`STATE_DIR`, the copy's
/// manifests), taken as found.
fn holds_exactly(mut want: tree::Tree, volume: &Path) -> Result<()> {
    let found = tree::snapshot(volume)?;
    let state = STATE_DIR.as_bytes();
    for (path, meta) in &found.entries {
        if path.as_slice() == state
            || (path.starts_with(state) && path.get(state.len()) == Some(&b'/'))
        {
            want.entries.insert(path.clone(), meta.clone());
        }
    }
    let check = tree::Check {
        root_meta: false,
        ..tree::Check::default()
    };
    tree::compare(&want, volume, check).map(drop)
}

/// The PersistentVolumes whose claimRef has uid `uid`.
fn volumes_claimed_by(tier: &KubeTier, uid: &str) -> Result<Vec<String>> {
    let all = tier.kubectl_ok(&[
        "get",
        "pv",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.claimRef.uid}{\"\\n\"}{end}",
    ])?;
    Ok(all
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, u)| *u == uid)
        .map(|(pv, _)| pv.to_string())
        .collect())
}

/// A claim populated from another claim (a VolumeSource `{pvc, path}`): bound to the
/// volume its prime claim was given (csi-provisioner made none for it), within 5 s of its
/// copy finishing, holding exactly the source tree; the prime claim gone, the Populated
/// event on the claim, and the VolumeSource's status listing it Populated.
pub fn from_a_claim(tier: &KubeTier, _: &Path) -> Result<()> {
    let result = (|| -> Result<()> {
        claim(tier, "default", "pop-src", "ferry-csi", "ReadWriteOnce")?;
        tier.wait_claim_bound("default", "pop-src")?;
        let src = volume_dir(tier, "default", "pop-src")?.join("data");
        rich_tree(&src)?;
        let want = tree::snapshot(&src)?;
        volume_source(
            tier,
            "default",
            "pop-from-claim",
            "{pvc: pop-src, path: data}",
        )?;
        let uid = populated_claim(tier, "pop-copy", "ferry-csi", "name: pop-from-claim")?;
        let seen = until_bound(tier, "pop-copy", &uid, Duration::from_secs(180))?;
        let job = format!("copyjob/{}", populate_job_name(&uid));
        let finished = tier.get(&job, "default", "{.status.finishedAt}")?;
        let after_copy = seen.bound_seen - epoch_of(&finished)?;
        eprintln!(
            "populator: claim Bound {after_copy:.2} s after its CopyJob's finishedAt ({finished}, whole seconds){}",
            seen.succeeded_seen.map_or(String::new(), |s| format!(
                ", {:.2} s after the test saw it Succeeded",
                seen.bound_seen - s
            ))
        );
        ensure!(
            seen.prime_volume.as_deref() == Some(seen.volume.as_str()),
            "the claim is bound to {:?}, not to the volume of its prime claim ({:?})",
            seen.volume,
            seen.prime_volume
        );
        let claiming = volumes_claimed_by(tier, &uid)?;
        ensure!(
            claiming == [seen.volume.clone()],
            "the volumes that name the claim: {claiming:?} (csi-provisioner provisioned it too?)"
        );
        ensure!(
            after_copy <= BOUND_AFTER_COPY,
            "the claim was bound {after_copy:.2} s after its copy finished (target {BOUND_AFTER_COPY} s)"
        );
        holds_exactly(want, &volume_dir(tier, "default", "pop-copy")?)
            .context("the populated volume is not the source tree")?;
        gone(tier, &format!("pvc/{}", prime_claim_name(&uid))).context("the prime claim stayed")?;
        let reasons = said(tier, "default", "pop-copy", "Populated")?;
        eprintln!("populator: events on the claim: {reasons}");
        tier.wait_until(
            "volumesource/pop-from-claim",
            "default",
            "{.status.claims[?(@.name==\"pop-copy\")].phase}/{.status.populated}",
            Duration::from_secs(30),
            |s| s == "Populated/1",
        )
        .context("the VolumeSource's status does not list the claim Populated")?;
        all_let_go(tier, "default")
    })();
    let cleanup = remove(
        tier,
        "default",
        &["pvc/pop-copy", "volumesource/pop-from-claim", "pvc/pop-src"],
    );
    result.and(cleanup)
}

/// A claim of a WaitForFirstConsumer class populated from a VolumeSnapshot: nothing is
/// made for it (no prime claim, no CopyJob) until a pod that uses it is scheduled, and it
/// says so; then that pod starts on the populated volume, which holds exactly the
/// snapshot's contents.
pub fn from_a_snapshot_on_first_use(tier: &KubeTier, _: &Path) -> Result<()> {
    let result = (|| -> Result<()> {
        claim(
            tier,
            "default",
            "pop-snap-src",
            "ferry-csi",
            "ReadWriteOnce",
        )?;
        tier.wait_claim_bound("default", "pop-snap-src")?;
        dated_tree(
            &volume_dir(tier, "default", "pop-snap-src")?.join("data"),
            200,
        )?;
        let taken = snapshot(tier, "pop-snap", "pop-snap-src")?;
        let want = tree::snapshot(&taken)?;
        volume_source(tier, "default", "pop-from-snap", "{snapshot: pop-snap}")?;
        let made = Instant::now();
        let uid = populated_claim(tier, "pop-later", "ferry-csi-wffc", "name: pop-from-snap")?;
        said(tier, "default", "pop-later", "WaitingForConsumer")?;
        std::thread::sleep(Duration::from_secs(3).saturating_sub(made.elapsed()));
        for what in [
            format!("pvc/{}", prime_claim_name(&uid)),
            format!("copyjob/{}", populate_job_name(&uid)),
        ] {
            ensure!(
                tier.get(&what, "default", "{.metadata.name}")?.is_empty(),
                "{what} was made before any pod used the claim"
            );
        }
        let phase = tier.get("pvc/pop-later", "default", "{.status.phase}")?;
        ensure!(
            phase == "Pending",
            "before any pod used it, the claim is {phase}"
        );
        let started = Instant::now();
        user_pod(tier, "default", "pop-user", "pop-later")?;
        eprintln!(
            "populator: the claim's first pod Ready {:.1} s after it was made",
            started.elapsed().as_secs_f64()
        );
        tier.wait_claim_bound("default", "pop-later")?;
        let node = tier.get("pod/pop-user", "default", "{.spec.nodeName}")?;
        let selected = tier.get(
            "pvc/pop-later",
            "default",
            "{.metadata.annotations.volume\\.kubernetes\\.io/selected-node}",
        )?;
        ensure!(
            node == selected,
            "the pod runs on {node:?}, the claim was provisioned for {selected:?}"
        );
        holds_exactly(want, &volume_dir(tier, "default", "pop-later")?)
            .context("the populated volume is not the snapshot's contents")?;
        gone(tier, &format!("pvc/{}", prime_claim_name(&uid))).context("the prime claim stayed")?;
        let job_uid = tier.get(
            &format!("copyjob/{}", populate_job_name(&uid)),
            "default",
            "{.metadata.uid}",
        )?;
        gone(tier, &format!("pvc/ferry-restore-{job_uid}"))
            .context("the claim restored from the snapshot stayed")?;
        let reasons = said(tier, "default", "pop-later", "Populated")?;
        eprintln!("populator: events on the claim: {reasons}");
        all_let_go(tier, "default")
    })();
    let cleanup = remove(
        tier,
        "default",
        &[
            "pod/pop-user",
            "pvc/pop-later",
            "volumesource/pop-from-snap",
            "volumesnapshot/pop-snap",
            "pvc/pop-snap-src",
        ],
    );
    result.and(cleanup)
}

/// A claim whose dataSourceRef names a VolumeSource of another namespace is not populated
/// from it. With `dataSourceRef.namespace` the API server keeps the reference only under
/// the CrossNamespaceVolumeDataSource feature gate (then it is refused as CrossNamespace);
/// without the gate it drops the whole reference, and the claim is an ordinary one,
/// provisioned empty. By its name alone, no such source is found in the claim's namespace
/// (VolumeSourceNotFound) and the claim stays Pending (csi-provisioner leaves it to the
/// populator). Either way no prime claim, no CopyJob and no holder is made, nothing of the
/// other namespace's data reaches a claim, and its source lists no claim.
pub fn another_namespaces_source(tier: &KubeTier, _: &Path) -> Result<()> {
    const OTHER: &str = "populate-other";
    tier.kubectl_ok(&["create", "namespace", OTHER])?;
    let result = (|| -> Result<()> {
        claim(tier, OTHER, "their-data", "ferry-csi", "ReadWriteOnce")?;
        tier.wait_claim_bound(OTHER, "their-data")?;
        std::fs::write(
            volume_dir(tier, OTHER, "their-data")?.join("secret"),
            "theirs\n",
        )?;
        volume_source(tier, OTHER, "theirs", "{pvc: their-data}")?;
        // (claim, uid, the reason it is refused with; None: not a populated claim at all)
        let mut claims: Vec<(&str, String, Option<&str>)> = Vec::new();
        let reference = format!("name: theirs, namespace: {OTHER}");
        match populated_claim(tier, "pop-theirs", "ferry-csi", &reference) {
            Ok(uid) => {
                let kept = tier.get("pvc/pop-theirs", "default", "{.spec.dataSourceRef}")?;
                let reason = if kept.contains(OTHER) {
                    Some("CrossNamespace")
                } else if kept.contains("VolumeSource") {
                    Some("VolumeSourceNotFound")
                } else {
                    None
                };
                eprintln!(
                    "populator: with a namespace, the API server stored dataSourceRef {kept:?}; expecting {reason:?}"
                );
                claims.push(("pop-theirs", uid, reason));
            }
            Err(e) => eprintln!("populator: a dataSourceRef with a namespace was refused: {e:#}"),
        }
        let uid = populated_claim(tier, "pop-theirs-by-name", "ferry-csi", "name: theirs")?;
        claims.push(("pop-theirs-by-name", uid, Some("VolumeSourceNotFound")));
        for (name, _, reason) in &claims {
            if let Some(reason) = reason {
                let reasons = said(tier, "default", name, reason)?;
                eprintln!("populator: events on {name}: {reasons}");
            }
        }
        // Time for anything that would be made to be made.
        std::thread::sleep(Duration::from_secs(3));
        for (name, uid, reason) in &claims {
            for ns in ["default", OTHER] {
                for what in [
                    format!("pvc/{}", prime_claim_name(uid)),
                    format!("copyjob/{}", populate_job_name(uid)),
                ] {
                    ensure!(
                        tier.get(&what, ns, "{.metadata.name}")?.is_empty(),
                        "{ns}/{what} was made for {name}"
                    );
                }
            }
            if reason.is_some() {
                let phase = tier.get(&format!("pvc/{name}"), "default", "{.status.phase}")?;
                ensure!(phase == "Pending", "claim {name} is {phase}");
            } else {
                tier.wait_claim_bound("default", name)?;
                let dir = volume_dir(tier, "default", name)?;
                let found: Vec<_> = std::fs::read_dir(&dir)?
                    .flatten()
                    .map(|e| e.file_name())
                    .collect();
                ensure!(
                    found.is_empty(),
                    "claim {name}'s new volume holds {found:?}"
                );
            }
        }
        for ns in ["default", OTHER] {
            all_let_go(tier, ns)?;
        }
        let listed = tier.get("volumesource/theirs", OTHER, "{.status.claims}")?;
        ensure!(
            listed.is_empty() || listed == "[]",
            "the other namespace's source lists claims: {listed}"
        );
        Ok(())
    })();
    let cleanup = remove(
        tier,
        "default",
        &["pvc/pop-theirs", "pvc/pop-theirs-by-name"],
    )
    .and_then(|()| {
        tier.kubectl_ok(&[
            "delete",
            "namespace",
            OTHER,
            "--wait=true",
            "--timeout=120s",
        ])
        .map(drop)
    });
    result.and(cleanup)
}

/// A claim deleted while its CopyJob copies (the agent slowed down to 30 ms a file at two
/// workers, then put back): within 60 s its CopyJob, its prime claim, the holder pods and
/// the prime's new volume are gone; the source stays as it was.
pub fn deleted_mid_population(tier: &KubeTier, _: &Path) -> Result<()> {
    upgrade_and_roll(tier, &SLOW_FILES)?;
    let result = (|| -> Result<()> {
        claim(
            tier,
            "default",
            "pop-slow-src",
            "ferry-csi",
            "ReadWriteOnce",
        )?;
        tier.wait_claim_bound("default", "pop-slow-src")?;
        let src = volume_dir(tier, "default", "pop-slow-src")?.join("data");
        dated_tree(&src, 1200)?;
        let before = ferry_e2e::tree_meta(&src)?;
        volume_source(
            tier,
            "default",
            "pop-slow",
            "{pvc: pop-slow-src, path: data}",
        )?;
        let uid = populated_claim(tier, "pop-dropped", "ferry-csi", "name: pop-slow")?;
        let (prime, job) = (
            format!("pvc/{}", prime_claim_name(&uid)),
            format!("copyjob/{}", populate_job_name(&uid)),
        );
        tier.wait_until(
            &job,
            "default",
            "{.status.progress.filesDone}",
            Duration::from_secs(120),
            |n| n.parse::<u64>().is_ok_and(|n| n >= 20),
        )?;
        tier.wait_until(
            "volumesource/pop-slow",
            "default",
            "{.status.claims[?(@.name==\"pop-dropped\")].phase}",
            Duration::from_secs(30),
            |p| p == "Populating",
        )?;
        let volume = tier.get(&prime, "default", "{.spec.volumeName}")?;
        ensure!(
            !volume.is_empty(),
            "mid-copy, the prime claim has no volume"
        );
        let phase = tier.get(&job, "default", "{.status.phase}")?;
        ensure!(
            phase != "Succeeded",
            "the copy finished before the claim was deleted"
        );
        let deleted = Instant::now();
        tier.kubectl_ok(&[
            "delete",
            "pvc",
            "pop-dropped",
            "-n",
            "default",
            "--wait=false",
        ])?;
        let pv = format!("pv/{volume}");
        let left = || -> Vec<String> {
            let mut left: Vec<String> = [&job, &prime, &pv]
                .into_iter()
                .filter(|what| {
                    tier.get(what, "default", "{.metadata.name}")
                        .map_or(true, |n| !n.is_empty())
                })
                .cloned()
                .collect();
            let holders = holder_pods(tier, "default").unwrap_or_else(|e| format!("{e:#}"));
            left.extend(holders.split_whitespace().map(String::from));
            left
        };
        let mut still = Vec::new();
        wait_for(
            "the deleted claim's CopyJob, prime claim, holders and volume gone",
            Duration::from_secs(60),
            || {
                still = left();
                still.is_empty()
            },
        )
        .with_context(|| {
            format!(
                "left: {still:?}\nprime claim: {}\noperator:\n{}",
                tier.get(&prime, "default", "{.metadata}")
                    .unwrap_or_default(),
                operator_log(tier)
            )
        })?;
        eprintln!(
            "populator: everything the deleted claim had gone {:.1} s after its deletion",
            deleted.elapsed().as_secs_f64()
        );
        ensure!(ferry_e2e::tree_meta(&src)? == before, "the source changed");
        Ok(())
    })();
    let cleanup = remove(
        tier,
        "default",
        &[
            "pvc/pop-dropped",
            "volumesource/pop-slow",
            "pvc/pop-slow-src",
        ],
    );
    let back = upgrade_and_roll(
        tier,
        &["--set", "agent.extraEnv=null", "--set", "agent.workers=0"],
    );
    result.and(cleanup).and(back)
}
