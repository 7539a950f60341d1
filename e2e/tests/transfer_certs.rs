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

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use ferry_link::{client_config, server_config, Trust};
use serde_json::Value;

mod certs;
use certs::*;

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
    ensure!(
        reason.contains("no CopyJob with uid 0b5e2c1e-0000-0000-0000-000000000000"),
        "{reason}"
    );
    // A client that dialled node-b at node-a's port refuses the server.
    let wrong = hello_at(&addr, &b, &trust, "node-b");
    ensure!(wrong.is_err(), "node-a's port passed for node-b: {wrong:?}");
    Ok(())
}
