//! `ferry-agent`: the node agent binary. Today it carries the `copy` subcommand, Ferry's
//! engine for people without a cluster.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ferry_agent::cli::Cli::parse();
    match cli.command {
        ferry_agent::cli::Command::Copy(args) => ferry_agent::copy_cmd::run(&args),
    }
}
