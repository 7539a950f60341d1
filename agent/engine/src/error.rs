//! Errors: a fatal one stops the copy before it starts; a [`Failure`] is one entry that
//! could not be copied while the others went on.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// A copy that could not start, or could not go on at all.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{0}")]
    Usage(String),
    /// A path inside a root cannot be used safely: it would leave the root, it passes a
    /// symlink, or the kernel cannot resolve it with those guarantees. `reason` is a stable
    /// condition reason (`PathEscape`, `SymlinkRejected`, `Openat2Unavailable`).
    #[error("{message}")]
    Refused {
        reason: &'static str,
        message: String,
    },
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

/// Why one entry failed. Bounded and exhaustive, so metrics and conditions can label by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The destination filesystem is full (or over quota).
    NoSpace,
    /// Permission denied reading the source or writing the destination.
    PermissionDenied,
    /// The source entry vanished during the copy.
    NotFound,
    /// The source changed size or content while it was copied.
    SourceChanged,
    /// The destination bytes did not hash to the source bytes.
    ChecksumMismatch,
    /// `reflink: always` on a filesystem pair that cannot clone.
    ReflinkUnsupported,
    /// A destination name is taken by an entry of another type (e.g. a directory where the
    /// source has a file), or by a symlink where a directory is needed.
    DestinationConflict,
    /// Any other I/O error.
    Io,
}

impl FailureKind {
    /// Every kind, so a metric can export each label from the start.
    pub const ALL: [FailureKind; 8] = [
        Self::NoSpace,
        Self::PermissionDenied,
        Self::NotFound,
        Self::SourceChanged,
        Self::ChecksumMismatch,
        Self::ReflinkUnsupported,
        Self::DestinationConflict,
        Self::Io,
    ];

    pub fn from_io(err: &io::Error) -> Self {
        match err.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Self::NoSpace,
            Some(libc::EACCES) | Some(libc::EPERM) => Self::PermissionDenied,
            Some(libc::ENOENT) => Self::NotFound,
            _ => Self::Io,
        }
    }

    /// A stable, bounded label (for metrics, JSON and condition reasons).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSpace => "NoSpace",
            Self::PermissionDenied => "PermissionDenied",
            Self::NotFound => "NotFound",
            Self::SourceChanged => "SourceChanged",
            Self::ChecksumMismatch => "ChecksumMismatch",
            Self::ReflinkUnsupported => "ReflinkUnsupported",
            Self::DestinationConflict => "DestinationConflict",
            Self::Io => "IOError",
        }
    }
}

/// One entry that was not copied, with the operation that failed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Path relative to the copy's root (bytes as the filesystem has them).
    pub path: PathBuf,
    pub op: &'static str,
    pub kind: FailureKind,
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
