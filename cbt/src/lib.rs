//! Changed-block tracking: what a CSI driver says about its own block snapshots, through
//! its `csi-snapshot-metadata` sidecar (the Kubernetes SnapshotMetadata API, beta in 1.36).
//!
//! - [`Service::of_driver`] finds the driver's `SnapshotMetadataService` (cluster-scoped,
//!   named after the driver): the sidecar's address, the CA that signs its certificate and
//!   the audience its callers' tokens must carry.
//! - [`token`] asks the API server for such a token for a ServiceAccount (TokenRequest).
//!   The sidecar reviews it and asks the API server whether its holder may `get` the
//!   VolumeSnapshots of the namespace it names, so a caller reads nothing it could not
//!   already see.
//! - [`ranges`] streams either the allocated ranges of one snapshot or the ranges changed
//!   between a base snapshot and a later one, checks them as the API promises them (in
//!   order, not overlapping, inside the volume, one capacity) and merges adjacent ones.
//!
//! The answer is an input from outside Ferry, so every call is bounded: a deadline, at most
//! `limit` ranges, messages of at most [`MAX_MESSAGE`] bytes. A stream cut half-way is asked
//! again from where it stopped (the API's `starting_offset`), a few times.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::{Api, CustomResource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

#[allow(clippy::all, missing_debug_implementations)]
pub mod api;

use api::snapshot_metadata_client::SnapshotMetadataClient;

/// The largest message accepted from a sidecar. Each range is ~20 bytes on the wire, so
/// this is ~200k ranges in one message, far more than a sidecar sends at once.
pub const MAX_MESSAGE: usize = 4 << 20;

/// Times a stream cut half-way is asked again from where it stopped.
const RESUMES: u32 = 3;

/// The advertisement of a driver's snapshot-metadata sidecar (`cbt.storage.k8s.io`), as
/// its CRD (vendored by the sidecar's client module) defines it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "cbt.storage.k8s.io",
    version = "v1alpha1",
    kind = "SnapshotMetadataService",
    plural = "snapshotmetadataservices"
)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotMetadataServiceSpec {
    /// The sidecar's TCP address, `host:port`.
    pub address: String,
    /// The audience its callers' tokens must carry.
    pub audience: String,
    /// The CA bundle (PEM) that signs the sidecar's serving certificate.
    #[schemars(with = "String")]
    pub ca_cert: ByteString,
}

/// Where and how to reach one driver's sidecar.
#[derive(Clone, Debug)]
pub struct Service {
    pub driver: String,
    pub address: String,
    pub audience: String,
    ca_pem: Vec<u8>,
}

/// What to ask a sidecar.
#[derive(Clone, Copy, Debug)]
pub enum Query<'a> {
    /// The ranges of VolumeSnapshot `snapshot` that hold data.
    Allocated { snapshot: &'a str },
    /// The ranges where VolumeSnapshot `snapshot` differs from the snapshot whose CSI handle
    /// (its VolumeSnapshotContent's `status.snapshotHandle`) is `base_handle`.
    Delta {
        base_handle: &'a str,
        snapshot: &'a str,
    },
}

/// The bounds of one call.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The whole call, resumes included.
    pub deadline: Duration,
    /// Ranges as the sidecar sends them, before merging.
    pub ranges: usize,
}

/// A sidecar's answer: byte ranges `(offset, length)` in increasing order, adjacent ones
/// merged, all inside `capacity`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranges {
    /// The volume's size, as every message says it; 0 when the answer had no message (no
    /// range: nothing allocated or changed, and the size not said).
    pub capacity: u64,
    pub ranges: Vec<(u64, u64)>,
}

