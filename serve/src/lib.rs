//! The endpoints every long-running Ferry process serves on its `--listen` address:
//! `/metrics` (Prometheus text format), `/healthz` (the process answers) and `/readyz`
//! (the process says whether it is ready, and if not why). HTTP/1.1 by hyper's server on a
//! tokio listener, with a bound on everything a client controls: the size of a request
//! head, the time to send it, a connection's lifetime, and how many connections are open
//! at once, per peer address and in all ([`Limits`], enforced by a [`gate::Gate`], which
//! the agent's transfer port uses too). Used by `ferry-operator` and `ferry-agent run`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;

pub mod gate;
use gate::{Gate, GateLimits};

/// What a process exposes.
pub trait Endpoints: Send + Sync + 'static {
    /// The body of `/metrics`, in the Prometheus text format (see [`render`]).
    fn metrics(&self) -> String;
    /// `Ok` when ready; otherwise why not (the body of the 503 answer).
    fn ready(&self) -> Result<(), String>;
}

/// `registry` in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    // Encoding into a Vec cannot fail for well-formed metric families.
    let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// What a client may make the server hold. Anyone who can reach the port is a client, and
/// none proves anything: the connections are held in a [`Gate`], where a peer address has a
/// share of them and a newcomer evicts the busiest peer's oldest connection rather than
/// being refused, so a flood (idle connections, slow heads, unread answers) from a few
/// addresses cannot starve the kubelet's probe, which sends its head at once and whose
/// answer is a few bytes.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of a request head (request line and headers); a longer one gets 431 and the
    /// connection is closed. hyper's floor is 8 KiB. Default 16 KiB.
    pub head_bytes: usize,
    /// Time from the connection's accept to its complete request head. Default 2 s: the
    /// kubelet and Prometheus send theirs at once (a probe's own timeout is 1 s by default).
    pub head_timeout: Duration,
    /// Time a connection may stay open at all (the head, then writing the answer). Default
    /// 10 s, Prometheus's default scrape timeout.
    pub connection_timeout: Duration,
    /// Connections one peer address may hold open; its next one evicts its oldest (one that
    /// has not sent its head first). Default 8: a kubelet holds one or two (liveness and
    /// readiness), a Prometheus one.
    pub connections_per_peer: usize,
    /// Connections open at once in all; the next one evicts the oldest of the peer holding
    /// the most. Default 128 (file descriptors, and at most a head buffer and an answer
    /// each).
    pub connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            head_bytes: 16 * 1024,
            head_timeout: Duration::from_secs(2),
            connection_timeout: Duration::from_secs(10),
            connections_per_peer: 8,
            connections: 128,
        }
    }
}

/// After a failed accept (out of file descriptors, say), the pause before the next: the
/// error is the same until a connection closes, and retrying at once spins a core.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Answer on `listener` until the process ends, within [`Limits::default`].
pub async fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>) {
    serve_with(listener, endpoints, Limits::default()).await;
}

/// Answer on `listener` until the process ends, within `limits`.
pub async fn serve_with(listener: TcpListener, endpoints: Arc<dyn Endpoints>, limits: Limits) {
    let gate = Gate::new(GateLimits {
        per_peer: limits.connections_per_peer,
        total: limits.connections,
        pending_timeout: limits.head_timeout,
    });
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        // Admitted here, in accept order, so that the eviction order is the arrival order.
        let mut entry = gate.admit(peer.ip());
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let proof = entry.proof();
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                // The head is complete: from now on the head time no longer applies, and the
                // peer's connections still without one are evicted before this one.
                proof.proven();
                let response = answer(req.method(), req.uri().path(), &*endpoints);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.head_timeout)
                .max_buf_size(limits.head_bytes.max(8192))
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // The body of a request is never read; the connection closes after the answer,
            // when the gate evicts it, or at the connection timeout, whichever comes first.
            let _ = entry
                .run(tokio::time::timeout(limits.connection_timeout, connection))
                .await;
        });
    }
}

