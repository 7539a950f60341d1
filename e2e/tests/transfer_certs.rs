//! The operator's signer of the agents' transfer certificates (`ferry.dev/transfer`), against
//! the real kube-apiserver with the chart's manifests and RBAC, the operator running on its
//! ServiceAccount's token: an agent's node-bound token gets a certificate for its own node,
//! which another node's agent accepts with the trust bundle the operator publishes; any other
//! request is denied, saying why; a restarted operator adds its new CA to the bundle beside
//! the old one and signs with the new one, while the old certificates still connect.
//!
//! Requests are made as an agent would: `NodeKey::generate` for the key and CSR, then a
//! CertificateSigningRequest created with the agent's token. A certificate is checked as a
//! peer checks it: by a TLS handshake (in memory) with `ferry_link`'s configurations.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use ferry_e2e::{ControlPlane, Proc};
use ferry_link::{client_config, server_config, NodeKey, Trust};
use serde_json::Value;

const NS: &str = "ferry-system";
const SIGNER: &str = "ferry.dev/transfer";
const TRUST: &str = "ferry-transfer-trust";
const AGENT: &str = "system:serviceaccount:ferry-system:ferry-agent";
/// How long a request may wait for its decision, and the bundle for a CA: the signer acts on
/// the watch event, so a decision takes well under a second on an idle machine.
const DECIDED_WITHIN: Duration = Duration::from_secs(20);
/// The operator's start (a build of the binary if stale, leadership, the bundle).
const STARTED_WITHIN: Duration = Duration::from_secs(60);

/// The operator on its ServiceAccount's token, logging to `operator.log` (appended to across
/// restarts).
fn start_operator(cp: &ControlPlane, kubeconfig: &Path) -> Result<Proc> {
    cp.spawn_operator(
        "operator",
        &[
            ("KUBECONFIG", &kubeconfig.to_string_lossy()),
            ("FERRY_NAMESPACE", NS),
            ("POD_NAME", "ferry-operator-0"),
        ],
    )
}

