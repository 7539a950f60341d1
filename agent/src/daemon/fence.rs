//! The node's heartbeat Lease, renewed every third of a lease, and the [`Fence`] it
//! moves: until when this agent may commit work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::AGENT_MANAGER_PREFIX;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::settings::Settings;

/// Name of a node's heartbeat Lease.
pub fn lease_name(node: &str) -> String {
    format!("ferry-agent-{node}")
}

/// Until when this agent may run shards: two thirds of a lease after its last successful
/// renewal was sent. The operator gives an agent's shared work away only after a whole
/// lease without renewal, so an agent cut off from the API server (or frozen) stops a
/// third of a lease before anyone else may start on the same files.
#[derive(Debug)]
pub struct Fence {
    base: std::time::Instant,
    /// Nanoseconds after `base`; 0 before the first renewal.
    until: AtomicU64,
    /// Times a renewal came after `until` had passed: a run that began before such a gap
    /// may have lost its work meanwhile, so it never commits again (see `holds_since`).
    lapses: AtomicU64,
    lease: Duration,
}

impl Fence {
    pub(super) fn new(lease_seconds: i32) -> Self {
        Self {
            base: std::time::Instant::now(),
            until: AtomicU64::new(0),
            lapses: AtomicU64::new(0),
            lease: Duration::from_secs(lease_seconds.max(1) as u64),
        }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// A renewal sent at `sent` succeeded. A gap is recorded before the deadline moves,
    /// so a worker that sees the new deadline also sees the gap.
    fn renewed(&self, sent: std::time::Instant) {
        let until = self.until.load(Ordering::SeqCst);
        if until != 0 && self.now() >= until {
            self.lapses.fetch_add(1, Ordering::SeqCst);
        }
        let next = sent.duration_since(self.base) + self.lease * 2 / 3;
        self.until
            .fetch_max(next.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Whether this agent may still commit work.
    pub fn holds(&self) -> bool {
        self.now() < self.until.load(Ordering::SeqCst)
    }

    /// The gaps so far: a run remembers it when it begins, for [`Fence::holds_since`].
    pub(super) fn lapses(&self) -> u64 {
        self.lapses.load(Ordering::SeqCst)
    }

    /// Whether a run that began when the lapse count was `lapses` may still commit: the
    /// lease holds and has held without a gap since.
    pub(super) fn holds_since(&self, lapses: u64) -> bool {
        self.holds() && self.lapses.load(Ordering::SeqCst) == lapses
    }
}

/// Renew the node's Lease forever, moving `fence` after each renewal that succeeded.
pub(super) async fn heartbeat(
    client: Client,
    settings: Settings,
    health: Arc<crate::serve::Health>,
    fence: Arc<Fence>,
) {
    let leases = Api::<Lease>::namespaced(client, &settings.namespace);
    let name = lease_name(&settings.node);
    let every = Duration::from_secs(settings.lease_seconds.max(3) as u64) / 3;
    loop {
        let sent = std::time::Instant::now();
        // The transfer port's address, for the receivers of the copies this node sends, and
        // the peering port's, for the exports it serves.
        let annotations: std::collections::BTreeMap<String, String> = [
            (
                ferry_crds::TRANSFER_ADDRESS_ANNOTATION,
                &settings.transfer_address,
            ),
            (
                ferry_crds::PEERING_ADDRESS_ANNOTATION,
                &settings.peering_address,
            ),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v.clone()?)))
        .collect();
        let annotations = (!annotations.is_empty()).then_some(annotations);
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                annotations,
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.node.clone()),
                lease_duration_seconds: Some(settings.lease_seconds),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        let mut body = serde_json::to_value(&lease).unwrap_or_default();
        body["apiVersion"] = "coordination.k8s.io/v1".into();
        body["kind"] = "Lease".into();
        let pp = PatchParams::apply(&format!("{AGENT_MANAGER_PREFIX}{}", settings.node)).force();
        match leases.patch(&name, &pp, &Patch::Apply(&body)).await {
            Ok(_) => {
                fence.renewed(sent);
                health
                    .lease_renewed
                    .store(crate::serve::unix_now(), Ordering::Relaxed)
            }
            Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
        }
        tokio::time::sleep(every.saturating_sub(sent.elapsed())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_may_commit_only_while_the_heartbeat_has_held_without_a_gap_since_it_began() {
        let fence = Fence::new(3);
        assert!(
            !fence.holds(),
            "nothing may be committed before the first renewal"
        );
        fence.renewed(std::time::Instant::now());
        assert!(fence.holds());
        let run = fence.lapses.load(Ordering::SeqCst);
        assert!(fence.holds_since(run));
        // A renewal sent long ago (the agent was frozen or cut off) has already run out...
        let long_ago = std::time::Instant::now() - Duration::from_secs(10);
        let fence = Fence {
            base: long_ago - Duration::from_secs(1),
            ..Fence::new(3)
        };
        fence.renewed(long_ago);
        let run = fence.lapses.load(Ordering::SeqCst);
        assert!(!fence.holds() && !fence.holds_since(run));
        // ...and the next renewal brings the agent back, but not the runs from before the gap.
        fence.renewed(std::time::Instant::now());
        assert!(fence.holds());
        assert!(
            !fence.holds_since(run),
            "a run from before the gap must stay fenced"
        );
        assert!(
            fence.holds_since(run + 1),
            "a run started after it may commit"
        );
    }
}
