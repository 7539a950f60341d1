//! Agent liveness from their heartbeat Leases (`ferry-agent-<node>`). A pod's status says
//! nothing about a lost node, so each agent renews a Lease and the operator reads it.
//!
//! Expiry is judged on the operator's own monotonic clock, as client-go's leader election
//! does: a Lease counts as renewed when its `renewTime` changes, whatever the agent's clock
//! says. Only on first sight (an operator that just started) is the agent's timestamp
//! used, so a replica taking over does not give long-dead agents a fresh lease.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use kube::ResourceExt;

/// Prefix of the agents' Lease names; the rest is the node name.
pub const LEASE_PREFIX: &str = "ferry-agent-";

/// What this operator has seen of one agent's Lease.
#[derive(Debug)]
struct Seen {
    renew: Option<String>,
    /// When the current `renew` was (in effect) written, on our clock.
    at: Instant,
    duration: Duration,
}

/// The agents' heartbeats, read from a reflector of their Leases.
#[derive(Debug)]
pub struct Heartbeats {
    store: Store<Lease>,
    seen: Mutex<HashMap<String, Seen>>,
}

impl Heartbeats {
    pub fn new(store: Store<Lease>) -> Self {
        Self {
            store,
            seen: Mutex::default(),
        }
    }

    /// Take in the Leases as they are now, and look at what was seen.
    fn observe<T>(&self, look: impl FnOnce(&HashMap<String, Seen>) -> T) -> T {
        let now = Instant::now();
        let wall = Timestamp::now();
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for lease in self.store.state() {
            let Some(node) = lease
                .name_any()
                .strip_prefix(LEASE_PREFIX)
                .map(String::from)
            else {
                continue;
            };
            let Some(spec) = &lease.spec else { continue };
            let renew = spec.renew_time.as_ref().map(|t| t.0.to_string());
            let duration =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(30).max(1) as u64);
            match seen.get_mut(&node) {
                Some(s) if s.renew == renew => s.duration = duration,
                Some(s) => {
                    *s = Seen {
                        renew,
                        at: now,
                        duration,
                    }
                }
                None => {
                    // First sight: trust the agent's timestamp, but never beyond one lease.
                    let age = spec
                        .renew_time
                        .as_ref()
                        .map_or(duration, |t| {
                            let secs = (wall.as_millisecond() - t.0.as_millisecond()).max(0);
                            Duration::from_millis(secs as u64)
                        })
                        .min(duration + Duration::from_secs(1));
                    seen.insert(
                        node,
                        Seen {
                            renew,
                            at: now.checked_sub(age).unwrap_or(now),
                            duration,
                        },
                    );
                }
            }
        }
        look(&seen)
    }

    /// Nodes whose agent's Lease is current.
    pub fn live(&self) -> BTreeSet<String> {
        self.observe(|seen| {
            seen.iter()
                .filter(|(_, s)| s.at.elapsed() <= s.duration)
                .map(|(node, _)| node.clone())
                .collect()
        })
    }

    /// Whether the node's agent serves a transfer port (its Lease says where): it can send
    /// and receive copies between nodes.
    pub fn serves_transfers(&self, node: &str) -> bool {
        self.advertises(node, ferry_crds::TRANSFER_ADDRESS_ANNOTATION)
    }

    /// Whether the node's agent has a peering port (and so a peering identity, to read
    /// another install's export with).
    pub fn serves_peering(&self, node: &str) -> bool {
        self.advertises(node, ferry_crds::PEERING_ADDRESS_ANNOTATION)
    }

    /// Whether the node's heartbeat Lease carries the address annotation `annotation`.
    fn advertises(&self, node: &str, annotation: &str) -> bool {
        let name = format!("{LEASE_PREFIX}{node}");
        self.store.state().iter().any(|l| {
            l.metadata.name.as_deref() == Some(name.as_str())
                && l.annotations().contains_key(annotation)
        })
    }

    /// `None` while the node's agent is live; otherwise how long ago its Lease expired
    /// (zero for a node whose agent this operator has never seen).
    pub fn lost_for(&self, node: &str) -> Option<Duration> {
        self.observe(|seen| match seen.get(node) {
            None => Some(Duration::ZERO),
            Some(s) => s.at.elapsed().checked_sub(s.duration),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::runtime::{reflector, watcher};

    fn lease(node: &str, renewed: Timestamp, secs: i32) -> Lease {
        Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{LEASE_PREFIX}{node}")),
                namespace: Some("ferry-system".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn an_agent_is_live_while_its_lease_keeps_changing_on_the_operators_clock() {
        let (store, mut writer) = reflector::store::<Lease>();
        let now = Timestamp::now();
        let hour_ago = now - k8s_openapi::jiff::SignedDuration::from_secs(3600);
        writer.apply_watcher_event(&watcher::Event::Apply(lease("fresh", now, 1)));
        writer.apply_watcher_event(&watcher::Event::Apply(lease("old", hour_ago, 30)));
        let hb = Heartbeats::new(store);
        // First sight: the agent's own timestamp says whether it is current.
        assert_eq!(hb.live(), BTreeSet::from(["fresh".to_string()]));
        assert!(hb.lost_for("old").is_some());
        assert_eq!(hb.lost_for("never-seen"), Some(Duration::ZERO));
        // Not renewed for its 1 s duration: lost, whatever the timestamp claims.
        std::thread::sleep(Duration::from_millis(1100));
        assert!(hb.live().is_empty());
        // A renewal (a new renewTime) brings it back, even from a clock far behind ours.
        writer.apply_watcher_event(&watcher::Event::Apply(lease("fresh", hour_ago, 1)));
        assert_eq!(hb.live(), BTreeSet::from(["fresh".to_string()]));
        assert_eq!(hb.lost_for("fresh"), None);
    }
}
