//! Peering between two installs, each on its own control plane (etcd + kube-apiserver),
//! the chart rendered with `peering.enabled=true` and its operator on the chart's
//! ServiceAccount token: each install makes its peering CA once (kept across a restart) and
//! publishes its name, CA certificate and a FerryPeer for the other side; each admin applies
//! the other's FerryPeer as it is published and its status says Valid with the fingerprint the
//! other side published; a second FerryPeer for one install, a bundle that is not a CA and a
//! bad install name are each refused with what to change; the operator may read the peering
//! CA's Secret and no other, the agents not even that one. Then a tenant's CopyExport on
//! east (peering/exports.rs).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{wait_for, ControlPlane, CHART_NAMESPACE};

#[path = "peering/exports.rs"]
mod exports;

use ferry_e2e::peering::{install, published, spawn_operator, valid, WITHIN};

fn can_i(cp: &ControlPlane, sa: &str, args: &[&str]) -> Result<bool> {
    let who = format!("system:serviceaccount:{CHART_NAMESPACE}:{sa}");
    let mut all = vec!["auth", "can-i", "--as", &who];
    all.extend(args);
    let out = cp.kubectl(&all)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
}

#[test]
fn two_installs_pair_by_applying_what_each_publishes_and_bad_peers_are_refused() -> Result<()> {
    let Some(helm) = ferry_e2e::helm_or_skip()? else {
        return Ok(());
    };
    // East names itself by default (its namespace and random digits), west by the chart value.
    let Some(east) = install(&helm, None)? else {
        return Ok(());
    };
    let Some(west) = install(&helm, Some("west"))? else {
        return Ok(());
    };
    let (a, b) = (&east.cp, &west.cp);
    let east_name = published(a, "install")?;
    ensure!(
        east_name.starts_with("ferry-system-") && east_name.len() == "ferry-system-".len() + 8,
        "east's made name: {east_name}"
    );
    ensure!(published(b, "install")? == "west");
    let east_fingerprint = published(a, "fingerprint")?;
    let west_fingerprint = published(b, "fingerprint")?;
    ensure!(east_fingerprint != west_fingerprint);

    // Each admin applies what the other publishes, as it is.
    b.apply(&published(a, "ferrypeer.yaml")?)?;
    a.apply(&published(b, "ferrypeer.yaml")?)?;
    let on_b = valid(b, &east_name)?;
    ensure!(on_b.starts_with("Valid True"), "east on west: {on_b}");
    let on_a = valid(a, "west")?;
    ensure!(on_a.starts_with("Valid True"), "west on east: {on_a}");
    ensure!(
        b.get(
            &format!("ferrypeer/{east_name}"),
            "",
            "{.status.certificates[0].fingerprint}"
        )? == east_fingerprint,
        "west's FerryPeer for east lists another fingerprint than east publishes"
    );
    let columns = a.kubectl_ok(&["get", "ferrypeers"])?;
    ensure!(
        columns.contains("INSTALL") && columns.contains("west") && columns.contains("True"),
        "{columns}"
    );

    // The CA is made once: a restarted operator keeps it (peers trust it by hand).
    let mut east = east;
    drop(east.operator.take());
    east.operator = Some(spawn_operator(&east.cp, None)?);
    let a = &east.cp;
    wait_for("the restarted operator's FerryPeer watch", WITHIN, || {
        a.log_tail("operator.log", 200)
            .matches("this install's CA is ready")
            .count()
            >= 2
    })?;
    ensure!(published(a, "fingerprint")? == east_fingerprint);
    ensure!(published(a, "install")? == east_name);

    // Refusals, each saying what to change.
    b.apply(
        &published(a, "ferrypeer.yaml")?
            .replace(&format!("name: {east_name}\n"), "name: east-again\n"),
    )?;
    let again = valid(b, "east-again")?;
    ensure!(
        again.starts_with("DuplicatePeer False")
            && again.contains(&format!("FerryPeer {east_name} already names")),
        "{again}"
    );
    ensure!(valid(b, &east_name)?.starts_with("Valid True"));
    let not_a_ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let bad = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "FerryPeer",
        "metadata": {"name": "garbled"},
        "spec": {"install": "south", "caBundle": not_a_ca},
    });
    a.apply(&bad.to_string())?;
    let garbled = valid(a, "garbled")?;
    ensure!(
        garbled.starts_with("InvalidBundle False")
            && garbled.contains("ca.crt key of its ferry-peering ConfigMap"),
        "{garbled}"
    );
    let refused = a.kubectl_stdin(
        &["apply", "-f", "-"],
        &bad.to_string().replace("\"south\"", "\"South_Pole\""),
    )?;
    ensure!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("install is a DNS label"),
        "a bad install name: {refused:?}"
    );

    let reader = agents_serve_the_peering_port_to_trusted_peers_only(a, &east_name, b)?;
    exports::a_tenants_export_is_served_by_a_secret_only_its_status_hash_names(a, &reader)?;
    exports::the_peering_port_serves_an_export_to_its_reader_only(a, b, &reader)?;
    exports::a_csi_claims_export_is_served_where_its_holder_mounts_it(a, &reader)?;

    // Who may read the peering CA: the operator, that Secret only; the agents, nothing.
    for cp in [a, b] {
        ensure!(can_i(
            cp,
            "ferry-operator",
            &["get", "secret/ferry-peering-ca", "-n", CHART_NAMESPACE]
        )?);
        ensure!(!can_i(
            cp,
            "ferry-operator",
            &["get", "secret/other", "-n", CHART_NAMESPACE]
        )?);
        ensure!(!can_i(
            cp,
            "ferry-operator",
            &["list", "secrets", "-n", CHART_NAMESPACE]
        )?);
        ensure!(!can_i(
            cp,
            "ferry-agent",
            &["get", "secret/ferry-peering-ca", "-n", CHART_NAMESPACE]
        )?);
        ensure!(!can_i(cp, "ferry-operator", &["create", "ferrypeers"])?);
    }
    Ok(())
}