impl Ranges {
    /// Bytes the ranges cover.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|&(_, len)| len).sum()
    }

    /// One flag a chunk of `chunk` bytes over a device of `size`: set where a range touches
    /// the chunk, and past `capacity` (what the driver says nothing about is read).
    pub fn chunks(&self, chunk: u64, size: u64) -> Vec<bool> {
        let count = size.div_ceil(chunk.max(1));
        let mut changed = vec![false; usize::try_from(count).unwrap_or(usize::MAX)];
        let mut mark = |from: u64, to: u64| {
            if from >= to || from >= size {
                return;
            }
            let last = (to.min(size) - 1) / chunk;
            for c in from / chunk..=last {
                changed[c as usize] = true;
            }
        };
        for &(off, len) in &self.ranges {
            mark(off, off.saturating_add(len));
        }
        mark(self.capacity, size);
        changed
    }

    /// Ranges from text, one `offset length` (bytes) a line, in any order: what
    /// `ferry-agent copy-block --changed` reads. At most `limit` lines.
    pub fn parse(text: &str, limit: usize) -> Result<Ranges, String> {
        let mut ranges = Vec::new();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            if ranges.len() == limit {
                return Err(format!("more than {limit} ranges"));
            }
            let mut fields = line.split_whitespace().map(str::parse::<u64>);
            match (fields.next(), fields.next(), fields.next()) {
                (Some(Ok(off)), Some(Ok(len)), None) if len > 0 => ranges.push((off, len)),
                _ => {
                    return Err(format!(
                        "line {}: {line:?} is not `offset length` in bytes",
                        n + 1
                    ))
                }
            }
        }
        ranges.sort_unstable();
        Ok(Ranges {
            // The list covers the whole device: nothing past a capacity to read.
            capacity: u64::MAX,
            ranges,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the SnapshotMetadataService of driver {driver}: {source}")]
    Lookup {
        driver: String,
        #[source]
        source: kube::Error,
    },
    #[error("the SnapshotMetadataService of driver {driver} is unusable: {why}")]
    BadService { driver: String, why: String },
    #[error("requesting a token for ServiceAccount {namespace}/{name}: {source}")]
    Token {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("connecting to the snapshot-metadata sidecar of {driver} at {address}: {source}")]
    Connect {
        driver: String,
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The sidecar (or the driver behind it) answered with an error status.
    #[error("the snapshot-metadata sidecar of {driver} refused: {code:?}: {message}")]
    Refused {
        driver: String,
        code: tonic::Code,
        message: String,
    },
    #[error(
        "the snapshot-metadata sidecar of {driver} sent an answer the API does not allow: {why}"
    )]
    Invalid { driver: String, why: String },
    #[error("the snapshot-metadata sidecar of {driver} sent more than {limit} ranges")]
    TooMany { driver: String, limit: usize },
    #[error("the snapshot-metadata sidecar of {driver} did not finish within {deadline:?}")]
    Deadline { driver: String, deadline: Duration },
}

impl Service {
    /// The sidecar of CSI driver `driver`, if the cluster advertises one.
    pub async fn of_driver(client: &kube::Client, driver: &str) -> Result<Option<Service>, Error> {
        let api: Api<SnapshotMetadataService> = Api::all(client.clone());
        let found = match api.get_opt(driver).await {
            Ok(found) => found,
            // No such CRD in the cluster: nobody serves changed blocks.
            Err(kube::Error::Api(status)) if status.code == 404 => None,
            Err(source) => {
                return Err(Error::Lookup {
                    driver: driver.to_owned(),
                    source,
                })
            }
        };
        found.map(|sms| Service::new(driver, sms.spec)).transpose()
    }

    /// A service from its advertisement, refused when it cannot be used as it stands.
    pub fn new(driver: &str, spec: SnapshotMetadataServiceSpec) -> Result<Service, Error> {
        let bad = |why: &str| Error::BadService {
            driver: driver.to_owned(),
            why: why.to_owned(),
        };
        // host:port, nothing else: the scheme is always https.
        if spec.address.is_empty()
            || spec.address.contains("://")
            || spec.address.contains('/')
            || !spec.address.contains(':')
        {
            return Err(bad("spec.address is not host:port"));
        }
        if spec.audience.is_empty() {
            return Err(bad("spec.audience is empty"));
        }
        if !String::from_utf8_lossy(&spec.ca_cert.0).contains("-----BEGIN CERTIFICATE-----") {
            return Err(bad("spec.caCert holds no PEM certificate"));
        }
        Ok(Service {
            driver: driver.to_owned(),
            address: spec.address,
            audience: spec.audience,
            ca_pem: spec.ca_cert.0,
        })
    }

