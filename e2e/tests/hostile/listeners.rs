//! Holes 6 and 7: anyone on the network could hold the listeners' connection slots. The
//! agent's transfer port took one of its 64 slots before the TLS handshake and held it up to
//! 10 s, so 300 idle TCP connections failed a copy between nodes ("the TLS handshake took
//! longer than 10s"); the /healthz endpoints held idle connections 5 s in 64 slots, so 100
//! of them failed the kubelet's liveness probe, which restarts the process. Now a
//! connection that has not completed its handshake or request head waits in a pool apart,
//! bounded per peer address and in all, where a newcomer evicts the busiest peer's oldest.
//!
//! Here a hostile pod (127.0.0.9: the agents dial from 127.0.0.1, the kernel's source for
//! a loopback destination, and the probes come from there too) keeps 300 connections open
//! to node-a's transfer port, reopening each one the agent closes, while a copy from node-a
//! to node-b runs; and 150 to node-a's agent's and the operator's endpoints while /healthz
//! is probed 12 times each, every answer a 200 within the kubelet's 1 s. No NetworkPolicy
//! is involved (this tier has none): the listeners alone must hold. All on loopback.

#[path = "../certs/mod.rs"]
mod certs;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{ControlPlane, Proc};
use serde_json::Value;

const TEAM: &str = "team";
const NODE_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const NODE_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// The hostile pod's address.
const HOSTILE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
/// How often the flood reopens the connections the server closed.
const REFILL_EVERY: Duration = Duration::from_secs(1);
/// A flood stops by itself after this long, or after this many connections opened.
const FLOOD_AT_MOST: (Duration, usize) = (Duration::from_secs(150), 60_000);
/// The kubelet's default probe timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A control plane with the chart installed, the operator, and node-a and node-b with an
/// agent each, transfer ports on 127.0.0.2 and 127.0.0.3; StorageRoot `vol-a` (`/srv/vol`
/// on node-a) and `vol-b` (on node-b), both for namespace `team`.
struct Nodes {
    cp: ControlPlane,
    _operator: Proc,
    _agents: Vec<Proc>,
    transfer_a: SocketAddrV4,
}

impl Nodes {
    fn start() -> Result<Option<Self>> {
        let Some((cp, operator)) = certs::cluster()? else {
            return Ok(None);
        };
        cp.kubectl_ok(&["create", "namespace", TEAM])?;
        for (root, node) in [("vol-a", "node-a"), ("vol-b", "node-b")] {
            cp.apply(&format!(
                "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {root}\nspec:\n  path: /srv/vol\n  nodeSelector: {{ferry.dev/node: {node}}}\n  namespaces: {{names: [{TEAM}]}}\n"
            ))?;
        }
        let mut agents = Vec::new();
        let mut transfer_a = None;
        for (node, ip) in [("node-a", NODE_A), ("node-b", NODE_B)] {
            let transfer = SocketAddrV4::new(ip, ferry_e2e::free_port()?);
            transfer_a.get_or_insert(transfer);
            let kc = certs::agent(&cp, node)?.to_string_lossy().into_owned();
            let listen = transfer.to_string();
            agents.push(cp.spawn_agent(
                node,
                &[
                    ("KUBECONFIG", &kc),
                    ("FERRY_TRANSFER_LISTEN", &listen),
                    ("FERRY_TICKET_NAMESPACE", certs::TICKETS),
                ],
            )?);
            std::fs::create_dir_all(cp.dir().join("hosts").join(node).join("srv/vol"))?;
        }
        Ok(Some(Self {
            cp,
            _operator: operator,
            _agents: agents,
            transfer_a: transfer_a.context("node-a's transfer address")?,
        }))
    }

