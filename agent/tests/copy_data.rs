//! `ferry-agent copy` moves file bytes correctly whatever the filesystems do: holes stay
//! holes, sources changing mid-copy never hang it, a full destination is reported, cross-
//! filesystem copies fall back, reflinks share extents only when allowed, and verification
//! and the manifest mean what they say.

mod common;

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A file of `size` bytes that is a hole except for `extents` (offset, length) of pattern.
fn sparse_file(path: &Path, size: u64, extents: &[(u64, u64)]) -> Result<()> {
    let f = File::create(path)?;
    f.set_len(size)?;
    for &(off, len) in extents {
        f.write_all_at(&pattern(off, len as usize), off)?;
    }
    f.sync_all()?;
    Ok(())
}

#[test]
fn sparse_1gib_files_keep_their_holes_and_their_bytes() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    sparse_file(
        &src.join("hole_at_start_data_at_end"),
        GIB,
        &[
            (64 * MIB, MIB),
            (512 * MIB + 4096, 256 * 1024),
            (GIB - 64 * 1024, 64 * 1024),
        ],
    )?;
    sparse_file(
        &src.join("data_at_start_hole_at_end"),
        GIB,
        &[(0, MIB), (300 * MIB, 8192)],
    )?;
    sparse_file(&src.join("hole_only"), GIB, &[])?;
    let before = snapshot(&src)?;
    for (name, m) in &before.entries {
        if m.kind == Kind::File {
            ensure!(
                m.blocks * 512 < 4 * MIB,
                "setup: {} is not sparse on this filesystem ({} blocks)",
                show(name),
                m.blocks
            );
        }
    }
    let dst = tmp.path().join("dst");
    let json = copy_ok([&src, &dst])?;
    // Holes are not data: at most the data extents (plus a little) may have been moved.
    let moved = num(&json, "bytes_copy_file_range")
        + num(&json, "bytes_read_write")
        + num(&json, "bytes_reflinked");
    ensure!(
        moved <= 4 * MIB,
        "holes were copied as data: {moved} bytes moved: {json}"
    );
    ensure!(
        num(&json, "bytes") == 3 * GIB,
        "bytes is the apparent size: {json}"
    );
    compare(
        &before,
        &dst,
        Check {
            blocks_slack: Some(256),
            ..Check::default()
        },
    )?;
    Ok(())
}

/// What a copy of a file another thread keeps changing may end with.
fn check_changing_copy(out: &Output, dst: &Path, name: &str, max_len: u64) -> Result<&'static str> {
    let leftovers = staging_leftovers(dst)?;
    ensure!(
        leftovers.is_empty(),
        "staging files left behind: {leftovers:?}\n{out}"
    );
    let json = out.json()?;
    match out.code {
        0 => {
            let mut f = File::open(dst.join(name)).context("copied file missing after exit 0")?;
            let mut v = Vec::new();
            f.read_to_end(&mut v)?;
            ensure!(
                v.len() as u64 <= max_len,
                "copy longer than the source ever was"
            );
            ensure!(
                v == pattern(0, v.len()),
                "exit 0 but the copy ({} bytes) is not a state the source was in",
                v.len()
            );
            Ok("consistent copy")
        }
        1 => {
            let f = failures(&json);
            ensure!(
                !f.is_empty() && f.iter().all(|(p, r)| p == name && r == "SourceChanged"),
                "exit 1 must report {name} as SourceChanged, got {f:?}\n{out}"
            );
            ensure!(
                out.failure_lines()
                    .iter()
                    .any(|l| l.starts_with("failed [SourceChanged]")),
                "stderr does not list the failure:\n{out}"
            );
            ensure!(
                !dst.join(name).exists(),
                "a partial copy is visible under the final name"
            );
            Ok("reported SourceChanged")
        }
        _ => bail!("unexpected exit code:\n{out}"),
    }
}

