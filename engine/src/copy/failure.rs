//! Recording what went wrong: one entry's failure (kept up to a cap, counted always, a
//! full destination stopping the copy), labelled by `error::kind_of`; and the error of a
//! copy that no longer owns its destination.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::data;
use crate::error::{kind_of, Failure};
use crate::Reason;

use super::{lock, Ctx};

/// Failures kept in the summary; the count goes on past it.
const MAX_FAILURES_KEPT: usize = 1000;

impl<'a> Ctx<'a> {
    /// Record one failed entry. A full destination stops the whole copy: every later file
    /// would fail the same way. An entry the stopping copy cut off is not a failure of its
    /// own: the copy's summary says why it stopped.
    pub(super) fn fail(&self, path: &[u8], op: &'static str, err: &io::Error) {
        if !data::is_stopped(err) {
            self.fail_kind(path, op, kind_of(err), err.to_string());
        }
    }

    fn fail_kind(&self, path: &[u8], op: &'static str, kind: Reason, message: String) {
        let path = if path.is_empty() {
            PathBuf::from(".")
        } else {
            PathBuf::from(std::ffi::OsStr::from_bytes(path))
        };
        let failure = Failure {
            path,
            op,
            kind,
            message,
        };
        self.progress.failed(&failure);
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        if kind == Reason::DestinationFull && !self.abort.swap(true, Ordering::Relaxed) {
            *lock(&self.aborted) = Some(format!("destination is full: {}", failure.message));
        }
        let mut f = lock(&self.failures);
        if f.len() < MAX_FAILURES_KEPT {
            f.push(failure);
        }
    }
}

/// The copy no longer owns the destination (`Options::fence`).
pub(super) fn not_owner() -> io::Error {
    io::Error::other("this copy no longer owns the destination (fenced); nothing more is committed")
}