    /// Copy `vol-a:src` to `vol-b:<name>` (node-b's agent receives it from node-a's);
    /// the job's status once finished, within `within`.
    fn copy(&self, name: &str, within: Duration) -> Result<Value> {
        self.cp.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {TEAM}\nspec:\n  source: {{root: vol-a, path: src}}\n  destination: {{root: vol-b, path: {name}}}\n"
        ))?;
        let start = Instant::now();
        loop {
            let out = self
                .cp
                .kubectl_ok(&["get", "copyjob", name, "-n", TEAM, "-o", "json"])?;
            let status = serde_json::from_str::<Value>(&out)?["status"].clone();
            if status["phase"] == "Succeeded" || status["phase"] == "Failed" {
                return Ok(status);
            }
            if start.elapsed() > within {
                bail!(
                    "{name} did not finish within {within:?}: {status}\nnode-b:\n{}",
                    self.cp.log_tail("agent-node-b.log", 20)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn root(&self, node: &str) -> std::path::PathBuf {
        self.cp.dir().join("hosts").join(node).join("srv/vol")
    }
}

/// A TCP connection to `to` from `source`. std cannot bind a client socket before it
/// connects, and this crate has no socket crate, so the three calls are made here.
#[allow(unsafe_code)]
fn connect_from(source: Ipv4Addr, to: SocketAddrV4) -> std::io::Result<TcpStream> {
    fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        }
    }
    fn check(r: libc::c_int) -> std::io::Result<()> {
        match r {
            0.. => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // Close-on-exec: the agents this test starts must not inherit the flood's sockets.
    // SAFETY: socket(2) takes no pointers; its result is checked before it is used.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    check(fd)?;
    // SAFETY: `fd` is a socket just made and owned by nothing else; OwnedFd closes it once.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let from = sockaddr(SocketAddrV4::new(source, 0));
    // SAFETY: `from` is a sockaddr_in of `len` bytes that outlives the call.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const from).cast(), len) })?;
    let dest = sockaddr(to);
    // SAFETY: as for bind.
    check(unsafe { libc::connect(fd.as_raw_fd(), (&raw const dest).cast(), len) })?;
    Ok(TcpStream::from(fd))
}

/// Whether the server has closed `s` (it sends nothing before it does).
fn closed_by_server(s: &TcpStream) -> bool {
    match s.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// A hostile pod keeping `held` connections from [`HOSTILE`] open to a port, none of which
/// sends anything: each one the server closes is reopened at the next refill. Stops when
/// dropped, or at [`FLOOD_AT_MOST`].
struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Reopened>>,
}

/// What a flood's refills did.
#[derive(Debug, Default)]
struct Reopened {
    /// Connections opened again after the server closed them.
    connections: usize,
    /// Reopens that failed (a refill stops at its first), and the first such error.
    failed: usize,
    first_error: Option<String>,
}

impl Flood {
    /// Open `held` connections to `to`, then keep them open on a thread of its own.
    fn start(to: SocketAddrV4, held: usize) -> Result<Self> {
        let mut open = Vec::new();
        let mut opened = 0;
        let mut refill = move |open: &mut Vec<TcpStream>| -> Result<usize> {
            open.retain(|s| !closed_by_server(s));
            let before = opened;
            while open.len() < held && opened < FLOOD_AT_MOST.1 {
                let s = connect_from(HOSTILE, to)
                    .with_context(|| format!("connecting from {HOSTILE} to {to}"))?;
                s.set_nonblocking(true)?;
                open.push(s);
                opened += 1;
            }
            Ok(opened - before)
        };
        // The first fill must succeed: without it nothing is tested.
        refill(&mut open)?;
        // Give the server the time to accept them, so that what is tested comes after them.
        std::thread::sleep(Duration::from_millis(300));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut reopened = Reopened::default();
            while !stopped.load(Ordering::Relaxed) && start.elapsed() < FLOOD_AT_MOST.0 {
                std::thread::sleep(REFILL_EVERY);
                match refill(&mut open) {
                    Ok(n) => reopened.connections += n,
                    Err(e) => {
                        reopened.failed += 1;
                        reopened.first_error.get_or_insert(format!("{e:#}"));
                    }
                }
            }
            reopened
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stop it; what its refills did.
    fn stop(mut self) -> Result<Reopened> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(reopened)) => Ok(reopened),
            Some(Err(_)) => bail!("the flood's thread panicked"),
            None => Ok(Reopened::default()),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `GET /healthz` on loopback port `port` as the kubelet sends it: its status code, within
/// [`PROBE_TIMEOUT`], or why not.
fn probe(port: u16) -> Result<(), String> {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(PROBE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut answer = String::new();
    let read = s.read_to_string(&mut answer);
    let took = started.elapsed();
    match (read, ferry_e2e::http_code(&answer)) {
        (Ok(_), "200") if took <= PROBE_TIMEOUT => Ok(()),
        (Ok(_), "200") => Err(format!("answered after {took:?}")),
        (Ok(_), "") => Err(format!("closed unanswered after {took:?}")),
        (Ok(_), code) => Err(format!("answered {code}")),
        (Err(e), _) => Err(format!("no answer after {took:?}: {e}")),
    }
}

/// 12 probes a quarter of a second apart: the failed ones, numbered.
fn probes(port: u16) -> Vec<String> {
    (1..=12)
        .filter_map(|i| {
            let outcome = probe(port);
            std::thread::sleep(Duration::from_millis(250));
            outcome.err().map(|why| format!("probe {i}: {why}"))
        })
        .collect()
}

#[test]
fn three_hundred_idle_connections_to_the_senders_transfer_port_do_not_stop_a_copy_between_nodes(
) -> Result<()> {
    let Some(nodes) = Nodes::start()? else {
        return Ok(());
    };
    let src = nodes.root("node-a").join("src");
    std::fs::create_dir_all(src.join("sub"))?;
    std::fs::write(src.join("sub/f"), b"across nodes")?;
    std::fs::write(src.join("big"), vec![7u8; 3 << 20])?;
    // Without the flood first: both agents have their certificates and the copy works.
    let s = nodes.copy("before", Duration::from_secs(120))?;
    ensure!(
        s["phase"] == "Succeeded" && s["mode"] == "Network",
        "the copy without a flood: {s}"
    );

    let flood = Flood::start(nodes.transfer_a, 300)?;
    let started = Instant::now();
    let s = nodes.copy("flooded", Duration::from_secs(100))?;
    let took = started.elapsed();
    let reopened = flood.stop()?;
    eprintln!(
        "the copy with the flood: {} in {took:?}; the flood reopened {reopened:?}",
        s["phase"]
    );
    ensure!(
        s["phase"] == "Succeeded",
        "the copy with 300 connections from {HOSTILE} held open to node-a's transfer port: {s}"
    );
    ensure!(s["mode"] == "Network", "{s}");
    let copied = std::fs::read(nodes.root("node-b").join("flooded/sub/f"))?;
    ensure!(copied == b"across nodes", "{copied:?}");
    // The copy did not wait for the flood's connections to time out.
    ensure!(
        took < Duration::from_secs(30),
        "the flooded copy took {took:?}"
    );
    Ok(())
}

#[test]
fn idle_connections_to_the_agents_and_the_operators_endpoints_do_not_fail_healthz() -> Result<()> {
    let Some(nodes) = Nodes::start()? else {
        return Ok(());
    };
    let ports = [
        ("node-a's agent", nodes.cp.agent_port("node-a")?),
        ("the operator", nodes.cp.operator_port()?),
    ];
    for (who, port) in ports {
        ferry_e2e::wait_for(&format!("{who}'s /healthz"), certs::STARTED_WITHIN, || {
            probe(port).is_ok()
        })?;
    }
    let mut failed = Vec::new();
    for (who, port) in ports {
        let flood = Flood::start(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port), 150)?;
        let failures = probes(port);
        let reopened = flood.stop()?;
        eprintln!(
            "{who}'s /healthz with the flood: {} of 12 failed; the flood reopened {reopened:?}",
            failures.len()
        );
        if !failures.is_empty() {
            failed.push(format!(
                "{who} (port {port}), with 150 connections from {HOSTILE} held open: {}",
                failures.join("; ")
            ));
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}
