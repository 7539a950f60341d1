//! A copy between the two halves (`send` and `copy_from`) whose connection is cut at random
//! points, then resumed on a new connection: it ends identical to the source, leaves no
//! staging, and sends again only what was in flight (finished files are not sent twice).

mod common;

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::recv::Connection;
use ferry_engine::send::{serve, SendOptions, SourceTop};
use ferry_engine::{copy_from, NoProgress, Options, Summary, Verify};

/// One test at a time in this file: the bandwidth test measures a rate, which the others'
/// copies would slow on a small machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A reader that fails after `left` bytes, as a connection cut in the middle does, and
/// cuts the socket itself so the sender sees it too.
struct Cut {
    inner: UnixStream,
    left: Option<u64>,
}

impl Read for Cut {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = match self.left {
            Some(0) => {
                let _ = self.inner.shutdown(std::net::Shutdown::Both);
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "cut by the test",
                ));
            }
            Some(n) => buf.len().min(n as usize),
            None => buf.len(),
        };
        let got = self.inner.read(&mut buf[..want])?;
        if let Some(n) = &mut self.left {
            *n -= got as u64;
        }
        Ok(got)
    }
}

/// One copy over a new connection, cut after `cut` bytes from the sender (if any): its
/// summary (or the error it could not start with) and the file bytes it received.
fn run(src: &Path, dst: &Path, opts: &Options, cut: Option<u64>) -> Result<(Option<Summary>, u64)> {
    let send = SendOptions {
        workers: 4,
        ..SendOptions::default()
    };
    run_with(src, dst, opts, cut, send)
}

fn run_with(
    src: &Path,
    dst: &Path,
    opts: &Options,
    cut: Option<u64>,
    send: SendOptions,
) -> Result<(Option<Summary>, u64)> {
    let top = SourceTop::open(src)?;
    let (ours, theirs) = UnixStream::pair()?;
    let sender = {
        let r = theirs.try_clone()?;
        std::thread::spawn(move || serve(&top, r, theirs, &send))
    };
    let reader = Cut {
        inner: ours.try_clone()?,
        left: cut,
    };
    let conn: Arc<Connection> = Connection::start(reader, ours.try_clone()?)?;
    let result = copy_from(&conn, src, dst, opts, &NoProgress);
    let received = conn.bytes_received();
    drop(conn);
    let _ = ours.shutdown(std::net::Shutdown::Both);
    // The sender ends (cleanly or not) once its connection is gone.
    let _ = sender.join();
    Ok((result.ok(), received))
}

#[test]
fn a_copy_cut_at_random_points_resumes_to_an_identical_tree_sending_little_twice() -> Result<()> {
    let _one = one_at_a_time();
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    let mut total = 0u64;
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for d in 0..12 {
        let dir = src.join(format!("d{d}/sub"));
        mkdir(&dir)?;
        for f in 0..50 {
            // Small (inline), medium and up to 1 MiB.
            let len = match f % 5 {
                0 => next() % 4096,
                1 | 2 => 64 * 1024 + next() % (192 * 1024),
                _ => next() % (1 << 20),
            };
            write_pattern_file(&dir.join(format!("f{f}")), len)?;
            total += len;
        }
        symlink("../elsewhere", &src.join(format!("d{d}/link")))?;
    }
    let before = snapshot(&src)?;
    let dst = tmp.path().join("dst");
    let opts = Options {
        verify: Verify::Checksum,
        resume: true,
        staging_tag: Some("cut".into()),
        manifest: Some(tmp.path().join("manifest")),
        workers: 4,
        ..Options::default()
    };
    let (mut received, mut cuts) = (0u64, 0);
    for _ in 0..12 {
        // Within the first fifteenth of the tree's bytes: twelve runs cut this way leave
        // part of the tree for the last one, whatever each resumed run has left to send.
        let at = 1 + next() % (total / 15);
        let (summary, got) = run(&src, &dst, &opts, Some(at))?;
        received += got;
        match summary {
            Some(s) if s.aborted.is_none() => break,
            Some(s) => {
                cuts += 1;
                ensure!(
                    s.aborted
                        .as_deref()
                        .is_some_and(|a| a.contains("connection")),
                    "aborted for another reason: {:?}",
                    s.aborted
                );
            }
            None => cuts += 1,
        }
    }
    let (summary, got) = run(&src, &dst, &opts, None)?;
    received += got;
    let summary = summary.ok_or_else(|| anyhow::anyhow!("the last run did not start"))?;
    ensure!(
        summary.aborted.is_none() && summary.failed == 0,
        "{summary:?}"
    );
    ensure!(cuts == 12, "only {cuts} runs were cut");
    compare(&before, &dst, Check::default())?;
    let left = staging_leftovers(&dst)?;
    ensure!(left.is_empty(), "staging left: {left:?}");
    // What was in flight at each cut (4 workers, files up to 1 MiB) is sent again; nothing
    // that was finished is.
    let ratio = received as f64 / total as f64;
    eprintln!("{cuts} cuts; {received} bytes received for a tree of {total}: {ratio:.3}");
    ensure!(ratio <= 1.10, "sent {ratio:.3}x the tree");
    xxh128sum_check(&dst, &tmp.path().join("manifest"))?;
    Ok(())
}

