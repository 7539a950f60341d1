//! Which chunks a block copy has finished, kept while it runs, so that a copy stopped
//! (killed, cancelled, its node restarted) resumes by chunk: a chunk the journal lists with
//! the hash the source still has is neither written again nor read on the destination.
//!
//! An entry is appended only after the destination was flushed (`fdatasync`) with that
//! chunk in it, so the journal never lists a chunk the device could still lose; losing the
//! journal's own last lines costs only their chunks' rewriting. Like a kept manifest, the
//! journal is believed: it belongs where the agent keeps job state, never on the volume.
//! Read back bounded; a journal of another copy (another chunk size or size) is started
//! over.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::Error;
use crate::sys;

const MAGIC: &str = "# ferry block journal v1";
/// Chunks finished between two flushes of the destination (64 MiB at 4 MiB): a flush costs
/// a device cache flush, a resume redoes at most this many chunks a worker.
const FLUSH_EVERY: usize = 16;

pub(super) struct Journal {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    file: File,
    pending: Vec<(u64, u128)>,
}

impl Journal {
    /// Open (or start) the journal at `path` for a copy of `size` bytes in `chunk`-byte
    /// chunks, with the hash of each chunk it lists as finished.
    pub(super) fn open(
        path: &Path,
        chunk: u64,
        size: u64,
        chunks: u64,
    ) -> Result<(Journal, Vec<Option<u128>>), Error> {
        let header = format!("{MAGIC}\nchunk {chunk}\nsize {size}\n");
        let mut done = vec![None; chunks as usize];
        let mut ours = false;
        if let Ok(f) = File::open(path) {
            // Read a line at a time, at most what a journal of this copy can hold: the header
            // and every chunk's line (an index, a space, 32 hex digits) at most twice.
            let bound = header.len() as u64 + 2 * chunks * (20 + 1 + 32 + 1);
            let mut r = BufReader::new(f.take(bound));
            let mut head = String::new();
            for _ in 0..3 {
                let _ = r.read_line(&mut head);
            }
            ours = head == header;
            let mut line = String::new();
            while ours && r.read_line(&mut line).unwrap_or(0) > 0 {
                // Only whole lines count: a line cut by a kill has no newline yet.
                if let Some((i, h)) = line.strip_suffix('\n').and_then(|l| entry(l, chunks)) {
                    done[i as usize] = Some(h);
                }
                line.clear();
            }
        }
        let file = if ours {
            std::fs::OpenOptions::new().append(true).open(path)
        } else {
            File::create(path).and_then(|mut f| f.write_all(header.as_bytes()).map(|()| f))
        }
        .map_err(|e| Error::io("open the journal", path, e))?;
        let journal = Journal {
            path: path.to_owned(),
            state: Mutex::new(State {
                file,
                pending: Vec::new(),
            }),
        };
        Ok((journal, done))
    }

    /// Chunk `i` is written (and verified, if asked) with hash `h`; listed once the
    /// destination has been flushed with it.
    pub(super) fn record(&self, i: u64, h: u128, dst: BorrowedFd<'_>) -> Result<(), Error> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pending.push((i, h));
        if st.pending.len() >= FLUSH_EVERY {
            self.flush_locked(&mut st, dst)?;
        }
        Ok(())
    }

    /// Flush the destination, then list every chunk finished since the last flush.
    pub(super) fn flush(&self, dst: BorrowedFd<'_>) -> Result<(), Error> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.flush_locked(&mut st, dst)
    }

    fn flush_locked(&self, st: &mut State, dst: BorrowedFd<'_>) -> Result<(), Error> {
        if st.pending.is_empty() {
            return Ok(());
        }
        sys::fdatasync(dst)
            .map_err(|e| Error::io("fdatasync the destination for", &self.path, e))?;
        let mut lines = String::with_capacity(st.pending.len() * 54);
        for (i, h) in st.pending.drain(..) {
            let _ = writeln!(lines, "{i} {h:032x}");
        }
        st.file
            .write_all(lines.as_bytes())
            .map_err(|e| Error::io("append to the journal", &self.path, e))
    }

    /// The copy is complete: the journal has nothing left to say.
    pub(super) fn remove(&self) -> Result<(), Error> {
        std::fs::remove_file(&self.path).map_err(|e| Error::io("remove the journal", &self.path, e))
    }
}

/// One journal line, `INDEX HASH`, if it is one for a copy of `chunks` chunks.
fn entry(line: &str, chunks: u64) -> Option<(u64, u128)> {
    let (i, h) = line.split_once(' ')?;
    let i = i.parse::<u64>().ok().filter(|&i| i < chunks)?;
    if h.len() != 32 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((i, u128::from_str_radix(h, 16).ok()?))
}
