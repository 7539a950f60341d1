//! What a CopyJob copies, as a digest: the spec's fields that decide which bytes go where
//! and how (everything but `suspend`, `parallelism` and `ttlSecondsAfterFinished`, the
//! fields a started job may change). The operator stamps it on each shard it cuts; a
//! shard runs, and a status reports, only for the spec it was cut for, so a spec changed
//! behind the CRD's rule (a job back in Pending while its shards still ran, a CRD
//! installed without its rules) can never be reported as copied or verified.

use crate::CopyJobSpec;

impl CopyJobSpec {
    /// `sha256:` and the first 128 bits of SHA-256 (hex) of the spec's copy-defining
    /// fields in their JSON form. A cryptographic hash: a tenant cannot craft a different
    /// spec with the same digest.
    pub fn digest(&self) -> String {
        let what = CopyJobSpec {
            suspend: false,
            parallelism: Default::default(),
            ttl_seconds_after_finished: None,
            ..self.clone()
        };
        // Serialising plain structs, enums, strings and lists cannot fail; fields come out
        // in declaration order, so equal specs give equal text.
        let text = serde_json::to_vec(&what).unwrap_or_default();
        format!("sha256:{}", sha256_128_hex(&text))
    }
}

/// The first 128 bits of the SHA-256 of `bytes`, in hex (32 characters): a name or a
/// digest no one can aim a collision at.
pub(crate) fn sha256_128_hex(bytes: &[u8]) -> String {
    let sum = ring::digest::digest(&ring::digest::SHA256, bytes);
    sum.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::{CopyJobSpec, Endpoint};

    fn spec(dst: &str) -> CopyJobSpec {
        serde_json::from_value(serde_json::json!({
            "source": {"root": "r", "path": "in"},
            "destination": {"root": "r", "path": dst},
        }))
        .expect("a spec")
    }

    #[test]
    fn what_is_copied_changes_the_digest_and_what_a_started_job_may_change_does_not() {
        let a = spec("out");
        assert_eq!(a.digest(), spec("out").digest());
        assert!(a.digest().starts_with("sha256:") && a.digest().len() == 7 + 32);
        let mut moved = a.clone();
        moved.destination = Endpoint {
            path: "elsewhere".into(),
            ..a.destination.clone()
        };
        assert_ne!(a.digest(), moved.digest());
        let mut filtered = a.clone();
        filtered.exclude = vec!["*.tmp".into()];
        assert_ne!(a.digest(), filtered.digest());
        let mut tuned = a.clone();
        tuned.suspend = true;
        tuned.parallelism.max_agents = 7;
        tuned.ttl_seconds_after_finished = Some(5);
        assert_eq!(a.digest(), tuned.digest());
    }
}
