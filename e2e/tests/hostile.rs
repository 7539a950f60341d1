//! A hostile tenant and a hostile pod on the cluster network, against Ferry on the local
//! control plane with the chart's RBAC and policies (issue 31, "tenant safety, round
//! three"). One module a class of hole; each test shows what the user (or the tenant next
//! door) would check: the operator and agents stay up and bounded, other tenants' copies
//! still finish, nothing is reported verified that was not compared, nothing in a tenant's
//! volume is opened before it is known to be a regular file or directory.
//!
//! docs/security.md names the test of each class.

use anyhow::{Context, Result};

/// Resident and peak resident memory of a process, in KiB (`VmRSS`, `VmHWM`): what the
/// memory checks of these tests read.
fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} of pid {pid}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[path = "hostile/devices.rs"]
mod devices;
#[path = "hostile/exports.rs"]
mod exports;
#[path = "hostile/holder.rs"]
mod holder;
#[path = "hostile/hooks.rs"]
mod hooks;
#[path = "hostile/listeners.rs"]
mod listeners;
#[path = "hostile/migrations.rs"]
mod migrations;
#[path = "hostile/pods.rs"]
mod pods;
#[path = "hostile/populator.rs"]
mod populator;
#[path = "hostile/spec.rs"]
mod spec;
#[path = "hostile/watch.rs"]
mod watch;
