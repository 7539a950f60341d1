//! A destination checked against the manifest an earlier copy wrote there (a CopyJob's
//! `spec.check`, `kubectl ferry verify`): every file the manifest lists opened beneath the
//! destination path and its bytes hashed, in parallel, without writing anything.
//!
//! The manifest is in the tenant's volume, so nothing in it is trusted: it is opened only
//! if it is a regular file (a FIFO there would block the read forever), read one line at a
//! time and never more than [`MAX_LINE`] of a line, and a line Ferry would never write (an
//! absolute path, a `..`, a line cut short, more than [`MAX_LISTED`] files) ends the check
//! with a refusal that says so. A path listed twice is checked once (each path's xxh3-64
//! is kept, 8 bytes and a hash table's overhead a file), so a short manifest cannot make
//! the agent read one large file over and over. Each listed path is resolved from the
//! destination's directory fd with `openat2` (no symlink on the way, none at the end),
//! opened `O_PATH`, `fstat`ed, and reopened for reading only if it is a regular file: a
//! device node or FIFO planted where a file was listed is reported, never opened.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use twox_hash::XxHash3_64;

use crate::copy::{parse_line, MAX_LINE};
use crate::data::{hash_fd, Guard, Stop};
use crate::{beneath, sys, Error, Failure, Faults, Progress, Reason};

/// The most files one check reads: what its table of paths seen costs (about 16 bytes a
/// file, 128 MiB at most) is bounded whatever the manifest holds.
pub const MAX_LISTED: u64 = 8 << 20;

/// Paths handed to the workers at once.
const BATCH: usize = 256;

/// A batch of manifest entries: the recorded xxh128 and the relative path's bytes.
type Batch = Vec<(u128, Vec<u8>)>;

/// What a check is asked to do.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Files hashed at once (0: the engine's default).
    pub workers: usize,
    /// Set to stop the check at the next block.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// What a check found: every path the manifest lists is one of matched, changed, missing,
/// not regular or unreadable.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// Paths the manifest lists, each once.
    pub listed: u64,
    /// Files whose bytes hash to what the manifest lists.
    pub matched: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files whose bytes do not (`ChecksumMismatch`).
    pub changed: u64,
    /// Paths with nothing there (`NotFound`).
    pub missing: u64,
    /// Paths that are not regular files, or are reached through a symlink
    /// (`DestinationConflict`).
    pub not_regular: u64,
    /// Files that could not be read (permission, I/O errors).
    pub unreadable: u64,
    /// The first 1000 paths that did not match, with why.
    pub failures: Vec<Failure>,
    /// Stopped by `CheckOptions::cancel` before the end.
    pub cancelled: bool,
    pub elapsed: Duration,
}

/// Check the files beneath `top` (relative to `root`; a directory, or the one file a
/// copy of a file made) against `.ferry/<manifest>` in `root`, a file name such as
/// `<job uid>.xxh128`. `Err`: the check could not be made (no such manifest, not one
/// Ferry writes, `top` not there); each file that does not match is in the result.
pub fn check_beneath(
    root: BorrowedFd<'_>,
    top: &Path,
    manifest: &str,
    opts: &CheckOptions,
    progress: &dyn Progress,
) -> Result<Checked, Error> {
    let began = Instant::now();
    if manifest.is_empty() || manifest.contains('/') || manifest.starts_with('.') {
        return Err(Error::Usage(format!(
            "{manifest:?} is not a manifest's file name in .ferry/ (e.g. <job uid>.xxh128)"
        )));
    }
    let shown = PathBuf::from(format!("{}/{manifest}", ferry_crds::STATE_DIR));
    let file = open_manifest(root, &shown)?;
    let base = open_top(root, top)?;
    let state = State {
        base,
        cancel: opts.cancel.clone(),
        progress,
        counts: Counts::default(),
        failures: Mutex::default(),
    };
    let workers = match opts.workers {
        0 => crate::default_workers(),
        n => n,
    };
    // A bounded queue: a manifest read faster than its files are hashed waits here, never
    // gathering the rest of itself in memory.
    let (tx, rx) = mpsc::sync_channel::<Batch>(workers * 2);
    let rx = Mutex::new(rx);
    let read = std::thread::scope(|s| {
        let (rx, state) = (&rx, &state);
        for _ in 0..workers {
            s.spawn(move || state.work(rx));
        }
        // The sender is dropped when the reading ends: the workers then finish the queue.
        read_lines(&file, &shown, state, tx)
    });
    let listed = read?;
    let cancelled = state.should_stop();
    let c = &state.counts;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Ok(Checked {
        listed,
        matched: load(&c.matched),
        bytes: load(&c.bytes),
        changed: load(&c.changed),
        missing: load(&c.missing),
        not_regular: load(&c.not_regular),
        unreadable: load(&c.unreadable),
        failures: state
            .failures
            .into_inner()
            .unwrap_or_else(|e| e.into_inner()),
        cancelled,
        elapsed: began.elapsed(),
    })
}