/// East's agent (on its chart token, bound to its Node) gets a peering certificate naming
/// east and its node; its peering port lets in an agent of west (a certificate of west's
/// CA, which a FerryPeer on east trusts) and tells it that no export is served, and gives a
/// plain TCP client, an impostor of west (another CA) and an install no FerryPeer names
/// nothing but a failed handshake.
/// A reader of west on east's peering port: east-1's agent, its address and host root, a
/// west agent's peering certificate and key, and east's install name and CA.
struct Reader {
    _agent: ferry_e2e::Proc,
    listen: String,
    root: PathBuf,
    west: (String, String),
    east_name: String,
    east_ca: String,
}

fn agents_serve_the_peering_port_to_trusted_peers_only(
    east: &ControlPlane,
    east_name: &str,
    west: &ControlPlane,
) -> Result<Reader> {
    use ferry_link::{Ca, NodeKey};
    let root = east.add_node("east-1")?;
    let port = ferry_e2e::free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let agent = east.spawn_chart_agent(
        "east-1",
        &ferry_e2e::transfer_ip(0),
        &[("FERRY_PEERING_LISTEN", &listen)],
    )?;
    // Its certificate, issued by east's peering signer for the node its token is bound to.
    let mut cert = String::new();
    wait_for("east-1's peering certificate", WITHIN, || {
        cert = east
            .get(
                "csr",
                "",
                "{range .items[?(@.spec.signerName==\"ferry.dev/peering\")]}{.status.certificate}{end}",
            )
            .unwrap_or_default();
        !cert.is_empty()
    })
    .with_context(|| east.log_tail("agent-east-1.log", 20))?;
    let pem = String::from_utf8(base64_decode(&cert)?)?;
    let id = ferry_link::peer_of_pem(&pem)?;
    ensure!(
        (id.install.as_str(), id.node.as_str()) == (east_name, "east-1"),
        "{id:?}"
    );
    wait_for("east-1's peering port trusting west", WITHIN, || {
        east.log_tail("agent-east-1.log", 200)
            .contains("the installs whose agents may connect installs=[\"west\"]")
    })
    .with_context(|| east.log_tail("agent-east-1.log", 20))?;
    let east_ca = published(east, "ca.crt")?;

    // West's real CA (its admin's Secret) signs for a west node: let in, told no export.
    let secret = |key: &str| -> Result<String> {
        let v = west.get(
            "secret/ferry-peering-ca",
            CHART_NAMESPACE,
            &format!("{{.data.{}}}", key.replace('.', "\\.")),
        )?;
        Ok(String::from_utf8(base64_decode(&v)?)?)
    };
    let west_ca = Ca::from_pem(&secret("tls.crt")?, &secret("tls.key")?)?;
    let peer = |ca: &Ca, install: &str| -> Result<(String, String)> {
        let key = NodeKey::generate("west-1")?;
        let cert = ca.sign_peer(&key.csr_pem, install, "west-1", Duration::from_secs(3600))?;
        Ok((cert, key.key_pem))
    };
    let west_agent = peer(&west_ca, "west")?;
    let answer = hello(&listen, &west_agent, &east_ca, east_name)?;
    ensure!(
        answer.starts_with("ExportNotFound: no export with uid"),
        "a trusted peer was told: {answer}"
    );

    // Nothing for the others.
    let impostor = Ca::generate("Ferry peering CA west")?;
    for (who, identity) in [
        ("an impostor of west", peer(&impostor, "west")?),
        ("an install no FerryPeer names", peer(&west_ca, "north")?),
    ] {
        let got = hello(&listen, &identity, &east_ca, east_name);
        ensure!(got.is_err(), "{who} got an answer: {got:?}");
    }
    let mut tcp = std::net::TcpStream::connect(&listen)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    std::io::Write::write_all(&mut tcp, b"GET / HTTP/1.0\r\n\r\n")?;
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut tcp, &mut got);
    // At most a TLS alert record (content type 21), never a frame or any text.
    ensure!(
        got.is_empty() || got[0] == 21,
        "a plain TCP client got {} bytes: {:?}",
        got.len(),
        String::from_utf8_lossy(&got)
    );
    Ok(Reader {
        _agent: agent,
        listen,
        root,
        west: west_agent,
        east_name: east_name.to_string(),
        east_ca,
    })
}

