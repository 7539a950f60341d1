//! Re-runs between the two halves (`send` and `copy_from`) with `compare: Checksum` over a
//! destination that has every file, some of them changed since in a few places: a large
//! file is mended from the destination's own copy and the chunks that differ (holes in
//! them punched), sending a small part of it; one changed all over, and a small one, are
//! sent whole; a chunk changed on the way is caught by the whole-file check and the file
//! sent whole; the result is identical to the source and listed in the manifest.

mod common;

use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use common::*;
use ferry_engine::recv::Connection;
use ferry_engine::send::{serve, SendOptions, SourceTop};
use ferry_engine::{copy_from, Compare, NoProgress, Options, Overwrite, Summary, Verify};

const MIB: u64 = 1 << 20;

/// One copy of `src` into `dst` between the halves: its summary and the file bytes that
/// crossed (data, inline files and chunk hashes).
fn across(src: &Path, dst: &Path, opts: &Options, send: SendOptions) -> Result<(Summary, u64)> {
    let top = SourceTop::open(src)?;
    let (ours, theirs) = UnixStream::pair()?;
    let sender = {
        let r = theirs.try_clone()?;
        std::thread::spawn(move || serve(&top, r, theirs, &send))
    };
    let conn: Arc<Connection> = Connection::start(ours.try_clone()?, ours.try_clone()?)?;
    let result = copy_from(&conn, src, dst, opts, &NoProgress);
    let received = conn.bytes_received();
    drop(conn);
    let _ = ours.shutdown(std::net::Shutdown::Both);
    let _ = sender.join();
    Ok((result?, received))
}

fn rerun() -> Options {
    Options {
        overwrite: Overwrite::IfChanged,
        compare: Compare::Checksum,
        verify: Verify::Checksum,
        workers: 2,
        ..Options::default()
    }
}

/// Write `bytes` at `offset` of the file at `path`, keeping its size.
fn poke(path: &Path, offset: u64, bytes: &[u8]) -> Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all_at(bytes, offset)?;
    Ok(())
}

#[test]
fn a_file_changed_in_a_few_places_is_mended_sending_only_its_changed_chunks() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let disk = src.join("disk.img");
    write_pattern_file(&disk, 64 * MIB)?;
    write_pattern_file(&src.join("rewritten"), 8 * MIB)?;
    write_pattern_file(&src.join("small"), 300 << 10)?;
    // Sparse: data at 0 and at 8 MiB, holes elsewhere.
    let sparse = src.join("sparse.img");
    {
        let f = std::fs::File::create(&sparse)?;
        f.set_len(16 * MIB)?;
        f.write_all_at(&pattern(0, MIB as usize), 0)?;
        f.write_all_at(&pattern(8 * MIB, MIB as usize), 8 * MIB)?;
    }
    let dst = tmp.path().join("dst");
    let first = Options {
        verify: Verify::Checksum,
        workers: 2,
        ..Options::default()
    };
    let (s, _) = across(&src, &dst, &first, SendOptions::default())?;
    ensure!(s.failed == 0 && s.files == 4, "{s:?}");

    // A few bytes in three places of the large file (two in one chunk), all of the
    // rewritten one, one byte of the small one; in the sparse one, data where a hole was
    // and a hole punched into data.
    poke(&disk, 5, b"hello")?;
    poke(&disk, 100, b"again")?;
    poke(&disk, 30 * MIB + 7, b"\x00\x01\x02")?;
    poke(&disk, 64 * MIB - 1, b"!")?;
    let changed: Vec<u8> = pattern(0, 8 * MIB as usize).iter().map(|b| !b).collect();
    std::fs::write(src.join("rewritten"), changed)?;
    poke(&src.join("small"), 1000, b"x")?;
    poke(&sparse, 4 * MIB + 10, b"data in a hole")?;
    sh(
        "fallocate",
        &[
            "-p".as_ref(),
            "-o".as_ref(),
            (MIB / 2).to_string().as_ref(),
            "-l".as_ref(),
            "65536".as_ref(),
            sparse.as_os_str(),
        ],
    )
    .context("punch a hole into the source")?;
    let before = snapshot(&src)?;

    let opts = Options {
        manifest: Some(tmp.path().join("manifest")),
        ..rerun()
    };
    let (s, received) = across(&src, &dst, &opts, SendOptions::default())?;
    ensure!(s.failed == 0, "{s:?}");
    compare(&before, &dst, Check::default())?;
    // The large and the sparse file mended; the rewritten one (every chunk differs) and
    // the small one sent whole.
    ensure!(s.patched == 2, "patched {} files: {s:?}", s.patched);
    ensure!(s.files == 4, "{s:?}");
    // The large file: three chunks of 64 KiB and its chunk hashes (16 bytes per chunk);
    // the sparse one: two chunks and its hashes; the other two whole.
    let chunk = 64 << 10;
    let want = 3 * chunk + (64 * MIB / chunk) * 16 + 2 * chunk + (16 * MIB / chunk) * 16;
    let whole = 8 * MIB + (300 << 10);
    eprintln!(
        "received {received} bytes: {} for the two mended files of 80 MiB",
        received - whole
    );
    ensure!(
        received >= whole && received - whole <= want,
        "received {received} bytes, {} for the mended files (at most {want})",
        received.saturating_sub(whole)
    );
    ensure!(
        (received - whole) as f64 <= 0.01 * (64 * MIB) as f64,
        "the mended files cost more than 1% of the large one"
    );
    xxh128sum_check(&dst, &tmp.path().join("manifest"))?;

    // Nothing changed since: nothing mended, nothing sent but the hashes.
    let (s, received) = across(&src, &dst, &rerun(), SendOptions::default())?;
    ensure!(s.patched == 0 && s.files == 0 && s.failed == 0, "{s:?}");
    ensure!(
        received < MIB,
        "an unchanged re-run received {received} bytes"
    );
    // (The comparison above read both trees, which moved their atimes under relatime; a
    // re-run does not give a kept file its source's atime.)
    let check = Check {
        atime: false,
        ..Check::default()
    };
    compare(&before, &dst, check)?;
    Ok(())
}

