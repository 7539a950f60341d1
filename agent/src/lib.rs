//! The Ferry node agent. `cli` parses the command line; `copy_cmd` is `ferry-agent copy`;
//! `block_cmd` is `ferry-agent copy-block`; `handoff` a block device passed from its holder
//! pod to the agent (`ferry-agent hold-block`) and checked;
//! `confinement` what the agent may do on its node (`ferry-agent confinement`);
//! `daemon` is `ferry-agent run`, the per-node agent; `serve` its /metrics, /healthz and
//! /readyz endpoints; `flush` the `syncfs` that shards finishing together share; `memcg` the memory
//! limit a copy into tmpfs counts against.

pub mod block_cmd;
pub mod cli;
pub mod confinement;
pub mod copy_cmd;
pub mod daemon;
pub mod flush;
pub mod handoff;
pub mod memcg;
pub mod peering;
pub mod serve;
pub mod transfer;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Lock `m` even if a thread panicked holding it: what the agent keeps behind locks
/// (counters, lists of running shards and failures) is consistent at every step, so one
/// panicked task must not take the others down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An error and each of its causes, joined by ": " (what `anyhow` prints with `{:#}`): the
/// one-line message a shard's status and the CLI's usage error carry. A cause whose text
/// the message already ends with is not said twice: some errors print their source in
/// their own text (the transfer's I/O errors do), and "refused: refused" tells no more.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::with_causes;

    #[derive(Debug)]
    struct Wrapped(String, std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let said = refused().to_string();
        // A wrapper that prints its source in its own text: the source is not repeated.
        let own = format!("dial 127.0.0.5:4000: {said}");
        let e = Wrapped(own.clone(), refused());
        assert_eq!(with_causes(&e), own);
        // One that does not: its source is added.
        let e = Wrapped("dial 127.0.0.5:4000".into(), refused());
        assert_eq!(with_causes(&e), format!("dial 127.0.0.5:4000: {said}"));
    }
}
