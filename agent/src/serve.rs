//! The agent's HTTP endpoints: `/metrics` (Prometheus text format), `/healthz` (the
//! process answers) and `/readyz` (it watches CopyJobs and its heartbeat Lease is
//! current). Plain HTTP/1.1 over a tokio listener: three GET routes do not need a web
//! framework, and nothing here ever blocks the copy.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// The agent's metrics, named `ferry_agent_<what>_<unit>`.
#[derive(Clone)]
#[allow(missing_debug_implementations)]
pub struct Metrics {
    pub registry: Registry,
    /// Bytes of file data moved, by strategy (reflink, copy_file_range, read_write).
    pub bytes: IntCounterVec,
    /// Regular files committed.
    pub files: IntCounter,
    /// Entries that failed, by reason.
    pub failures: IntCounterVec,
    /// Shards running on this agent now.
    pub active_shards: IntGauge,
}

impl Metrics {
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let bytes = IntCounterVec::new(
            Opts::new(
                "ferry_agent_bytes_copied_total",
                "File data bytes moved to destinations, by strategy",
            ),
            &["strategy"],
        )?;
        let files = IntCounter::new(
            "ferry_agent_files_copied_total",
            "Regular files committed under their final names",
        )?;
        let failures = IntCounterVec::new(
            Opts::new(
                "ferry_agent_failures_total",
                "Entries that failed to copy, by reason",
            ),
            &["reason"],
        )?;
        let active_shards = IntGauge::new(
            "ferry_agent_active_shards",
            "CopyJob shards this agent is running",
        )?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(files.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        registry.register(Box::new(active_shards.clone()))?;
        // Every strategy is exported from the start, so rate() has a zero to start from.
        for s in ferry_engine::Strategy::ALL {
            bytes.with_label_values(&[s.as_str()]);
        }
        Ok(Self {
            registry,
            bytes,
            files,
            failures,
            active_shards,
        })
    }

    fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The process's metrics (one registry per agent process, like Prometheus' default one).
pub fn metrics() -> &'static Metrics {
    static METRICS: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
    // The names are constants: registration cannot fail.
    METRICS.get_or_init(|| Metrics::new().unwrap_or_else(|e| panic!("metrics: {e}")))
}

/// What `/readyz` looks at.
#[derive(Debug, Default)]
pub struct Health {
    /// The CopyJob watch has delivered its first list.
    pub watching: AtomicBool,
    /// Unix seconds of the last successful heartbeat Lease renewal (0: never).
    pub lease_renewed: AtomicI64,
    /// How long a renewal stays good, in seconds.
    pub lease_seconds: i64,
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Health {
    /// `Ok` when ready, or why not.
    pub fn ready(&self) -> Result<(), String> {
        if !self.watching.load(Ordering::Relaxed) {
            return Err("not watching CopyJobs yet".into());
        }
        let renewed = self.lease_renewed.load(Ordering::Relaxed);
        if renewed == 0 {
            return Err("heartbeat Lease not renewed yet".into());
        }
        let age = unix_now() - renewed;
        if age > self.lease_seconds {
            return Err(format!("heartbeat Lease last renewed {age} s ago"));
        }
        Ok(())
    }
}

/// Answer on `listener` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Metrics, health: Arc<Health>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            let Ok(Some(request)) = lines.next_line().await else {
                return;
            };
            // Headers are read and ignored (up to the blank line), so clients see a
            // complete exchange.
            while let Ok(Some(line)) = lines.next_line().await {
                if line.is_empty() {
                    break;
                }
            }
            let mut parts = request.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (code, content_type, body) = match (method, path) {
                ("GET", "/metrics") => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics.render(),
                ),
                ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
                ("GET", "/readyz") => match health.ready() {
                    Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
                    Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
                },
                ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
                _ => (
                    "405 Method Not Allowed",
                    "text/plain",
                    "GET only\n".to_string(),
                ),
            };
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