#[test]
fn a_chunk_changed_on_the_way_fails_the_whole_file_check_and_the_file_is_sent_whole() -> Result<()>
{
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let disk = src.join("disk.img");
    write_pattern_file(&disk, 16 * MIB)?;
    let dst = tmp.path().join("dst");
    let (s, _) = across(&src, &dst, &rerun(), SendOptions::default())?;
    ensure!(s.failed == 0 && s.files == 1, "{s:?}");
    poke(&disk, 9 * MIB, b"changed")?;
    let before = snapshot(&src)?;
    // The sender flips a byte of the first data it sends of the file: the mended copy
    // does not hash as the source, is never committed, and the file is sent again whole.
    let send = SendOptions {
        corrupt_in_flight: Some((b"disk.img".to_vec(), 1)),
        ..SendOptions::default()
    };
    for verify in [Verify::None, Verify::Checksum, Verify::Full] {
        let dst = tmp.path().join(format!("dst-{verify:?}"));
        let plain = Options {
            verify: Verify::Checksum,
            workers: 2,
            ..Options::default()
        };
        // (The earlier copy, from before the change.)
        let (s, _) = across(&src, &dst, &plain, SendOptions::default())?;
        ensure!(s.failed == 0, "{s:?}");
        // Put the old bytes back, so that the destination differs in one chunk.
        poke(&dst.join("disk.img"), 9 * MIB, &pattern(9 * MIB, 7))?;
        let opts = Options { verify, ..rerun() };
        let (s, received) = across(&src, &dst, &opts, send.clone())?;
        ensure!(
            s.failed == 0 && s.files == 1 && s.patched == 0,
            "{verify:?}: {s:?}"
        );
        compare(&before, &dst, Check::default())?;
        ensure!(
            received >= 16 * MIB,
            "{verify:?}: received {received} bytes: the file was not sent again whole"
        );
    }
    Ok(())
}

#[test]
fn a_file_that_grew_or_was_cut_is_mended_keeping_its_common_part() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let (grown, cut) = (src.join("grown.db"), src.join("cut.img"));
    write_pattern_file(&grown, 32 * MIB)?;
    write_pattern_file(&cut, 32 * MIB)?;
    let dst = tmp.path().join("dst");
    let (s, _) = across(&src, &dst, &rerun(), SendOptions::default())?;
    ensure!(s.failed == 0 && s.files == 2, "{s:?}");

    // A database that grew by a little over a MiB and changed one page; an image cut to a
    // length that is not a whole chunk.
    {
        let f = std::fs::OpenOptions::new().append(true).open(&grown)?;
        f.write_all_at(&pattern(7, (MIB + 100) as usize), 32 * MIB)?;
    }
    poke(&grown, 3 * MIB + 5, b"page")?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)?
        .set_len(20 * MIB + 1000)?;
    let before = snapshot(&src)?;
    let opts = Options {
        manifest: Some(tmp.path().join("manifest")),
        ..rerun()
    };
    let (s, received) = across(&src, &dst, &opts, SendOptions::default())?;
    ensure!(s.failed == 0 && s.files == 2 && s.patched == 2, "{s:?}");
    compare(&before, &dst, Check::default())?;
    xxh128sum_check(&dst, &tmp.path().join("manifest"))?;
    // The grown file: its new MiB and 100 bytes (18 chunks from its old end, the last
    // partial) and the changed page's chunk; the cut one: its last, partial chunk; each
    // with its chunk hashes.
    let chunk = 64 << 10;
    let hashes = ((33 * MIB + 100).div_ceil(chunk) + (20 * MIB + 1000).div_ceil(chunk)) * 16;
    let want = 18 * chunk + chunk + chunk + hashes;
    eprintln!("received {received} bytes for a grown and a cut file of 53 MiB (at most {want})");
    ensure!(
        received <= want,
        "received {received} bytes, more than {want}: the common parts were sent again"
    );
    Ok(())
}

#[test]
fn a_file_changed_in_hundreds_of_places_is_mended_with_its_parts_asked_ahead() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let disk = src.join("db");
    write_pattern_file(&disk, 64 * MIB)?;
    let dst = tmp.path().join("dst");
    let (s, _) = across(&src, &dst, &rerun(), SendOptions::default())?;
    ensure!(s.failed == 0 && s.files == 1, "{s:?}");
    // 300 pages changed, every third chunk: 300 parts, far more than one file's credit
    // holds at once (64 parts of 64 KiB), so they are asked for in many windows.
    let chunk = 64 << 10;
    for i in 0..300u64 {
        poke(&disk, i * 3 * chunk + (i % 7) * 4096, &[i as u8; 16])?;
    }
    let before = snapshot(&src)?;
    let (s, received) = across(&src, &dst, &rerun(), SendOptions::default())?;
    ensure!(s.failed == 0 && s.files == 1 && s.patched == 1, "{s:?}");
    compare(&before, &dst, Check::default())?;
    let want = 300 * chunk + (64 * MIB / chunk) * 16;
    ensure!(
        received <= want,
        "received {received} bytes (at most {want})"
    );
    Ok(())
}