/// Copy `src` to fresh destinations `runs` times while `mutate` runs in a thread.
fn copy_while_changing(
    tmp: &Path,
    src: &Path,
    max_len: u64,
    runs: usize,
    mutate: impl FnOnce(Arc<AtomicBool>) -> Result<()> + Send + 'static,
) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let mutator = {
        let stop = stop.clone();
        std::thread::spawn(move || mutate(stop))
    };
    std::thread::sleep(Duration::from_millis(20));
    let mut outcomes = Vec::new();
    let mut result = Ok(());
    for i in 0..runs {
        let dst = tmp.join(format!("dst{i}"));
        let mut args: Vec<&OsStr> = vec!["--json".as_ref()];
        if i % 2 == 1 {
            args.extend([OsStr::new("--workers"), OsStr::new("4")]);
        }
        args.extend([src.as_os_str(), dst.as_os_str()]);
        let started = Instant::now();
        let run = copy(args).and_then(|out| check_changing_copy(&out, &dst, "file", max_len));
        match run {
            Ok(what) => outcomes.push(format!("{what} in {:.2?}", started.elapsed())),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&dst);
    }
    stop.store(true, Ordering::Relaxed);
    let mutated = mutator
        .join()
        .map_err(|_| anyhow::anyhow!("mutator panicked"))?;
    eprintln!("outcomes: {outcomes:?}");
    result?;
    mutated
}

#[test]
fn a_file_growing_during_the_copy_ends_consistent_or_reported_never_hangs() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let path = src.join("file");
    write_pattern_file(&path, 8 * MIB)?;
    const CAP: u64 = 320 * MIB;
    copy_while_changing(tmp.path(), &src, CAP, 4, move |stop| {
        let f = OpenOptions::new().write(true).open(&path)?;
        let mut len = f.metadata()?.len();
        let block = 512 * 1024;
        while !stop.load(Ordering::Relaxed) {
            if len + block as u64 > CAP {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            f.write_all_at(&pattern(len, block), len)?;
            len += block as u64;
            std::thread::sleep(Duration::from_micros(500));
        }
        Ok(())
    })
}

#[test]
fn a_file_shrinking_during_the_copy_ends_consistent_or_reported_never_hangs() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let path = src.join("file");
    const FULL: u64 = 200 * MIB;
    write_pattern_file(&path, FULL)?;
    copy_while_changing(tmp.path(), &src, FULL, 4, move |stop| {
        let f = OpenOptions::new().write(true).open(&path)?;
        let mut len = FULL;
        while !stop.load(Ordering::Relaxed) {
            if len <= 16 * MIB {
                // Grow back with the same bytes, so every state is a prefix of one stream.
                while len < FULL && !stop.load(Ordering::Relaxed) {
                    f.write_all_at(&pattern(len, 8 << 20), len)?;
                    len += 8 * MIB;
                }
                continue;
            }
            len -= 3 * MIB;
            f.set_len(len)?;
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    })
}

#[test]
fn copy_across_filesystems_falls_back_when_copy_file_range_says_exdev() -> Result<()> {
    let Some(shm) = shm_tempdir() else {
        eprintln!("skipped: no writable /dev/shm");
        return Ok(());
    };
    let src = shm.path().join("src");
    mkdir(&src.join("sub"))?;
    write_pattern_file(&src.join("big"), 20 * MIB + 123)?;
    write(&src.join("sub/small"), b"small file across filesystems")?;
    sparse_file(
        &src.join("sparse"),
        64 * MIB,
        &[(MIB, 4096), (40 * MIB, 64 * 1024)],
    )?;
    let disk = tempdir()?;
    ensure!(
        fs_type(shm.path())? != fs_type(disk.path())?,
        "setup: /dev/shm and the temp dir share a filesystem type"
    );
    let dst = disk.path().join("dst");
    let json = copy_and_compare(&src, &dst, &[], Check::default())?;
    let moved = num(&json, "bytes_copy_file_range") + num(&json, "bytes_read_write");
    ensure!(moved >= 20 * MIB, "data was not moved: {json}");
    eprintln!(
        "tmpfs -> disk: copy_file_range {} B, read/write {} B",
        num(&json, "bytes_copy_file_range"),
        num(&json, "bytes_read_write")
    );

    // Two separate tmpfs mounts: same filesystem type, different superblocks.
    if !require_root("mounting two tmpfs") {
        return Ok(());
    }
    let mnt = tempdir()?;
    let a = Mount::tmpfs(&mnt.path().join("a"), "128m")?;
    let b = Mount::tmpfs(&mnt.path().join("b"), "128m")?;
    let src2 = a.dir.join("src");
    sh("cp", &["-a".as_ref(), src.as_os_str(), src2.as_os_str()])?;
    let dst2 = b.dir.join("dst");
    let json = copy_and_compare(&src2, &dst2, &["--workers", "2"], Check::default())?;
    eprintln!(
        "tmpfs -> tmpfs: copy_file_range {} B, read/write {} B",
        num(&json, "bytes_copy_file_range"),
        num(&json, "bytes_read_write")
    );
    Ok(())
}

