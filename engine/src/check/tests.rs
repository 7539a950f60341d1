//! `check_beneath` on a real tree: a copy's manifest matched file for file, each kind of
//! difference named, device nodes and FIFOs never opened, hostile manifests refused.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;
use crate::{NoProgress, Options, Verify};

const UID: &str = "0d6e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";

fn manifest_name() -> String {
    format!("{UID}.xxh128")
}

/// A tree copied by the engine into `root/dst` with its manifest in `root/.ferry/`, as
/// an agent's copy leaves it.
fn copied(root: &Path) -> anyhow::Result<()> {
    let src = root.join("src");
    std::fs::create_dir_all(src.join("a/b"))?;
    for i in 0..50u32 {
        let dir = ["", "a", "a/b"][i as usize % 3];
        std::fs::write(
            src.join(dir).join(format!("f{i}")),
            vec![i as u8; 100 * i as usize],
        )?;
    }
    std::fs::write(src.join("new\nline"), b"a name with a newline")?;
    std::fs::create_dir_all(root.join(".ferry"))?;
    let opts = Options {
        verify: Verify::Checksum,
        manifest: Some(root.join(".ferry").join(manifest_name())),
        ..Options::default()
    };
    let s = crate::copy(&src, &root.join("dst"), &opts, &NoProgress)?;
    anyhow::ensure!(s.failures.is_empty() && s.files == 51, "{s:?}");
    Ok(())
}

fn check(root: &Path, top: &str) -> Result<Checked, Error> {
    let dir = File::open(root).expect("open root");
    check_beneath(
        dir.as_fd(),
        Path::new(top),
        &manifest_name(),
        &CheckOptions::default(),
        &NoProgress,
    )
}

fn reasons(c: &Checked) -> Vec<(String, Reason)> {
    let mut v: Vec<_> = c
        .failures
        .iter()
        .map(|f| (f.path.to_string_lossy().into_owned(), f.kind))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn an_untouched_copy_matches_its_manifest_file_for_file() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    copied(tmp.path())?;
    let c = check(tmp.path(), "dst")?;
    assert_eq!(
        (c.listed, c.matched, c.failures.len()),
        (51, 51, 0),
        "{c:?}"
    );
    let bytes: u64 = (0..50u64).map(|i| 100 * i).sum::<u64>() + 21;
    assert_eq!(c.bytes, bytes);
    Ok(())
}

#[test]
fn changed_missing_grown_and_swapped_files_are_each_named_and_nothing_special_is_opened(
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    copied(root)?;
    let dst = root.join("dst");
    // One byte changed in place, size kept.
    let mut bytes = std::fs::read(dst.join("f3"))?;
    bytes[10] ^= 1;
    std::fs::write(dst.join("f3"), &bytes)?;
    // Grown by a byte.
    let mut grown = std::fs::read(dst.join("a/f4"))?;
    grown.push(0);
    std::fs::write(dst.join("a/f4"), &grown)?;
    std::fs::remove_file(dst.join("a/b/f5"))?;
    // A symlink where a file was (to a file that would match: never followed).
    std::fs::remove_file(dst.join("f6"))?;
    symlink(root.join("src/f6"), dst.join("f6"))?;
    // A FIFO where a file was: opening it would block the check for ever.
    std::fs::remove_file(dst.join("f9"))?;
    let d = File::open(&dst)?;
    sys::mknodat(d.as_fd(), c"f9", libc::S_IFIFO | 0o600, 0)?;
    // A directory on the way replaced by a symlink to a copy of it.
    std::fs::rename(dst.join("a/b"), root.join("elsewhere"))?;
    symlink(root.join("elsewhere"), dst.join("a/b"))?;
    let c = check(root, "dst")?;
    let failed = reasons(&c);
    for (path, reason) in [
        ("f3", Reason::ChecksumMismatch),
        ("a/f4", Reason::ChecksumMismatch),
        ("f6", Reason::DestinationConflict),
        ("f9", Reason::DestinationConflict),
    ] {
        assert!(
            failed.contains(&(path.into(), reason)),
            "{path}: {failed:?}"
        );
    }
    // Every file under a/b: reached through a symlink (f5 among them, not reported missing).
    let under_b = (0..50).filter(|i| i % 3 == 2).count() as u64;
    assert!(
        failed.contains(&("a/b/f5".into(), Reason::DestinationConflict)),
        "{failed:?}"
    );
    assert_eq!(
        (c.changed, c.not_regular, c.missing),
        (2, 2 + under_b, 0),
        "{c:?}"
    );
    assert_eq!(c.matched, 51 - 4 - under_b);
    // Put back, a/b/f5 is missing.
    std::fs::remove_file(dst.join("a/b"))?;
    std::fs::rename(root.join("elsewhere"), dst.join("a/b"))?;
    let c = check(root, "dst")?;
    assert!(
        reasons(&c).contains(&("a/b/f5".into(), Reason::NotFound)),
        "{c:?}"
    );
    assert_eq!(c.missing, 1);
    Ok(())
}

