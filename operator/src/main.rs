//! `ferry-operator`: reconciles CopyJobs. Uses the in-cluster config, or KUBECONFIG.

use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let client = kube::Client::try_default().await?;
    tracing::info!("ferry-operator starting");
    ferry_operator::controller::run(client).await;
    Ok(())
}