#[test]
fn bytes_changed_in_flight_are_caught_sent_once_more_then_reported_checksum_mismatch() -> Result<()>
{
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("d"))?;
    write_pattern_file(&src.join("d/big"), 3 << 20)?;
    write(&src.join("d/small"), b"small enough to travel inline")?;
    write(&src.join("other"), b"untouched")?;
    let before = snapshot(&src)?;
    let opts = Options {
        verify: Verify::Checksum,
        ..Options::default()
    };
    // Once, by a read and inline: both caught and sent again, the copy ends identical.
    for victim in [&b"d/big"[..], b"d/small"] {
        let dst = tmp.path().join(format!("once-{}", victim.len()));
        let send = SendOptions {
            corrupt_in_flight: Some((victim.to_vec(), 1)),
            ..SendOptions::default()
        };
        let (summary, _) = run_with(&src, &dst, &opts, None, send)?;
        let summary = summary.ok_or_else(|| anyhow::anyhow!("did not start"))?;
        ensure!(summary.failed == 0, "{victim:?}: {summary:?}");
        compare(&before, &dst, Check::default())?;
    }
    // Every time: reported, nothing of it left under its name or staged.
    let dst = tmp.path().join("always");
    let send = SendOptions {
        corrupt_in_flight: Some((b"d/big".to_vec(), u32::MAX)),
        ..SendOptions::default()
    };
    let (summary, _) = run_with(&src, &dst, &opts, None, send)?;
    let summary = summary.ok_or_else(|| anyhow::anyhow!("did not start"))?;
    ensure!(summary.failed == 1, "{summary:?}");
    let f = &summary.failures[0];
    ensure!(
        f.path == Path::new("d/big") && f.kind == ferry_engine::Reason::ChecksumMismatch,
        "{f:?}"
    );
    ensure!(f.message.contains("sent once more"), "{f:?}");
    ensure!(
        !dst.join("d/big").exists(),
        "a mismatched file was committed"
    );
    ensure!(std::fs::read(dst.join("other"))? == b"untouched");
    let left = staging_leftovers(&dst)?;
    ensure!(left.is_empty(), "staging left: {left:?}");
    Ok(())
}

#[test]
fn a_full_destination_fails_destination_full_across_the_halves_as_locally() -> Result<()> {
    let _one = one_at_a_time();
    if !require_root("mounting a small tmpfs") {
        return Ok(());
    }
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    for i in 0..8 {
        write_pattern_file(&src.join(format!("f{i}")), 1 << 20)?;
    }
    let mnt = Mount::tmpfs(&tmp.path().join("small"), "3m")?;
    let dst = mnt.dir.join("dst");
    let opts = Options {
        verify: Verify::Checksum,
        ..Options::default()
    };
    let (summary, _) = run(&src, &dst, &opts, None)?;
    let summary = summary.ok_or_else(|| anyhow::anyhow!("did not start"))?;
    ensure!(
        summary
            .aborted
            .as_deref()
            .is_some_and(|a| a.starts_with("destination is full")),
        "{summary:?}"
    );
    ensure!(
        summary
            .failures
            .iter()
            .any(|f| f.kind == ferry_engine::Reason::DestinationFull),
        "{summary:?}"
    );
    Ok(())
}

#[test]
fn a_bandwidth_limit_holds_within_ten_percent() -> Result<()> {
    let _one = one_at_a_time();
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("small"))?;
    let mut total = 0u64;
    for i in 0..2 {
        write_pattern_file(&src.join(format!("f{i}")), 12 << 20)?;
        total += 12 << 20;
    }
    // Small files too: their bytes travel inline in listings, under the same limit.
    for i in 0..100 {
        write_pattern_file(&src.join(format!("small/s{i}")), 10_000)?;
        total += 10_000;
    }
    let limit = 8u64 << 20;
    let send = SendOptions {
        bandwidth_limit: Some(limit),
        ..SendOptions::default()
    };
    let start = std::time::Instant::now();
    let (summary, received) = run_with(
        &src,
        &tmp.path().join("dst"),
        &Options::default(),
        None,
        send,
    )?;
    let elapsed = start.elapsed().as_secs_f64();
    let summary = summary.ok_or_else(|| anyhow::anyhow!("did not start"))?;
    ensure!(
        summary.failed == 0 && received == total,
        "{summary:?} {received}"
    );
    let ratio = total as f64 / elapsed / limit as f64;
    eprintln!("{total} bytes in {elapsed:.2} s: {ratio:.3} of the limit");
    // Never over the limit by more than 10%. Under it by as much only when the machine is
    // busy (a 2-core CI runner running other tests): the copy's own work is then slower
    // than the limit for part of the time.
    ensure!(ratio <= 1.10, "{ratio:.3} of the limit");
    ensure!(ratio >= 0.85, "{ratio:.3} of the limit");
    Ok(())
}

