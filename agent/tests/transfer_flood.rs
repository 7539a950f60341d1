//! The transfer port under a flood of connections that never complete a TLS handshake (issue
//! 31, hole 6): 300 idle or half-started connections, from another address, from the
//! receiver's own address, or from thirty addresses (as many hostile pods), and a receiver
//! with the shard's certificate and ticket is still let in at once and copies the source.
//! node-a serves on 127.0.0.2; the receiver dials from 127.0.0.1 (the kernel's choice for a
//! loopback destination); the floods come from 127.0.0.9 and 127.0.0.10 to .39.

mod common;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use common::*;
use ferry_agent::transfer::{dial, open_path, serve, Grant, Grants, Hello, Tls};
use ferry_engine::send::SendOptions;
use ferry_engine::{copy_from, NoProgress, Options};
use ferry_link::{Ca, NodeKey};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

const TICKET: [u8; 32] = [7; 32];

/// How soon a receiver must be let in: a handshake and a hello on loopback take
/// milliseconds; before the fix it waited for idle connections' 10 s handshake timeouts.
const LET_IN_WITHIN: Duration = Duration::from_secs(3);

struct One(Grant);

impl Grants for One {
    fn grant<'a>(
        &'a self,
        job: &'a str,
        shard: u32,
        epoch: u64,
    ) -> Pin<Box<dyn Future<Output = Result<Grant, String>> + Send + 'a>> {
        let g = &self.0;
        let found = (g.job == job && g.shard == shard && g.epoch == epoch)
            .then(|| g.clone())
            .ok_or_else(|| format!("no grant for shard {shard} of job {job} at epoch {epoch}"));
        Box::pin(async move { found })
    }
}

fn identity(ca: &Ca, node: &str) -> Result<Tls> {
    let key = NodeKey::generate(node)?;
    let cert = ca.sign_node(&key.csr_pem, node, Duration::from_secs(3600))?;
    Ok(Tls::new(ca.cert_pem(), &cert, &key.key_pem)?)
}

struct Sender {
    tmp: tempfile::TempDir,
    src: std::path::PathBuf,
    addr: SocketAddr,
    ca: Ca,
}

/// node-a serving `src` (a small tree) for shard 0 of job uid-1 at epoch 3 to node-b.
async fn sender() -> Result<Sender> {
    let tmp = tempdir()?;
    let src = tmp.path().join("node-a/volume/data");
    mkdir(&src.join("sub"))?;
    write(&src.join("sub/f"), b"across nodes")?;
    write_pattern_file(&src.join("big"), 1 << 20)?;
    let ca = Ca::generate("ferry install CA")?;
    let node_a = Arc::new(identity(&ca, "node-a")?);
    let grants = Arc::new(One(Grant {
        job: "uid-1".into(),
        shard: 0,
        epoch: 3,
        receiver: "node-b".into(),
        ticket: TICKET,
        open: open_path(src.clone()),
        options: SendOptions {
            workers: 2,
            reserved_top: None,
            ..SendOptions::default()
        },
        named: ("team".into(), "copy".into()),
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await?;
    let addr = listener.local_addr()?;
    let (_, identity) = tokio::sync::watch::channel(Some(node_a));
    tokio::spawn(serve(listener, identity, grants as Arc<dyn Grants>));
    Ok(Sender { tmp, src, addr, ca })
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// `n` connections to `to` from each of `sources`, interleaved: every other one idle, the
/// others having sent the header of a TLS record of 16 KiB and nothing of it.
async fn flood(sources: &[IpAddr], to: SocketAddr, n: usize) -> Result<Vec<TcpStream>> {
    let mut held = Vec::new();
    for _ in 0..n {
        for source in sources {
            let socket = TcpSocket::new_v4()?;
            socket.bind((*source, 0).into())?;
            let mut s = socket
                .connect(to)
                .await
                .with_context(|| format!("connect from {source}"))?;
            if held.len() % 2 == 1 {
                s.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00]).await?;
            }
            held.push(s);
        }
    }
    // Give the sender the time to accept them all, so that the receiver comes after them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(held)
}

/// node-b dials node-a for the shard (let in within [`LET_IN_WITHIN`]) and copies it.
async fn receive(s: &Sender) -> Result<()> {
    let node_b = identity(&s.ca, "node-b")?;
    let hello = Hello {
        job: "uid-1".into(),
        shard: 0,
        epoch: 3,
        ticket: TICKET,
    };
    let started = Instant::now();
    let conn = dial(s.addr, &node_b, "node-a", &hello).await?;
    let took = started.elapsed();
    ensure!(took < LET_IN_WITHIN, "let in after {took:?}");
    let before = snapshot(&s.src)?;
    let dst = s.tmp.path().join("node-b/volume/copy");
    mkdir(dst.parent().context("parent")?)?;
    let (src, to) = (s.src.clone(), dst.clone());
    let summary = tokio::task::spawn_blocking(move || {
        copy_from(&conn, &src, &to, &Options::default(), &NoProgress)
    })
    .await??;
    ensure!(
        summary.failed == 0 && summary.aborted.is_none(),
        "{summary:?}"
    );
    compare(&before, &dst, Check::default())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_is_served_while_another_address_holds_300_connections_without_a_handshake(
) -> Result<()> {
    let s = sender().await?;
    let _held = flood(&[loopback(9)], s.addr, 300).await?;
    receive(&s).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_is_served_while_its_own_address_holds_300_connections_without_a_handshake(
) -> Result<()> {
    let s = sender().await?;
    let _held = flood(&[loopback(1)], s.addr, 300).await?;
    receive(&s).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_is_served_while_thirty_addresses_hold_10_connections_each_without_a_handshake(
) -> Result<()> {
    let s = sender().await?;
    let sources: Vec<IpAddr> = (10..40).map(loopback).collect();
    let _held = flood(&sources, s.addr, 10).await?;
    receive(&s).await
}