/// The answer to one request (a query string does not change it).
fn answer(method: &Method, path: &str, endpoints: &dyn Endpoints) -> Response<Full<Bytes>> {
    let (code, content_type, body) = match (method, path) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            endpoints.metrics(),
        ),
        (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        (&Method::GET, "/readyz") => match endpoints.ready() {
            Ok(()) => (StatusCode::OK, "text/plain", "ok\n".to_string()),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{why}\n"),
            ),
        },
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Fixed(Result<(), String>);

    impl Endpoints for Fixed {
        fn metrics(&self) -> String {
            "ferry_test_total 1\n".into()
        }
        fn ready(&self) -> Result<(), String> {
            self.0.clone()
        }
    }

    async fn get(port: u16, request: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        // The server may close before it has read it all (a refused request): not an error.
        let _ = s.write_all(request.as_bytes()).await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The status code of an answer ("" if there was none).
    fn code(answer: &str) -> &str {
        answer.split_whitespace().nth(1).unwrap_or("")
    }

    async fn start(ready: Result<(), String>) -> u16 {
        start_with(ready, Limits::default()).await
    }

    async fn start_with(ready: Result<(), String>, limits: Limits) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(serve_with(listener, Arc::new(Fixed(ready)), limits));
        port
    }

    #[tokio::test]
    async fn metrics_healthz_and_readyz_answer_with_their_bodies() {
        let port = start(Ok(())).await;
        let m = get(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(code(&m) == "200", "{m}");
        assert!(
            m.to_ascii_lowercase().contains("content-length: 19\r\n"),
            "{m}"
        );
        assert!(m.ends_with("\r\n\r\nferry_test_total 1\n"), "{m}");
        let h = get(port, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(code(&h) == "200" && h.ends_with("ok\n"), "{h}");
        let r = get(port, "GET /readyz?verbose HTTP/1.0\r\n\r\n").await;
        assert!(code(&r) == "200", "{r}");
    }

    #[tokio::test]
    async fn not_ready_is_a_503_that_says_why() {
        let port = start(Err("not watching CopyJobs yet".into())).await;
        let r = get(port, "GET /readyz HTTP/1.0\r\n\r\n").await;
        assert!(code(&r) == "503", "{r}");
        assert!(r.ends_with("not watching CopyJobs yet\n"), "{r}");
        // Liveness does not depend on readiness.
        let h = get(port, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(code(&h) == "200", "{h}");
    }

    #[tokio::test]
    async fn other_paths_and_methods_are_refused() {
        let port = start(Ok(())).await;
        let r = get(port, "GET /debug HTTP/1.0\r\n\r\n").await;
        assert!(code(&r) == "404", "{r}");
        let r = get(port, "POST /metrics HTTP/1.0\r\n\r\n").await;
        assert!(code(&r) == "405", "{r}");
    }

    #[tokio::test]
    async fn a_request_head_over_the_limit_is_refused_and_the_server_keeps_answering() {
        let port = start(Ok(())).await;
        // 4 MiB of request line: once the process read a line whole, however long.
        let huge = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(4 << 20));
        let r = get(port, &huge).await;
        assert!(
            r.is_empty() || code(&r) == "431",
            "{}",
            &r[..r.len().min(200)]
        );
        let h = get(port, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(code(&h) == "200", "{h}");
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_is_dropped_after_the_head_timeout() {
        let limits = Limits {
            head_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let port = start_with(Ok(()), limits).await;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let started = Instant::now();
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the idle connection is still open after 5 s");
        assert!(started.elapsed() >= Duration::from_millis(150));
    }

    #[tokio::test]
    async fn with_every_connection_taken_a_newcomer_evicts_the_oldest_idle_one_and_is_answered() {
        let limits = Limits {
            connections: 2,
            ..Limits::default()
        };
        let port = start_with(Ok(()), limits).await;
        let connect = || tokio::net::TcpStream::connect(("127.0.0.1", port));
        let mut oldest = connect().await.expect("connect");
        let _idle = connect().await.expect("connect");
        // Give the server the time to accept both.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let h = get(port, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(code(&h) == "200", "{h}");
        assert!(started.elapsed() < Duration::from_secs(1), "it was queued");
        // The oldest idle connection was closed for it, not the newer one.
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(1), oldest.read_to_end(&mut out));
        assert!(
            read.await.is_ok(),
            "the oldest idle connection is still open"
        );
    }
}
