//! What the tests of the transfer certificates and of copies between nodes share: a control
//! plane with the chart installed and the operator on its ServiceAccount's token, agents'
//! node-bound tokens, certificates requested as an agent requests them, and a hello to an
//! agent's transfer port.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use ferry_e2e::{ControlPlane, Proc};
use ferry_link::{client_config, NodeKey, Trust};
use serde_json::Value;

pub const NS: &str = ferry_e2e::CHART_NAMESPACE;
/// Where the chart keeps the tickets of copies between nodes (`<namespace>-tickets`).
pub const TICKETS: &str = ferry_e2e::TICKET_NAMESPACE;
pub const SIGNER: &str = "ferry.dev/transfer";
pub const TRUST: &str = "ferry-transfer-trust";
pub const AGENT: &str = "system:serviceaccount:ferry-system:ferry-agent";
/// How long a request may wait for its decision, and the bundle for a CA: the signer acts on
/// the watch event, so a decision takes well under a second on an idle machine.
pub const DECIDED_WITHIN: Duration = Duration::from_secs(20);
/// The operator's start (a build of the binary if stale, leadership, the bundle).
pub const STARTED_WITHIN: Duration = Duration::from_secs(60);

/// The operator on its ServiceAccount's token, logging to `operator.log` (appended to across
/// restarts).
pub fn start_operator(cp: &ControlPlane, kubeconfig: &Path) -> Result<Proc> {
    cp.spawn_chart_operator_on(kubeconfig)
}

/// A control plane with the chart installed, Nodes `node-a` and `node-b`, and the operator
/// running; `None` when the binaries are not installed (outside CI).
pub fn cluster() -> Result<Option<(ControlPlane, Proc)>> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(None);
    };
    // The chart as `kubectl apply` installs it (its RBAC is what the operator and agents
    // run on here).
    cp.install_rendered(NS, "ferry.yaml")?;
    for node in ["node-a", "node-b"] {
        cp.add_node(node)?;
    }
    let operator_kc = cp.service_account_kubeconfig(NS, "ferry-operator", None)?;
    let operator = start_operator(&cp, &operator_kc)?;
    Ok(Some((cp, operator)))
}

/// The agents' token bound to `node` (as a pod's on that node is), as a kubeconfig.
pub fn agent(cp: &ControlPlane, node: &str) -> Result<std::path::PathBuf> {
    cp.service_account_kubeconfig(NS, "ferry-agent", Some(node))
}

/// A node's key and its certificate once issued.
pub struct NodeIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What the signer decided on a request.
#[derive(Debug)]
pub enum Decision {
    Issued {
        cert_pem: String,
        reason: String,
        message: String,
    },
    Denied {
        reason: String,
        message: String,
    },
}

/// Create request `name` for a CSR of `csr_node`, as `kubeconfig` (the admin's when `None`),
/// as an agent does; returns the key that stays with the requester.
pub fn request(
    cp: &ControlPlane,
    kubeconfig: Option<&Path>,
    name: &str,
    csr_node: &str,
) -> Result<NodeKey> {
    let key = NodeKey::generate(csr_node)?;
    let csr = serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(&key.csr_pem),
            "signerName": SIGNER,
            "usages": ["digital signature", "client auth", "server auth"],
        },
    });
    let kc = kubeconfig.map(|k| k.to_string_lossy().into_owned());
    let mut args = Vec::new();
    if let Some(kc) = &kc {
        args.extend(["--kubeconfig", kc.as_str()]);
    }
    args.extend(["create", "-f", "-"]);
    let out = cp.kubectl_stdin(&args, &csr.to_string())?;
    ensure!(
        out.status.success(),
        "creating request {name} as {}: {}",
        kc.as_deref().unwrap_or("the admin"),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(key)
}