#[test]
fn a_device_node_where_a_file_was_listed_is_reported_and_never_opened() -> anyhow::Result<()> {
    if sys::geteuid() == 0 {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path();
        copied(root)?;
        let dst = root.join("dst");
        std::fs::remove_file(dst.join("f12"))?;
        let d = File::open(&dst)?;
        // /dev/watchdog's numbers (10, 130): opening it would arm a node's watchdog.
        sys::mknodat(
            d.as_fd(),
            c"f12",
            libc::S_IFCHR | 0o600,
            libc::makedev(10, 130),
        )?;
        let c = check(root, "dst")?;
        let failed = reasons(&c);
        assert!(
            failed.contains(&("f12".into(), Reason::DestinationConflict)),
            "{failed:?}"
        );
        let f = c.failures.iter().find(|f| f.path == Path::new("f12"));
        assert!(
            f.is_some_and(|f| f.message.contains("character device")),
            "{c:?}"
        );
    } else {
        eprintln!("skipped: making a device node needs root (CI runs as root)");
    }
    Ok(())
}

#[test]
fn a_manifest_ferry_would_not_write_ends_the_check_with_what_is_wrong() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    copied(root)?;
    let at = root.join(".ferry").join(manifest_name());
    let good = std::fs::read(&at)?;
    let hash = "0123456789abcdef0123456789abcdef";
    let rows: Vec<(&str, Vec<u8>, &str)> = vec![
        ("a 1 MiB line", vec![b'a'; 1 << 20], "longer than"),
        (
            "a path with ..",
            format!("{hash}  ../src/f1\n").into_bytes(),
            "not a path inside",
        ),
        (
            "an absolute path",
            format!("{hash}  /etc/shadow\n").into_bytes(),
            "not a path inside",
        ),
        (
            "a last line cut short",
            [good.clone(), format!("{hash}  f1").into_bytes()].concat(),
            "cut short",
        ),
        (
            "not a line at all",
            b"hello\n".to_vec(),
            "not a hash and a path",
        ),
    ];
    for (what, text, says) in rows {
        std::fs::write(&at, &text)?;
        let err = check(root, "dst").expect_err(what);
        assert!(err.to_string().contains(says), "{what}: {err}");
    }
    // A path listed twice is read once.
    std::fs::write(&at, [good.clone(), good.clone()].concat())?;
    let c = check(root, "dst")?;
    assert_eq!((c.listed, c.matched), (51, 51), "{c:?}");
    // A FIFO planted as the manifest: refused, not waited on.
    std::fs::remove_file(&at)?;
    let ferry = File::open(root.join(".ferry"))?;
    let name = CString::new(manifest_name())?;
    sys::mknodat(ferry.as_fd(), &name, libc::S_IFIFO | 0o600, 0)?;
    let err = check(root, "dst").expect_err("a FIFO");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    // A symlink as the manifest, or as .ferry, to a real manifest: never followed.
    std::fs::remove_file(&at)?;
    std::fs::write(root.join("real"), &good)?;
    symlink(root.join("real"), &at)?;
    let err = check(root, "dst").expect_err("a symlinked manifest");
    assert!(err.to_string().contains("symlink"), "{err}");
    std::fs::remove_file(&at)?;
    std::fs::rename(root.join(".ferry"), root.join("state"))?;
    std::fs::rename(root.join("real"), root.join("state").join(manifest_name()))?;
    symlink(root.join("state"), root.join(".ferry"))?;
    let err = check(root, "dst").expect_err("a symlinked .ferry");
    assert!(err.to_string().contains("symlink"), "{err}");
    // None there: says what to name.
    std::fs::remove_file(root.join(".ferry"))?;
    let err = check(root, "dst").expect_err("no manifest");
    assert!(err.to_string().contains("status.manifest"), "{err}");
    Ok(())
}

#[test]
fn a_copy_of_one_file_is_checked_by_its_name() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    std::fs::write(root.join("one"), vec![7u8; 5000])?;
    std::fs::create_dir_all(root.join(".ferry"))?;
    let opts = Options {
        verify: Verify::Checksum,
        manifest: Some(root.join(".ferry").join(manifest_name())),
        ..Options::default()
    };
    crate::copy(&root.join("one"), &root.join("copy"), &opts, &NoProgress)?;
    let c = check(root, "copy")?;
    assert_eq!((c.listed, c.matched, c.bytes), (1, 1, 5000), "{c:?}");
    std::fs::write(root.join("copy"), vec![8u8; 5000])?;
    let c = check(root, "copy")?;
    assert_eq!(c.changed, 1, "{c:?}");
    Ok(())
}

#[test]
fn a_cancelled_check_stops_and_says_so() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    copied(tmp.path())?;
    let dir = File::open(tmp.path())?;
    let cancel = Arc::new(AtomicBool::new(true));
    let opts = CheckOptions {
        workers: 2,
        cancel: Some(cancel),
    };
    let c = check_beneath(
        dir.as_fd(),
        Path::new("dst"),
        &manifest_name(),
        &opts,
        &NoProgress,
    )?;
    assert!(
        c.cancelled && c.matched == 0 && c.failures.is_empty(),
        "{c:?}"
    );
    Ok(())
}
