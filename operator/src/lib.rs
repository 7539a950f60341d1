//! The Ferry operator: validation (the second of three checks: CRD rules at admission,
//! this, the agent at open time), volume resolution, shard scheduling, the CopyJob
//! reconciler, the CopySchedule controller, the signer of the agents' transfer certificates,
//! leader election, and the metrics and readiness served on `--listen`.
//!
//! Modules depend one way: `controller` (wiring) on `apply` (the finalizer's two sides),
//! which uses `resolve`, `decide`, `status`, `schedule`, `heartbeat` and `ticket`; `copyschedule`
//! (its own wiring and I/O) on `copyschedule::decide`, which uses `cron`, `status` and
//! `validate`; `metrics` (which reads schedules with `cron`) and `leader` know nothing of
//! the controllers (`main` passes what they need in); `signer` stands alone.

pub mod apply;
pub mod controller;
pub mod copyschedule;
pub mod cron;
pub mod decide;
pub mod heartbeat;
pub mod holder;
pub mod leader;
pub mod metrics;
pub mod schedule;
pub mod signer;
pub mod snapshot;
pub mod status;
pub mod ticket;

/// The tenant rules and volume resolution, shared with the agents.
pub use ferry_resolve::{self as resolve, validate, volume};

/// Errors of a reconcile that are worth a retry (the API server, the network). A variant
/// that wraps another error says only what failed and leaves the cause to `source()`, so
/// printing the chain ([`error_chain`]) shows each cause once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API")]
    Kube(#[from] kube::Error),
    #[error("finalizer")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("{0} has no namespace")]
    NoNamespace(String),
    #[error("a ticket for a copy between nodes")]
    Ticket(#[source] ferry_link::Error),
    /// Not a failure: deletion waits for these nodes' agents to stop their shards.
    #[error("waiting for the agents on {0} to stop")]
    Stopping(String),
}

/// An error and its causes, each once: `what failed: why: why that`. For log lines. kube-rs
/// errors print their cause inside their own message as well as return it as their
/// source, so a cause whose message is already in the line is not repeated.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let message = e.to_string();
        if !line.contains(&message) {
            line.push_str(": ");
            line.push_str(&message);
        }
        cause = e.source();
    }
    line
}

impl metrics::MetricKind for Error {
    /// The bounded `kind` label of a reconcile error, or `None` for an outcome that is not
    /// a failure (a deletion that waits for agents to stop their shards).
    fn metric_kind(&self) -> Option<&'static str> {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Kube(_) => Some("kube_api"),
            Error::NoNamespace(_) => Some("no_namespace"),
            Error::Ticket(_) => Some("ticket"),
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

    #[test]
    fn a_reconcile_error_prints_each_cause_once() {
        let parse = serde_json::from_str::<i64>("x").expect_err("not a number");
        let cause = parse.to_string();
        let error = Error::Finalizer(Box::new(kube::runtime::finalizer::Error::ApplyFailed(
            Error::Kube(kube::Error::SerdeError(parse)),
        )));
        assert_eq!(error.to_string(), "finalizer");
        let line = error_chain(&error);
        assert_eq!(
            line,
            format!(
                "finalizer: failed to apply object: kubernetes API: Error deserializing response: {cause}"
            )
        );
        assert_eq!(line.matches(&cause).count(), 1, "{line}");
        assert_eq!(line.matches("kubernetes API").count(), 1, "{line}");
    }
}
