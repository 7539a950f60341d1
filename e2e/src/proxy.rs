//! A TCP proxy for tests of copies over the network: it forwards a listening address to
//! another, counts the bytes coming back from the far side (what a sender sends, TLS and
//! framing included), and cuts every open connection when asked. The agents' TLS passes
//! through untouched: each side checks the other's certificate, not its address.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};

/// The bytes the sender sent through the proxy, and the first and last instants they came.
type Counted = (Arc<AtomicU64>, Arc<Mutex<Option<(Instant, Instant)>>>);

/// Forwards `listen` to `to`, counting the bytes from `to` (the sender's answers), and cuts
/// every open connection when asked.
#[allow(missing_debug_implementations)] // threads and sockets: nothing to print
pub struct Proxy {
    from_sender: Arc<AtomicU64>,
    /// First and last instants bytes came from the sender.
    span: Arc<Mutex<Option<(Instant, Instant)>>>,
    cut: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(listen: &str, to: String) -> Result<Self> {
        let listener = TcpListener::bind(listen).with_context(|| format!("bind {listen}"))?;
        let p = Self {
            from_sender: Arc::default(),
            span: Arc::default(),
            cut: Arc::default(),
            stop: Arc::default(),
        };
        let (count, span, cut, stop) = (
            p.from_sender.clone(),
            p.span.clone(),
            p.cut.clone(),
            p.stop.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(&to) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                if let Ok(mut open) = cut.lock() {
                    open.extend(client.try_clone().ok());
                    open.extend(server.try_clone().ok());
                }
                let pump = |mut from: TcpStream, mut to: TcpStream, counted: Option<Counted>| {
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 256 << 10];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if let Some((count, span)) = &counted {
                                count.fetch_add(n as u64, Ordering::Relaxed);
                                if let Ok(mut s) = span.lock() {
                                    let now = Instant::now();
                                    *s = Some(s.map_or((now, now), |(a, _)| (a, now)));
                                }
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                };
                pump(client, server, None);
                pump(s2, c2, Some((count.clone(), span.clone())));
            }
        });
        Ok(p)
    }

    /// Cut every connection open now, in the middle of whatever it carries.
    pub fn cut(&self) {
        if let Ok(mut open) = self.cut.lock() {
            for s in open.drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// The first and last instants bytes came back from the far side.
    pub fn span(&self) -> Option<(Instant, Instant)> {
        self.span.lock().ok().and_then(|s| *s)
    }

    /// Forget the instants bytes came: [`Proxy::span`] counts from the next byte.
    pub fn restart_span(&self) {
        if let Ok(mut s) = self.span.lock() {
            *s = None;
        }
    }

    /// The bytes that came back from the far side so far.
    pub fn bytes(&self) -> u64 {
        self.from_sender.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}
