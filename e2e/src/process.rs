//! A process a test started ([`Proc`]): signalled by name, stopped for certain, killed and
//! reaped when dropped.

use std::process::{Child, Command};

use anyhow::{bail, Result};

/// A process started by a test, killed when dropped.
#[derive(Debug)]
pub struct Proc(pub(crate) Child);

impl Proc {
    /// The process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Send a signal (`STOP`, `CONT`, `KILL`, ...) by name. `STOP` returns once every thread
    /// of the process has stopped: kill(2) returns before they have, and a thread still
    /// finishing a syscall could change the disk after the caller looked.
    pub fn signal(&self, sig: &str) -> Result<()> {
        let pid = self.0.id();
        let status = Command::new("kill")
            .args(["-s", sig, &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -s {sig} {pid} failed");
        }
        if sig == "STOP" {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !all_threads_stopped(pid)? {
                if std::time::Instant::now() > deadline {
                    bail!("process {pid} did not stop within 10 s of SIGSTOP");
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// Kill the process (SIGKILL: no chance to clean up) and reap it.
    pub fn kill(&mut self) -> Result<()> {
        self.0.kill()?;
        self.0.wait()?;
        Ok(())
    }

    /// Leave the process running; returns its pid.
    pub fn detach(self) -> u32 {
        let this = std::mem::ManuallyDrop::new(self);
        this.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether every thread of `pid` is in state `T` (stopped by a signal), from
/// /proc/PID/task/*/stat, whose third field (after the parenthesised name) is the state.
fn all_threads_stopped(pid: u32) -> Result<bool> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = match std::fs::read_to_string(task?.path().join("stat")) {
            Ok(s) => s,
            // A thread that exited meanwhile is not running either.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state != Some('T') {
            return Ok(false);
        }
    }
    Ok(true)
}

impl From<Child> for Proc {
    /// A process the test spawned itself, killed and reaped when dropped.
    fn from(child: Child) -> Self {
        Proc(child)
    }
}
