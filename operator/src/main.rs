//! `ferry-operator`: reconciles CopyJobs and CopySchedules, populates claims from
//! VolumeSources, signs the agents' transfer certificates, and keeps the install's peering CA
//! and the FerryPeers' status when peering is on (the leading replica only).
//! Uses the in-cluster config, or KUBECONFIG.
//! Serves `/metrics`, `/healthz` and `/readyz` on `--listen` from the start, leader or not.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// The Ferry operator.
#[derive(Debug, Parser)]
#[command(version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("FERRY_GIT_REV"), ")"))]
struct Args {
    /// Address for /metrics (Prometheus), /healthz and /readyz.
    #[arg(long, env = "FERRY_LISTEN", default_value = "0.0.0.0:9090")]
    listen: SocketAddr,
    /// Seconds that work on a node's own volumes waits for a node whose agent stopped
    /// heartbeating, before its job fails with `NodeUnavailable`. (Work on shared roots
    /// moves to another agent as soon as the heartbeat expires.)
    #[arg(long, env = "FERRY_NODE_UNAVAILABLE_AFTER", default_value_t = 300)]
    node_unavailable_after: u64,
    /// The agents' ServiceAccount (in the operator's namespace): the only requester whose
    /// `ferry.dev/transfer` certificate requests are approved.
    #[arg(
        long,
        env = "FERRY_AGENT_SERVICE_ACCOUNT",
        default_value = "ferry-agent"
    )]
    agent_service_account: String,
}

/// The volume populator, when the chart turns it on (`FERRY_POPULATOR=true`: it needs
/// holder pods and the rebind's admission policy, which the chart installs with it).
async fn populator(client: kube::Client) {
    if std::env::var("FERRY_POPULATOR").is_ok_and(|v| v == "true") {
        ferry_operator::populator::run(client).await;
    }
}

/// Claim migrations, when the chart turns them on (`FERRY_MIGRATIONS=true`: they need
/// holder pods for the final sync and the `-migrations` admission policy).
async fn migrations(client: kube::Client) {
    if std::env::var("FERRY_MIGRATIONS").is_ok_and(|v| v == "true") {
        ferry_operator::migrate::run(client).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        // Colour codes only on a terminal: logs in files and `kubectl logs` stay greppable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let metrics = Arc::new(ferry_operator::metrics::Metrics::new()?);
    let health = Arc::new(ferry_operator::metrics::Health::default());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {} for /metrics and /healthz", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    tokio::spawn(ferry_serve::serve(
        listener,
        Arc::new(ferry_operator::metrics::OperatorEndpoints {
            metrics: metrics.clone(),
            health: health.clone(),
        }),
    ));
    let client = kube::Client::try_default().await?;
    tracing::info!("ferry-operator starting");
    let namespace = std::env::var("FERRY_NAMESPACE").unwrap_or_else(|_| "ferry-system".into());
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
        format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "operator".into()),
            std::process::id()
        )
    });
    ferry_operator::leader::acquire(client.clone(), &namespace, "ferry-operator", &identity, {
        let health = health.clone();
        move |leading| health.lease_checked(leading)
    })
    .await;
    // The controllers and the signer stop on SIGTERM; the process ends when all have.
    tokio::join!(
        ferry_operator::controller::run(
            client.clone(),
            metrics,
            &health,
            std::time::Duration::from_secs(args.node_unavailable_after),
        ),
        ferry_operator::copyschedule::run(client.clone(), &health),
        populator(client.clone()),
        migrations(client.clone()),
        ferry_operator::peering::run(client.clone(), &namespace, &args.agent_service_account),
        ferry_operator::signer::run(client, &namespace, &args.agent_service_account),
    );
    Ok(())
}