/// A control plane with the chart installed, Nodes `node-a` and `node-b`, and the operator
/// running; `None` when the binaries are not installed (outside CI).
fn cluster() -> Result<Option<(ControlPlane, Proc)>> {
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
fn agent(cp: &ControlPlane, node: &str) -> Result<std::path::PathBuf> {
    cp.service_account_kubeconfig(NS, "ferry-agent", Some(node))
}

/// A node's key and its certificate once issued.
struct NodeIdentity {
    cert_pem: String,
    key_pem: String,
}

/// What the signer decided on a request.
#[derive(Debug)]
enum Decision {
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
fn request(
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
fn decision(cp: &ControlPlane, name: &str) -> Result<Decision> {
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
fn issued(cp: &ControlPlane, name: &str, node: &str) -> Result<NodeIdentity> {
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
fn denied(cp: &ControlPlane, name: &str) -> Result<String> {
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
fn bundle(cp: &ControlPlane) -> Result<BTreeMap<String, String>> {
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
fn bundle_of(cp: &ControlPlane, n: usize) -> Result<BTreeMap<String, String>> {
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

/// A trust bundle of the CAs `pems`.
fn trust<'a>(pems: impl IntoIterator<Item = &'a String>) -> Result<Trust> {
    Ok(Trust::from_pem(
        &pems.into_iter().cloned().collect::<String>(),
    )?)
}

/// A TLS handshake in memory between `client` (trusting `client_trust`, dialling node
/// `expect`) and `server` (trusting `server_trust`), as two agents make it: the node the
/// server saw connect and the node the client reached.
fn handshake(
    client: &NodeIdentity,
    client_trust: &Trust,
    expect: &str,
    server: &NodeIdentity,
    server_trust: &Trust,
) -> Result<(String, String)> {
    let c = client_config(client_trust, &client.cert_pem, &client.key_pem, expect)?;
    let s = server_config(server_trust, &server.cert_pem, &server.key_pem)?;
    let mut c = rustls::Connection::Client(rustls::ClientConnection::new(
        Arc::clone(&c),
        ferry_link::server_name(),
    )?);
    let mut s = rustls::Connection::Server(rustls::ServerConnection::new(Arc::clone(&s))?);
    // TLS 1.3 with client certificates: three flights.
    for _ in 0..4 {
        if !c.is_handshaking() && !s.is_handshaking() {
            break;
        }
        pump(&mut c, &mut s).context("the server refused the client")?;
        pump(&mut s, &mut c).context("the client refused the server")?;
    }
    ensure!(
        !c.is_handshaking() && !s.is_handshaking(),
        "the handshake did not finish"
    );
    Ok((ferry_link::peer_node(&s)?, ferry_link::peer_node(&c)?))
}

/// Everything `from` has to send, read and processed by `to`.
fn pump(from: &mut rustls::Connection, to: &mut rustls::Connection) -> Result<()> {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire)?;
    }
    let mut rest = wire.as_slice();
    while !rest.is_empty() {
        to.read_tls(&mut rest)?;
        to.process_new_packets()?;
    }
    Ok(())
}

/// `result` is a handshake that `side` ended because the peer's certificate has no issuer
/// it trusts.
fn refused(result: Result<(String, String)>, side: &str) -> Result<()> {
    match result {
        Ok(peers) => bail!("the handshake succeeded: {peers:?}"),
        Err(e) => {
            let why = format!("{e:#}");
            ensure!(
                why.contains(side) && why.contains("UnknownIssuer"),
                "the handshake failed otherwise: {why}"
            );
            Ok(())
        }
    }
}

/// No API call of the operator was refused (a refusal it retries would fail no step).
fn nothing_forbidden(cp: &ControlPlane) -> Result<()> {
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

#[test]
fn agents_get_certificates_for_their_own_node_and_every_other_request_is_denied() -> Result<()> {
    let Some((cp, _operator)) = cluster()? else {
        return Ok(());
    };
    // The bundle: one CA, published by the operator at its start.
    let cas = bundle_of(&cp, 1)?;
    let all = trust(cas.values())?;

    // Each agent's token, bound to its node, gets a certificate for that node ...
    let a = issued(&cp, "node-a-transfer", "node-a")?;
    let b = issued(&cp, "node-b-transfer", "node-b")?;
    // ... with which the two agents connect, each verifying the other against the bundle.
    let (server_saw, client_reached) = handshake(&a, &all, "node-b", &b, &all)?;
    ensure!(
        server_saw == "node-a" && client_reached == "node-b",
        "node-a dialling node-b: the server saw {server_saw}, the client reached {client_reached}"
    );

    // node-a's token asking for node-b's name: denied, naming both.
    request(&cp, Some(&agent(&cp, "node-a")?), "node-a-as-b", "node-b")?;
    let why = denied(&cp, "node-a-as-b")?;
    ensure!(
        why.contains("bound to node node-a") && why.contains("node/node-b"),
        "node-a asking for node-b: {why}"
    );

    // The admin is no agent: denied, saying who may ask.
    request(&cp, None, "by-admin", "node-a")?;
    let why = denied(&cp, "by-admin")?;
    ensure!(
        why.contains("\"ferry-admin\"") && why.contains(AGENT),
        "the admin's request: {why}"
    );

    // The agents' ServiceAccount with a token bound to no node (not a pod's): denied.
    let unbound = cp.service_account_kubeconfig(NS, "ferry-agent", None)?;
    request(&cp, Some(&unbound), "unbound", "node-a")?;
    let why = denied(&cp, "unbound")?;
    ensure!(
        why.contains("bound to no node"),
        "the unbound token's request: {why}"
    );

    nothing_forbidden(&cp)
}

#[test]
fn a_restarted_operator_adds_its_ca_beside_the_old_one_and_signs_with_it_while_old_certificates_still_connect(
) -> Result<()> {
    let Some((cp, mut operator)) = cluster()? else {
        return Ok(());
    };
    let first = bundle_of(&cp, 1)?;
    let a = issued(&cp, "node-a-transfer", "node-a")?;

    // Killed (no chance to clean up) and started again: a new CA, in memory only; the old
    // one stays in the bundle.
    operator.kill()?;
    let operator_kc = cp.dir().join("ferry-operator.kubeconfig");
    let _operator = start_operator(&cp, &operator_kc)?;
    let both = bundle_of(&cp, 2)?;
    let (old_key, old_ca) = first.iter().next().context("the first bundle is empty")?;
    ensure!(
        both.get(old_key) == Some(old_ca),
        "the old CA left the bundle or changed: {:?}",
        both.keys().collect::<Vec<_>>()
    );
    let (new_key, new_ca) = both
        .iter()
        .find(|(k, _)| *k != old_key)
        .context("no new CA")?;
    ensure!(
        new_key.trim_end_matches(".crt").parse::<u64>()?
            > old_key.trim_end_matches(".crt").parse::<u64>()?,
        "the new CA's key {new_key} is not newer than {old_key}"
    );

    let b = issued(&cp, "node-b-after-restart", "node-b")?;
    let (all, old, new) = (trust(both.values())?, trust([old_ca])?, trust([new_ca])?);
    // node-b's new certificate is the new CA's: a client trusting only that CA accepts it,
    // one trusting only the old CA refuses it.
    let (_, reached) = handshake(&a, &new, "node-b", &b, &all)?;
    ensure!(reached == "node-b", "reached {reached}");
    refused(
        handshake(&a, &old, "node-b", &b, &all),
        "the client refused the server",
    )
    .context("node-b's new certificate against the old CA alone")?;
    // node-a's certificate from before the restart still connects, both ways, with the
    // bundle of both CAs, and would not with the new CA alone.
    let (saw, reached) = handshake(&a, &all, "node-b", &b, &all)?;
    ensure!(
        saw == "node-a" && reached == "node-b",
        "a→b: {saw} {reached}"
    );
    let (saw, reached) = handshake(&b, &all, "node-a", &a, &all)?;
    ensure!(
        saw == "node-b" && reached == "node-a",
        "b→a: {saw} {reached}"
    );
    refused(
        handshake(&a, &all, "node-b", &b, &new),
        "the server refused the client",
    )
    .context("node-a's old certificate against the new CA alone")?;

    nothing_forbidden(&cp)
}

/// Dial the transfer port at `addr` as `me`, expecting node `expect` there; send a hello for
/// a shard no one granted; the sender's answer (or why there was none).
fn hello_at(addr: &str, me: &NodeIdentity, trust: &str, expect: &str) -> Result<String> {
    use ferry_transfer::frame::{read_frame, write_frame, Frame, VERSION};
    let trust = Trust::from_pem(trust)?;
    let config = client_config(&trust, &me.cert_pem, &me.key_pem, expect)?;
    let tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let conn = rustls::ClientConnection::new(config, ferry_link::server_name())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let hello = Frame::Hello {
        version: VERSION,
        job: b"0b5e2c1e-0000-0000-0000-000000000000".to_vec(),
        shard: 0,
        epoch: 1,
        ticket: [1; 32],
    };
    write_frame(&mut tls, &hello, &mut Vec::new())?;
    std::io::Write::flush(&mut tls)?;
    match read_frame(&mut tls, &mut Vec::new())? {
        Frame::Refused { reason } => Ok(reason),
        other => bail!("the transfer port answered {other:?}"),
    }
}

#[test]
fn an_agent_with_a_transfer_port_gets_its_own_certificate_and_answers_only_this_installs_peers(
) -> Result<()> {
    let Some((cp, _operator)) = cluster()? else {
        return Ok(());
    };
    let addr = format!("127.0.0.2:{}", ferry_e2e::free_port()?);
    let kc = agent(&cp, "node-a")?;
    let _agent = cp.spawn_agent(
        "node-a",
        &[
            ("KUBECONFIG", &kc.to_string_lossy()),
            ("FERRY_TRANSFER_LISTEN", &addr),
        ],
    )?;
    // The agent's own request, made with its token: issued, for node-a.
    let start = Instant::now();
    let ours = loop {
        let all: Value = serde_json::from_str(&cp.kubectl_ok(&["get", "csr", "-o", "json"])?)?;
        let found = all["items"].as_array().into_iter().flatten().find(|c| {
            c["spec"]["username"] == AGENT
                && c["spec"]["signerName"] == SIGNER
                && !c["status"]["certificate"]
                    .as_str()
                    .unwrap_or_default()
                    .is_empty()
        });
        if let Some(c) = found {
            break c.clone();
        }
        ensure!(
            start.elapsed() < STARTED_WITHIN,
            "the agent's certificate was not issued: {}\nagent:\n{}",
            all["items"],
            cp.log_tail("agent-node-a.log", 15)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ours["status"]["certificate"].as_str().unwrap_or_default())?;
    ensure!(ferry_link::node_of_pem(std::str::from_utf8(&pem)?)? == "node-a");
    ensure!(
        ours["spec"]["extra"]["authentication.kubernetes.io/node-name"][0] == "node-a",
        "{}",
        ours["spec"]
    );

    // A peer of this install (node-b's identity, as node-b's agent gets it) reaches node-a's
    // transfer port over mutual TLS; the hello for a shard nobody granted is refused, with
    // the reason. (The agent may still be reading the bundle: it is given a few seconds.)
    let b = issued(&cp, "peer-b", "node-b")?;
    let trust: Vec<String> = bundle_of(&cp, 1)?.into_values().collect();
    let trust = trust.join("\n");
    let start = Instant::now();
    let reason = loop {
        match hello_at(&addr, &b, &trust, "node-a") {
            Ok(r) => break r,
            Err(e) if start.elapsed() < DECIDED_WITHIN => {
                eprintln!("not yet: {e:#}");
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => return Err(e.context(cp.log_tail("agent-node-a.log", 15))),
        }
    };
    ensure!(reason.contains("no grant"), "{reason}");
    // A client that dialled node-b at node-a's port refuses the server.
    let wrong = hello_at(&addr, &b, &trust, "node-b");
    ensure!(wrong.is_err(), "node-a's port passed for node-b: {wrong:?}");
    Ok(())
}