#[test]
fn compressed_data_arrives_identical_in_fewer_bytes() -> Result<()> {
    let _one = one_at_a_time();
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    // Text-like data (compressible) and random data (sent as it is).
    let text: Vec<u8> = (0..(4 << 20))
        .map(|i: u32| b"the quick brown fox jumps over the lazy dog\n"[(i % 44) as usize])
        .collect();
    write(&src.join("text"), &text)?;
    let mut noise = vec![0u8; 1 << 20];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in &mut noise {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    write(&src.join("noise"), &noise)?;
    let before = snapshot(&src)?;
    let opts = Options {
        compress: true,
        verify: Verify::Checksum,
        ..Options::default()
    };
    let (summary, received) = run(&src, &tmp.path().join("dst"), &opts, None)?;
    let summary = summary.ok_or_else(|| anyhow::anyhow!("did not start"))?;
    ensure!(summary.failed == 0, "{summary:?}");
    compare(&before, &tmp.path().join("dst"), Check::default())?;
    let total = (text.len() + noise.len()) as u64;
    eprintln!("{received} bytes on the wire for {total}");
    ensure!(
        received < (noise.len() as u64) + total / 20,
        "{received} of {total}"
    );
    ensure!(
        received >= noise.len() as u64,
        "random data cannot shrink: {received}"
    );
    Ok(())
}

/// A sender that answers a one-file tree, and sends `data` for the file's read.
fn hostile_sender(conn: UnixStream, data: ferry_transfer::Frame) {
    use ferry_transfer::stream::{read_frame, write_frame};
    use ferry_transfer::{Entry, Frame, Kind, Time};
    let entry = |name: &[u8], kind: Kind, size: u64| Entry {
        name: name.to_vec(),
        kind,
        perm: 0o644,
        uid: 0,
        gid: 0,
        size,
        blocks: size / 512 + 1,
        atime: Time::default(),
        mtime: Time::default(),
        ctime: Time::default(),
        nlink: 1,
        dev: 1,
        ino: 2,
        xattrs: Vec::new(),
    };
    let mut r = conn.try_clone().expect("clone");
    let mut w = conn;
    let (mut rb, mut wb) = (Vec::new(), Vec::new());
    while let Ok(f) = read_frame(&mut r, &mut rb) {
        let answer = match f {
            Frame::Stat { req, .. } => Frame::Entry {
                req,
                entry: entry(b"-", Kind::Directory, 0),
            },
            Frame::List { req, .. } => Frame::Listing {
                req,
                entries: vec![entry(b"bomb", Kind::Regular, 1 << 20)],
                inline: Vec::new(),
                last: true,
            },
            Frame::Read { req, .. } => {
                let mut d = data.clone();
                if let Frame::Data { req: r, .. } = &mut d {
                    *r = req;
                }
                d
            }
            _ => continue,
        };
        if write_frame(&mut w, &answer, &mut wb).is_err() {
            return;
        }
    }
}

#[test]
fn data_that_decompresses_past_a_frame_fails_its_file_without_filling_memory() -> Result<()> {
    let _one = one_at_a_time();
    let tmp = tempdir()?;
    // 1 GiB of zeros compress to about 32 KB: a frame that claims one MiB at most.
    let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19)?;
    ensure!(
        bomb.len() < ferry_transfer::frame::MAX_DATA,
        "{}",
        bomb.len()
    );
    let data = ferry_transfer::Frame::Data {
        req: 0,
        offset: 0,
        zstd: true,
        data: bomb.into(),
    };
    let (ours, theirs) = UnixStream::pair()?;
    std::thread::spawn(move || hostile_sender(theirs, data));
    let conn = Connection::start(ours.try_clone()?, ours.try_clone()?)?;
    let dst = tmp.path().join("dst");
    let opts = Options {
        verify: Verify::Checksum,
        ..Options::default()
    };
    let summary = copy_from(&conn, Path::new("remote"), &dst, &opts, &NoProgress)?;
    let _ = ours.shutdown(std::net::Shutdown::Both);
    ensure!(summary.failed == 1, "{summary:?}");
    let f = &summary.failures[0];
    ensure!(
        f.path == Path::new("bomb") && f.message.contains("does not decompress"),
        "{f:?}"
    );
    ensure!(!dst.join("bomb").exists());
    Ok(())
}

#[test]
fn a_count_on_a_lost_connection_fails_instead_of_waiting_for_its_answer() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    write(&src.join("f"), b"counted")?;
    let top = SourceTop::open(&src)?;
    let (ours, theirs) = UnixStream::pair()?;
    let sender = {
        let r = theirs.try_clone()?;
        let send = SendOptions::default();
        std::thread::spawn(move || serve(&top, r, theirs, &send))
    };
    // Cut before the first byte of any answer.
    let reader = Cut {
        inner: ours.try_clone()?,
        left: Some(0),
    };
    let conn = Connection::start(reader, ours.try_clone()?)?;
    for links in [true, false] {
        match conn.count(links) {
            Err(e) => ensure!(e.to_string().contains("lost"), "{e}"),
            Ok(t) => anyhow::bail!("counted over a cut connection: {t:?}"),
        }
    }
    drop(conn);
    let _ = ours.shutdown(std::net::Shutdown::Both);
    let _ = sender.join();
    Ok(())
}