/// A TLS connection to the peering port at `addr` as the agent `(cert, key)` of another
/// install, trusting the export's CA `ca_pem` and expecting install `expect`.
fn connect(
    addr: &str,
    (cert, key): &(String, String),
    ca_pem: &str,
    expect: &str,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
    let config = ferry_link::peering_client_config(ca_pem, expect, cert, key)?;
    let tcp = std::net::TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let conn = rustls::ClientConnection::new(config, ferry_link::server_name())?;
    Ok(rustls::StreamOwned::new(conn, tcp))
}

/// An export hello for an export no install has, on [`connect`]'s connection: the refusal.
fn hello(addr: &str, identity: &(String, String), ca_pem: &str, expect: &str) -> Result<String> {
    use ferry_transfer::frame::{Frame, VERSION};
    let mut tls = connect(addr, identity, ca_pem, expect)?;
    let frame = Frame::ExportHello(ferry_transfer::ExportHello {
        version: VERSION,
        export: b"00000000-0000-4000-8000-000000000000".to_vec(),
        credential: [7; 32],
        job: b"a job".to_vec(),
        namespace: b"shop-dr".to_vec(),
        shard: 0,
        epoch: 1,
        path: Vec::new(),
        bandwidth_limit: 0,
    });
    match exports::ask(&mut tls, &frame)? {
        Frame::Refused { reason } => Ok(reason),
        other => anyhow::bail!("the peering port answered {other:?}"),
    }
}

fn base64_decode(text: &str) -> Result<Vec<u8>> {
    use base64::Engine;
    Ok(base64::engine::general_purpose::STANDARD.decode(text.trim())?)
}
