//! A raw block device copied from another node: the source half serves the device by range
//! (`SourceTop::Device`, `Frame::ReadRange`) over a socket pair, and the block copy reads
//! it through a `recv::Connection` (`block::Source::Remote`). What crosses is what the
//! copy needs: pieces of zeros never, on a re-run only the hashes of unchanged chunks,
//! after a cut connection only the chunks the journal lacks; and the bytes that arrive are
//! checked against the hash the sender read.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{ensure, Context, Result};
use ferry_engine::block::{copy_from, BlockOptions, Device, Rerun, Source};
use ferry_engine::recv::Connection;
use ferry_engine::send::{serve, SendError, SendOptions, SendSummary, SourceTop};
use ferry_engine::NoProgress;

const MIB: u64 = 1 << 20;
/// 1 MiB chunks: the tests' devices are 16 of them.
const CHUNK: u64 = MIB;

/// Chunk `i` of a source: distinct noise.
fn chunk_data(i: u64, salt: u8) -> Vec<u8> {
    (0..CHUNK)
        .map(|b| ((b.wrapping_mul(2_654_435_761) >> 7) as u8) ^ (i as u8) ^ salt)
        .collect()
}

/// An image of 16 chunks with data in `data`, zeros elsewhere (a sparse file).
fn image(path: &Path, data: &[u64]) -> Result<()> {
    let f = std::fs::File::create(path)?;
    f.set_len(16 * CHUNK)?;
    for &i in data {
        f.write_all_at(&chunk_data(i, 0), i * CHUNK)?;
    }
    Ok(())
}

/// The source half serving `src` as a device on one end of a socket pair whose writes stop
/// (the connection cut) after `cut` bytes, and the receiver's connection on the other.
/// The receiver's side: its connection, the sender's thread, and its socket (to close the
/// connection: the connection's reader thread holds a descriptor of it too).
type Served = (
    Arc<Connection>,
    JoinHandle<Result<SendSummary, SendError>>,
    UnixStream,
);

fn served(src: &Path, cut: Option<usize>) -> Result<Served> {
    let top = SourceTop::Device(Device::open(src, false, false)?);
    let (ours, theirs) = UnixStream::pair()?;
    let server = std::thread::spawn(move || {
        let r = theirs.try_clone().expect("clone");
        let w = Cut {
            stream: theirs,
            left: cut.unwrap_or(usize::MAX),
        };
        serve(&top, r, w, &SendOptions::default())
    });
    let conn = Connection::start(ours.try_clone()?, ours.try_clone()?)?;
    Ok((conn, server, ours))
}

/// Close the receiver's side and return what the sender says of the connection.
fn finish(served: Served) -> Result<SendSummary> {
    let (conn, server, socket) = served;
    drop(conn);
    socket.shutdown(std::net::Shutdown::Both)?;
    Ok(server.join().expect("the sender's thread")?)
}

/// A writer that cuts its stream after `left` bytes.
struct Cut {
    stream: UnixStream,
    left: usize,
}

impl Write for Cut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let n = self.stream.write(&buf[..buf.len().min(self.left)])?;
        self.left -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

fn opts() -> BlockOptions {
    BlockOptions {
        chunk: CHUNK,
        ..BlockOptions::default()
    }
}