/// `.ferry/<manifest>` beneath `root`: only a regular file (a FIFO or device planted there
/// is refused unopened, and so is a symlinked `.ferry`).
fn open_manifest(root: BorrowedFd<'_>, shown: &Path) -> Result<File, Error> {
    let path = beneath::resolve_beneath(root, shown, libc::O_PATH).map_err(|e| match e {
        Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => {
            Error::Refused {
                reason: Reason::CannotStart,
                message: format!(
                    "the destination has no {}: name the status.manifest of a job that copied into it (with the destination that job had)",
                    shown.display()
                ),
            }
        }
        other => other,
    })?;
    match sys::opened_if(path, libc::O_RDONLY | libc::O_NOATIME, false)
        .map_err(|e| Error::io("open", shown, e))?
    {
        sys::Opened::Open(fd, _) => Ok(File::from(fd)),
        sys::Opened::Other(st) => Err(Error::Refused {
            reason: Reason::CannotStart,
            message: format!(
                "{} is a {}, not a regular file, so not a manifest Ferry wrote; it was not opened",
                shown.display(),
                kind_name(st.st_mode)
            ),
        }),
    }
}

/// The directory the manifest's paths are relative to: `top` itself, or the directory
/// that holds it when it is a file (a copy of one file lists it by its name).
fn open_top(root: BorrowedFd<'_>, top: &Path) -> Result<(OwnedFd, Option<Vec<u8>>), Error> {
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY;
    let path = beneath::resolve_beneath(root, top, libc::O_PATH)?;
    let st = sys::fstat(path.as_fd()).map_err(|e| Error::io("stat", top, e))?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Ok((
            sys::reopen(path.as_fd(), dir_flags).map_err(|e| Error::io("open", top, e))?,
            None,
        )),
        libc::S_IFREG => {
            let parent = top.parent().unwrap_or(Path::new(""));
            let name = top.file_name().map(|n| n.as_bytes().to_vec());
            Ok((beneath::resolve_beneath(root, parent, dir_flags)?, name))
        }
        _ => Err(Error::Refused {
            reason: Reason::CannotStart,
            message: format!(
                "{} is neither a directory nor a regular file: nothing a copy made is there",
                top.display()
            ),
        }),
    }
}

#[derive(Default)]
struct Counts {
    matched: AtomicU64,
    bytes: AtomicU64,
    changed: AtomicU64,
    missing: AtomicU64,
    not_regular: AtomicU64,
    unreadable: AtomicU64,
}

/// What the reader and the workers share.
struct State<'a> {
    /// The directory paths are resolved from, and the one file's name when the copy was
    /// of a file (the only path its manifest may list).
    base: (OwnedFd, Option<Vec<u8>>),
    cancel: Option<Arc<AtomicBool>>,
    progress: &'a dyn Progress,
    counts: Counts,
    failures: Mutex<Vec<Failure>>,
}

