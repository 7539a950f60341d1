//! kubectl against one cluster (the process tier's control plane, or the real node of
//! `e2e/kube/`): running it, reading and waiting on objects, and, when a wait fails, the
//! tails of the logs that explain why.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// kubectl with one kubeconfig; `logs` is the directory of `*.log` files a failed wait quotes.
#[derive(Debug)]
pub struct Kubectl {
    bin: PathBuf,
    pub kubeconfig: PathBuf,
    logs: PathBuf,
}

impl Kubectl {
    pub fn new(bin: PathBuf, kubeconfig: PathBuf, logs: PathBuf) -> Self {
        Self {
            bin,
            kubeconfig,
            logs,
        }
    }

    /// The installed kubectl (`make deps`) with `kubeconfig`, e.g. the one `make dev-up`
    /// prints, quoting the logs in `logs`.
    pub fn installed(kubeconfig: PathBuf, logs: PathBuf) -> Result<Self> {
        let (_, _, bin) = crate::tools::binaries()?;
        Ok(Self::new(bin, kubeconfig, logs))
    }

    /// The kubectl binary this runs.
    pub fn bin(&self) -> &std::path::Path {
        &self.bin
    }

    /// The same kubectl as another user: with `kubeconfig` (e.g. a ServiceAccount's, from
    /// `ControlPlane::service_account_kubeconfig`).
    pub fn as_user(&self, kubeconfig: PathBuf) -> Self {
        Self::new(self.bin.clone(), kubeconfig, self.logs.clone())
    }

