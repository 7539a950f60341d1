//! The source half of a copy between nodes: answers a receiver's requests (see
//! `ferry_transfer::frame`) about the tree beneath one source, and nothing else.
//!
//! The receiver drives: its walk, resume, overwrite and include/exclude decisions are the
//! local copy's, made on the destination's node. What this half does for it is what a
//! local copy does on the source side: resolve a path beneath the top (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, never a symlink followed, never `..`), stat,
//! read extended attributes and symlink targets, list directories a buffer at a time, and
//! read files (data extents only: holes are not sent) while hashing what it read, and tell
//! whether a file changed while it was read; and count what a copy of the whole top would
//! carry (the receiver has no source of its own to count). FIFOs, sockets and devices are
//! never opened.
//!
//! Requests run on a pool of `workers` threads; a request waiting for the receiver (a
//! listing's next batch, a file's next credit) holds no thread, only its state: an open
//! descriptor and a cursor. So what one connection costs is bounded by
//! [`MAX_REQUESTS`] open requests (each one descriptor and at most a 64 KiB listing
//! buffer) and one data buffer per worker, whatever the receiver asks.
//!
//! Its parts, by job: `top` (what is served), `options` (how it serves, what it did, why
//! it stopped, its bounds), `serve` (one connection from its first request to its end),
//! `pool` (the workers and their queue), `half` (a connection's state, each request's
//! state between steps, and what each frame from the receiver does), `entries` (finding
//! and describing an entry beneath the top, and counting the top), `listing` (a
//! directory's batches, small files inline), `read` (a file's data within its credit),
//! `range` (a raw block device's bytes, a range at a time) and `bucket` (the bandwidth
//! limit).

mod bucket;
mod entries;
mod half;
mod listing;
mod options;
mod pool;
mod range;
mod read;
mod serve;
mod top;

pub use options::{SendError, SendOptions, SendSummary, MAX_CREDIT, MAX_REQUESTS};
pub use serve::serve;
pub use top::SourceTop;
