//! Shared helpers for the black-box tests of `ferry-agent copy`: run the real binary with a
//! timeout and read its JSON summary. Building and comparing trees is the engine tests'
//! (`engine/tests/common`), included here as `tree` so there is one copy of it.

#![allow(dead_code)]

#[path = "../../../engine/tests/common/mod.rs"]
mod tree;

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

pub use tree::*;

// ---------------------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------------------

/// The `ferry-agent` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_ferry-agent");

/// Longest any single copy in these tests may take before it counts as a hang.
pub const COPY_TIMEOUT: Duration = Duration::from_secs(90);

/// What one run of the binary did.
#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "exit code {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Output {
    /// The `--json` summary printed on stdout.
    pub fn json(&self) -> Result<serde_json::Value> {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .ok_or_else(|| anyhow!("no JSON object on stdout:\n{self}"))?;
        serde_json::from_str(line).with_context(|| format!("stdout is not JSON:\n{self}"))
    }

    /// Lines on stderr that report a failed entry (`failed [Reason]: ...`).
    pub fn failure_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("failed ["))
            .collect()
    }

    pub fn expect_code(&self, code: i32) -> Result<&Self> {
        if self.code != code {
            bail!("expected exit code {code}, got:\n{self}");
        }
        Ok(self)
    }
}

/// A number field of the JSON summary.
pub fn num(json: &serde_json::Value, field: &str) -> u64 {
    json[field]
        .as_u64()
        .unwrap_or_else(|| panic!("summary field {field} is not a number: {json}"))
}

/// `(path, reason)` of every failure in the JSON summary.
pub fn failures(json: &serde_json::Value) -> Vec<(String, String)> {
    json["failures"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["path"].as_str().unwrap_or_default().to_string(),
                        f["reason"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Run `cmd` to completion, capturing its output; a run longer than `timeout` is killed
/// and reported as a hang.
pub fn run(mut cmd: Command, timeout: Duration) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("spawn {cmd:?}"))?;
    let mut out = child.stdout.take().context("stdout pipe")?;
    let mut err = child.stderr.take().context("stderr pipe")?;
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            // Our own child, killed by its id.
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} did not finish within {timeout:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok(Output {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// `copy --no-progress ARGS...` as `ferry-agent`'s arguments, with `--verify none` unless
/// ARGS name `--verify`: these tests were written when the CLI did not verify by default,
/// and a hash forces the user-space read/write path, which would take the kernel's copy
/// paths they exercise out of them. The default itself is tested by
/// `the_cli_verifies_by_default_as_a_copyjob_does`.
pub fn copy_args<I, S>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let mut all: Vec<OsString> = vec!["copy".into(), "--no-progress".into()];
    if !args.iter().any(|a| a == "--verify") {
        all.extend(["--verify".into(), "none".into()]);
    }
    all.extend(args);
    all
}

/// `ferry-agent` with [`copy_args`], not yet run.
pub fn copy_command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(BIN);
    cmd.args(copy_args(args));
    cmd
}

/// Run `ferry-agent copy --no-progress ARGS...` with the standard timeout.
pub fn copy<I, S>(args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(copy_command(args), COPY_TIMEOUT)
}

/// Run `ferry-agent copy --no-progress --json ARGS...` and insist on exit 0 and `ok: true`.
pub fn copy_ok<I, S>(args: I) -> Result<serde_json::Value>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut all: Vec<std::ffi::OsString> = vec!["--json".into()];
    all.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
    let out = copy(all)?;
    out.expect_code(0)?;
    let json = out.json()?;
    if json["ok"] != serde_json::Value::Bool(true) || num(&json, "failed") != 0 {
        bail!("summary does not say ok:\n{out}");
    }
    Ok(json)
}

/// Snapshot `src`, copy it to `dst` with `extra` flags (expecting success), and compare.
/// A copy to a new `dst` is made a second time through the two halves of a copy between
/// nodes (`--two-halves`, into `dst` + `.halves`), which must keep the same: one set of
/// destination rules, whichever way the source's bytes and metadata arrive.
pub fn copy_and_compare(
    src: &Path,
    dst: &Path,
    extra: &[&str],
    check: Check,
) -> Result<serde_json::Value> {
    let before = snapshot(src)?;
    let fresh = std::fs::symlink_metadata(dst).is_err();
    let json = copy_compared(&before, src, dst, extra, check)?;
    // (Cloning cannot be asked for across nodes.)
    if fresh && !extra.windows(2).any(|w| w == ["--reflink", "always"]) {
        let mut halves = dst.as_os_str().to_owned();
        halves.push(".halves");
        let mut extra = extra.to_vec();
        extra.push("--two-halves");
        copy_compared(&before, src, Path::new(&halves), &extra, check)
            .context("through the two halves (--two-halves)")?;
    }
    Ok(json)
}

/// [`copy_and_compare`] without the second copy through the two halves: for tests of what
/// only a local copy can do (share blocks with the source), on filesystems sized for one copy.
pub fn copy_and_compare_once(
    src: &Path,
    dst: &Path,
    extra: &[&str],
    check: Check,
) -> Result<serde_json::Value> {
    copy_compared(&snapshot(src)?, src, dst, extra, check)
}

fn copy_compared(
    before: &Tree,
    src: &Path,
    dst: &Path,
    extra: &[&str],
    check: Check,
) -> Result<serde_json::Value> {
    let mut args: Vec<&OsStr> = extra.iter().map(OsStr::new).collect();
    args.push(src.as_os_str());
    args.push(dst.as_os_str());
    let json = copy_ok(args)?;
    compare(before, dst, check)?;
    let left = staging_leftovers(dst)?;
    if !left.is_empty() {
        bail!("staging entries left after a successful copy: {left:?}");
    }
    Ok(json)
}
