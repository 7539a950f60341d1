//! Errors: a fatal one stops the copy before it starts; a [`Failure`] is one entry that
//! could not be copied while the others went on.

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
    /// `PathEscape`, `SymlinkRejected` or `Openat2Unavailable`.
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