    async fn connect(&self) -> Result<SnapshotMetadataClient<tonic::transport::Channel>, Error> {
        let connect = |source| Error::Connect {
            driver: self.driver.clone(),
            address: self.address.clone(),
            source,
        };
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        let channel = Endpoint::from_shared(format!("https://{}", self.address))
            .map_err(connect)?
            .connect_timeout(Duration::from_secs(10))
            .tls_config(tls)
            .map_err(connect)?
            .connect()
            .await
            .map_err(connect)?;
        Ok(SnapshotMetadataClient::new(channel).max_decoding_message_size(MAX_MESSAGE))
    }
}

/// A token of ServiceAccount `namespace/name` for `audience`, valid `ttl` (the API server
/// may shorten it; at least 10 minutes is always granted).
pub async fn token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    audience: &str,
    ttl: Duration,
) -> Result<String, Error> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_owned()],
            expiration_seconds: Some(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let granted = api
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(|source| Error::Token {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        })?;
    Ok(granted.status.map(|s| s.token).unwrap_or_default())
}

/// Ask `service` the `query` about VolumeSnapshots in `namespace`, as the holder of `token`.
pub async fn ranges(
    service: &Service,
    token: &str,
    namespace: &str,
    query: Query<'_>,
    limits: Limits,
) -> Result<Ranges, Error> {
    let work = async {
        let mut client = service.connect().await?;
        let mut seen = Seen::new(&service.driver, limits.ranges);
        let mut resumes = 0;
        loop {
            let from = seen.next_offset();
            match stream_once(&mut client, &mut seen, token, namespace, query, from).await {
                Ok(()) => return Ok(seen.finish()),
                // A cut stream that had made progress is asked again from where it stopped;
                // an answer that is an error from the start is the sidecar's answer.
                Err(Cut::Transport(_)) if resumes < RESUMES && seen.next_offset() > from => {
                    resumes += 1;
                    seen.resumed = true;
                }
                Err(Cut::Transport(status)) => {
                    return Err(Error::Refused {
                        driver: service.driver.clone(),
                        code: status.code(),
                        message: status.message().to_owned(),
                    })
                }
                Err(Cut::Bad(e)) => return Err(e),
            }
        }
    };
    tokio::time::timeout(limits.deadline, work)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Deadline {
                driver: service.driver.clone(),
                deadline: limits.deadline,
            })
        })
}

enum Cut {
    Transport(tonic::Status),
    Bad(Error),
}

async fn stream_once(
    client: &mut SnapshotMetadataClient<tonic::transport::Channel>,
    seen: &mut Seen,
    token: &str,
    namespace: &str,
    query: Query<'_>,
    from: u64,
) -> Result<(), Cut> {
    let starting_offset = i64::try_from(from).unwrap_or(i64::MAX);
    // Each message is (offset, length, capacity) as one shape for both calls.
    let mut stream = match query {
        Query::Allocated { snapshot } => client
            .get_metadata_allocated(api::GetMetadataAllocatedRequest {
                security_token: token.to_owned(),
                namespace: namespace.to_owned(),
                snapshot_name: snapshot.to_owned(),
                starting_offset,
                max_results: 0,
            })
            .await
            .map_err(Cut::Transport)?
            .into_inner()
            .map(|m| m.map(|m| (m.volume_capacity_bytes, m.block_metadata)))
            .boxed(),
        Query::Delta {
            base_handle,
            snapshot,
        } => client
            .get_metadata_delta(api::GetMetadataDeltaRequest {
                security_token: token.to_owned(),
                namespace: namespace.to_owned(),
                base_snapshot_id: base_handle.to_owned(),
                target_snapshot_name: snapshot.to_owned(),
                starting_offset,
                max_results: 0,
            })
            .await
            .map_err(Cut::Transport)?
            .into_inner()
            .map(|m| m.map(|m| (m.volume_capacity_bytes, m.block_metadata)))
            .boxed(),
    };
    while let Some(message) = stream.next().await {
        let (capacity, blocks) = message.map_err(Cut::Transport)?;
        seen.take(capacity, &blocks).map_err(Cut::Bad)?;
    }
    Ok(())
}

/// The ranges received so far, checked one by one as the API promises them.
struct Seen {
    driver: String,
    limit: usize,
    received: usize,
    capacity: Option<u64>,
    ranges: Vec<(u64, u64)>,
    /// The next range is the first of a resumed stream.
    resumed: bool,
}

