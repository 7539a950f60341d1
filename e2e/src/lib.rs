//! A real control plane on this machine for end-to-end tests: Debian's etcd and a
//! kube-apiserver built from the `k8s.io/kubernetes` Go module (see `e2e/tools/`), on free
//! loopback ports, torn down when the [`ControlPlane`] is dropped, even if a test panics.
//!
//! `control_plane` starts and drives it, `ferry` runs the operator and agents against it,
//! `chart` runs them as the Helm chart does (its RBAC and policies, transfer ports),
//! `trees` checks what a copy made, `proxy` counts and cuts a connection, `peering` sets up
//! two installs that trust each other, `tools` finds the binaries; small helpers for HTTP,
//! polling, metrics and patches are here.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

mod chart;
mod control_plane;
mod ferry;
pub mod kube;
mod kubectl;
pub mod peering;
mod process;
mod proxy;
mod tools;
mod trees;

pub use chart::{
    agent_capabilities, holder_image, setpriv_holding, transfer_ip, ADVERTISED_WITHIN,
    CHART_NAMESPACE, TICKET_NAMESPACE,
};
pub use control_plane::ControlPlane;
pub use ferry::{workspace_bin, PACED};
pub use kubectl::{Kubectl, Watch};
pub use process::Proc;
pub use proxy::Proxy;
pub use tools::{
    control_plane_installed_or_skip, helm_or_skip, kube_score_or_skip, prometheus_k8s_or_skip,
    prometheus_operator_crds_or_skip,
};
pub use trees::{
    assert_same_contents, assert_same_tree, staging_leftovers, tree_bytes, tree_meta, BindMount,
    LoopExt4, Tmpfs,
};

/// Whether this process runs as root (its effective uid, from /proc: this crate does not
/// link libc).
pub fn is_root() -> bool {
    // "Uid:\treal\teffective\tsaved\tfs"
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"));
    uids.and_then(|u| u.split_whitespace().nth(1)) == Some("0")
}

/// The repository root (for the chart's CRDs and examples).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// A loopback port nothing listens on, for a server a test starts a moment later.
///
/// It comes from below the kernel's ephemeral range, not from binding port 0: a port from
/// inside that range can be taken as the local end of any outgoing connection (an apiserver's
/// to etcd, a kubectl's) between this check and the server's own bind, which made a CI run's
/// apiserver fail "address already in use". No port is handed out twice in one process, and
/// each process starts at its own offset so that concurrent test binaries rarely meet.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // 10,000 ports below the range, never the privileged ones.
    let low = ephemeral_low.saturating_sub(10_000).max(1024);
    let span = ephemeral_low.saturating_sub(low);
    if span < 100 {
        // The ephemeral range starts too low to leave room below it: take the kernel's pick.
        return Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    }
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let port = u16::try_from(low + NEXT.fetch_add(1, Ordering::SeqCst) % span)?;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port in {low}..{ephemeral_low}")
}

/// The raw HTTP response (status line, headers, body) to a GET on the loopback.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The status code of a raw HTTP response ("" if there is none): servers answer an
/// HTTP/1.0 request as HTTP/1.0 or 1.1, so the version is not compared.
pub fn http_code(response: &str) -> &str {
    response.split_whitespace().nth(1).unwrap_or("")
}

/// Poll `ready` until it answers true or `timeout` passes.
pub fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// The arguments of `kubectl patch OBJ -n NS --type=merge -p PATCH`, of the status
/// subresource when `status`: for `kubectl` (may be refused) or `kubectl_ok`.
pub fn merge_patch<'a>(obj: &'a str, ns: &'a str, status: bool, patch: &'a str) -> Vec<&'a str> {
    let mut args = vec!["patch", obj, "-n", ns];
    if status {
        args.push("--subresource=status");
    }
    args.extend(["--type=merge", "-p", patch]);
    args
}

/// The value of the series `name` that has (at least) `labels`, from /metrics text.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        let have: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
        let all = labels
            .iter()
            .all(|(k, v)| have.contains(&format!("{k}=\"{v}\"").as_str()));
        (n == name && all).then(|| value.parse().ok()).flatten()
    })
}
