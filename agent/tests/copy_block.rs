//! `ferry-agent copy-block` as a user runs it: an image copied byte for byte with its zeros
//! left as holes, the manifest it writes checked against the copy, a re-run after a change
//! that writes only the changed chunk (and reads nothing of DST with `--kept`), and each
//! flag combination that cannot mean anything refused with what to change (exit 2).

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-agent");
const CHUNK: u64 = 4 << 20;

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Result<Output> {
    let mut cmd = Command::new(BIN);
    cmd.arg("copy-block");
    for a in args {
        cmd.arg(a);
    }
    cmd.output().context("run ferry-agent copy-block")
}

/// The number after `label` in the report line ("... 3 written, ...").
fn count(out: &Output, label: &str) -> Result<u64> {
    let text = String::from_utf8_lossy(&out.stdout);
    let before = text
        .split(label)
        .next()
        .filter(|b| b.len() < text.len())
        .with_context(|| format!("no {label:?} in {text:?}"))?;
    let n = before.split_whitespace().last().context("a number")?;
    Ok(n.parse()?)
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn same(a: &Path, b: &Path) -> Result<bool> {
    Ok(std::fs::read(a)? == std::fs::read(b)?)
}

#[test]
fn an_image_is_copied_then_only_its_changed_chunk_is_written_again() -> Result<()> {
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
    let (src, dst) = (dir.path().join("disk.img"), dir.path().join("copy.img"));
    let manifest = dir.path().join("copy.manifest");
    let f = File::create(&src)?;
    f.set_len(8 * CHUNK)?;
    for c in [0, 3, 5] {
        f.write_all_at(&noise(c, CHUNK as usize), c * CHUNK)?;
    }
    let out = run(&[&src, &dst, &"--manifest", &manifest])?;
    ensure!(out.status.success(), "{out:?}");
    ensure!(same(&src, &dst)?, "the copy differs");
    ensure!(
        (count(&out, " written")?, count(&out, " punched")?) == (3, 5),
        "{out:?}"
    );
    let allocated = std::fs::metadata(&dst)?.blocks() * 512;
    ensure!(
        allocated <= 3 * CHUNK + (1 << 20),
        "{allocated} bytes allocated for 3 chunks of data"
    );
    let text = std::fs::read_to_string(&manifest)?;
    let device = text
        .lines()
        .nth(3)
        .and_then(|l| l.strip_prefix("device "))
        .context("device line")?;
    ensure!(
        String::from_utf8_lossy(&out.stdout).contains(device),
        "the report names the manifest's device hash"
    );

    // 100 bytes changed inside chunk 5: one chunk written, nothing of DST read with --kept.
    f.write_all_at(&noise(9, 100), 5 * CHUNK + 1000)?;
    let rerun = ["--overwrite", "if-changed", "--compare", "checksum"];
    let out = run(&[
        &src,
        &dst,
        &rerun[0],
        &rerun[1],
        &rerun[2],
        &rerun[3],
        &"--kept",
        &manifest,
        &"--manifest",
        &manifest,
    ])?;
    ensure!(out.status.success(), "{out:?}");
    ensure!(same(&src, &dst)?, "the re-run's copy differs");
    ensure!(
        (count(&out, " written")?, count(&out, " unchanged")?) == (1, 7),
        "{out:?}"
    );
    ensure!(count(&out, " of the destination")? == 0, "{out:?}");
    // Without --kept the destination is read, and nothing differs now.
    let out = run(&[&src, &dst, &rerun[0], &rerun[1], &rerun[2], &rerun[3]])?;
    ensure!(
        (
            count(&out, " written")?,
            count(&out, " of the destination")?
        ) == (0, 8 * CHUNK),
        "{out:?}"
    );
    Ok(())
}

#[test]
fn changed_ranges_given_with_the_kept_manifest_are_all_that_is_read() -> Result<()> {
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
    let (src, dst) = (dir.path().join("disk.img"), dir.path().join("copy.img"));
    let (manifest, ranges) = (dir.path().join("m"), dir.path().join("ranges"));
    let f = File::create(&src)?;
    f.set_len(8 * CHUNK)?;
    for c in 0..8 {
        f.write_all_at(&noise(c, CHUNK as usize), c * CHUNK)?;
    }
    let out = run(&[&src, &dst, &"--manifest", &manifest])?;
    ensure!(out.status.success(), "{out:?}");
    // 64 KiB changed in chunks 2 and 6, and the ranges say so.
    for c in [2, 6] {
        f.write_all_at(&noise(c + 50, 65536), c * CHUNK + 8192)?;
    }
    std::fs::write(
        &ranges,
        format!("{} 65536\n{} 65536\n", 6 * CHUNK + 8192, 2 * CHUNK + 8192),
    )?;
    let rerun = ["--overwrite", "if-changed", "--compare", "checksum"];
    let by_ranges = || {
        run(&[
            &src,
            &dst,
            &rerun[0],
            &rerun[1],
            &rerun[2],
            &rerun[3],
            &"--kept",
            &manifest,
            &"--changed",
            &ranges,
        ])
    };
    let out = by_ranges()?;
    ensure!(out.status.success(), "{out:?}");
    ensure!(same(&src, &dst)?, "the copy by changed ranges differs");
    ensure!(
        (
            count(&out, " written")?,
            count(&out, " bytes of the source")?,
            count(&out, " of the destination")?
        ) == (2, 2 * CHUNK, 0),
        "{out:?}"
    );
    // A line that is not `offset length`, and --changed without --kept: refused (exit 2).
    std::fs::write(&ranges, "12 banana\n")?;
    let out = by_ranges()?;
    ensure!(
        out.status.code() == Some(2)
            && String::from_utf8_lossy(&out.stderr).contains("offset length"),
        "{out:?}"
    );
    let out = run(&[
        &src,
        &dst,
        &rerun[0],
        &rerun[1],
        &rerun[2],
        &rerun[3],
        &"--changed",
        &ranges,
    ])?;
    ensure!(out.status.code() == Some(2), "{out:?}");
    Ok(())
}

#[test]
fn a_killed_copy_run_again_resumes_from_its_journal() -> Result<()> {
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
    let (src, dst) = (dir.path().join("disk.img"), dir.path().join("copy.img"));
    let journal = dir.path().join("journal");
    let f = File::create(&src)?;
    f.set_len(64 * CHUNK)?;
    for c in 0..64 {
        f.write_all_at(&noise(c + 1, 4096), c * CHUNK)?;
    }
    // 20 ms a chunk, one worker: about 1.3 s in all; killed once the journal lists chunks.
    let mut child = Command::new(BIN)
        .args(["copy-block", "-w", "1", "--journal"])
        .args([&journal, &src, &dst])
        .env("FERRY_FAULT_CHUNK_DELAY_MS", "20")
        .spawn()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_to_string(&journal)
        .unwrap_or_default()
        .lines()
        .count()
        < 3 + 16
    {
        ensure!(
            std::time::Instant::now() < deadline,
            "the journal listed no chunk"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill()?;
    child.wait()?;
    ensure!(journal.exists(), "the copy ended before it was killed");

    let out = run(&[&"--journal", &journal, &src, &dst])?;
    ensure!(out.status.success(), "{out:?}");
    ensure!(same(&src, &dst)?, "the resumed copy differs");
    let resumed = count(&out, " resumed")?;
    ensure!((16..64).contains(&resumed), "{resumed} resumed: {out:?}");
    ensure!(count(&out, " written")? == 64 - resumed, "{out:?}");
    ensure!(
        !journal.exists(),
        "the journal is removed once the copy is complete"
    );
    Ok(())
}

#[test]
fn flags_that_mean_nothing_for_a_device_are_refused_with_what_to_change() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("disk.img");
    File::create(&src)?.set_len(CHUNK)?;
    let dst = dir.path().join("copy.img");
    let bad = dir.path().join("bad.manifest");
    std::fs::write(&bad, "not a manifest\n")?;
    for (flags, says) in [
        (vec!["--overwrite", "if-changed"], "--compare checksum"),
        (vec!["--compare", "checksum"], "add --overwrite if-changed"),
        (vec!["--overwrite", "never"], "use always"),
        (
            vec!["--verify", "full", "--cache", "buffered"],
            "use --cache direct",
        ),
        (
            vec!["--kept", bad.to_str().context("utf-8")?],
            "add --overwrite if-changed",
        ),
        (
            vec![
                "--overwrite",
                "if-changed",
                "--compare",
                "checksum",
                "--kept",
                bad.to_str().context("utf-8")?,
            ],
            "not a block manifest",
        ),
        (vec!["--chunk", "1000"], "power of two"),
    ] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&src, &dst];
        for f in &flags {
            args.push(f);
        }
        let out = run(&args)?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(2) && err.contains(says),
            "{flags:?}: {out:?}"
        );
    }
    ensure!(!dst.exists(), "nothing copied by a refused run");
    let out = run(&[&dir.path(), &dst])?;
    ensure!(
        out.status.code() == Some(2)
            && String::from_utf8_lossy(&out.stderr).contains("is a directory"),
        "{out:?}"
    );
    Ok(())
}