/// Wait (polling) until request `name` is issued or denied.
pub fn decision(cp: &ControlPlane, name: &str) -> Result<Decision> {
    let start = Instant::now();
    let mut csr = Value::Null;
    while start.elapsed() < DECIDED_WITHIN {
        csr = serde_json::from_str(&cp.kubectl_ok(&["get", "csr", name, "-o", "json"])?)?;
        let condition = |type_: &str| {
            csr["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_ && c["status"] == "True")
                .map(|c| {
                    (
                        c["reason"].as_str().unwrap_or_default().to_string(),
                        c["message"].as_str().unwrap_or_default().to_string(),
                    )
                })
        };
        if let Some((reason, message)) = condition("Denied") {
            return Ok(Decision::Denied { reason, message });
        }
        let certificate = csr["status"]["certificate"].as_str().unwrap_or_default();
        if let (Some((reason, message)), false) = (condition("Approved"), certificate.is_empty()) {
            let pem = base64::engine::general_purpose::STANDARD.decode(certificate)?;
            return Ok(Decision::Issued {
                cert_pem: String::from_utf8(pem)?,
                reason,
                message,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "request {name} was neither issued nor denied within {DECIDED_WITHIN:?}: status {}\noperator:\n{}",
        csr["status"],
        cp.log_tail("operator.log", 15)
    )
}

/// Request a certificate for `node` with the agent token bound to it, and expect it issued
/// for that node.
pub fn issued(cp: &ControlPlane, name: &str, node: &str) -> Result<NodeIdentity> {
    let started = Instant::now();
    let key = request(cp, Some(&agent(cp, node)?), name, node)?;
    match decision(cp, name)? {
        Decision::Issued {
            cert_pem,
            reason,
            message,
        } => {
            eprintln!("{name}: issued in {:?}", started.elapsed());
            ensure!(
                reason == "FerryNodeVerified" && message.contains(node),
                "{name}: approved with {reason}: {message}"
            );
            let named = ferry_link::node_of_pem(&cert_pem)?;
            ensure!(
                named == node,
                "{name}: the certificate names {named}, not {node}"
            );
            Ok(NodeIdentity {
                cert_pem,
                key_pem: key.key_pem,
            })
        }
        denied => bail!("{name}: expected a certificate for {node}, got {denied:?}"),
    }
}

/// Expect request `name` denied by the signer; its message.
pub fn denied(cp: &ControlPlane, name: &str) -> Result<String> {
    match decision(cp, name)? {
        Decision::Denied { reason, message } => {
            ensure!(reason == "FerryRefused", "{name}: denied with {reason}");
            let cert =
                cp.kubectl_ok(&["get", "csr", name, "-o", "jsonpath={.status.certificate}"])?;
            ensure!(cert.is_empty(), "{name}: denied, yet it has a certificate");
            Ok(message)
        }
        issued => bail!("{name}: expected a denial, got {issued:?}"),
    }
}

/// The trust ConfigMap's data (empty while it does not exist).
pub fn bundle(cp: &ControlPlane) -> Result<BTreeMap<String, String>> {
    let out = cp.kubectl(&["get", "configmap", TRUST, "-n", NS, "-o", "json"])?;
    if !out.status.success() {
        return Ok(BTreeMap::new());
    }
    let cm: Value = serde_json::from_slice(&out.stdout)?;
    Ok(cm["data"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect())
}

/// Wait until the bundle holds `n` CAs; each key is the unix second its CA was made, each
/// value one CA certificate.
pub fn bundle_of(cp: &ControlPlane, n: usize) -> Result<BTreeMap<String, String>> {
    let start = Instant::now();
    let mut data = BTreeMap::new();
    while start.elapsed() < STARTED_WITHIN {
        data = bundle(cp)?;
        if data.len() == n {
            for (key, pem) in &data {
                let made: u64 = key
                    .strip_suffix(".crt")
                    .and_then(|s| s.parse().ok())
                    .with_context(|| format!("bundle key {key} is not <unix seconds>.crt"))?;
                let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
                ensure!(
                    made <= now + 5 && made + 600 > now,
                    "bundle key {key}: made at {made}, now is {now}"
                );
                ensure!(
                    Trust::from_pem(pem)?.len() == 1,
                    "bundle key {key} holds more than one certificate"
                );
            }
            return Ok(data);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the trust bundle did not come to hold {n} CAs within {STARTED_WITHIN:?}: keys {:?}\noperator:\n{}",
        data.keys().collect::<Vec<_>>(),
        cp.log_tail("operator.log", 15)
    )
}

/// Dial the transfer port at `addr` as `me`, expecting node `expect` there; send a hello for
/// a shard no one granted; the sender's answer (or why there was none).
pub fn hello_at(addr: &str, me: &NodeIdentity, trust: &str, expect: &str) -> Result<String> {
    hello_for(
        addr,
        me,
        trust,
        expect,
        ("0b5e2c1e-0000-0000-0000-000000000000", 0, 1, [1; 32]),
    )
}

/// [`hello_at`] for `(job uid, shard, epoch, ticket)`: the refusal's reason, or `welcome`.
pub fn hello_for(
    addr: &str,
    me: &NodeIdentity,
    trust: &str,
    expect: &str,
    (job, shard, epoch, ticket): (&str, u32, u64, [u8; 32]),
) -> Result<String> {
    use ferry_transfer::frame::{Frame, VERSION};
    use ferry_transfer::stream::{read_frame, write_frame};
    let trust = Trust::from_pem(trust)?;
    let config = client_config(&trust, &me.cert_pem, &me.key_pem, expect)?;
    let tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let conn = rustls::ClientConnection::new(config, ferry_link::server_name())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let hello = Frame::Hello {
        version: VERSION,
        job: job.as_bytes().to_vec(),
        shard,
        epoch,
        ticket,
    };
    write_frame(&mut tls, &hello, &mut Vec::new())?;
    std::io::Write::flush(&mut tls)?;
    match read_frame(&mut tls, &mut Vec::new())? {
        Frame::Refused { reason } => Ok(reason),
        Frame::Welcome { .. } => Ok("welcome".into()),
        other => bail!("the transfer port answered {other:?}"),
    }
}

/// No API call of the operator was refused (a refusal it retries would fail no step).
pub fn nothing_forbidden(cp: &ControlPlane) -> Result<()> {
    let log = std::fs::read_to_string(cp.dir().join("operator.log"))?;
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    ensure!(
        refused.is_empty(),
        "the operator's API calls were refused:\n{}",
        refused.join("\n")
    );
    Ok(())
}
