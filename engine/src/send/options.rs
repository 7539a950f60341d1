//! The source half's contract with its caller: how it serves ([`SendOptions`]), what a
//! connection did ([`SendSummary`]), why one ended early ([`SendError`]), and the bounds a
//! receiver is held to ([`MAX_REQUESTS`], [`MAX_CREDIT`]).

use std::ffi::CString;
use std::io;
use std::sync::atomic::AtomicU64;

use crate::options::Filter;

/// Requests open at once on one connection; a receiver that opens more is cut off.
pub const MAX_REQUESTS: usize = 1024;
/// Credit one file may be granted beyond what it was sent: a receiver that grants more is
/// cut off (it would let the sender run that far ahead of what it can take).
pub const MAX_CREDIT: u64 = 64 << 20;

/// How the source half serves.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Threads that run requests; 0: the engine's default pool, of which only as many as
    /// CPUs run while the source is read from the page cache (as a local copy's pool).
    pub workers: usize,
    /// A name at the top that is never listed nor served (Ferry's `.ferry` state).
    pub reserved_top: Option<CString>,
    /// Extended attributes are read and sent.
    pub xattrs: bool,
    /// At most this many file bytes a second on this connection (data and inline), or
    /// unlimited. What is over the rate waits in the sender, before it is read.
    pub bandwidth_limit: Option<u64>,
    /// Test only: flip a byte of what is sent of the file at this path (after it was
    /// hashed), as a network that changes bytes in flight would, this many times.
    pub corrupt_in_flight: Option<(Vec<u8>, u32)>,
    /// The include/exclude lists of the copy, for [`Frame::Count`]: a count is of what the
    /// receiver's copy would carry. (Listings and reads are not filtered: the receiver
    /// filters its own walk.)
    pub filter: Filter,
    /// Also counted here as they are sent, for a caller that shows a live rate (the
    /// summary counts them too): file bytes sent, data and inline.
    pub sent: Option<std::sync::Arc<AtomicU64>>,
}

impl Default for SendOptions {
    fn default() -> Self {
        Self {
            workers: 0,
            reserved_top: Some(c".ferry".into()),
            xattrs: true,
            bandwidth_limit: None,
            corrupt_in_flight: None,
            filter: Filter::default(),
            sent: None,
        }
    }
}

/// What a connection's source half did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendSummary {
    pub requests: u64,
    /// File bytes sent (data frames and inline), not counting holes.
    pub bytes_sent: u64,
    /// Files whose data was sent whole (by a read or inline).
    pub files_sent: u64,
}

/// Why a connection ended before the receiver closed it.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("reading from the receiver: {0}")]
    Read(#[source] io::Error),
    #[error("writing to the receiver: {0}")]
    Write(#[source] io::Error),
    #[error("the receiver broke the protocol: {0}")]
    Protocol(String),
    #[error("the receiver aborted: {0}")]
    Aborted(String),
    #[error("starting the source half's threads: {0}")]
    Threads(String),
}
