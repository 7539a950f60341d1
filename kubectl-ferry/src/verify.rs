//! `kubectl ferry verify`: a check job (`spec.check`) made from what the user has at hand.
//! `verify JOB` checks JOB's destination against the manifest JOB wrote there (its
//! `status.manifest`); `verify DST --manifest .ferry/UID.xxh128` checks a destination whose
//! job is gone (a job past its ttl); `verify --migration NAME` checks a migrated claim
//! against its final sync's manifest (the migration's `status.manifest`). The agent reads every file the
//! manifest lists; nothing is copied and nothing is written.

use anyhow::{bail, Context, Result};
use ferry_crds::{Check, ClaimMigration, CopyJob, CopyJobSpec, Endpoint, MigrationStep};
use kube::Api;

use crate::endpoint;

/// The destination and manifest of the check `verify TARGET [--manifest M]` asks for.
pub async fn target(
    jobs: &Api<CopyJob>,
    target: &str,
    manifest: Option<String>,
) -> Result<(Endpoint, Check)> {
    if let Some(manifest) = manifest {
        let check = Check { manifest };
        if check.file_name().is_none() {
            bail!(
                "--manifest {:?} is not a job's status.manifest: give .ferry/<job uid>.xxh128 as `kubectl get copyjob JOB -o jsonpath={{.status.manifest}}` prints it",
                ferry_crds::shorten(&check.manifest, 80)
            );
        }
        return Ok((endpoint::parse(target, false)?, check));
    }
    let job = jobs.get(target).await.with_context(|| {
        format!("no CopyJob {target} to verify (to check a destination whose job is gone, give DST and --manifest)")
    })?;
    if let Some(check) = &job.spec.check {
        // Checking again what a check checked.
        return Ok((job.spec.destination.clone(), check.clone()));
    }
    let Some(manifest) = job.status.as_ref().and_then(|s| s.manifest.clone()) else {
        bail!(
            "CopyJob {target} names no manifest (status.manifest): it has not run, was a dry run, or copied a raw block device (its manifest stays with the agent); nothing to verify against"
        );
    };
    Ok((job.spec.destination.clone(), Check { manifest }))
}

/// The destination and manifest of `verify --migration NAME`: the migrated claim, whole,
/// against the final sync's manifest, which is on the claim's new volume.
pub async fn migrated(migrations: &Api<ClaimMigration>, name: &str) -> Result<(Endpoint, Check)> {
    let m = migrations
        .get(name)
        .await
        .with_context(|| format!("no ClaimMigration {name} to verify"))?;
    let status = m.status.unwrap_or_default();
    if status.step != Some(MigrationStep::Succeeded) {
        let step = status
            .step
            .map_or_else(|| "Pending".to_string(), |s| s.to_string());
        bail!("ClaimMigration {name} is at step {step}, not Succeeded: its claim is checked once it is on the new volume (kubectl get claimmigration {name} -w)");
    }
    let Some(manifest) = status.manifest else {
        bail!("ClaimMigration {name} names no manifest (status.manifest): its claim is a raw block device (its manifest stays with the agent), or it finished before Ferry recorded manifests; give the claim and --manifest of its final sync if you have it");
    };
    let destination = Endpoint {
        pvc: Some(m.spec.claim.clone()),
        ..Default::default()
    };
    Ok((destination, Check { manifest }))
}

/// The check job for `destination` against `check`, named `name` or, by the API server,
/// `<head>-verify-XXXXX` after `head` (the job or destination it checks).
pub fn job(destination: Endpoint, check: Check, name: Option<&str>, head: &str) -> Result<CopyJob> {
    // Every other field at its default, as a check requires.
    let spec: CopyJobSpec = serde_json::from_value(serde_json::json!({
        "destination": destination,
        "check": check,
    }))?;
    let mut job = CopyJob::new(name.unwrap_or_default(), spec);
    if name.is_none() {
        job.metadata.name = None;
        // A name is at most 63 characters here (its label values); the API server adds 5.
        let head: String = head
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let head = head.trim_matches('-');
        job.metadata.generate_name = Some(if head.is_empty() {
            "verify-".into()
        } else {
            format!("{head}-verify-")
        });
    }
    Ok(job)
}

/// The line a finished check prints: its Complete or Failed condition's message.
pub fn outcome(job: &CopyJob) -> String {
    job.status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| format!("{}: {}", c.reason, c.message))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    #[test]
    fn a_check_job_has_the_destination_the_manifest_and_a_name_after_what_it_checks() {
        let dst = endpoint::parse("data:out", false).expect("dst");
        let check = Check {
            manifest: ".ferry/0b6a2f0c-3d1e-4c55-9f3a-2b7d6e8c9a10.xxh128".into(),
        };
        let j = job(dst.clone(), check.clone(), None, "Copy_Of.Data").expect("job");
        assert_eq!(
            j.metadata.generate_name.as_deref(),
            Some("copy-of-data-verify-")
        );
        assert_eq!(j.metadata.name, None);
        assert_eq!(j.spec.destination, dst);
        assert_eq!(j.spec.check, Some(check.clone()));
        // What the API server sees: no source at all (its rule: one of source and check).
        let sent = serde_json::to_value(&j.spec).expect("json");
        assert!(sent.get("source").is_none(), "{sent}");
        assert!(
            sent.get("include")
                .is_none_or(|v| v == &serde_json::json!([])),
            "{sent}"
        );
        let j = job(dst, check, Some("mine"), "x").expect("job");
        assert_eq!(j.name_any(), "mine");
        assert_eq!(j.metadata.generate_name, None);
    }
}
