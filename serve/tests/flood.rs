//! Floods of connections that never finish a request head, against the endpoints with their
//! default limits (issue 31, hole 7): from one address, from the probe's own address, and
//! from forty loopback addresses (127.0.0.10 to .49, as many hostile pods), the kubelet's
//! probe from 127.0.0.1 is still answered 200 at once, 12 times out of 12, and the
//! connections the flood holds are closed rather than kept.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_serve::{serve, Endpoints};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

struct Up;

impl Endpoints for Up {
    fn metrics(&self) -> String {
        "ferry_test_total 1\n".into()
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The kubelet's default probe timeout: an answer later than this is a failed probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

async fn start() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(serve(listener, Arc::new(Up)));
    port
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A connection from `source` to the endpoints, having sent `head` (and nothing more).
async fn from(source: IpAddr, port: u16, head: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind((source, 0).into())
        .expect("bind the source address");
    let mut s = socket
        .connect((Ipv4Addr::LOCALHOST, port).into())
        .await
        .expect("connect");
    s.write_all(head.as_bytes()).await.expect("write");
    s
}

/// `n` connections from each of `sources`, interleaved; every other one sends half a head.
async fn flood(sources: &[IpAddr], port: u16, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        for source in sources {
            let head = if held.len() % 2 == 0 {
                ""
            } else {
                "GET /healthz HTTP/1.1\r\nHost: x\r\n"
            };
            held.push(from(*source, port, head).await);
        }
    }
    // Give the server the time to accept them all, so that the probes come after them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    held
}

/// 12 probes as the kubelet sends them, one after another: each answer's status, or why
/// there was none.
async fn probes(port: u16) -> Vec<Result<String, String>> {
    let mut answers = Vec::new();
    for _ in 0..12 {
        let probe = async {
            let mut s = from(
                loopback(1),
                port,
                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            )
            .await;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
            let out = String::from_utf8_lossy(&out).into_owned();
            Ok(out.split_whitespace().nth(1).unwrap_or("none").to_owned())
        };
        let answer = tokio::time::timeout(PROBE_TIMEOUT, probe).await;
        answers.push(answer.unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}"))));
    }
    answers
}

fn all_ok(answers: &[Result<String, String>]) -> bool {
    answers.iter().all(|a| a.as_deref() == Ok("200"))
}

/// Of `held`, how many the server has closed (reads the end within `within`).
async fn closed_by_server(held: &mut [TcpStream], within: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + within;
    let mut closed = 0;
    for s in held.iter_mut() {
        let mut buf = [0u8; 512];
        let read = tokio::time::timeout_at(deadline, s.read(&mut buf)).await;
        if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            closed += 1;
        }
    }
    closed
}

#[tokio::test]
async fn the_probe_is_answered_while_one_address_holds_300_idle_connections() {
    let port = start().await;
    let mut held = flood(&[loopback(9)], port, 300).await;
    let started = Instant::now();
    let answers = probes(port).await;
    assert!(all_ok(&answers), "{answers:?}");
    assert!(started.elapsed() < 12 * PROBE_TIMEOUT);
    // The flood's address holds its share and no more: the rest were closed at once.
    let closed = closed_by_server(&mut held, Duration::from_secs(1)).await;
    assert!(closed >= 300 - 8, "only {closed} of 300 closed");
}

#[tokio::test]
async fn the_probe_is_answered_while_its_own_address_holds_300_idle_connections() {
    let port = start().await;
    let _held = flood(&[loopback(1)], port, 300).await;
    let answers = probes(port).await;
    assert!(all_ok(&answers), "{answers:?}");
}

#[tokio::test]
async fn the_probe_is_answered_while_forty_addresses_hold_8_idle_connections_each() {
    let port = start().await;
    let sources: Vec<IpAddr> = (10..50).map(loopback).collect();
    let mut held = flood(&sources, port, 8).await;
    let answers = probes(port).await;
    assert!(all_ok(&answers), "{answers:?}");
    // The pool holds at most 128: of 320, the rest were closed.
    let closed = closed_by_server(&mut held, Duration::from_secs(1)).await;
    assert!(closed >= 320 - 128, "only {closed} of 320 closed");
}
