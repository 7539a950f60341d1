//! The gate in front of a listener that anyone on the network can reach: the connections
//! whose peer has not yet shown anything (no TLS handshake done, no request head sent) are
//! held in one bounded pool, so that such peers can never hold what a peer that does show
//! something needs (an agent completing its handshake, the kubelet's probe sending its head).
//!
//! - A peer (an IP address: a hostile pod has one) may hold at most
//!   [`GateLimits::per_peer`] connections in the pool; the pool at most
//!   [`GateLimits::total`]. A newcomer is never refused: when the pool is full it evicts a
//!   connection instead, the peer's own oldest when the peer is at its share, else the oldest
//!   of the peer that holds the most. A flood from one address therefore only ever evicts
//!   itself, and one from many addresses evicts a peer with a single connection in the pool
//!   (a probe that sends its head within milliseconds) only when every other peer holds no
//!   more than one too, and only if the probe is the oldest of them all.
//! - Until it is [`Entry::proven`], a connection must be done within
//!   [`GateLimits::pending_timeout`]; a proven one stays in the pool (where the caller keeps
//!   it, as the HTTP endpoints do until the answer is written) but is evicted only after every
//!   unproven connection of the same peer.
//! - Everything is bounded by the pool: file descriptors, tasks and buffers of unproven
//!   connections, and the pool's own bookkeeping (one entry a connection, one counter a peer).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How many connections the pool holds, and for how long an unproven one.
#[derive(Debug, Clone, Copy)]
pub struct GateLimits {
    /// Connections one peer address may hold in the pool.
    pub per_peer: usize,
    /// Connections the pool holds in all.
    pub total: usize,
    /// Time an admitted connection has to be proven (its handshake or request head done).
    pub pending_timeout: Duration,
}

/// Why the gate closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Evicted to admit a newer connection (the pool, or the peer's share of it, was full).
    Evicted,
    /// Not proven within the pending time.
    TimedOut(Duration),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Evicted => f.write_str(
                "closed to admit a newer connection (the pool of connections not yet proven was full)",
            ),
            Closed::TimedOut(t) => write!(f, "not done within {t:?}"),
        }
    }
}

impl std::error::Error for Closed {}

/// Where a connection in the pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending,
    Proven,
    Evicted,
}

#[derive(Debug)]
struct Held {
    peer: IpAddr,
    phase: watch::Sender<Phase>,
}

#[derive(Debug, Default)]
struct Pool {
    /// By admission order: the smallest id is the oldest connection.
    held: BTreeMap<u64, Held>,
    per_peer: HashMap<IpAddr, usize>,
    next: u64,
}

impl Pool {
    fn remove(&mut self, id: u64) -> Option<Held> {
        let held = self.held.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&held.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&held.peer);
            }
        }
        Some(held)
    }

    /// Evict `peer`'s oldest unproven connection, or its oldest if all are proven.
    fn evict_from(&mut self, peer: IpAddr) {
        let of_peer = || self.held.iter().filter(|(_, h)| h.peer == peer);
        let victim = of_peer()
            .find(|(_, h)| *h.phase.borrow() == Phase::Pending)
            .or_else(|| of_peer().next())
            .map(|(id, _)| *id);
        if let Some(held) = victim.and_then(|id| self.remove(id)) {
            held.phase.send_replace(Phase::Evicted);
        }
    }

    /// The peer holding the most connections; of several, the one whose oldest unproven
    /// connection is oldest (then the one whose oldest connection is).
    fn busiest(&self) -> Option<IpAddr> {
        let most = self.per_peer.values().copied().max()?;
        let busiest = |h: &&Held| self.per_peer.get(&h.peer) == Some(&most);
        let mut held = self.held.values();
        held.clone()
            .filter(busiest)
            .find(|h| *h.phase.borrow() == Phase::Pending)
            .or_else(|| held.find(busiest))
            .map(|h| h.peer)
    }
}

/// The pool of connections not yet proven, shared by a listener's connection tasks.
#[derive(Debug, Clone)]
pub struct Gate {
    pool: Arc<Mutex<Pool>>,
    limits: GateLimits,
}

impl Gate {
    /// An empty pool within `limits` (a limit of 0 counts as 1).
    pub fn new(limits: GateLimits) -> Self {
        Self {
            pool: Arc::default(),
            limits: GateLimits {
                per_peer: limits.per_peer.max(1),
                total: limits.total.max(1),
                ..limits
            },
        }
    }

    /// Its limits.
    pub fn limits(&self) -> GateLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        // The pool's invariants hold between statements that cannot panic: a poisoned lock
        // (a panic elsewhere while holding it) leaves a consistent pool.
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admit a connection from `peer`, evicting another if the pool or `peer`'s share of it
    /// is full. The connection leaves the pool when the [`Entry`] is dropped.
    pub fn admit(&self, peer: IpAddr) -> Entry {
        let peer = peer.to_canonical();
        let mut pool = self.lock();
        if pool.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.per_peer {
            pool.evict_from(peer);
        } else if pool.held.len() >= self.limits.total {
            if let Some(busiest) = pool.busiest() {
                pool.evict_from(busiest);
            }
        }
        let id = pool.next;
        pool.next += 1;
        let (phase, watched) = watch::channel(Phase::Pending);
        pool.held.insert(id, Held { peer, phase });
        *pool.per_peer.entry(peer).or_insert(0) += 1;
        drop(pool);
        Entry {
            gate: self.clone(),
            id,
            phase: watched,
            deadline: Instant::now() + self.limits.pending_timeout,
        }
    }