/// Loop-mount a fresh `fs` image (xfs or btrfs) of `size_mb`, or say why not.
fn loop_fs(tmp: &Path, fs: &str, size_mb: u64) -> Result<Option<Mount>> {
    if !require_root(&format!("loop-mounting {fs}")) {
        return Ok(None);
    }
    let mkfs = format!("mkfs.{fs}");
    if !require_tools(&[&mkfs, "mount", "losetup", "filefrag"]) {
        return Ok(None);
    }
    let known = std::fs::read_to_string("/proc/filesystems")?;
    if !known.split_whitespace().any(|w| w == fs) {
        eprintln!("skipped: the kernel does not list {fs} in /proc/filesystems");
        return Ok(None);
    }
    let image = tmp.join(format!("{fs}.img"));
    File::create(&image)?.set_len(size_mb * MIB)?;
    let args: Vec<&OsStr> = match fs {
        "xfs" => vec![
            "-q".as_ref(),
            "-m".as_ref(),
            "reflink=1".as_ref(),
            image.as_os_str(),
        ],
        _ => vec!["-q".as_ref(), image.as_os_str()],
    };
    sh(&mkfs, &args)?;
    match Mount::loop_image(&image, &tmp.join(fs)) {
        Ok(m) => Ok(Some(m)),
        Err(e) => {
            eprintln!("skipped: cannot loop-mount {fs}: {e:#}");
            Ok(None)
        }
    }
}

fn shared_extents(path: &Path) -> Result<bool> {
    let out = sh("filefrag", &["-v".as_ref(), path.as_os_str()])?;
    ensure!(out.contains("extent"), "unexpected filefrag output: {out}");
    Ok(out.lines().any(|l| l.contains("shared")))
}

fn reflink_on(fs: &str, size_mb: u64) -> Result<()> {
    let tmp = tempdir()?;
    let Some(mnt) = loop_fs(tmp.path(), fs, size_mb)? else {
        return Ok(());
    };
    let src = mnt.dir.join("src");
    mkdir(&src)?;
    write_pattern_file(&src.join("big"), 64 * MIB)?;
    File::open(src.join("big"))?.sync_all()?;
    ensure!(
        !shared_extents(&src.join("big"))?,
        "setup: the source already shares extents"
    );
    let check = Check {
        blocks_slack: None,
        ..Check::default()
    };

    let auto = mnt.dir.join("auto");
    let json = copy_and_compare_once(&src, &auto, &[], check)?;
    ensure!(
        num(&json, "bytes_reflinked") == 64 * MIB,
        "default reflink did not clone on {fs}: {json}"
    );
    ensure!(
        shared_extents(&auto.join("big"))?,
        "filefrag shows no shared extents after a reflink copy on {fs}"
    );

    let never = mnt.dir.join("never");
    let json = copy_and_compare_once(&src, &never, &["--reflink", "never"], check)?;
    ensure!(
        num(&json, "bytes_reflinked") == 0,
        "--reflink never reported reflinked bytes: {json}"
    );
    ensure!(
        !shared_extents(&never.join("big"))?,
        "--reflink never on {fs}: the copy shares extents with the source (implicit clone)\n{}",
        sh("filefrag", &["-v".as_ref(), never.join("big").as_os_str()])?
    );

    let always = mnt.dir.join("always");
    let json = copy_and_compare(&src, &always, &["--reflink", "always"], check)?;
    ensure!(
        num(&json, "bytes_reflinked") == 64 * MIB,
        "--reflink always on {fs}: {json}"
    );
    ensure!(shared_extents(&always.join("big"))?);
    Ok(())
}

#[test]
fn reflink_on_xfs_shares_extents_by_default_and_never_with_reflink_never() -> Result<()> {
    reflink_on("xfs", 300)
}

#[test]
fn reflink_on_btrfs_shares_extents_by_default_and_never_with_reflink_never() -> Result<()> {
    reflink_on("btrfs", 256)
}

