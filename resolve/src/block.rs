//! Raw block claims (`volumeMode: Block`): what a job between two of them may ask for
//! ([`check_pair`]: both ends block, the destination at least as large, no field that
//! means something only for files), and where the agent finds a block claim on its node:
//! the socket directory of the job's holder pod ([`fd_dir`]), which hands over the device,
//! and the kubelet's node for that volume and pod ([`device_node`]), which says which
//! device is the claim's.

use ferry_crds::{CopyJob, Overwrite, Preserve, Reason, Reflink};

use crate::validate::Refusal;

/// One end of a job as [`check_pair`] sees it: `None` for a filesystem (a root, or a
/// filesystem claim), `Some(capacity)` for a raw block claim (its volume's size in bytes,
/// when known).
pub type End = Option<Option<u64>>;

/// The holder's `emptyDir` volume, where `ferry-agent hold-block` listens.
pub const FD_VOLUME: &str = "ferry-fd";

/// Where the kubelet keeps the `emptyDir` [`FD_VOLUME`] of the pod with uid `pod_uid`: the
/// directory a block claim's holder hands its device over in (a shard's root for a block
/// claim).
pub fn fd_dir(kubelet_dir: &str, pod_uid: &str) -> String {
    format!(
        "{}/pods/{pod_uid}/volumes/kubernetes.io~empty-dir/{FD_VOLUME}",
        kubelet_dir.trim_end_matches('/')
    )
}

/// The pod uid of a path made by [`fd_dir`], or `None` for any other path.
pub fn holder_of_fd_dir<'a>(path: &'a str, kubelet_dir: &str) -> Option<&'a str> {
    let uid = path
        .strip_prefix(kubelet_dir.trim_end_matches('/'))?
        .strip_prefix("/pods/")?
        .strip_suffix(&format!("/volumes/kubernetes.io~empty-dir/{FD_VOLUME}"))?;
    let uuid = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    uuid.then_some(uid)
}

/// The directory of the device node the kubelet makes for CSI block volume `pv`, one per
/// pod that uses it, named by the pod's uid: its `st_rdev` is the claim's device for that
/// pod (confirmed on kubelet 1.35 by the real-node tier).
pub fn device_node_dir(kubelet_dir: &str, pv: &str) -> String {
    format!(
        "{}/plugins/kubernetes.io/csi/volumeDevices/{pv}/dev",
        kubelet_dir.trim_end_matches('/')
    )
}

/// Bytes in a Kubernetes quantity (`64Mi`, `1G`, `1073741824`, `1.5Gi`), or `None` for
/// one that is not a whole number of bytes in that form. Capacities only: no negative
/// numbers, no exponents, at most 2^63 bytes.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    const SUFFIXES: [(&str, u128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((q, 1));
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit()) && s.len() <= 19;
    let dangling_point = number.ends_with('.');
    if whole.is_empty() || dangling_point || !digits(whole) || !digits(frac) {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let mut bytes = whole.checked_mul(scale)?;
    if !frac.is_empty() {
        let den = 10u128.checked_pow(frac.len() as u32)?;
        let num: u128 = frac.parse().ok()?;
        let part = num.checked_mul(scale)?;
        // A fraction of a byte is not a capacity.
        if part % den != 0 {
            return None;
        }
        bytes = bytes.checked_add(part / den)?;
    }
    u64::try_from(bytes).ok().filter(|b| *b <= i64::MAX as u64)
}

fn refused(reason: Reason, message: String) -> Refusal {
    Refusal { reason, message }
}

/// The fields of the job's spec that mean something only for files, as set.
fn file_only_fields(job: &CopyJob) -> Vec<&'static str> {
    let spec = &job.spec;
    let path_set = |p: &str| !matches!(p.trim_matches('/'), "" | ".");
    [
        ("spec.source.path", path_set(&spec.source.path)),
        ("spec.destination.path", path_set(&spec.destination.path)),
        ("spec.include", !spec.include.is_empty()),
        ("spec.exclude", !spec.exclude.is_empty()),
        ("spec.deleteExtraneous", spec.delete_extraneous),
        ("spec.deleteExcluded", spec.delete_excluded),
        ("spec.preserve", spec.preserve != Preserve::ALL),
        ("spec.reflink: Always", spec.reflink == Reflink::Always),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(f, _)| f)
    .collect()
}

