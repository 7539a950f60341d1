//! The endpoints every long-running Ferry process serves on its `--listen` address:
//! `/metrics` (Prometheus text format), `/healthz` (the process answers) and `/readyz`
//! (the process says whether it is ready, and if not why). Plain HTTP/1.1 over a tokio
//! listener: three GET routes do not need a web framework, and nothing here ever blocks
//! the work the process does. Used by `ferry-operator` and `ferry-agent run`.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Encoder, Registry, TextEncoder};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

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

/// A client that has not sent its request head by then is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Answer on `listener` until the process ends.
pub async fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            let head = async {
                let request = lines.next_line().await.ok().flatten()?;
                // Headers are read and ignored (up to the blank line), so clients see a
                // complete exchange.
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.is_empty() {
                        break;
                    }
                }
                Some(request)
            };
            let Ok(Some(request)) = tokio::time::timeout(REQUEST_TIMEOUT, head).await else {
                return;
            };
            let (code, content_type, body) = answer(&request, &*endpoints);
            let head = format!(
                "HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = write.write_all(head.as_bytes()).await;
            let _ = write.write_all(body.as_bytes()).await;
            let _ = write.shutdown().await;
        });
    }
}

/// Status line, content type and body for one request line.
fn answer(request: &str, endpoints: &dyn Endpoints) -> (&'static str, &'static str, String) {
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    // A query string does not change the answer.
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            endpoints.metrics(),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => match endpoints.ready() {
            Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
            Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

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
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    async fn start(ready: Result<(), String>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(serve(listener, Arc::new(Fixed(ready))));
        port
    }

    #[tokio::test]
    async fn metrics_healthz_and_readyz_answer_with_their_bodies() {
        let port = start(Ok(())).await;
        let m = get(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
        assert!(m.contains("Content-Length: 19\r\n"), "{m}");
        assert!(m.ends_with("\r\n\r\nferry_test_total 1\n"), "{m}");
        let h = get(port, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(
            h.starts_with("HTTP/1.1 200 OK") && h.ends_with("ok\n"),
            "{h}"
        );
        let r = get(port, "GET /readyz?verbose HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    }

    #[tokio::test]
    async fn not_ready_is_a_503_that_says_why() {
        let port = start(Err("not watching CopyJobs yet".into())).await;
        let r = get(port, "GET /readyz HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 503 Service Unavailable"), "{r}");
        assert!(r.ends_with("not watching CopyJobs yet\n"), "{r}");
        // Liveness does not depend on readiness.
        let h = get(port, "GET /healthz HTTP/1.0\r\n\r\n").await;
        assert!(h.starts_with("HTTP/1.1 200 OK"), "{h}");
    }

    #[tokio::test]
    async fn other_paths_and_methods_are_refused() {
        let port = start(Ok(())).await;
        let r = get(port, "GET /debug HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 404 Not Found"), "{r}");
        let r = get(port, "POST /metrics HTTP/1.0\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed"), "{r}");
    }
}
