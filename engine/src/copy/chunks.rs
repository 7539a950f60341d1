//! Large files copied in chunks by several workers at once (a single huge file would
//! otherwise keep one worker busy while the others idle); the last worker out commits it.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::data::{self, Caps, Moved, Range};
use crate::error::source_changed;
use crate::meta;
use crate::sys::Stat;

use super::regular::{check_unchanged, Tries};
use super::stage::Staged;
use super::walk::Task;
use super::{lock, Ctx, Local, OpenDir};

/// Chunk size: a multiple of every filesystem block size, so `copy_file_range` can still
/// clone or offload each chunk (rsync#153: unaligned ranges are not cloned).
const CHUNK: u64 = 64 << 20;

/// A file large enough to be copied in chunks by several workers.
pub(super) struct LargeFile {
    node: Arc<OpenDir>,
    src_name: CString,
    dst_name: CString,
    src: OwnedFd,
    staged: Mutex<Staged>,
    st: Stat,
    caps: Caps,
    chunks: u64,
    next_chunk: AtomicU64,
    /// Tasks still working on it; the last one out finishes the file.
    workers: AtomicUsize,
    error: Mutex<Option<(&'static str, io::Error)>>,
    /// When its source was opened, for the per-file copy time.
    started: Instant,
    /// Attempts before this one (a failed one is retried from `finish_chunked`).
    tries: Tries,
}

impl<'a> Ctx<'a> {
    /// Hand a large file to chunk workers. `file`: its source and destination names, the
    /// capabilities to copy with, when it was opened, and the attempts before this one.
    pub(super) fn start_chunks(
        &self,
        dir: &Arc<OpenDir>,
        src: &OwnedFd,
        staged: Staged,
        st: &Stat,
        file: (&CStr, &CStr, Caps, Instant, Tries),
        local: &Local,
    ) {
        let (src_name, name, caps, started, tries) = file;
        let chunks = (st.st_size as u64).div_ceil(CHUNK);
        // At most a helper per CPU, whatever the worker count: warm, a chunk's copy is CPU
        // work and the writes to one file serialise on its inode lock, so helpers beyond the
        // CPUs only queue (2 x 1 GiB on tmpfs, 2 CPUs: 0.58 s with 2 helpers a file, 0.9 s
        // with 16); cold, a file's readahead already keeps its reads in flight.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let helpers = (self.opts.workers_resolved() as u64)
            .min(chunks)
            .min(cpus.max(2)) as usize;
        let src = match src.try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                let mut staged = staged;
                self.discard(dir, &mut staged);
                self.fail(&dir.child_path(name), "duplicate descriptor", &e);
                return;
            }
        };
        dir.pending.fetch_add(1, Ordering::Relaxed);
        let file = Arc::new(LargeFile {
            node: dir.clone(),
            src_name: src_name.to_owned(),
            dst_name: name.to_owned(),
            src,
            staged: Mutex::new(staged),
            st: *st,
            caps,
            chunks,
            next_chunk: AtomicU64::new(0),
            workers: AtomicUsize::new(helpers),
            error: Mutex::new(None),
            started,
            tries,
        });
        // All its tasks go to this worker's deque, where idle workers steal them, and this
        // worker returns to its directory: with several large files each worker takes its
        // own (buffered writes to one inode serialise on its lock, so one file per worker is
        // the fast case) and the spare tasks help with whichever file still has chunks left.
        for _ in 0..helpers {
            local.push(Task::Chunks(file.clone()));
        }
    }

    pub(super) fn chunks(&self, file: &Arc<LargeFile>, local: &mut Local) {
        let size = file.st.st_size as u64;
        let mut caps = file.caps;
        // The fd is only borrowed for the pwrites; the lock guards commit, not I/O.
        let dst = match lock(&file.staged).fd.try_clone() {
            Ok(fd) => Some(fd),
            Err(e) => {
                lock(&file.error).get_or_insert(("duplicate descriptor", e));
                None
            }
        };
        while let Some(dst) = &dst {
            let i = file.next_chunk.fetch_add(1, Ordering::Relaxed);
            if self.abort.load(Ordering::Relaxed) {
                lock(&file.error).get_or_insert(("copy data", io::Error::other(data::Stopped)));
            }
            if i >= file.chunks || lock(&file.error).is_some() {
                break;
            }
            let off = i * CHUNK;
            let len = CHUNK.min(size - off);
            let r = Range {
                src: file.src.as_fd(),
                dst: dst.as_fd(),
                off,
                len: Some(len),
            };
            match data::copy_range(r, &mut caps, &mut local.buf, None, &self.guard()) {
                Ok(m) if m.bytes == len => {
                    if let Some(s) = m.strategy {
                        local.tally.by_strategy[s as usize] += m.bytes;
                        self.progress.bytes_copied(m.bytes, s);
                    }
                }
                Ok(m) => {
                    let msg = format!(
                        "source shrank: chunk at {off} got {} of {len} bytes",
                        m.bytes
                    );
                    lock(&file.error).get_or_insert(("copy data", source_changed(msg)));
                }
                Err(e) => {
                    lock(&file.error).get_or_insert(("copy data", e));
                }
            }
        }
        drop(dst);
        if file.workers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish_chunked(file, local);
            self.release(&file.node.node);
        }
    }

    fn finish_chunked(&self, file: &LargeFile, local: &mut Local) {
        let dir = &file.node;
        let mut staged = lock(&file.staged);
        let result = match lock(&file.error).take() {
            Some(err) => Err(err),
            None => check_unchanged(file.src.as_fd(), &file.st)
                .and_then(|()| {
                    meta::apply_fd(
                        meta::SrcXattrs::Fd(file.src.as_fd()),
                        staged.fd.as_fd(),
                        &file.st,
                        self.rules(),
                        staged.mode_done,
                        &mut local.xattrs,
                    )
                })
                // As for a whole file: ownership is checked right before the times.
                .and_then(|()| self.may_finish())
                .and_then(|()| meta::apply_times(staged.fd.as_fd(), &file.st, &self.opts.preserve))
                .and_then(|()| self.commit_staged(dir, &mut staged, &file.dst_name)),
        };
        match result {
            // Its bytes were counted by strategy chunk by chunk; no hash, so no manifest line.
            Ok(true) => self.count_file(
                &file.st,
                &Moved::default(),
                (dir, &file.dst_name),
                None,
                file.started,
                local,
            ),
            Ok(false) => self.count_skipped(),
            Err(err) => {
                self.discard(dir, &mut staged);
                drop(staged);
                // Copied again (whole, or in chunks by new tasks) when the error allows.
                let mut tries = file.tries;
                let again =
                    self.retry(dir, &file.src_name, &mut tries, err)
                        .and_then(|(src, st)| {
                            self.copy_regular(
                                dir,
                                src,
                                &file.src_name,
                                &st,
                                &file.dst_name,
                                file.started,
                                local,
                                tries,
                            )
                        });
                if let Err((op, e)) = again {
                    self.fail(&dir.child_path(&file.dst_name), op, &e);
                }
            }
        }
    }
}
