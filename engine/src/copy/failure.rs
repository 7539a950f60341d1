//! Recording what went wrong: one entry's failure (kept up to a cap, counted always, a
//! full destination stopping the copy) and the reason label it gets, including the
//! engine's own marker errors that no errno describes.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::data;
use crate::error::Failure;
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

/// What kind of failure `err` is (marker payloads first, then the errno).
pub(super) fn kind_of(err: &io::Error) -> Reason {
    match err.kind() {
        io::ErrorKind::AlreadyExists => Reason::DestinationConflict,
        _ if err.raw_os_error() == Some(libc::ELOOP)
            || err.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Reason::DestinationConflict
        }
        _ => match err.get_ref() {
            Some(inner) if inner.is::<SourceChanged>() => Reason::SourceChanged,
            Some(inner) if inner.is::<ChecksumMismatch>() => Reason::ChecksumMismatch,
            Some(inner) if inner.is::<ReflinkRefused>() => Reason::ReflinkUnsupported,
            Some(inner) if inner.is::<PrivilegedDropped>() => Reason::PermissionDenied,
            _ => crate::error::reason_of_io(err),
        },
    }
}

/// The copy no longer owns the destination (`Options::fence`).
pub(super) fn not_owner() -> io::Error {
    io::Error::other("this copy no longer owns the destination (fenced); nothing more is committed")
}

pub(crate) fn source_changed(msg: String) -> io::Error {
    io::Error::other(SourceChanged(msg))
}

pub(super) fn checksum_mismatch(expected: u128, got: u128) -> io::Error {
    io::Error::other(ChecksumMismatch(format!(
        "destination hashes to {got:032x}, source to {expected:032x}"
    )))
}

/// A checksum mismatch with its own message.
pub(super) fn checksum_mismatch_msg(msg: String) -> io::Error {
    io::Error::other(ChecksumMismatch(msg))
}

/// A device node from the source that this copy does not make (`Options::privileged` is
/// `Drop`), with what would allow it: at most 256 bytes, what a CopyJob's status keeps of
/// an entry's message (`FailedPath::ENTRY_BYTES`), so none of it is cut.
pub(super) fn device_dropped(st: &crate::sys::Stat) -> io::Error {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFBLK => "block",
        _ => "character",
    };
    let (major, minor) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
    io::Error::other(PrivilegedDropped(format!(
        "a {kind} device ({major}:{minor}) is not made: device nodes, setuid/setgid bits and capabilities need the destination's consent (StorageRoot {}; a claim copied from the job's own claim or snapshot; --keep-privileged-files)",
        ferry_crds::ALLOW_PRIVILEGED_FILES,
    )))
}

/// Marker payloads so [`Ctx::fail`] can tell these kinds from plain I/O errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct SourceChanged(pub String);
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct ChecksumMismatch(pub String);
#[derive(Debug, thiserror::Error)]
#[error("reflink is `always` but this file cannot be cloned here (both sides must be on one XFS or btrfs filesystem); use `auto` to copy instead")]
pub(super) struct ReflinkRefused;
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct PrivilegedDropped(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_device_is_explained_in_what_a_status_keeps_of_a_message() {
        let mut st = crate::sys::zeroed_stat();
        st.st_mode = libc::S_IFCHR;
        // The largest device number Linux has (12-bit major, 20-bit minor).
        st.st_rdev = libc::makedev(4095, 1_048_575);
        let msg = device_dropped(&st).to_string();
        assert!(msg.len() <= 256, "{} bytes: {msg}", msg.len());
        assert!(msg.contains("spec.allowPrivilegedFiles: true"), "{msg}");
        assert_eq!(kind_of(&device_dropped(&st)), Reason::PermissionDenied);
    }
}