#[test]
fn a_device_on_another_node_is_copied_by_range_with_no_zeros_crossing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    image(&src, &[0, 3, 4, 9, 15])?;
    // The destination starts full of noise: a zero chunk must be made zeros there.
    std::fs::write(&dst, vec![0xEE; (16 * CHUNK) as usize])?;
    let link = served(&src, None)?;
    let conn = link.0.clone();
    let source = Source::remote(&conn, false)?;
    ensure!(source.size() == 16 * CHUNK, "size {}", source.size());
    let mut d = Device::open(&dst, true, false)?;
    let sum = copy_from(&source, &mut d, &opts(), &NoProgress)?;
    ensure!(
        std::fs::read(&src)? == std::fs::read(&dst)?,
        "not identical"
    );
    ensure!(
        (sum.written, sum.punched + sum.zeros_written) == (5, 11),
        "{sum:?}"
    );
    ensure!(
        conn.bytes_received() == 5 * CHUNK,
        "{} bytes crossed for 5 chunks of data",
        conn.bytes_received()
    );
    let manifest = sum.manifest.context("a manifest")?;
    drop(conn);
    let summary = finish(link)?;
    ensure!(summary.bytes_sent == 5 * CHUNK, "{summary:?}");

    // Compressed, the same bytes (what the receiver decompresses is bounded by the range).
    let dst2 = dir.path().join("dst2");
    let link = served(&src, None)?;
    let conn = link.0.clone();
    let mut d2 = Device::open(&dst2, true, true)?;
    copy_from(&Source::remote(&conn, true)?, &mut d2, &opts(), &NoProgress)?;
    ensure!(
        std::fs::read(&src)? == std::fs::read(&dst2)?,
        "not identical compressed"
    );

    // A re-run after one chunk changed: hashes cross for every chunk, data for that one;
    // with the manifest kept, the destination is not read either.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&src)?
        .write_all_at(&chunk_data(7, 0x55), 7 * CHUNK)?;
    let link2 = served(&src, None)?;
    let conn = link2.0.clone();
    let again = BlockOptions {
        rerun: Rerun::OnlyChanged,
        kept: Some(manifest),
        ..opts()
    };
    let sum = copy_from(&Source::remote(&conn, false)?, &mut d, &again, &NoProgress)?;
    ensure!(
        std::fs::read(&src)? == std::fs::read(&dst)?,
        "re-run not identical"
    );
    ensure!(
        (
            sum.written,
            sum.unchanged,
            sum.bytes_read_destination,
            sum.kept_used
        ) == (1, 15, 0, true),
        "{sum:?}"
    );
    ensure!(
        conn.bytes_received() == CHUNK,
        "{} bytes crossed on a re-run that changed one chunk",
        conn.bytes_received()
    );
    let manifest = sum.manifest.context("the re-run's manifest")?;
    drop(conn);

    // Changed-block tracking between nodes (what the receiving agent does when the
    // driver says only chunk 11 changed): nothing is asked of the other node for the rest,
    // not even a hash, and the manifest stays whole.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&src)?
        .write_all_at(&chunk_data(11, 0x66), 11 * CHUNK)?;
    let link3 = served(&src, None)?;
    let conn = link3.0.clone();
    let mut changed = vec![false; 16];
    changed[11] = true;
    let delta = BlockOptions {
        rerun: Rerun::OnlyChanged,
        kept: Some(manifest),
        changed: Some(changed),
        ..opts()
    };
    let sum = copy_from(&Source::remote(&conn, false)?, &mut d, &delta, &NoProgress)?;
    ensure!(
        std::fs::read(&src)? == std::fs::read(&dst)?,
        "delta run not identical"
    );
    ensure!(
        (
            sum.delta_used,
            sum.written,
            sum.unchanged,
            sum.bytes_read_source
        ) == (true, 1, 15, CHUNK),
        "{sum:?}"
    );
    // Whole: the device hash a full copy of the source computes.
    let fresh = ferry_engine::block::copy_device(
        &Device::open(&src, false, false)?,
        &mut Device::open(&dir.path().join("fresh"), true, true)?,
        &opts(),
        &NoProgress,
    )?;
    let digest = |s: &ferry_engine::block::BlockSummary| s.manifest.as_ref().map(|m| m.digest());
    ensure!(
        digest(&sum).is_some() && digest(&sum) == digest(&fresh),
        "the delta run's manifest is not the source's"
    );
    ensure!(
        conn.bytes_received() == CHUNK,
        "{} bytes crossed for one changed chunk",
        conn.bytes_received()
    );
    drop(conn);
    let sent = finish(link3)?;
    ensure!(sent.bytes_sent == CHUNK, "{sent:?}");
    finish(link)?;
    finish(link2)?;
    Ok(())
}

#[test]
fn a_cut_connection_resumes_from_the_journal_sending_only_what_is_missing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    image(&src, &(0..16).collect::<Vec<_>>())?;
    let journal = dir.path().join("journal");
    let with_journal = BlockOptions {
        journal: Some(journal.clone()),
        workers: 1,
        ..opts()
    };
    let mut d = Device::open(&dst, true, true)?;
    // Cut after about 6 of the 16 chunks.
    let cut = served(&src, Some((6 * CHUNK + CHUNK / 2) as usize))?;
    let conn = cut.0.clone();
    let first = copy_from(
        &Source::remote(&conn, false)?,
        &mut d,
        &with_journal,
        &NoProgress,
    );
    ensure!(
        first.is_err(),
        "the copy went on past a cut connection: {first:?}"
    );
    ensure!(journal.exists(), "no journal left to resume from");

    let link = served(&src, None)?;
    let conn = link.0.clone();
    let sum = copy_from(
        &Source::remote(&conn, false)?,
        &mut d,
        &with_journal,
        &NoProgress,
    )?;
    ensure!(
        std::fs::read(&src)? == std::fs::read(&dst)?,
        "not identical after resuming"
    );
    ensure!(
        (4..=7).contains(&sum.resumed),
        "resumed {} chunks: {sum:?}",
        sum.resumed
    );
    ensure!(
        conn.bytes_received() == (16 - sum.resumed) * CHUNK,
        "{} bytes crossed after {} chunks were resumed",
        conn.bytes_received(),
        sum.resumed
    );
    ensure!(
        !journal.exists(),
        "the journal stays after the copy completed"
    );
    drop(conn);
    finish(link)?;
    Ok(())
}

#[test]
fn ranges_are_served_only_from_a_device_and_only_inside_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("src");
    image(&src, &[1])?;
    // Past the device's end: a failure, the connection still good.
    let link = served(&src, None)?;
    let conn = link.0.clone();
    let mut buf = vec![0; CHUNK as usize];
    let past = conn.read_range(16 * CHUNK - 10, &mut buf, false, false);
    ensure!(past.is_err(), "a range past the end was served");
    conn.read_range(CHUNK, &mut buf, false, false)?;
    ensure!(buf == chunk_data(1, 0), "the range's bytes");
    drop(conn);
    finish(link)?;

    // A tree is not read by range: the sender refuses, and the connection ends.
    let top = SourceTop::open(dir.path())?;
    let (ours, theirs) = UnixStream::pair()?;
    let server = std::thread::spawn(move || {
        let r = theirs.try_clone().expect("clone");
        serve(&top, r, theirs, &SendOptions::default())
    });
    let conn = Connection::start(ours.try_clone()?, ours.try_clone()?)?;
    ensure!(
        conn.read_range(0, &mut buf, false, false).is_err(),
        "a tree served a range"
    );
    drop(conn);
    ours.shutdown(std::net::Shutdown::Both)?;
    let served = server.join().expect("server");
    ensure!(
        matches!(served, Err(SendError::Protocol(ref why)) if why.contains("not a raw block device")),
        "{served:?}"
    );
    Ok(())
}
