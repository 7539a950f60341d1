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
    // What this agent may do, once in its log; and, for a capability the chart gives that
    // it lacks (an admin's narrower list), what every copy will lose.
    match ferry_agent::confinement::Confinement::current() {
        Ok(c) => {
            tracing::info!(
                uid = c.uid,
                capabilities = %c.capability_names().join(" "),
                no_new_privs = c.no_new_privs,
                seccomp = c.seccomp,
                "confinement"
            );
            for (capability, loss) in c.losses() {
                tracing::warn!(capability, "copies lose this without it: {loss}");
            }
        }
        Err(e) => tracing::warn!("cannot read this agent's capabilities: {e}"),
    }
    let settings = ferry_agent::daemon::Settings {
        node: args.node,
        host_root: args.host_root,
        ticket_namespace: args
            .ticket_namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| args.namespace.clone()),
        namespace: args.namespace,
        workers: args.workers.into(),
        max_shards: args.max_shards.into(),
        listen: args.listen,
        lease_seconds: args.lease_seconds,
        transfer_listen: args.transfer_listen,
        transfer_address: args.transfer_address,
        peering_listen: args.peering_listen,
        peering_address: args.peering_address.map(|a| a.to_string()),
        changed_blocks_account: args.changed_blocks_account.filter(|a| !a.is_empty()),
        corrupt_in_flight: std::env::var("FERRY_FAULT_CORRUPT_IN_FLIGHT")
            .ok()
            .filter(|v| !v.is_empty()),
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
    let result = runtime.block_on(async {
        tokio::select! {
            r = ferry_agent::daemon::run(settings) => Some(r),
            signal = stop_signal() => {
                tracing::info!(signal, "stopping: copies in progress resume where they are when an agent on this node starts again");
                None
            }
        }
    });
    match result {
        // Stopped by the kubelet (pod deleted, DaemonSet rolled) or by hand. Exit at once,
        // without waiting for the copy threads: what they finished is committed, what they
        // did not is staged, and a resumed copy takes both over (as after a kill). As PID 1
        // without this handler the agent would ignore SIGTERM and copy on until the grace
        // period ends in SIGKILL, delaying the pod that replaces it.
        None => std::process::exit(0),
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            // The error and each of its causes: "outer: cause: root cause".
            eprintln!("ferry-agent run: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}

/// The first SIGTERM or SIGINT, by name; never resolves if the handlers cannot be set up
/// (the agent then runs on, as it would have without them).
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => std::future::pending().await,
    }
}

/// Wait for SIGTERM or SIGINT, then exit 0 (as PID 1 in a container a signal without a
/// handler would be ignored: these are handled).
fn pause() -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => {
            rt.block_on(stop_signal());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ferry-agent pause: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `ferry-agent hold-block`: hand the device over until SIGTERM or SIGINT, then exit 0;
/// 1 when the device or the socket cannot be had.
fn hold_block(args: &ferry_agent::cli::HoldBlockArgs) -> ExitCode {
    let holder = match ferry_agent::handoff::Holder::open(&args.device, args.write, &args.dir) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ferry-agent hold-block: {}", ferry_agent::with_causes(&e));
            return ExitCode::FAILURE;
        }
    };
    std::thread::spawn(move || holder.serve());
    pause()
}

/// `ferry-agent confinement`: the report, exit 0; 2 when it cannot be made.
fn confinement(args: &ferry_agent::cli::ConfinementArgs) -> ExitCode {
    let c = match ferry_agent::confinement::Confinement::current() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferry-agent confinement: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{}", c.report());
    if args.calls {
        match ferry_agent::confinement::probe_calls(&args.scratch) {
            Ok(lines) => print!("{lines}"),
            Err(e) => {
                eprintln!("ferry-agent confinement: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(device) = &args.device {
        match ferry_agent::confinement::probe_device(device, &args.scratch) {
            Ok(lines) => print!("{lines}"),
            Err(e) => {
                eprintln!("ferry-agent confinement: {e}");
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let cli = ferry_agent::cli::Cli::parse();
    match cli.command {
        ferry_agent::cli::Command::Copy(args) => ferry_agent::copy_cmd::run(&args),
        ferry_agent::cli::Command::CopyBlock(args) => ferry_agent::block_cmd::run(&args),
        ferry_agent::cli::Command::Run(args) => run_daemon(args),
        ferry_agent::cli::Command::Pause => pause(),
        ferry_agent::cli::Command::HoldBlock(args) => hold_block(&args),
        ferry_agent::cli::Command::Confinement(args) => confinement(&args),
    }
}
