//! The `ferry-agent` command line outside `copy`: what `--version` says, and `pause`, the
//! image's default command (a pod that only holds something runs it as PID 1).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

const BIN: &str = env!("CARGO_BIN_EXE_ferry-agent");

#[test]
fn version_names_the_release_and_the_git_revision() -> Result<()> {
    let out = Command::new(BIN).arg("--version").output()?;
    ensure!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout)?;
    let want_prefix = format!("ferry-agent {} (", env!("CARGO_PKG_VERSION"));
    let rev = text
        .trim()
        .strip_prefix(&want_prefix)
        .and_then(|r| r.strip_suffix(')'))
        .with_context(|| format!("unexpected --version: {text:?}"))?;
    let commit = rev.strip_suffix("-dirty").unwrap_or(rev);
    ensure!(
        commit == "unknown"
            || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "not a 12-digit revision: {text:?}"
    );
    // In this checkout git knows the revision, and it is the one printed.
    if let Ok(head) = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
    {
        if head.status.success() {
            let head = String::from_utf8(head.stdout)?;
            ensure!(
                commit == head.trim(),
                "--version says {rev}, HEAD is {head}"
            );
        }
    }
    Ok(())
}

#[test]
fn pause_waits_until_sigterm_then_exits_zero() -> Result<()> {
    let mut child = Command::new(BIN)
        .arg("pause")
        .stdin(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(300));
    ensure!(
        child.try_wait()?.is_none(),
        "pause exited before it was signalled"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    ensure!(killed.success(), "kill -TERM failed");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait()? {
            ensure!(status.success(), "pause exited with {status} on SIGTERM");
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("pause did not exit within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The peering address is dialled as given by the other cluster's agents, which take an IP
/// address and port only: anything else (a host name, an unexpanded `$(NODE_IP)` where the
/// chart's environment was not set) stops the agent at start, naming the setting, instead
/// of being published into every export's Secret and refused by each reader.
#[test]
fn a_peering_address_that_is_not_an_ip_and_port_is_refused_at_start() -> Result<()> {
    for bad in [
        "node-1.ferry.example.com:7451",
        "$(NODE_IP):7451",
        "10.0.0.5",
    ] {
        let out = Command::new(BIN)
            .args(["run", "--peering-listen", "127.0.0.1:0"])
            .env("FERRY_PEERING_ADDRESS", bad)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(2) && err.contains("--peering-address") && err.contains(bad),
            "{bad}: {:?} {err}",
            out.status
        );
    }
    Ok(())
}
