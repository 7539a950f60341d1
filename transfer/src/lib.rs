//! Ferry's transfer protocol between two agents: the frames a sender and a receiver
//! exchange to copy one shard across nodes, and the records of source entries they carry.
//! No I/O of its own beyond reading and writing whole frames on a byte stream (the TLS
//! connection is the agent's): every length and count a peer sends is checked against its
//! bound before anything is allocated for it, and every field the receiver hands to a
//! syscall (names, symlink targets, attribute names, times) is validated on decode.

pub mod buffers;
mod codec;
pub mod entry;
mod export_hello;
mod fields;
pub mod frame;
pub mod stream;

pub use buffers::Buffers;
pub use entry::{Entry, Kind, Time, Xattr};
pub use frame::{ExportHello, Fingerprint, Frame, Inline};
pub use stream::{read_frame, write_frame};

/// Why bytes from a peer are not a frame (or a frame cannot be sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{0}: the frame ends early")]
    Truncated(&'static str),
    #[error("{what}: {len} bytes, at most {max} allowed")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{what}: {n} of them, at most {max} allowed")]
    TooMany {
        what: &'static str,
        n: usize,
        max: usize,
    },
    #[error("{what}: {n} bytes left over after it")]
    Trailing { what: &'static str, n: usize },
    #[error("{what} {why}")]
    Invalid {
        what: &'static str,
        why: &'static str,
    },
    #[error("{what}: unknown value {tag}")]
    Unknown { what: &'static str, tag: u8 },
    #[error("a frame of {len} bytes, at most {max} allowed")]
    FrameTooLarge { len: usize, max: usize },
}

impl Error {
    /// `len` bytes of `what`: refused when more than `max`.
    pub(crate) fn at_most(what: &'static str, len: usize, max: usize) -> Result<(), Error> {
        match len > max {
            true => Err(Error::TooLong { what, len, max }),
            false => Ok(()),
        }
    }

    /// `n` items of `what`: refused when more than `max`.
    pub(crate) fn few_enough(what: &'static str, n: usize, max: usize) -> Result<(), Error> {
        match n > max {
            true => Err(Error::TooMany { what, n, max }),
            false => Ok(()),
        }
    }
}
