//! The bandwidth limit of one connection: a token bucket its requests share, taken before
//! what it limits is read.

use std::sync::{Mutex, PoisonError};

/// A token bucket for the bandwidth limit, shared by a connection's requests: every send
/// takes its bytes, going into debt if it must, and waits until the debt is paid at the
/// rate. It starts empty (no burst), so the rate holds from the first byte.
pub(super) struct Bucket {
    rate: u64,
    /// Bytes that may be sent now (negative: owed) and when that was computed.
    state: Mutex<(f64, std::time::Instant)>,
}

impl Bucket {
    pub(super) fn new(rate: u64) -> Self {
        Self {
            rate: rate.max(1),
            state: Mutex::new((0.0, std::time::Instant::now())),
        }
    }

    pub(super) fn take(&self, n: u64) {
        let wait = {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let now = std::time::Instant::now();
            let rate = self.rate as f64;
            // Unused allowance is kept for at most 100 ms: an idle connection does not
            // bank a burst.
            let tokens = (s.0 + now.duration_since(s.1).as_secs_f64() * rate).min(rate / 10.0);
            *s = (tokens - n as f64, now);
            match s.0 < 0.0 {
                true => std::time::Duration::from_secs_f64(-s.0 / rate),
                false => std::time::Duration::ZERO,
            }
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}