#[test]
fn reflink_always_on_tmpfs_fails_each_file_with_reflink_unsupported() -> Result<()> {
    let Some(shm) = shm_tempdir() else {
        eprintln!("skipped: no writable /dev/shm");
        return Ok(());
    };
    let src = shm.path().join("src");
    mkdir(&src.join("sub"))?;
    write(&src.join("a"), b"cannot be cloned on tmpfs")?;
    write(&src.join("sub/b"), b"nor this one")?;
    let dst = shm.path().join("dst");
    let out = copy([
        "--json".as_ref(),
        "--reflink".as_ref(),
        "always".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    out.expect_code(1)?;
    let json = out.json()?;
    let mut f = failures(&json);
    f.sort();
    ensure!(
        f == vec![
            ("a".to_string(), "ReflinkUnsupported".to_string()),
            ("sub/b".to_string(), "ReflinkUnsupported".to_string())
        ],
        "failures: {f:?}\n{out}"
    );
    ensure!(
        out.failure_lines().len() == 2
            && out
                .failure_lines()
                .iter()
                .all(|l| l.starts_with("failed [ReflinkUnsupported]")),
        "{out}"
    );
    ensure!(
        !dst.join("a").exists() && !dst.join("sub/b").exists(),
        "files appeared although they could not be cloned"
    );
    let left = staging_leftovers(&dst)?;
    ensure!(left.is_empty(), "staging files left: {left:?}");
    Ok(())
}

#[test]
fn full_destination_reports_no_space_and_leaves_no_partial_or_staging_files() -> Result<()> {
    if !require_root("mounting a 1 MiB tmpfs") {
        return Ok(());
    }
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("sub"))?;
    for i in 0..6 {
        write_pattern_file(&src.join(format!("f{i}")), 512 * 1024 + i)?;
    }
    write_pattern_file(&src.join("sub/big"), MIB + 7)?;
    for i in 0..20 {
        write(
            &src.join(format!("sub/small{i}")),
            format!("small {i}").as_bytes(),
        )?;
    }
    let full = Mount::tmpfs(&tmp.path().join("full"), "1m")?;
    let dst = full.dir.join("dst");
    let out = copy([
        "--json".as_ref(),
        "--workers".as_ref(),
        "2".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    out.expect_code(1)?;
    let json = out.json()?;
    let reasons: Vec<String> = failures(&json).into_iter().map(|(_, r)| r).collect();
    ensure!(
        reasons.iter().any(|r| r == "DestinationFull"),
        "no DestinationFull failure: {reasons:?}\n{out}"
    );
    ensure!(
        out.stderr.contains("failed [DestinationFull]"),
        "stderr does not list the DestinationFull failure:\n{out}"
    );
    ensure!(
        out.stderr.to_lowercase().contains("full"),
        "stderr does not say the destination is full:\n{out}"
    );
    ensure!(
        json["aborted"].as_str().is_some_and(|s| s.contains("full")),
        "aborted: {json}"
    );
    let got = snapshot(&dst)?;
    let staging = staging_leftovers(&dst)?;
    ensure!(
        staging.is_empty(),
        "staging files left on the full filesystem: {staging:?}"
    );
    let mut present = 0;
    for (rel, m) in &got.entries {
        if m.kind == Kind::File {
            let a = open_rel(&src, rel, libc::O_RDONLY)?;
            let b = open_rel(&dst, rel, libc::O_RDONLY)?;
            compare_files(a, b)
                .with_context(|| format!("{} is a partial file under its final name", show(rel)))?;
            present += 1;
        }
    }
    eprintln!("{present} complete files fit; stderr:\n{}", out.stderr);
    Ok(())
}

/// A tree of regular files (no hard links) for the verification tests; returns the count.
fn verify_tree(src: &Path) -> Result<u64> {
    mkdir(&src.join("sub/deeper"))?;
    write(&src.join("empty"), b"")?;
    write(&src.join("one byte"), b"1")?;
    write_pattern_file(&src.join("three_mib"), 3 * MIB + 5)?;
    write_pattern_file(&src.join("sub/odd size"), 65537)?;
    sparse_file(
        &src.join("sub/deeper/sparse"),
        16 * MIB,
        &[(MIB, 4096), (16 * MIB - 10, 10)],
    )?;
    for i in 0..30 {
        write(
            &src.join(format!("sub/deeper/n{i}")),
            &pattern(i * 13, (i * 97) as usize),
        )?;
    }
    Ok(35)
}

/// A copy of `verify_tree` with `--verify MODE` counts every file as verified.
fn every_file_is_verified_with(mode: &str) -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    let n = verify_tree(&src)?;
    let json = copy_and_compare(
        &src,
        &tmp.path().join("dst"),
        &["--verify", mode],
        Check::default(),
    )?;
    ensure!(
        num(&json, "files") == n && num(&json, "verified") == n,
        "{json}"
    );
    Ok(())
}

#[test]
fn verify_checksum_reports_every_file_verified() -> Result<()> {
    every_file_is_verified_with("checksum")
}

#[test]
fn verify_full_reports_every_file_verified() -> Result<()> {
    every_file_is_verified_with("full")
}

/// Undo the GNU-style escape of a manifest line that starts with a backslash.
fn unescape(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut it = name.iter();
    while let Some(&b) = it.next() {
        if b == b'\\' {
            match it.next() {
                Some(b'n') => out.push(b'\n'),
                Some(b'\\') => out.push(b'\\'),
                Some(&o) => out.extend([b'\\', o]),
                None => out.push(b'\\'),
            }
        } else {
            out.push(b);
        }
    }
    out
}

#[test]
fn manifest_is_accepted_by_xxh128sum_check_inside_the_destination() -> Result<()> {
    if !require_tools(&["xxh128sum"]) {
        return Ok(());
    }
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("sub dir"))?;
    let names: &[&[u8]] = &[
        b"plain",
        b"with space",
        b"back\\slash",
        b"sub dir/nested file",
        b"new\nline",
        b"empty",
        b"link1",
        b"large",
    ];
    for n in names {
        if *n == b"empty" {
            write(&bytes_path(&src, n), b"")?;
        } else if *n == b"large" {
            // Past the hash's 240-byte short path and across several of the copy's 1 MiB
            // reads, so the streamed, vectorised long path is what xxh128sum checks.
            write(&bytes_path(&src, n), &pattern((3 << 20) + 17, 7))?;
        } else if *n != b"link1" {
            write(
                &bytes_path(&src, n),
                &pattern(n.len() as u64, 1000 + n.len()),
            )?;
        }
    }
    std::fs::hard_link(src.join("plain"), src.join("link1"))?;
    let dst = tmp.path().join("dst");
    let manifest = tmp.path().join("manifest.xxh128");
    copy_and_compare(
        &src,
        &dst,
        &["--manifest", manifest.to_str().context("utf-8 temp path")?],
        Check::default(),
    )?;
    let text = std::fs::read(&manifest)?;

    // Every file is listed exactly once, under its path relative to DST.
    let mut listed: Vec<(String, Vec<u8>)> = Vec::new();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let (escaped, line) = match line.strip_prefix(b"\\") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let hash = String::from_utf8_lossy(&line[..32]).into_owned();
        ensure!(
            &line[32..34] == b"  ",
            "malformed manifest line: {}",
            show(line)
        );
        let name = if escaped {
            unescape(&line[34..])
        } else {
            line[34..].to_vec()
        };
        listed.push((hash, name));
    }
    let mut got: Vec<Vec<u8>> = listed.iter().map(|(_, n)| n.clone()).collect();
    got.sort();
    let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
    want.sort();
    ensure!(
        got == want,
        "manifest lists {:?}, want {:?}",
        got.iter().map(|n| show(n)).collect::<Vec<_>>(),
        want.iter().map(|n| show(n)).collect::<Vec<_>>()
    );

    // `cd DST && xxh128sum -c MANIFEST`.
    let out = std::process::Command::new("xxh128sum")
        .arg("-c")
        .arg(&manifest)
        .current_dir(&dst)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for n in names.iter().filter(|n| !n.contains(&b'\n')) {
        let want = format!("{}: OK", String::from_utf8_lossy(n));
        ensure!(
            stdout.lines().any(|l| l == want),
            "xxh128sum -c did not confirm {want:?}:\n{stdout}\n{stderr}"
        );
    }
    ensure!(
        !stdout.contains("FAILED") && !stderr.contains("FAILED"),
        "xxh128sum -c found a mismatch:\n{stdout}\n{stderr}"
    );
    ensure!(
        out.status.success(),
        "xxh128sum -c failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let newline_ok = stdout.lines().any(|l| l.contains("line: OK"));
    if !newline_ok {
        // xxh128sum 0.8.1 has no escape syntax for names with a newline: it skips the
        // escaped line as improperly formatted. Check that line's hash ourselves.
        eprintln!(
            "note: this xxh128sum cannot check the name with a newline ({}); checked by hand",
            format!("{stdout}{stderr}")
                .lines()
                .filter(|l| !l.ends_with(": OK"))
                .collect::<Vec<_>>()
                .join("; ")
        );
        let (hash, _) = listed
            .iter()
            .find(|(_, n)| n == b"new\nline")
            .context("newline entry")?;
        let mut child = std::process::Command::new("xxh128sum")
            .stdin(File::open(bytes_path(&dst, b"new\nline"))?)
            .output()?;
        child.stdout.truncate(32);
        ensure!(
            String::from_utf8_lossy(&child.stdout) == *hash,
            "manifest hash of the newline name is wrong"
        );
    }
    Ok(())
}
