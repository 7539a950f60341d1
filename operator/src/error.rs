//! Errors of a reconcile ([`Error`]) and how a log line prints one with its causes
//! ([`error_chain`]). Their metric kind is the metrics module's (`MetricKind`).

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metrics, ERROR_KINDS};
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