impl Stop for State<'_> {
    fn should_stop(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// How one listed path compares.
enum Outcome {
    Matched(u64),
    Failed(Reason, &'static str, String),
}

impl State<'_> {
    /// A worker: batches of (hash, path) from the reader until it is done.
    fn work(&self, rx: &Mutex<mpsc::Receiver<Batch>>) {
        let mut buf = Vec::new();
        loop {
            let batch = match rx.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => return,
            };
            let Ok(batch) = batch else { return };
            for (hash, path) in batch {
                if self.should_stop() {
                    return;
                }
                self.one(hash, &path, &mut buf);
            }
        }
    }

    fn one(&self, hash: u128, path: &[u8], buf: &mut Vec<u8>) {
        let shown = Path::new(OsStr::from_bytes(path));
        let c = &self.counts;
        match self.compare(hash, shown, buf) {
            Outcome::Matched(size) => {
                c.matched.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(size, Ordering::Relaxed);
                self.progress.file_checked(size);
            }
            // Stopped mid-file: neither matched nor not.
            Outcome::Failed(_, _, _) if self.should_stop() => {}
            Outcome::Failed(kind, op, message) => {
                let counter = match kind {
                    Reason::ChecksumMismatch => &c.changed,
                    Reason::NotFound => &c.missing,
                    Reason::DestinationConflict => &c.not_regular,
                    _ => &c.unreadable,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                let failure = Failure {
                    path: shown.to_path_buf(),
                    op,
                    kind,
                    message,
                };
                self.progress.failed(&failure);
                if let Ok(mut f) = self.failures.lock() {
                    if f.len() < 1000 {
                        f.push(failure);
                    }
                }
            }
        }
    }

    /// Open `path` beneath the base as only a regular file, and hash it.
    fn compare(&self, hash: u128, path: &Path, buf: &mut Vec<u8>) -> Outcome {
        let (dir, file) = (&self.base.0, &self.base.1);
        if file
            .as_deref()
            .is_some_and(|f| f != path.as_os_str().as_bytes())
        {
            return Outcome::Failed(
                Reason::NotFound,
                "open",
                "the copy was of one file, and this is not it".into(),
            );
        }
        let opened = match beneath::resolve_beneath(dir.as_fd(), path, libc::O_PATH) {
            Ok(fd) => sys::opened_if(fd, libc::O_RDONLY | libc::O_NOATIME, false)
                .map_err(|e| Error::io("open", path, e)),
            Err(e) => Err(e),
        };
        let (fd, st) = match opened {
            Ok(sys::Opened::Open(fd, st)) => (fd, st),
            Ok(sys::Opened::Other(st)) => {
                return Outcome::Failed(
                    Reason::DestinationConflict,
                    "open",
                    format!(
                        "listed as a file, but a {} is there (not opened)",
                        kind_name(st.st_mode)
                    ),
                )
            }
            Err(Error::Refused {
                reason: Reason::SymlinkRejected,
                message,
            }) => return Outcome::Failed(Reason::DestinationConflict, "open", message),
            Err(Error::Io { source, .. })
                if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
            {
                return Outcome::Failed(
                    Reason::NotFound,
                    "open",
                    "listed in the manifest, not on the destination".into(),
                )
            }
            Err(Error::Io { source, .. }) => {
                return Outcome::Failed(crate::reason_of_io(&source), "open", source.to_string())
            }
            Err(e) => return Outcome::Failed(Reason::IOError, "open", e.to_string()),
        };
        let size = st.st_size as u64;
        let faults = Faults::default();
        let guard = Guard {
            faults: &faults,
            stop: self,
        };
        // One byte past the size: a file that grew since its stat reads as changed.
        match hash_fd(fd.as_fd(), size.saturating_add(1), buf, &guard) {
            Ok((h, n)) if h == hash && n == size => Outcome::Matched(size),
            Ok((h, _)) => Outcome::Failed(
                Reason::ChecksumMismatch,
                "hash",
                format!("xxh128 {h:032x}, the manifest lists {hash:032x}"),
            ),
            Err(e) => Outcome::Failed(crate::reason_of_io(&e), "read", e.to_string()),
        }
    }
}

fn kind_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        _ => "file of another type",
    }
}

/// Read the manifest a line at a time, handing each new path to the workers; the number of
/// paths listed, or why this is not a manifest Ferry wrote.
fn read_lines(
    file: &File,
    shown: &Path,
    state: &State<'_>,
    tx: mpsc::SyncSender<Batch>,
) -> Result<u64, Error> {
    let not_ours = |n: u64, why: String| Error::Refused {
        reason: Reason::CannotStart,
        message: format!(
            "{} line {n}: {why}; this is not a manifest Ferry wrote (or it changed since)",
            shown.display()
        ),
    };
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut seen = HashSet::new();
    let mut batch = Vec::with_capacity(BATCH);
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        if state.should_stop() {
            break;
        }
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::io("read", shown, e))?;
        if n == 0 {
            break;
        }
        number += 1;
        if line.last() != Some(&b'\n') {
            return Err(match n as u64 == MAX_LINE {
                true => not_ours(number, format!("longer than {MAX_LINE} bytes")),
                false => not_ours(
                    number,
                    "cut short (no newline): the copy that wrote it did not finish".into(),
                ),
            });
        }
        let Some((hash, path)) = parse_line(&line[..n - 1]) else {
            return Err(not_ours(number, "not a hash and a path".into()));
        };
        let p = Path::new(OsStr::from_bytes(&path));
        if path.is_empty() || beneath::check_relative(p).is_err() {
            return Err(Error::Refused {
                reason: Reason::PathEscape,
                message: format!(
                    "{} line {number}: {:?} is not a path inside the destination (absolute, '..' or NUL); Ferry lists relative paths only, so the manifest was not written by Ferry",
                    shown.display(),
                    p
                ),
            });
        }
        if !seen.insert(XxHash3_64::oneshot(&path)) {
            continue;
        }
        if seen.len() as u64 > MAX_LISTED {
            return Err(not_ours(
                number,
                format!("more than {MAX_LISTED} files listed; check a smaller destination path"),
            ));
        }
        batch.push((hash, path));
        if batch.len() == BATCH && tx.send(std::mem::take(&mut batch)).is_err() {
            break;
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(batch);
    }
    Ok(seen.len() as u64)
}

#[cfg(test)]
mod tests;