impl Seen {
    fn new(driver: &str, limit: usize) -> Seen {
        Seen {
            driver: driver.to_owned(),
            limit,
            received: 0,
            capacity: None,
            ranges: Vec::new(),
            resumed: false,
        }
    }

    /// Where a resumed stream starts: just after the last byte received.
    fn next_offset(&self) -> u64 {
        self.ranges.last().map_or(0, |&(off, len)| off + len)
    }

    fn take(&mut self, capacity: i64, blocks: &[api::BlockMetadata]) -> Result<(), Error> {
        let invalid = |why: String| Error::Invalid {
            driver: self.driver.clone(),
            why,
        };
        let capacity = u64::try_from(capacity)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| invalid(format!("volume capacity {capacity}")))?;
        match self.capacity {
            Some(known) if known != capacity => {
                return Err(invalid(format!(
                    "the volume capacity changed from {known} to {capacity} within one answer"
                )))
            }
            _ => self.capacity = Some(capacity),
        }
        for block in blocks {
            self.received += 1;
            if self.received > self.limit {
                return Err(Error::TooMany {
                    driver: self.driver.clone(),
                    limit: self.limit,
                });
            }
            let (off, len) = match (
                u64::try_from(block.byte_offset),
                u64::try_from(block.size_bytes),
            ) {
                (Ok(off), Ok(len)) if len > 0 => (off, len),
                _ => {
                    return Err(invalid(format!(
                        "range at {} of {} bytes",
                        block.byte_offset, block.size_bytes
                    )))
                }
            };
            let end = off
                .checked_add(len)
                .filter(|&end| end <= capacity)
                .ok_or_else(|| {
                    invalid(format!(
                        "range {off}+{len} ends past the volume's {capacity} bytes"
                    ))
                })?;
            let last_end = self.next_offset();
            let resumed = std::mem::take(&mut self.resumed);
            let off = if off >= last_end {
                off
            } else if resumed && end > last_end {
                // A resumed stream starts with the range it was cut in (the API promises
                // only that it does not end before starting_offset): the new part counts.
                last_end
            } else {
                return Err(invalid(format!(
                    "range {off}+{len} starts before the end of the one before it ({last_end})"
                )));
            };
            match self.ranges.last_mut() {
                Some((last_off, last_len)) if *last_off + *last_len == off => {
                    *last_len = end - *last_off;
                }
                _ => self.ranges.push((off, end - off)),
            }
        }
        Ok(())
    }

    fn finish(self) -> Ranges {
        Ranges {
            capacity: self.capacity.unwrap_or(0),
            ranges: self.ranges,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(off: i64, len: i64) -> api::BlockMetadata {
        api::BlockMetadata {
            byte_offset: off,
            size_bytes: len,
        }
    }

    #[test]
    fn ranges_are_merged_when_adjacent_and_checked_against_the_promise() {
        let mut seen = Seen::new("d", 10);
        seen.take(
            1 << 20,
            &[block(0, 4096), block(4096, 4096), block(65536, 512)],
        )
        .expect("in order");
        seen.take(1 << 20, &[block(70000, 10)])
            .expect("next message");
        assert_eq!(seen.next_offset(), 70010);
        let r = seen.finish();
        assert_eq!(r.ranges, vec![(0, 8192), (65536, 512), (70000, 10)]);
        assert_eq!(r.bytes(), 8192 + 512 + 10);
        assert_eq!(r.capacity, 1 << 20);
    }

    #[test]
    fn an_answer_the_api_does_not_allow_is_refused() {
        let cases: [(&str, i64, Vec<api::BlockMetadata>); 6] = [
            ("overlap", 1 << 20, vec![block(0, 100), block(50, 100)]),
            ("out of order", 1 << 20, vec![block(500, 10), block(0, 10)]),
            ("past the end", 1 << 20, vec![block((1 << 20) - 10, 11)]),
            ("empty range", 1 << 20, vec![block(0, 0)]),
            ("negative", 1 << 20, vec![block(-1, 10)]),
            ("no capacity", 0, vec![]),
        ];
        for (what, capacity, blocks) in cases {
            let mut seen = Seen::new("d", 10);
            let err = seen.take(capacity, &blocks).expect_err(what);
            assert!(matches!(err, Error::Invalid { .. }), "{what}: {err}");
        }
        let mut seen = Seen::new("d", 10);
        seen.take(1 << 20, &[block(0, 1)]).expect("first");
        let err = seen
            .take(2 << 20, &[block(10, 1)])
            .expect_err("capacity changed");
        assert!(err.to_string().contains("capacity changed"), "{err}");
    }

    #[test]
    fn a_resumed_stream_may_repeat_the_range_it_was_cut_in_but_only_that() {
        let mut seen = Seen::new("d", 10);
        seen.take(1 << 20, &[block(0, 100)]).expect("first");
        seen.resumed = true;
        seen.take(1 << 20, &[block(50, 100), block(300, 10)])
            .expect("resumed");
        assert_eq!(seen.finish().ranges, vec![(0, 150), (300, 10)]);
        let mut seen = Seen::new("d", 10);
        seen.take(1 << 20, &[block(0, 100)]).expect("first");
        seen.resumed = true;
        seen.take(1 << 20, &[block(100, 10)])
            .expect("resumed just after");
        let err = seen
            .take(1 << 20, &[block(105, 10)])
            .expect_err("only the first may overlap");
        assert!(matches!(err, Error::Invalid { .. }), "{err}");
    }

    #[test]
    fn a_range_marks_every_chunk_it_touches_and_past_the_capacity_is_read() {
        let mib = 1 << 20;
        let r = Ranges {
            capacity: 12 * mib,
            // Inside chunk 0; across chunks 1 and 2 (4 MiB chunks); the last byte of chunk 2.
            ranges: vec![(4096, 4096), (8 * mib - 1, 2), (12 * mib - 1, 1)],
        };
        let set = |f: Vec<bool>| -> Vec<usize> { (0..f.len()).filter(|&i| f[i]).collect() };
        assert_eq!(set(r.chunks(4 * mib, 12 * mib)), vec![0, 1, 2]);
        // A device larger than the snapshot: the chunks past its capacity are read.
        assert_eq!(set(r.chunks(4 * mib, 20 * mib)), vec![0, 1, 2, 3, 4]);
        let none = Ranges {
            capacity: 12 * mib,
            ranges: vec![],
        };
        assert!(set(none.chunks(4 * mib, 12 * mib)).is_empty());
    }

    #[test]
    fn ranges_as_text_are_offset_and_length_lines_and_nothing_else() {
        let r = Ranges::parse("8192 10\n\n0 4096\n", 10).expect("two lines");
        assert_eq!(r.ranges, vec![(0, 4096), (8192, 10)]);
        for bad in ["1", "1 2 3", "x 1", "5 0", "-1 4"] {
            assert!(Ranges::parse(bad, 10).is_err(), "{bad:?}");
        }
        assert!(Ranges::parse("0 1\n2 1\n", 1).is_err_and(|e| e.contains("more than 1")));
    }

    #[test]
    fn more_ranges_than_the_limit_stop_the_answer() {
        let mut seen = Seen::new("d", 3);
        let blocks: Vec<_> = (0..4).map(|i| block(i * 100, 10)).collect();
        let err = seen.take(1 << 20, &blocks).expect_err("four of three");
        assert!(matches!(err, Error::TooMany { limit: 3, .. }), "{err}");
    }

    #[test]
    fn an_advertisement_that_cannot_be_used_is_refused_saying_which_field() {
        let pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec();
        let spec = |address: &str, audience: &str, ca: &[u8]| SnapshotMetadataServiceSpec {
            address: address.to_owned(),
            audience: audience.to_owned(),
            ca_cert: ByteString(ca.to_vec()),
        };
        assert!(Service::new("d", spec("10.0.0.1:50051", "a", &pem)).is_ok());
        for (s, field) in [
            (spec("https://x:1", "a", &pem), "address"),
            (spec("x", "a", &pem), "address"),
            (spec("x:1", "", &pem), "audience"),
            (spec("x:1", "a", b"not pem"), "caCert"),
        ] {
            let err = Service::new("d", s).expect_err(field);
            assert!(err.to_string().contains(field), "{field}: {err}");
        }
    }
}