    /// Connections in the pool: in all, and of `peer`.
    pub fn held(&self, peer: IpAddr) -> (usize, usize) {
        let pool = self.lock();
        let of_peer = pool.per_peer.get(&peer.to_canonical()).copied();
        (pool.held.len(), of_peer.unwrap_or(0))
    }
}

/// A connection in the pool; it leaves the pool when dropped.
#[derive(Debug)]
pub struct Entry {
    gate: Gate,
    id: u64,
    phase: watch::Receiver<Phase>,
    deadline: Instant,
}

impl Entry {
    /// The peer has shown what it had to (its handshake or request head is done): the pending
    /// time no longer applies, and the peer's unproven connections are evicted before it.
    pub fn proven(&self) {
        self.proof().proven();
    }

    /// A handle that calls [`Self::proven`] from elsewhere (hyper's service function).
    pub fn proof(&self) -> Proof {
        Proof {
            gate: self.gate.clone(),
            id: self.id,
        }
    }

    /// Resolves when the gate closes the connection: evicted, or the pending time over while
    /// still unproven. Never resolves otherwise.
    pub async fn closed(&mut self) -> Closed {
        let timeout = self.gate.limits.pending_timeout;
        let mut phase = self.phase.clone();
        let evicted = phase.wait_for(|p| *p == Phase::Evicted);
        let over = tokio::time::sleep_until(self.deadline);
        tokio::pin!(evicted, over);
        let mut past_deadline = false;
        loop {
            tokio::select! {
                // A closed channel means the entry left the pool other than by being dropped,
                // which only eviction does.
                _ = &mut evicted => return Closed::Evicted,
                () = &mut over, if !past_deadline => {
                    if *self.phase.borrow() == Phase::Pending {
                        return Closed::TimedOut(timeout);
                    }
                    past_deadline = true;
                }
            }
        }
    }

    /// `work`'s output, unless the gate closes the connection first.
    pub async fn run<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, Closed> {
        tokio::select! {
            out = work => Ok(out),
            closed = self.closed() => Err(closed),
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.gate.lock().remove(self.id);
    }
}

/// Marks an [`Entry`] proven; see [`Entry::proof`].
#[derive(Debug, Clone)]
pub struct Proof {
    gate: Gate,
    id: u64,
}

impl Proof {
    /// See [`Entry::proven`]. Once evicted, an entry stays evicted.
    pub fn proven(&self) {
        if let Some(held) = self.gate.lock().held.get(&self.id) {
            held.phase.send_if_modified(|p| {
                let was = *p == Phase::Pending;
                if was {
                    *p = Phase::Proven;
                }
                was
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    fn gate(per_peer: usize, total: usize) -> Gate {
        Gate::new(GateLimits {
            per_peer,
            total,
            pending_timeout: Duration::from_secs(60),
        })
    }

    fn evicted(e: &Entry) -> bool {
        *e.phase.borrow() == Phase::Evicted
    }

    #[tokio::test]
    async fn a_peer_at_its_share_evicts_its_own_oldest_and_no_one_elses() {
        let g = gate(3, 100);
        let other = g.admit(ip(1));
        let flood: Vec<Entry> = (0..10).map(|_| g.admit(ip(9))).collect();
        assert!(!evicted(&other));
        assert_eq!(g.held(ip(9)), (4, 3));
        assert!(flood[..7].iter().all(evicted));
        assert!(flood[7..].iter().all(|e| !evicted(e)));
    }

    #[tokio::test]
    async fn a_full_pool_evicts_from_the_busiest_peer_and_spares_a_single_connection() {
        let g = gate(8, 10);
        let probe = g.admit(ip(1));
        let mut flood = Vec::new();
        for i in 0..100u8 {
            flood.push(g.admit(ip(10 + i % 3)));
        }
        assert!(!evicted(&probe), "the oldest, but its peer holds one");
        assert_eq!(g.held(ip(1)), (10, 1));
    }

    #[tokio::test]
    async fn unproven_connections_go_before_proven_ones_of_the_same_peer() {
        let g = gate(2, 100);
        let answering = g.admit(ip(9));
        answering.proven();
        let pending = g.admit(ip(9));
        let _newcomer = g.admit(ip(9));
        assert!(evicted(&pending));
        assert!(!evicted(&answering));
    }

    #[tokio::test]
    async fn dropped_entries_leave_the_pool() {
        let g = gate(2, 2);
        let a = g.admit(ip(1));
        let b = g.admit(ip(2));
        drop((a, b));
        assert_eq!(g.held(ip(1)), (0, 0));
        let _c = g.admit(ip(1));
        assert_eq!(g.held(ip(1)), (1, 1));
    }

    #[tokio::test]
    async fn an_unproven_connection_times_out_and_a_proven_one_does_not() {
        let g = Gate::new(GateLimits {
            per_peer: 8,
            total: 8,
            pending_timeout: Duration::from_millis(100),
        });
        let mut late = g.admit(ip(1));
        assert_eq!(
            late.closed().await,
            Closed::TimedOut(Duration::from_millis(100))
        );
        let mut proven = g.admit(ip(1));
        proven.proven();
        let out = tokio::time::timeout(Duration::from_millis(400), proven.closed()).await;
        assert!(out.is_err(), "a proven connection was closed: {out:?}");
    }

    #[tokio::test]
    async fn an_evicted_connection_learns_it_at_once() {
        let g = gate(1, 8);
        let mut first = g.admit(ip(1));
        let _second = g.admit(ip(1));
        let out = tokio::time::timeout(Duration::from_secs(1), first.closed()).await;
        assert_eq!(out, Ok(Closed::Evicted));
    }
}
