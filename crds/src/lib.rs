//! Ferry's API and the contract between its operator, agents and engine (group
//! `ferry.dev`, version `v1alpha1`): types, constants and nothing that does I/O.
//!
//! - [`policy`]: the copy policies (reflink, verify, overwrite, preserve) and their
//!   defaults, shared by the CopyJob, the CLI and the engine;
//! - [`shard`]: a shard's state and part, and the names it leaves on the destination;
//! - [`reason`]: every failure and condition reason;
//! - [`filter`]: `include`/`exclude`, compiled once for the operator, agent and engine;
//! - `api` (feature `k8s`, on by default): the `CopyJob` and `StorageRoot` resources;
//! - `schedule` (feature `k8s`): the `CopySchedule` resource;
//! - `populate` (feature `k8s`): the `VolumeSource` resource a new claim is populated from;
//! - `migrate` (feature `k8s`): the `ClaimMigration` resource, a claim moved keeping its name;
//! - `peer` (feature `k8s`): the `FerryPeer` resource, another install trusted for copies
//!   between clusters;
//! - `export` (feature `k8s`): the `CopyExport` resource, a tenant's consent that a peer
//!   install's jobs read one volume, and the shape of its Secret.
//!
//! The engine depends on this crate without `k8s`, so it shares the contract's types
//! without knowing anything of Kubernetes.

#[macro_use]
mod wire;

pub mod filter;
pub mod policy;
pub mod reason;
pub mod shard;

pub use filter::Filter;
pub use policy::{Compare, CopyMethod, Overwrite, Policy, Preserve, Reflink, Verify};
pub use reason::{ConditionType, Reason};
pub use shard::{in_state_dir, ManifestName, Part, ShardState, STATE_DIR};

#[cfg(feature = "k8s")]
mod api;
#[cfg(feature = "k8s")]
pub use api::*;
#[cfg(feature = "k8s")]
mod digest;
#[cfg(feature = "k8s")]
mod node_label;
#[cfg(feature = "k8s")]
pub use node_label::{node_label, node_labels, NODE_LABEL_PREFIX};
#[cfg(feature = "k8s")]
mod export;
#[cfg(feature = "k8s")]
pub use export::*;
#[cfg(feature = "k8s")]
mod migrate;
#[cfg(feature = "k8s")]
pub use migrate::*;
#[cfg(feature = "k8s")]
mod peer;
#[cfg(feature = "k8s")]
pub use peer::*;
#[cfg(feature = "k8s")]
mod populate;
#[cfg(feature = "k8s")]
pub use populate::*;
#[cfg(feature = "k8s")]
mod schedule;
#[cfg(feature = "k8s")]
mod shard_status;
#[cfg(feature = "k8s")]
pub use schedule::*;
#[cfg(feature = "k8s")]
pub use shard_status::*;

/// What lets a destination root keep a source's privileged files, as messages name it: a
/// StorageRoot's `allowPrivilegedFiles` (a test in `api` checks the field's JSON name).
/// Here, without the `k8s` feature, for the engine's messages.
pub const ALLOW_PRIVILEGED_FILES: &str = "spec.allowPrivilegedFiles: true";

/// Most copy workers a shard runs (`parallelism.workersPerAgent`, the agent's `--workers`,
/// a node's CPU count): each holds a 1 MiB buffer.
pub const MAX_WORKERS: i32 = 64;

/// 1536 -> "1.5 KiB": bytes as the status's human-readable columns, the CLIs and the
/// messages write them (binary units, one decimal).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// API group of every Ferry resource.
pub const GROUP: &str = "ferry.dev";
/// API version served.
pub const VERSION: &str = "v1alpha1";
/// Annotation on an agent's heartbeat Lease: where its transfer port is reached
/// (`<address>:<port>`). An agent without it neither sends nor receives copies between
/// nodes, and the operator pairs no such agent.
pub const TRANSFER_ADDRESS_ANNOTATION: &str = "ferry.dev/transfer-address";
/// Finalizer the operator puts on each `CopyJob` so deletion cleans up staging data.
pub const FINALIZER: &str = "ferry.dev/cleanup";
/// Server-side-apply field manager of the operator (owns the status summary).
pub const OPERATOR_MANAGER: &str = "ferry-operator";
/// Field manager prefix of agents. An agent publishes each shard under its own manager
/// (`ferry-agent-<node>.<shard id>`, see [`agent_manager`]): server-side apply drops the
/// fields a manager stops sending, so one manager per node would erase the progress of the
/// node's earlier shards each time it published a later one.
pub const AGENT_MANAGER_PREFIX: &str = "ferry-agent-";
/// The field manager an agent on `node` publishes shard `shard` under (field managers are
/// at most 128 bytes; a longer node name is cut).
pub fn agent_manager(node: &str, shard: &str) -> String {
    let mut m = format!("{AGENT_MANAGER_PREFIX}{node}");
    let room = 128usize.saturating_sub(shard.len() + 1);
    if m.len() > room {
        let mut cut = room;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
    }
    format!("{m}.{shard}")
}
