//! Buffers for what a connection reads in bulk (a listing with its small files, a chunk of
//! a large one), used again once every slice of them is dropped.
//!
//! A listing's inline files are slices of the one payload that carried them ([`Bytes`]),
//! not a copy each, and that payload lives until the last of its files is written, on
//! whichever worker writes it. Reading every frame into a fresh allocation cost a page
//! fault per 4 KiB (the allocator hands large buffers back to the kernel when they are
//! freed): two thirds of a receiver's page faults on a tree of small files. So a buffer
//! whose last slice is dropped comes back here, and the next frame is read into memory
//! already touched. At most [`KEEP_BYTES`] of them wait here; more are freed, so what is
//! kept is bounded whatever the peer sends.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

/// The capacity of the buffers kept for reuse, at most (a receiver has a listing or a
/// chunk in flight per worker, most of them well under a megabyte).
pub const KEEP_BYTES: usize = 16 << 20;

/// A pool of buffers; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Buffers(Arc<Mutex<Kept>>);

#[derive(Debug, Default)]
struct Kept {
    free: Vec<Vec<u8>>,
    /// Their capacities' sum.
    bytes: usize,
}

impl Buffers {
    /// An empty buffer of at least `capacity` bytes: one given back if the last one given
    /// back is large enough, else a new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let mut kept = self.lock();
        match kept.free.pop() {
            Some(v) if v.capacity() >= capacity => {
                kept.bytes -= v.capacity();
                v
            }
            Some(v) => {
                kept.bytes -= v.capacity();
                drop(kept);
                drop(v);
                Vec::with_capacity(capacity)
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// `v` as shared bytes, given back to this pool when its last slice is dropped.
    pub fn share(&self, v: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            v,
            home: self.clone(),
        })
    }

    /// How many wait here (for tests).
    pub fn kept(&self) -> usize {
        self.lock().free.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A pooled buffer behind a [`Bytes`].
struct Pooled {
    v: Vec<u8>,
    home: Buffers,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.v
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.v);
        v.clear();
        let mut kept = self.home.lock();
        if kept.bytes + v.capacity() <= KEEP_BYTES {
            kept.bytes += v.capacity();
            kept.free.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_slice_is_dropped() {
        let pool = Buffers::default();
        let mut v = pool.take(1000);
        v.extend_from_slice(&[7; 1000]);
        let ptr = v.as_ptr();
        let whole = pool.share(v);
        let (a, b) = (whole.slice(0..10), whole.slice(500..));
        drop(whole);
        drop(a);
        assert_eq!(pool.kept(), 0, "a slice is still alive");
        assert_eq!(b.len(), 500);
        drop(b);
        assert_eq!(pool.kept(), 1);
        let again = pool.take(1000);
        assert!(again.is_empty() && again.capacity() >= 1000);
        assert_eq!(
            again.as_ptr(),
            ptr,
            "the same memory, not a fresh allocation"
        );
        // Too small for what is asked: a new one, and the small one is not kept.
        pool.share(again);
        assert!(pool.take(2000).capacity() >= 2000);
        assert_eq!(pool.kept(), 0);
    }

    #[test]
    fn at_most_keep_bytes_are_kept() {
        let pool = Buffers::default();
        let n = KEEP_BYTES / (1 << 20);
        let shared: Vec<Bytes> = (0..n + 3)
            .map(|_| pool.share(Vec::with_capacity(1 << 20)))
            .collect();
        drop(shared);
        assert_eq!(pool.kept(), n);
    }
}
