//! Kernel answers that cannot be summoned on demand, injected at the engine's syscall seam:
//! each must end in a correct copy (fallback) or a clear per-file failure, never a partial
//! file under its final name.

use std::fs;
use std::path::Path;

use ferry_engine::{copy, Faults, NoProgress, Options, Reason, Reflink, Verify};

fn tree(root: &Path) -> std::io::Result<()> {
    fs::create_dir_all(root.join("a/b"))?;
    for i in 0..50u32 {
        let body: Vec<u8> = (0..(i * 997)).map(|x| (x % 251) as u8).collect();
        fs::write(root.join(format!("a/f{i}")), &body)?;
    }
    fs::write(root.join("a/b/big"), vec![7u8; 3 << 20])?;
    fs::write(root.join("empty"), b"")?;
    Ok(())
}

fn assert_same_files(src: &Path, dst: &Path) {
    for rel in ["a/f0", "a/f1", "a/f49", "a/b/big", "empty"] {
        let a = fs::read(src.join(rel)).expect("read source");
        let b = fs::read(dst.join(rel)).expect("read destination");
        assert!(a == b, "{rel} differs after copy");
    }
}

fn no_staging_left(dir: &Path) -> bool {
    walk(dir)
        .iter()
        .all(|p| !p.to_string_lossy().contains(".ferry-"))
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

fn run(faults: Faults, verify: Verify) -> (tempfile::TempDir, ferry_engine::Summary) {
    let tmp = tempfile::tempdir().expect("tempdir");
    tree(&tmp.path().join("src")).expect("build tree");
    let opts = Options {
        faults,
        verify,
        workers: 2,
        ..Options::default()
    };
    let summary = copy(
        &tmp.path().join("src"),
        &tmp.path().join("dst"),
        &opts,
        &NoProgress,
    )
    .expect("copy starts");
    (tmp, summary)
}

#[test]
fn copy_file_range_returning_zero_falls_back_to_read_write() {
    let (tmp, s) = run(
        Faults {
            copy_file_range_returns_zero: true,
            ..Faults::default()
        },
        Verify::None,
    );
    assert_eq!(s.failed, 0, "{:?}", s.failures);
    assert_same_files(&tmp.path().join("src"), &tmp.path().join("dst"));
    assert_eq!(s.bytes_copy_file_range, 0);
    assert!(s.bytes_read_write > 0);
}

#[test]
fn copy_file_range_exdev_enosys_eperm_fall_back_to_read_write() {
    for errno in [
        libc::EXDEV,
        libc::ENOSYS,
        libc::EPERM,
        libc::EOPNOTSUPP,
        libc::EINVAL,
    ] {
        let (tmp, s) = run(
            Faults {
                copy_file_range_errno: Some(errno),
                ..Faults::default()
            },
            Verify::None,
        );
        assert_eq!(s.failed, 0, "errno {errno}: {:?}", s.failures);
        assert_same_files(&tmp.path().join("src"), &tmp.path().join("dst"));
        assert_eq!(s.bytes_copy_file_range, 0, "errno {errno}");
    }
}

#[test]
fn copy_file_range_eio_fails_the_file_and_leaves_no_partial_file() {
    let (tmp, s) = run(
        Faults {
            copy_file_range_errno: Some(libc::EIO),
            ..Faults::default()
        },
        Verify::None,
    );
    assert!(s.failed > 0);
    assert!(
        s.failures.iter().all(|f| f.kind == Reason::IOError),
        "{:?}",
        s.failures
    );
    assert!(
        !tmp.path().join("dst/a/f1").exists(),
        "failed file visible under its final name"
    );
    assert!(no_staging_left(&tmp.path().join("dst")));
}

#[test]
fn ficlone_unsupported_or_refused_per_file_still_copies() {
    for errno in [libc::EOPNOTSUPP, libc::EXDEV, libc::EINVAL, libc::ETXTBSY] {
        let (tmp, s) = run(
            Faults {
                ficlone_errno: Some(errno),
                ..Faults::default()
            },
            Verify::None,
        );
        assert_eq!(s.failed, 0, "errno {errno}: {:?}", s.failures);
        assert_eq!(s.bytes_reflinked, 0);
        assert_same_files(&tmp.path().join("src"), &tmp.path().join("dst"));
    }
}

#[test]
fn reflink_always_without_clone_support_fails_each_file_clearly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    tree(&tmp.path().join("src")).expect("tree");
    let opts = Options {
        reflink: Reflink::Always,
        faults: Faults {
            ficlone_errno: Some(libc::EOPNOTSUPP),
            ..Faults::default()
        },
        // Off, as when this test was written: a hash would force read/write past the
        // kernel copy paths it is about (see common::unverified in the other tests).
        verify: Verify::None,
        ..Options::default()
    };
    let s = copy(
        &tmp.path().join("src"),
        &tmp.path().join("dst"),
        &opts,
        &NoProgress,
    )
    .expect("copy starts");
    assert!(s.failed > 0);
    assert!(
        s.failures
            .iter()
            .all(|f| f.kind == Reason::ReflinkUnsupported),
        "{:?}",
        s.failures
    );
    assert!(
        s.failures[0].message.contains("auto"),
        "message should say what to change: {}",
        s.failures[0].message
    );
    assert!(no_staging_left(&tmp.path().join("dst")));
}

#[test]
fn corrupted_destination_fails_checksum_verification_and_is_not_committed() {
    for verify in [Verify::Checksum, Verify::Full] {
        let faults = Faults {
            corrupt_after_write: Some(b"f7".to_vec()),
            ..Faults::default()
        };
        let (tmp, s) = run(faults, verify);
        assert_eq!(s.failed, 1, "{:?}", s.failures);
        assert_eq!(s.failures[0].kind, Reason::ChecksumMismatch);
        assert_eq!(s.failures[0].path, Path::new("a/f7"));
        assert!(
            !tmp.path().join("dst/a/f7").exists(),
            "corrupt file committed"
        );
        assert_eq!(s.verified, s.files, "every committed file was verified");
        assert!(no_staging_left(&tmp.path().join("dst")));
    }
}

#[test]
fn verification_off_does_not_notice_corruption_which_is_why_it_exists() {
    let faults = Faults {
        corrupt_after_write: Some(b"f7".to_vec()),
        ..Faults::default()
    };
    let (tmp, s) = run(faults, Verify::None);
    assert_eq!(s.failed, 0);
    assert_eq!(s.verified, 0);
    assert_ne!(
        fs::read(tmp.path().join("src/a/f7")).ok(),
        fs::read(tmp.path().join("dst/a/f7")).ok()
    );
}

#[test]
fn plan_counts_what_a_copy_would_carry_and_copies_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    tree(&src).expect("tree");
    std::os::unix::fs::symlink("/etc", src.join("a/outside")).expect("symlink");
    let t = ferry_engine::plan(&src).expect("plan");
    let expected_bytes: u64 = (0..50u64).map(|i| i * 997).sum::<u64>() + (3 << 20);
    assert_eq!(
        (t.files, t.bytes, t.dirs, t.others),
        (52, expected_bytes, 3, 1)
    );
    assert_eq!(
        fs::read_dir(tmp.path()).expect("ls").count(),
        1,
        "plan wrote something"
    );
}