/// Whether the two ends of `job` may be copied as they are: both filesystems (nothing to
/// say here), or both raw block claims with a spec that means something for a device and
/// a destination at least as large as the source (their volumes' capacities; the agent
/// checks the devices' own sizes again, since a capacity is what was asked for, not a
/// measurement). One block end and one filesystem end are refused.
pub fn check_pair(job: &CopyJob, src: End, dst: End) -> Result<(), Refusal> {
    let (s_cap, d_cap) = match (src, dst) {
        (None, None) => return Ok(()),
        (Some(_), None) => return Err(refused(Reason::VolumeModeMismatch, "the source is a raw block claim (volumeMode: Block) and the destination a filesystem: a device is copied onto a device, so make the destination a claim with volumeMode: Block, at least as large as the source".into())),
        (None, Some(_)) => return Err(refused(Reason::VolumeModeMismatch, "the destination is a raw block claim (volumeMode: Block) and the source a filesystem: files are copied into a filesystem, so make the destination a claim with volumeMode: Filesystem (or leave volumeMode out)".into())),
        (Some(s), Some(d)) => (s, d),
    };
    let fields = file_only_fields(job);
    if !fields.is_empty() {
        return Err(refused(Reason::NotForBlock, format!("both claims are raw block devices, which have no paths, names or metadata: remove {} (a device is copied whole)", fields.join(", "))));
    }
    let spec = &job.spec;
    match (spec.overwrite, spec.compare) {
        // The default: for files it copies only what the destination lacks; a device
        // lacks nothing, so a copy onto one is said out loud.
        (Overwrite::Never, _) => return Err(refused(Reason::NotForBlock, "a copy between raw block claims replaces the destination device's bytes, and overwrite: Never (the default) keeps what the destination holds, which for a device is all of it: set overwrite: Always, or IfChanged with compare: Checksum to write only the chunks that differ".into())),
        (Overwrite::IfChanged, ferry_crds::Compare::SizeAndTime) => return Err(refused(Reason::NotForBlock, "a device has no sizes or times to compare: with overwrite: IfChanged set compare: Checksum (only the chunks whose hashes differ are written)".into())),
        _ => {}
    }
    if let (Some(s), Some(d)) = (s_cap, d_cap) {
        if d < s {
            return Err(refused(Reason::DestinationTooSmall, format!("the destination claim's volume holds {d} bytes and the source's {s}: a device is copied whole, so the destination must be at least as large; use a larger destination claim (or expand it)")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_bytes() {
        for (q, b) in [
            ("64Mi", 64 << 20),
            ("1Gi", 1 << 30),
            ("1G", 1_000_000_000),
            ("4096", 4096),
            ("1.5Gi", 3 << 29),
            ("0.5Ki", 512),
            ("2k", 2000),
        ] {
            assert_eq!(quantity_bytes(q), Some(b), "{q}");
        }
        for q in [
            "",
            "Gi",
            "-1Gi",
            "1e3",
            "0.1",
            "1.Gi",
            "abc",
            "9999999999Ei",
            "1m",
            ".5Gi",
        ] {
            assert_eq!(quantity_bytes(q), None, "{q}");
        }
    }

    #[test]
    fn fd_dirs_and_their_pods() {
        let uid = "0b5e2c1e-6a4c-4a5e-9d51-1f0e7c9c2d10";
        let dir = fd_dir("/var/lib/kubelet/", uid);
        assert_eq!(
            dir,
            format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/ferry-fd")
        );
        assert_eq!(holder_of_fd_dir(&dir, "/var/lib/kubelet"), Some(uid));
        for other in [
            format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/other"),
            format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/pv/mount"),
            "/var/lib/kubelet/pods/../../etc/volumes/kubernetes.io~empty-dir/ferry-fd".into(),
            format!("/elsewhere/pods/{uid}/volumes/kubernetes.io~empty-dir/ferry-fd"),
        ] {
            assert_eq!(
                holder_of_fd_dir(&other, "/var/lib/kubelet"),
                None,
                "{other}"
            );
        }
        assert_eq!(
            device_node_dir("/var/lib/kubelet", "pvc-1"),
            "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev"
        );
    }

    fn job(extra: serde_json::Value) -> CopyJob {
        let mut spec = serde_json::json!({"source": {"pvc": "a"}, "destination": {"pvc": "b"}, "overwrite": "Always"});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "CopyJob",
            "metadata": {"name": "j", "namespace": "n"}, "spec": spec,
        }))
        .expect("a job")
    }

    fn csi(block: bool, capacity: Option<u64>) -> End {
        block.then_some(capacity)
    }

    fn reason(r: Result<(), Refusal>) -> Option<Reason> {
        r.err().map(|b| b.reason)
    }

    #[test]
    fn block_pairs_are_checked_and_filesystem_pairs_left_alone() {
        let plain = job(serde_json::json!({}));
        let dir: End = None;
        assert_eq!(reason(check_pair(&plain, csi(false, None), dir)), None);
        assert_eq!(
            reason(check_pair(&plain, csi(true, Some(8)), csi(true, Some(8)))),
            None
        );
        // Larger is fine (the rest is left as it is); unknown sizes are the node's to check.
        assert_eq!(
            reason(check_pair(&plain, csi(true, Some(8)), csi(true, Some(9)))),
            None
        );
        assert_eq!(
            reason(check_pair(&plain, csi(true, None), csi(true, Some(9)))),
            None
        );
        assert_eq!(
            reason(check_pair(&plain, csi(true, Some(9)), csi(true, Some(8)))),
            Some(Reason::DestinationTooSmall)
        );
        for (s, d) in [(csi(true, None), dir), (csi(false, None), csi(true, None))] {
            let why = check_pair(&plain, s, d).expect_err("modes differ");
            assert_eq!(why.reason, Reason::VolumeModeMismatch);
            assert!(why.message.contains("volumeMode"), "{}", why.message);
        }
    }

    #[test]
    fn fields_for_files_are_refused_on_devices_by_name() {
        let both = (csi(true, None), csi(true, None));
        for (extra, field) in [
            (
                serde_json::json!({"source": {"pvc": "a", "path": "x"}}),
                "spec.source.path",
            ),
            (serde_json::json!({"include": ["*.db"]}), "spec.include"),
            (serde_json::json!({"exclude": ["tmp/"]}), "spec.exclude"),
            (
                serde_json::json!({"deleteExtraneous": true}),
                "spec.deleteExtraneous",
            ),
            (
                serde_json::json!({"preserve": {"ownership": false}}),
                "spec.preserve",
            ),
            (serde_json::json!({"reflink": "Always"}), "reflink: Always"),
        ] {
            let why = check_pair(&job(extra), both.0, both.1).expect_err(field);
            assert_eq!(why.reason, Reason::NotForBlock);
            assert!(why.message.contains(field), "{}", why.message);
        }
        let never = job(serde_json::json!({"overwrite": "Never"}));
        let why = check_pair(&never, both.0, both.1).expect_err("the default");
        assert!(why.message.contains("overwrite: Always"), "{}", why.message);
        assert_eq!(
            reason(check_pair(&never, both.0, both.1)),
            Some(Reason::NotForBlock)
        );
        let by_time = job(serde_json::json!({"overwrite": "IfChanged"}));
        assert_eq!(
            reason(check_pair(&by_time, both.0, both.1)),
            Some(Reason::NotForBlock)
        );
        let by_hash = job(serde_json::json!({"overwrite": "IfChanged", "compare": "Checksum"}));
        assert_eq!(reason(check_pair(&by_hash, both.0, both.1)), None);
        let dot = job(serde_json::json!({"source": {"pvc": "a", "path": "."}}));
        assert_eq!(reason(check_pair(&dot, both.0, both.1)), None);
    }
}