    /// Run kubectl against this cluster.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .context("run kubectl")
    }

    /// Run kubectl with `input` on stdin (e.g. `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Result<Output> {
        let mut child = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl")?;
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(input.as_bytes())?;
        Ok(child.wait_with_output()?)
    }

    /// kubectl that must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        stdout_of("kubectl", args, self.kubectl(args)?)
    }

    /// Wait (on the phase, never a fixed sleep) until CopyJob `ns/name` has Succeeded. The
    /// error carries kubectl's answer, the job's status and the tail of every process log.
    pub fn wait_succeeded(&self, ns: &str, name: &str, timeout_secs: u32) -> Result<()> {
        let job = format!("copyjob/{name}");
        let timeout = format!("--timeout={timeout_secs}s");
        let out = self.kubectl(&[
            "wait",
            "--for=jsonpath={.status.phase}=Succeeded",
            &timeout,
            &job,
            "-n",
            ns,
        ])?;
        if out.status.success() {
            return Ok(());
        }
        let status = self
            .kubectl_ok(&["get", &job, "-n", ns, "-o", "jsonpath={.status}"])
            .unwrap_or_default();
        let mut logs: Vec<String> = std::fs::read_dir(&self.logs)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log"))
            .collect();
        logs.sort();
        let tails: Vec<String> = logs
            .iter()
            .map(|l| format!("{l}:\n{}", self.log_tail(l, 5)))
            .collect();
        bail!(
            "{ns}/{name} did not succeed: {}\nstatus: {status}\n{}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            self.node_pressure(),
            tails.join("\n")
        )
    }

    /// A line per node condition that is not as a healthy node has it (Ready false, or a
    /// pressure true), e.g. DiskPressure: a kubelet evicting pods for a full disk explains
    /// a copy that never finished better than any of Ferry's logs.
    fn node_pressure(&self) -> String {
        let jsonpath = r#"{range .items[*]}{.metadata.name}{range .status.conditions[*]}{"\t"}{.type}={.status}: {.message}{end}{"\n"}{end}"#;
        let Ok(nodes) = self.kubectl_ok(&["get", "nodes", "-o", &format!("jsonpath={jsonpath}")])
        else {
            return String::new();
        };
        let mut out = String::new();
        for line in nodes.lines() {
            let mut fields = line.split('\t');
            let node = fields.next().unwrap_or_default();
            for condition in fields {
                let state = condition.split_once(": ").map_or(condition, |(s, _)| s);
                let healthy = match state.split_once('=') {
                    Some(("Ready", status)) => status == "True",
                    Some((_, status)) => status != "True",
                    None => true,
                };
                if !healthy {
                    out.push_str(&format!("node {node}: {condition}\n"));
                }
            }
        }
        out
    }

    /// A jsonpath of one object, as kubectl prints it ("" when the object is gone).
    pub fn get(&self, kind_name: &str, ns: &str, jsonpath: &str) -> Result<String> {
        let out = self.kubectl(&[
            "get",
            kind_name,
            "-n",
            ns,
            "--ignore-not-found",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])?;
        if !out.status.success() {
            bail!(
                "kubectl get {kind_name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Poll `jsonpath` of `kind_name` until `ready` accepts it; the error shows the last
    /// value and the agents' logs.
    pub fn wait_until(
        &self,
        kind_name: &str,
        ns: &str,
        jsonpath: &str,
        timeout: Duration,
        mut ready: impl FnMut(&str) -> bool,
    ) -> Result<String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < timeout {
            last = self.get(kind_name, ns, jsonpath)?;
            if ready(&last) {
                return Ok(last);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "{kind_name} {jsonpath}: still {last:?} after {timeout:?}\nstatus: {}\noperator:\n{}{}",
            self.get(kind_name, ns, "{.status}").unwrap_or_default(),
            self.log_tail("operator.log", 10),
            self.agent_log_tails(20)
        )
    }

    /// The last `lines` of every agent's log here (`agent-<node>.log`), each under its
    /// name: a shard that does not move is the agent's story, not the operator's.
    fn agent_log_tails(&self, lines: usize) -> String {
        let mut logs: Vec<String> = std::fs::read_dir(&self.logs)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("agent-") && n.ends_with(".log"))
            .collect();
        logs.sort();
        logs.iter()
            .map(|log| format!("\n{log}:\n{}", self.log_tail(log, lines)))
            .collect()
    }

    /// Wait until claim `name` in `ns` is `Bound` (by the PV controller).
    pub fn wait_claim_bound(&self, ns: &str, name: &str) -> Result<()> {
        self.wait_until(
            &format!("pvc/{name}"),
            ns,
            "{.status.phase}",
            Duration::from_secs(60),
            |phase| phase == "Bound",
        )
        .map(drop)
    }

    /// Wait until pod `name` in `ns` is Ready (its containers started and their probes
    /// answer).
    pub fn wait_pod_ready(&self, ns: &str, name: &str, timeout_secs: u32) -> Result<()> {
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "-n",
            ns,
            &format!("--timeout={timeout_secs}s"),
        ])
        .map(drop)
    }

    /// `kubectl apply -f -` that must succeed.
    pub fn apply(&self, yaml: &str) -> Result<()> {
        let out = self.kubectl_stdin(&["apply", "-f", "-"], yaml)?;
        if !out.status.success() {
            bail!("apply refused: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// The reasons of the events about one object, oldest first.
    pub fn event_reasons(&self, ns: &str, name: &str) -> Result<String> {
        self.kubectl_ok(&[
            "get",
            "events.events.k8s.io",
            "-n",
            ns,
            "--field-selector",
            &format!("regarding.name={name}"),
            "-o",
            "jsonpath={.items[*].reason}",
        ])
    }

    /// The last lines of a log in the control plane's directory (for failure messages).
    pub fn log_tail(&self, log: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.logs.join(log)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Watch one object (`kubectl get KIND NAME -w`, events included), each event's
    /// `jsonpath` line timestamped as it arrives: when its changes reach a watcher, with
    /// kubectl's own start-up outside the timing. Give it half a second to start watching
    /// before the object is made.
    pub fn watch(&self, kind: &str, ns: &str, name: &str, jsonpath: &str) -> Result<Watch> {
        self.watch_where(
            kind,
            ns,
            &format!("--field-selector=metadata.name={name}"),
            jsonpath,
        )
    }

    /// Like [`Kubectl::watch`], for every object of `kind` in `ns` with labels that match
    /// `selector` (a label selector, e.g. `app=x` or just a key).
    pub fn watch_labelled(
        &self,
        kind: &str,
        ns: &str,
        selector: &str,
        jsonpath: &str,
    ) -> Result<Watch> {
        self.watch_where(kind, ns, &format!("--selector={selector}"), jsonpath)
    }

    fn watch_where(&self, kind: &str, ns: &str, selector: &str, jsonpath: &str) -> Result<Watch> {
        let mut child = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["get", kind, "-n", ns, "-w", "--output-watch-events"])
            .arg(selector)
            .arg(format!("-o=jsonpath={jsonpath}{{\"\\n\"}}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("run kubectl get -w")?;
        let out = child.stdout.take().context("kubectl stdout")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Ok(Watch { child, lines })
    }
}

/// The stdout of `program args` that ran as `out`, or an error with its stderr if it failed.
pub(crate) fn stdout_of(program: &str, args: &[&str], out: Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A running `kubectl get -w` (see [`Kubectl::watch`]); stopped when dropped.
#[derive(Debug)]
pub struct Watch {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<(Instant, String)>,
}

impl Watch {
    /// The lines that have arrived so far (waiting for none).
    pub fn seen(&self) -> Vec<String> {
        self.lines.try_iter().map(|(_, line)| line).collect()
    }

    /// The events up to and including the first whose line satisfies `done`.
    pub fn until(
        &self,
        done: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<Vec<(Instant, String)>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, line) = self
                .lines
                .recv_timeout(left)
                .with_context(|| format!("no such event within {timeout:?}; saw {seen:?}"))?;
            let finished = done(&line);
            seen.push((at, line));
            if finished {
                return Ok(seen);
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
