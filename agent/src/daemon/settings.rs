//! What the daemon is told about its node (from the command line and the test-only
//! fault variables).

use std::path::PathBuf;
use std::time::Duration;

/// What the daemon needs to know about its node.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node: String,
    /// Where the node's filesystem is mounted (`/host` in the DaemonSet).
    pub host_root: PathBuf,
    /// Namespace of the heartbeat Leases.
    pub namespace: String,
    /// Namespace of the tickets of copies between nodes.
    pub ticket_namespace: String,
    /// Copy workers per shard (0: CPUs).
    pub workers: usize,
    /// Shards run at once; the others wait for a slot.
    pub max_shards: usize,
    /// Test-only: sleep this long before each file (`FERRY_FAULT_FILE_DELAY_MS`), so
    /// end-to-end tests can act while a copy runs.
    pub file_delay: Option<Duration>,
    /// Test-only: flip a byte of every destination file with this name after it is
    /// written (`FERRY_FAULT_CORRUPT_FILE`), so end-to-end tests see a checksum mismatch.
    pub corrupt_file: Option<String>,
    /// Test-only: append a byte to every source file with this name each time it has been
    /// copied (`FERRY_FAULT_CHANGE_SOURCE`), so end-to-end tests see `SourceChanged`.
    pub change_source: Option<String>,
    /// Address of the /metrics, /healthz and /readyz endpoints.
    pub listen: std::net::SocketAddr,
    /// Duration of the heartbeat Lease (renewed every third of it).
    pub lease_seconds: i32,
    /// Address of the transfer port, if this agent serves one.
    pub transfer_listen: Option<std::net::SocketAddr>,
    /// Where other agents reach it, if not at `transfer_listen` (see `--transfer-address`).
    pub transfer_address: Option<String>,
    /// Address of the peering port, if this agent serves one (chart `peering.enabled`).
    pub peering_listen: Option<std::net::SocketAddr>,
    /// Where other installs' agents reach it, if not at `peering_listen`.
    pub peering_address: Option<String>,
    /// Changed-block tracking's caller: this agent's ServiceAccount, or `None` (off).
    pub changed_blocks_account: Option<String>,
    /// Test-only: flip a byte of what is sent of the source file at this path (from the
    /// source's top), after it was hashed (`FERRY_FAULT_CORRUPT_IN_FLIGHT`: `path` once per
    /// connection, `path#n` n times), as a network that changes bytes in flight would.
    pub corrupt_in_flight: Option<String>,
}
