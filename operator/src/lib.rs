//! The Ferry operator: validation (the second of three checks: CRD rules at admission,
//! this, the agent at open time), volume resolution, shard scheduling, the CopyJob
//! reconciler, leader election, and the metrics and readiness served on `--listen`.
//!
//! Modules depend one way: `controller` (wiring) on `apply` (the finalizer's two sides),
//! which uses `resolve`, `decide`, `status`, `schedule` and `heartbeat`; `metrics` and
//! `leader` know nothing of the controller (`main` passes what they need in).

pub mod apply;
pub mod controller;
pub mod decide;
pub mod heartbeat;
pub mod leader;
pub mod metrics;
pub mod resolve;
pub mod schedule;
pub mod status;
pub mod validate;
pub mod volume;

/// Errors of a reconcile that are worth a retry (the API server, the network).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("{0} has no namespace")]
    NoNamespace(String),
    /// Not a failure: deletion waits for these nodes' agents to stop their shards.
    #[error("waiting for the agents on {0} to stop")]
    Stopping(String),
}

impl metrics::MetricKind for Error {
    /// The bounded `kind` label of a reconcile error, or `None` for an outcome that is not
    /// a failure (a deletion that waits for agents to stop their shards).
    fn metric_kind(&self) -> Option<&'static str> {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Kube(_) => Some("kube_api"),
            Error::NoNamespace(_) => Some("no_namespace"),
            Error::Stopping(_) => None,
            Error::Finalizer(e) => match &**e {
                F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner.metric_kind(),
                F::AddFinalizer(_)
                | F::RemoveFinalizer(_)
                | F::UnnamedObject
                | F::InvalidFinalizer => Some("finalizer"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::{Metrics, ERROR_KINDS};
    use std::time::Duration;

    #[test]
    fn errors_are_counted_by_a_bounded_kind_and_a_waiting_deletion_is_not_an_error() {
        let m = Metrics::new().expect("metrics");
        let apply_failed = Error::Finalizer(Box::new(
            kube::runtime::finalizer::Error::ApplyFailed(Error::NoNamespace("x".into())),
        ));
        let waiting = Error::Finalizer(Box::new(kube::runtime::finalizer::Error::CleanupFailed(
            Error::Stopping("node-a".into()),
        )));
        m.reconciled(Duration::from_millis(3), Some(&apply_failed));
        m.reconciled(Duration::from_millis(3), Some(&waiting));
        m.reconciled(Duration::from_millis(3), None);
        let count = |k| m.reconcile_errors.with_label_values(&[k]).get();
        assert_eq!(count("no_namespace"), 1);
        assert_eq!(count("kube_api") + count("finalizer"), 0);
        assert_eq!(m.reconcile_seconds.get_sample_count(), 3);
        let text = ferry_serve::render(&m.registry);
        for kind in ERROR_KINDS {
            assert!(
                text.contains(&format!(
                    "ferry_operator_reconcile_errors_total{{kind=\"{kind}\"}}"
                )),
                "{text}"
            );
        }
    }
}
