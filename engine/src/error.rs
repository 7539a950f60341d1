//! Errors: a fatal one stops the copy before it starts; a [`Failure`] is one entry that
//! could not be copied while the others went on; and the reason label a failed entry gets,
//! including the engine's own marker errors that no errno describes (a source that changed,
//! a checksum mismatch, a refused reflink, a dropped device), made here so every layer (a
//! local copy, the receiving end of a copy between nodes) raises them the same way.

use std::fmt;
use std::io;
use std::path::PathBuf;

use ferry_crds::Reason;

/// A copy that could not start, or could not go on at all.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The io error is the source, not part of the message: `anyhow`'s `{:#}` (or the
    /// agent's `with_causes`) prints each cause once.
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{0}")]
    Usage(String),
    /// A path inside a root cannot be used safely: it would leave the root, it passes a
    /// symlink, or the kernel cannot resolve it with those guarantees. `reason` is
    /// `PathEscape`, `SymlinkRejected` or `Openat2Unavailable`; or a block device copy's
    /// destination is smaller than its source (`DestinationTooSmall`).
    #[error("{message}")]
    Refused { reason: Reason, message: String },
}

impl Error {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Why one entry failed: one of [`Reason::PER_ENTRY`], from the errno of a failed call.
pub fn reason_of_io(err: &io::Error) -> Reason {
    match err.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Reason::DestinationFull,
        Some(libc::EACCES) | Some(libc::EPERM) => Reason::PermissionDenied,
        Some(libc::ENOENT) => Reason::NotFound,
        _ => Reason::IOError,
    }
}

/// One entry that was not copied, with the operation that failed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Path relative to the copy's root (bytes as the filesystem has them).
    pub path: PathBuf,
    pub op: &'static str,
    pub kind: Reason,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} failed: {}",
            self.path.display(),
            self.op,
            self.message
        )
    }
}

/// What kind of failure `err` is (marker payloads first, then the errno).
pub(crate) fn kind_of(err: &io::Error) -> Reason {
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
            _ => reason_of_io(err),
        },
    }
}

pub(crate) fn source_changed(msg: String) -> io::Error {
    io::Error::other(SourceChanged(msg))
}

pub(crate) fn checksum_mismatch(expected: u128, got: u128) -> io::Error {
    io::Error::other(ChecksumMismatch(format!(
        "destination hashes to {got:032x}, source to {expected:032x}"
    )))
}

/// A checksum mismatch with its own message.
pub(crate) fn checksum_mismatch_msg(msg: String) -> io::Error {
    io::Error::other(ChecksumMismatch(msg))
}

/// A device node from the source that this copy does not make (`Options::privileged` is
/// `Drop`), with what would allow it: at most 256 bytes, what a CopyJob's status keeps of
/// an entry's message (`FailedPath::ENTRY_BYTES`), so none of it is cut.
pub(crate) fn device_dropped(st: &crate::sys::Stat) -> io::Error {
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

/// Marker payloads so [`kind_of`] can tell these kinds from plain I/O errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SourceChanged(pub String);
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ChecksumMismatch(pub String);
#[derive(Debug, thiserror::Error)]
#[error("reflink is `always` but this file cannot be cloned here (both sides must be on one XFS or btrfs filesystem); use `auto` to copy instead")]
pub(crate) struct ReflinkRefused;
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PrivilegedDropped(pub String);

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
