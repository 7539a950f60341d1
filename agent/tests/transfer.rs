//! The transfer port between agents (`ferry_agent::transfer`), on loopback addresses of
//! their own: node-a serves a shard's source on 127.0.0.2, node-b receives it. Only a peer
//! with this install's certificate for the node the shard names, presenting the shard's
//! ticket at its epoch, is served; the others are refused before any of the source is
//! opened (the grants are not even looked at without a valid certificate).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Context, Result};
use common::*;
use std::future::Future;
use std::pin::Pin;

use ferry_agent::transfer::{dial, open_path, serve, Grant, Grants, Hello, Tls, TransferError};
use ferry_engine::send::SendOptions;
use ferry_engine::{copy_from, NoProgress, Options};
use ferry_link::{Ca, NodeKey};
use rustls::pki_types::CertificateDer;
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../../link/tests/common/any_server.rs"]
mod any_server;
use any_server::AnyServer;

const TICKET: [u8; 32] = [7; 32];

struct Table {
    grants: Mutex<Vec<Grant>>,
    looked_up: AtomicUsize,
}

impl Grants for Table {
    fn grant<'a>(
        &'a self,
        job: &'a str,
        shard: u32,
        epoch: u64,
    ) -> Pin<Box<dyn Future<Output = Result<Grant, String>> + Send + 'a>> {
        self.looked_up.fetch_add(1, Ordering::SeqCst);
        let found = self
            .grants
            .lock()
            .ok()
            .and_then(|g| {
                g.iter()
                    .find(|g| g.job == job && g.shard == shard && g.epoch == epoch)
                    .cloned()
            })
            .ok_or_else(|| format!("no grant for shard {shard} of job {job} at epoch {epoch}"));
        Box::pin(async move { found })
    }
}

fn identity(ca: &Ca, node: &str) -> Result<Tls> {
    let key = NodeKey::generate(node)?;
    let cert = ca.sign_node(&key.csr_pem, node, std::time::Duration::from_secs(3600))?;
    Ok(Tls::new(ca.cert_pem(), &cert, &key.key_pem)?)
}

struct Setup {
    _tmp: tempfile::TempDir,
    src: std::path::PathBuf,
    dst: std::path::PathBuf,
    addr: SocketAddr,
    table: Arc<Table>,
    ca: Ca,
}

async fn setup() -> Result<Setup> {
    let tmp = tempdir()?;
    let src = tmp.path().join("node-a/volume/data");
    mkdir(&src.join("sub"))?;
    write(&src.join("sub/f"), b"across nodes")?;
    write_pattern_file(&src.join("big"), 3 << 20)?;
    symlink("/etc/passwd", &src.join("link"))?;
    let ca = Ca::generate("ferry install CA")?;
    let node_a = Arc::new(identity(&ca, "node-a")?);
    let table = Arc::new(Table {
        grants: Mutex::new(vec![Grant {
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
        }]),
        looked_up: AtomicUsize::new(0),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await?;
    let addr = listener.local_addr()?;
    let (_, identity) = tokio::sync::watch::channel(Some(node_a));
    tokio::spawn(serve(listener, identity, table.clone() as Arc<dyn Grants>));
    let dst = tmp.path().join("node-b/volume/copy");
    mkdir(dst.parent().context("parent")?)?;
    Ok(Setup {
        _tmp: tmp,
        src,
        dst,
        addr,
        table,
        ca,
    })
}

fn hello(shard: u32, epoch: u64, ticket: [u8; 32]) -> Hello {
    Hello {
        job: "uid-1".into(),
        shard,
        epoch,
        ticket,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_receiver_with_its_ticket_copies_the_source_across_identical() -> Result<()> {
    let s = setup().await?;
    let before = snapshot(&s.src)?;
    let node_b = identity(&s.ca, "node-b")?;
    let conn = dial(s.addr, &node_b, "node-a", &hello(0, 3, TICKET)).await?;
    let (src, dst) = (s.src.clone(), s.dst.clone());
    let summary = tokio::task::spawn_blocking(move || {
        copy_from(&conn, &src, &dst, &Options::default(), &NoProgress)
    })
    .await??;
    ensure!(
        summary.failed == 0 && summary.aborted.is_none(),
        "{summary:?}"
    );
    ensure!(
        summary.verified == 2 && summary.symlinks == 1,
        "{summary:?}"
    );
    compare(&before, &s.dst, Check::default())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ticket_epoch_shard_or_receiver_is_refused_with_a_reason() -> Result<()> {
    let s = setup().await?;
    let node_b = identity(&s.ca, "node-b")?;
    let node_c = identity(&s.ca, "node-c")?;
    let cases = [
        (&node_b, hello(0, 3, [8; 32]), "ticket"),
        (&node_b, hello(0, 2, TICKET), "no grant"),
        (&node_b, hello(1, 3, TICKET), "no grant"),
        (&node_c, hello(0, 3, TICKET), "not node node-c's"),
    ];
    for (who, hello, why) in cases {
        match dial(s.addr, who, "node-a", &hello).await {
            Err(TransferError::Refused(reason)) => {
                ensure!(reason.contains(why), "{reason:?} does not say {why:?}")
            }
            Err(e) => bail!("{why}: failed otherwise: {e}"),
            Ok(_) => bail!("{why}: accepted"),
        }
    }
    ensure!(!s.dst.exists());
    // A client that expects another node at that address refuses the server itself.
    match dial(s.addr, &node_b, "node-c", &hello(0, 3, TICKET)).await {
        Err(TransferError::Handshake { .. }) => {}
        other => bail!("a server that is not node-c was accepted as node-c: {other:?}"),
    }
    Ok(())
}

/// Connect with `config`, send a hello with the right ticket, and return what came back
/// (an error, or the bytes the server sent).
async fn outsider(addr: SocketAddr, config: ClientConfig) -> Result<Vec<u8>, String> {
    let mut config = config;
    config.alpn_protocols = vec![ferry_link::ALPN.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut tls = connector
        .connect(ferry_link::server_name(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let mut frame = Vec::new();
    ferry_transfer::Frame::Hello {
        version: ferry_transfer::frame::VERSION,
        job: b"uid-1".to_vec(),
        shard: 0,
        epoch: 3,
        ticket: TICKET,
    }
    .encode(&mut frame)
    .map_err(|e| e.to_string())?;
    tls.write_all(&frame).await.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    match tls.read_to_end(&mut got).await {
        Ok(_) if got.is_empty() => Err("closed".into()),
        Ok(_) => Ok(got),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_this_installs_certificate_is_refused_before_any_grant_is_looked_at(
) -> Result<()> {
    let s = setup().await?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let anonymous = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_no_client_auth();
    let got = outsider(s.addr, anonymous).await;
    ensure!(got.is_err(), "a client without a certificate got {got:?}");

    // The same node name and the same ticket, from another CA.
    let rogue = Ca::generate("ferry install CA")?;
    let key = NodeKey::generate("node-b")?;
    let cert = rogue.sign_node(&key.csr_pem, "node-b", std::time::Duration::from_secs(3600))?;
    use rustls::pki_types::pem::PemObject;
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<_, _>>()?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.key_pem.as_bytes())?;
    let impostor = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_client_auth_cert(chain, key)?;
    let got = outsider(s.addr, impostor).await;
    ensure!(got.is_err(), "a client from another CA got {got:?}");

    ensure!(
        s.table.looked_up.load(Ordering::SeqCst) == 0,
        "a grant was looked up for an unauthenticated peer"
    );
    ensure!(!s.dst.exists());
    Ok(())
}
