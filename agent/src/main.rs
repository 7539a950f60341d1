//! `ferry-agent`: the node agent (`run`) and Ferry's engine for people without a cluster
//! (`copy`).

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn run_daemon(args: ferry_agent::cli::RunArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        // Colour codes only on a terminal: logs in files and `kubectl logs` stay greppable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let settings = ferry_agent::daemon::Settings {
        node: args.node,
        host_root: args.host_root,
        namespace: args.namespace,
        workers: args.workers,
        listen: args.listen,
        lease_seconds: args.lease_seconds,
        file_delay: std::env::var("FERRY_FAULT_FILE_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(std::time::Duration::from_millis),
        corrupt_file: std::env::var("FERRY_FAULT_CORRUPT_FILE")
            .ok()
            .filter(|v| !v.is_empty()),
        change_source: std::env::var("FERRY_FAULT_CHANGE_SOURCE")
            .ok()
            .filter(|v| !v.is_empty()),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferry-agent run: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ferry_agent::daemon::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error and each of its causes: "outer: cause: root cause".
            eprintln!("ferry-agent run: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}

/// Wait for SIGTERM or SIGINT (as PID 1 in a container, a signal without a handler would
/// be ignored: these are handled).
fn pause() -> ExitCode {
    use tokio::signal::unix::{signal, SignalKind};
    let waited = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .and_then(|rt| {
            rt.block_on(async {
                let mut term = signal(SignalKind::terminate())?;
                let mut int = signal(SignalKind::interrupt())?;
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                Ok(())
            })
        });
    match waited {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry-agent pause: cannot wait for signals: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = ferry_agent::cli::Cli::parse();
    match cli.command {
        ferry_agent::cli::Command::Copy(args) => ferry_agent::copy_cmd::run(&args),
        ferry_agent::cli::Command::Run(args) => run_daemon(args),
        ferry_agent::cli::Command::Pause => pause(),
    }
}
