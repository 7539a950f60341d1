//! `ferry-operator`: reconciles CopyJobs. Uses the in-cluster config, or KUBECONFIG.

use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        // Colour codes only on a terminal: logs in files and `kubectl logs` stay greppable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
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
    ferry_operator::leader::acquire(client.clone(), &namespace, "ferry-operator", &identity).await;
    ferry_operator::controller::run(client).await;
    Ok(())
}
