//! A tenant's CopyExport on a paired install, with the real operator on the chart's token
//! and the chart's `-exports` policy in force: it is Ready, and the operator wrote the
//! export Secret beside it (type `ferry.dev/export`, its five keys, this install's name and
//! peering CA) whose credential only the status's SHA-256 names; a rotation writes a new
//! credential and keeps the previous one's hash until its grace ends; an unknown reader, a
//! time beyond the install's longest and a missing source are each refused with what to
//! change; a namespace's editors may write exports but not their status. Then east-1's
//! agent serves the export on its peering port to west's agent holding the credential, and
//! to no one else, and the engine's copy over it (the reader's half, `dial_export` and
//! `copy_from`) brings the export's tree across identical, verified by checksum; deleting
//! the export cuts the reader it serves within seconds.

use std::io::Write;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{wait_for, ControlPlane, CHART_NAMESPACE};
use ferry_transfer::frame::{Frame, VERSION};
use ferry_transfer::stream::{read_frame, write_frame};
use ferry_transfer::ExportHello;

use super::{base64_decode, can_i, WITHIN};

const NS: &str = "shop";

/// Export `name`'s Ready condition as `reason status message`, once it is about the
/// current generation.
fn ready(cp: &ControlPlane, name: &str) -> Result<String> {
    let obj = format!("copyexport/{name}");
    let mut seen = String::new();
    wait_for(&format!("CopyExport {name}'s status"), WITHIN, || {
        let generation = cp.get(&obj, NS, "{.metadata.generation}");
        let observed = cp.get(&obj, NS, "{.status.observedGeneration}");
        let cond = "{.status.conditions[?(@.type==\"Ready\")]";
        seen = cp
            .get(
                &obj,
                NS,
                &format!("{cond}.reason}} {cond}.status}} {cond}.message}}"),
            )
            .unwrap_or_default();
        matches!((generation, observed), (Ok(g), Ok(o)) if g == o) && !seen.trim().is_empty()
    })
    .with_context(|| format!("{seen}\n{}", cp.log_tail("operator.log", 20)))?;
    Ok(seen)
}

fn export(name: &str, source: &str, peer: &str, ttl: &str) -> String {
    format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyExport\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  source: {source}\n  readers: [{{peer: {peer}, namespace: shop-dr}}]\n  ttl: {ttl}\n"
    )
}

/// The Secret's key `key`, decoded.
fn secret_key(cp: &ControlPlane, secret: &str, key: &str) -> Result<Vec<u8>> {
    let path = format!("{{.data.{}}}", key.replace('.', "\\."));
    base64_decode(&cp.get(&format!("secret/{secret}"), NS, &path)?)
}

/// The Secret's credential: 32 bytes.
fn credential(cp: &ControlPlane, secret: &str) -> Result<[u8; 32]> {
    let c = secret_key(cp, secret, "credential")?;
    c.try_into()
        .map_err(|c: Vec<u8>| anyhow::anyhow!("a credential of {} bytes", c.len()))
}

/// The hashes the status lists, current first.
fn hashes(cp: &ControlPlane) -> Result<Vec<String>> {
    Ok(cp
        .get("copyexport/db", NS, "{.status.credentials[*].sha256}")?
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// On `east` (paired with west, whose FerryPeer there is `west`): the export's life.
pub fn a_tenants_export_is_served_by_a_secret_only_its_status_hash_names(
    east: &ControlPlane,
    reader: &super::Reader,
) -> Result<()> {
    let east_name = reader.east_name.as_str();
    east.kubectl_ok(&["create", "namespace", NS])?;
    east.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: shared\nspec:\n  path: /srv/shared\n  shared: true\n  namespaces: {{names: [{NS}]}}\n"
    ))?;
    east.apply(&export("db", "{root: shared, path: db}", "west", "24h"))?;
    let r = ready(east, "db")?;
    ensure!(
        r.starts_with("Ready True") && r.contains("db-ferry-export"),
        "{r}"
    );

    // The Secret: the operator's, as the -exports policy admits it.
    let secret = "db-ferry-export";
    let shape = east.get(
        &format!("secret/{secret}"),
        NS,
        "{.type} {.metadata.ownerReferences[0].kind} {.metadata.ownerReferences[0].name}",
    )?;
    ensure!(shape == "ferry.dev/export CopyExport db", "{shape}");
    let keys = east.get(&format!("secret/{secret}"), NS, "{.data}")?;
    for key in ferry_crds::EXPORT_SECRET_KEYS {
        ensure!(keys.contains(&format!("\"{key}\"")), "{key} not in {keys}");
    }
    let uid = east.get("copyexport/db", NS, "{.metadata.uid}")?;
    ensure!(secret_key(east, secret, "export")? == uid.as_bytes());
    ensure!(secret_key(east, secret, "install")? == east_name.as_bytes());
    // Where readers dial: east-1's peering port, as its agent advertises it.
    ensure!(
        secret_key(east, secret, "address")? == reader.listen.as_bytes(),
        "the Secret's address is not east-1's peering port {}",
        reader.listen
    );
    ensure!(
        east.get("copyexport/db", NS, "{.status.address} {.status.node}")?
            == format!("{} east-1", reader.listen)
    );
    let ca = east.get(
        "configmap/ferry-peering",
        CHART_NAMESPACE,
        "{.data.ca\\.crt}",
    )?;
    ensure!(String::from_utf8(secret_key(east, secret, "ca.crt")?)?.trim() == ca.trim());
    let first = credential(east, secret)?;
    ensure!(
        hashes(east)? == [ferry_link::credential_hash(&first)],
        "the status names another credential than the Secret holds: {:?}",
        hashes(east)?
    );

    // The operator wrote it and cannot read it back, nor any Secret of the namespace.
    let secret_ref = format!("secret/{secret}");
    ensure!(can_i(
        east,
        "ferry-operator",
        &["patch", &secret_ref, "-n", NS]
    )?);
    for verb in ["get", "list", "watch", "delete"] {
        ensure!(
            !can_i(east, "ferry-operator", &[verb, &secret_ref, "-n", NS])?,
            "the operator may {verb} {secret_ref}"
        );
    }

    // A rotation: a new credential in the Secret, the old one's hash kept for the grace.
    east.kubectl_ok(&ferry_e2e::merge_patch(
        "copyexport/db",
        NS,
        false,
        "{\"spec\":{\"rotate\":1}}",
    ))?;
    ensure!(ready(east, "db")?.starts_with("Ready True"));
    let second = credential(east, secret)?;
    ensure!(second != first, "the Secret kept its credential");
    ensure!(
        hashes(east)?
            == [
                ferry_link::credential_hash(&second),
                ferry_link::credential_hash(&first)
            ],
        "{:?}",
        hashes(east)?
    );
    let until = east.get("copyexport/db", NS, "{.status.credentials[1].until}")?;
    ensure!(!until.is_empty(), "the previous credential has no end");

    // Refusals, each saying what to change.
    east.apply(&export("nobody", "{root: shared}", "north", "24h"))?;
    let r = ready(east, "nobody")?;
    ensure!(
        r.starts_with("PeerNotTrusted False") && r.contains("no FerryPeer \"north\""),
        "{r}"
    );
    east.apply(&export("forever", "{root: shared}", "west", "9999h"))?;
    let r = ready(east, "forever")?;
    ensure!(
        r.starts_with("TooLong False") && r.contains("peering.maxExportTtl"),
        "{r}"
    );
    east.apply(&export("nothing", "{pvc: missing}", "west", "1h"))?;
    let r = ready(east, "nothing")?;
    ensure!(
        r.starts_with("SourceNotFound False") && r.contains("\"missing\""),
        "{r}"
    );
    for refused in ["nobody", "forever", "nothing"] {
        let out = east.kubectl(&[
            "get",
            "secret",
            &format!("{refused}-ferry-export"),
            "-n",
            NS,
        ])?;
        ensure!(!out.status.success(), "{refused} got a Secret");
    }

    // A namespace's editors (the chart's aggregated role) write exports, not their status.
    east.kubectl_ok(&["create", "serviceaccount", "tenant", "-n", NS])?;
    east.kubectl_ok(&[
        "create",
        "rolebinding",
        "tenant",
        "-n",
        NS,
        "--clusterrole=ferry-copyjobs-edit",
        &format!("--serviceaccount={NS}:tenant"),
    ])?;
    let can = |args: &[&str]| -> Result<bool> {
        let who = format!("system:serviceaccount:{NS}:tenant");
        let mut all = vec!["auth", "can-i", "-n", NS, "--as", &who];
        all.extend(args);
        Ok(String::from_utf8_lossy(&east.kubectl(&all)?.stdout).trim() == "yes")
    };
    ensure!(can(&["create", "copyexports"])?);
    ensure!(can(&["patch", "copyexports/db"])?);
    ensure!(!can(&["patch", "copyexports/db", "--subresource=status"])?);
    Ok(())
}

/// Send `frame` on `tls` and read the answer.
pub fn ask<S: std::io::Read + std::io::Write>(tls: &mut S, frame: &Frame) -> Result<Frame> {
    write_frame(tls, frame, &mut Vec::new())?;
    tls.flush()?;
    Ok(read_frame(tls, &mut Vec::new())?)
}

/// East-1's agent (its peering port at `reader.listen`) serves export `db` (a root's `db`
/// directory, in `reader.root`) to west's agent with the Secret's credential for a job of
/// `shop-dr`: its tree beneath the export's path, the sub-path asked for; and refuses a
/// credential not the export's, a namespace not a reader, a second job while the first
/// holds the only slot, and, once deleted, the export itself.
pub fn the_peering_port_serves_an_export_to_its_reader_only(
    east: &ControlPlane,
    west: &ControlPlane,
    reader: &super::Reader,
) -> Result<()> {
    let data = reader.root.join("srv/shared/db");
    std::fs::create_dir_all(data.join("2026"))?;
    std::fs::write(data.join("orders.csv"), b"id,total\n1,20\n")?;
    std::fs::write(data.join("2026/jan.csv"), b"id\n7\n")?;
    fidelity_tree(&data)?;
    // Beside the export, never served.
    std::fs::write(reader.root.join("srv/shared/secret.txt"), b"not exported")?;
    let uid = east.get("copyexport/db", NS, "{.metadata.uid}")?;
    let credential = credential(east, "db-ferry-export")?;
    let hello = |credential: [u8; 32], job: &str, namespace: &str, path: &str| {
        Frame::ExportHello(ExportHello {
            version: VERSION,
            export: uid.as_bytes().to_vec(),
            credential,
            job: job.as_bytes().to_vec(),
            namespace: namespace.as_bytes().to_vec(),
            shard: 0,
            epoch: 1,
            path: path.as_bytes().to_vec(),
            bandwidth_limit: 0,
        })
    };
    let open = || {
        super::connect(
            &reader.listen,
            &reader.west,
            &reader.east_ca,
            &reader.east_name,
        )
    };
    let refused = |frame: &Frame| -> Result<String> {
        match ask(&mut open()?, frame)? {
            Frame::Refused { reason } => Ok(reason),
            other => anyhow::bail!("answered {other:?}"),
        }
    };

    // The reader: welcome, then the export's tree, not what is beside it.
    let mut first = open()?;
    let welcome = ask(&mut first, &hello(credential, "job-1", "shop-dr", ""))?;
    ensure!(matches!(welcome, Frame::Welcome { .. }), "{welcome:?}");
    let Frame::Entry { entry: top, .. } = ask(
        &mut first,
        &Frame::Stat {
            req: 1,
            path: Vec::new(),
        },
    )?
    else {
        anyhow::bail!("no entry for the export's top");
    };
    let list = Frame::List {
        req: 2,
        path: Vec::new(),
        ino: top.ino,
        inline: true,
        hash: false,
        attrs: true,
    };
    let Frame::Listing {
        entries, inline, ..
    } = ask(&mut first, &list)?
    else {
        anyhow::bail!("no listing of the export's top");
    };
    let names: Vec<String> = entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    ensure!(
        names.contains(&"orders.csv".into())
            && names.contains(&"2026".into())
            && !names.iter().any(|n| n.contains("secret")),
        "{names:?}"
    );
    ensure!(
        inline.iter().any(|i| &i.data[..] == b"id,total\n1,20\n"),
        "the file's bytes: {inline:?}"
    );
    // While job-1 holds the only slot, job-2 gets nothing.
    let second = refused(&hello(credential, "job-2", "shop-dr", ""))?;
    ensure!(second.starts_with("InUse:"), "{second}");
    // A path out of the export, sent as raw bytes (the encoder refuses to write it): the
    // sender answers no entry, and the connection ends.
    let path = b"../secret.txt";
    let mut raw = vec![4u8];
    raw.extend_from_slice(&((4 + 4 + path.len()) as u32).to_le_bytes());
    raw.extend_from_slice(&3u32.to_le_bytes());
    raw.extend_from_slice(&(path.len() as u32).to_le_bytes());
    raw.extend_from_slice(path);
    first.write_all(&raw)?;
    first.flush()?;
    let beside = read_frame(&mut first, &mut Vec::new());
    ensure!(
        !matches!(beside, Ok(Frame::Entry { .. })),
        "a path beyond the export: {beside:?}"
    );
    drop(first);
    // A sub-path of the export, for a job once the slot is free.
    let mut sub = None;
    wait_for("the reader slot freed", WITHIN, || {
        sub = open().ok().and_then(|mut c| {
            matches!(
                ask(&mut c, &hello(credential, "job-2", "shop-dr", "2026")),
                Ok(Frame::Welcome { .. })
            )
            .then_some(c)
        });
        sub.is_some()
    })?;
    let mut sub = sub.context("a connection")?;
    let Frame::Entry { entry: top, .. } = ask(
        &mut sub,
        &Frame::Stat {
            req: 1,
            path: Vec::new(),
        },
    )?
    else {
        anyhow::bail!("no entry for the sub-path");
    };
    let Frame::Listing { entries, .. } = ask(
        &mut sub,
        &Frame::List {
            req: 2,
            path: Vec::new(),
            ino: top.ino,
            inline: false,
            hash: false,
            attrs: true,
        },
    )?
    else {
        anyhow::bail!("no listing of the sub-path");
    };
    let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
    ensure!(
        names.contains(&&b"jan.csv"[..])
            && names.contains(&&b"q1"[..])
            && !names.contains(&&b"orders.csv"[..]),
        "the sub-path lists {entries:?}"
    );
    drop(sub);

    // The engine's copy over it, as a reader's job will run it: the export's tree,
    // identical (owners, modes, times, links, holes), verified by checksum end to end.
    let copied = tempfile::tempdir()?;
    let copy_hello = ExportHello {
        version: VERSION,
        export: uid.as_bytes().to_vec(),
        credential,
        job: b"job-5".to_vec(),
        namespace: b"shop-dr".to_vec(),
        shard: 0,
        epoch: 1,
        path: Vec::new(),
        bandwidth_limit: 0,
    };
    let summary = copy_over(reader, &copy_hello, &copied.path().join("db"))?;
    ferry_e2e::assert_same_tree(&data, &copied.path().join("db"))?;
    ensure!(
        (
            summary.files,
            summary.hardlinks,
            summary.symlinks,
            summary.verified
        ) == (6, 1, 1, 6),
        "{summary:?}"
    );

    a_copyjob_in_the_reading_cluster_copies_the_export(east, west, &data)?;

    // Refusals, each with its reason.
    let mut guess = credential;
    guess[0] ^= 1;
    let r = refused(&hello(guess, "job-3", "shop-dr", ""))?;
    ensure!(r.starts_with("BadCredential:"), "{r}");
    let r = refused(&hello(credential, "job-3", "elsewhere", ""))?;
    ensure!(r.starts_with("NotAReader:"), "{r}");

    // A reader being served when the export is deleted is cut within seconds (its socket
    // read times out only after 10 s).
    let mut held = None;
    wait_for("a reader slot", WITHIN, || {
        held = open().ok().and_then(|mut c| {
            matches!(
                ask(&mut c, &hello(credential, "job-4", "shop-dr", "")),
                Ok(Frame::Welcome { .. })
            )
            .then_some(c)
        });
        held.is_some()
    })?;
    let mut held = held.context("a connection")?;
    let deleted = std::time::Instant::now();
    east.kubectl_ok(&["delete", "copyexport", "db", "-n", NS, "--wait=false"])?;
    let after = read_frame(&mut held, &mut Vec::new());
    let took = deleted.elapsed();
    let timed_out = matches!(&after, Err(e) if e.to_string().contains("timed out") || e.to_string().contains("temporarily unavailable"));
    ensure!(
        after.is_err() && !timed_out && took < std::time::Duration::from_secs(8),
        "the served reader after the deletion, {took:?} later: {after:?}"
    );
    let mut gone = String::new();
    wait_for("the deleted export refused", WITHIN, || {
        gone = refused(&hello(credential, "job-3", "shop-dr", "")).unwrap_or_default();
        gone.starts_with("ExportNotFound:")
    })
    .with_context(|| gone.clone())?;
    Ok(())
}

/// The engine's copy over west's reader connection to east-1's peering port, as a reader's
/// job runs it, verified by checksum end to end, into `into`: dialled until it is let in
/// (a reader slot freed, or east-1's agent's watch caught up with the export).
fn copy_over(
    reader: &super::Reader,
    hello: &ExportHello,
    into: &std::path::Path,
) -> Result<ferry_engine::Summary> {
    let config = ferry_link::peering_client_config(
        &reader.east_ca,
        &reader.east_name,
        &reader.west.0,
        &reader.west.1,
    )?;
    let runtime = tokio::runtime::Runtime::new()?;
    let addr: std::net::SocketAddr = reader.listen.parse()?;
    let (mut conn, mut why) = (None, String::new());
    wait_for("the export let in for the copy", WITHIN, || {
        match runtime.block_on(ferry_agent::transfer::dial_export(
            addr,
            config.clone(),
            hello,
        )) {
            Ok(c) => conn = Some(c),
            Err(e) => why = e.to_string(),
        }
        conn.is_some()
    })
    .with_context(|| why.clone())?;
    let conn = conn.context("a connection")?;
    let options = ferry_engine::Options {
        verify: ferry_crds::Verify::Checksum,
        ..ferry_engine::Options::default()
    };
    let name = into.file_name().map(std::path::Path::new).unwrap_or(into);
    ferry_engine::copy_from(&conn, name, into, &options, &ferry_engine::NoProgress)
        .map_err(|e| anyhow::anyhow!("copying the export: {e}"))
}

/// What a copy must keep beside the two CSVs: a deep directory, a symlink, a hard link, a
/// sparse file, an empty file, a file larger than a listing's inline bytes, odd modes.
fn fidelity_tree(data: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let deep = data.join("2026/q1/a/b/c");
    std::fs::create_dir_all(&deep)?;
    std::fs::write(deep.join("leaf"), b"deep")?;
    std::os::unix::fs::symlink("../orders.csv", data.join("2026/latest"))?;
    std::fs::hard_link(data.join("orders.csv"), data.join("orders-link.csv"))?;
    let sparse = std::fs::File::create(data.join("sparse.img"))?;
    sparse.set_len(16 << 20)?;
    std::os::unix::fs::FileExt::write_at(&sparse, b"middle", 8 << 20)?;
    std::fs::write(data.join("empty"), b"")?;
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(data.join("big.bin"), big)?;
    std::fs::set_permissions(data.join("big.bin"), std::fs::Permissions::from_mode(0o640))?;
    std::fs::set_permissions(deep.join("leaf"), std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// In west, a tenant's CopyJob reads east's export `db` into a root of its own: refused
/// until the Secret is carried over and the namespace lets the operator read it (each
/// refusal saying what to do), then copied identical by west's agent from east's.
fn a_copyjob_in_the_reading_cluster_copies_the_export(
    east: &ControlPlane,
    west: &ControlPlane,
    data: &std::path::Path,
) -> Result<()> {
    let ns = "shop-dr";
    let root = west.add_node("west-1")?;
    std::fs::create_dir_all(root.join("srv/dr"))?;
    let port = ferry_e2e::free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let _agent = west.spawn_chart_agent(
        "west-1",
        &ferry_e2e::transfer_ip(1),
        &[("FERRY_PEERING_LISTEN", &listen)],
    )?;
    west.kubectl_ok(&["create", "namespace", ns])?;
    west.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: dr\nspec:\n  path: /srv/dr\n  shared: true\n  namespaces: {{names: [{ns}]}}\n"
    ))?;
    west.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-east\n  namespace: {ns}\nspec:\n  source: {{export: db-ferry-export}}\n  destination: {{root: dr, path: db}}\n  verify: Checksum\n"
    ))?;
    let resolved = |want: &str| -> Result<String> {
        let mut seen = String::new();
        wait_for(&format!("the job's Resolved condition {want}"), WITHIN, || {
            seen = west
                .get(
                    "copyjob/from-east",
                    ns,
                    "{.status.conditions[?(@.type==\"Resolved\")].reason} {.status.conditions[?(@.type==\"Resolved\")].message}",
                )
                .unwrap_or_default();
            seen.starts_with(want)
        })
        .with_context(|| format!("{seen}\n{}", west.log_tail("operator.log", 20)))?;
        Ok(seen)
    };
    // The operator may not read the namespace's Secrets: the refusal gives the commands,
    // which the tenant runs.
    let r = resolved("ExportNotFound")?;
    ensure!(
        r.contains("kubectl -n shop-dr create role ferry-reads-db-ferry-export"),
        "{r}"
    );
    ferry_e2e::peering::let_the_operator_read(west, ns, "db-ferry-export")?;
    // Now it may, and the Secret is not there yet.
    let mut r = String::new();
    wait_for("the Secret missing", WITHIN, || {
        r = resolved("ExportNotFound").unwrap_or_default();
        r.contains("no Secret \"db-ferry-export\"")
    })
    .with_context(|| r.clone())?;
    // Carried over as the tenant would (its data and type; nothing of east's metadata).
    let secret = ferry_e2e::peering::carried_secret(east, NS, "db-ferry-export", ns)?;
    // First with an address nothing answers on (an export that moved, a firewall): the
    // job says what it waits for, and keeps waiting.
    let nowhere = format!("127.0.0.1:{}", ferry_e2e::free_port()?);
    let mut stale = secret.clone();
    stale["data"][ferry_crds::EXPORT_ADDRESS_KEY] = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .encode(nowhere.as_bytes())
            .into()
    };
    west.apply(&stale.to_string())?;
    let mut seen = String::new();
    wait_for("the job's Scheduled condition PeerUnreachable", WITHIN, || {
        seen = west
            .get(
                "copyjob/from-east",
                ns,
                "{.status.conditions[?(@.type==\"Scheduled\")].reason} {.status.conditions[?(@.type==\"Scheduled\")].message}",
            )
            .unwrap_or_default();
        seen.starts_with("PeerUnreachable shard 0: node west-1 cannot reach")
            && seen.contains(&nowhere)
    })
    .with_context(|| {
        format!(
            "{seen}\n{}\n{}",
            west.log_tail("operator.log", 20),
            west.log_tail("agent-west-1.log", 30)
        )
    })?;
    // Carried again as it is: the operator writes it into the job's ticket, and the
    // waiting agent dials the export where it is.
    west.apply(&secret.to_string())?;
    west.wait_succeeded(ns, "from-east", 120)?;
    ferry_e2e::assert_same_tree(data, &root.join("srv/dr/db"))?;
    let mode = west.get("copyjob/from-east", ns, "{.status.shards[0].sender}")?;
    ensure!(
        mode == ferry_crds::EXPORT_SENDER,
        "the shard's sender: {mode}"
    );

    // The migration's final sync (docs/peering.md): by checksum and mirrored, after a few
    // bytes of the large file changed at the source and a file went: only that file,
    // mended from west's own copy by its changed chunks, and the gone one removed.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(data.join("big.bin"))?;
        f.write_all_at(b"a database page", 5 << 20)?;
    }
    std::fs::remove_file(data.join("empty"))?;
    west.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-east-again\n  namespace: {ns}\nspec:\n  source: {{export: db-ferry-export}}\n  destination: {{root: dr, path: db}}\n  overwrite: IfChanged\n  compare: Checksum\n  deleteExtraneous: true\n  verify: Checksum\n"
    ))?;
    west.wait_succeeded(ns, "from-east-again", 120)?;
    ferry_e2e::assert_same_tree(data, &root.join("srv/dr/db"))?;
    let progress = west.get(
        "copyjob/from-east-again",
        ns,
        "{.status.progress.filesDone} {.status.progress.patched} {.status.progress.deleted}",
    )?;
    ensure!(
        progress == "1 1 1",
        "the re-run wrote (files, of them mended), removed: {progress}"
    );
    // And verified against its manifest in west, as the recipe ends.
    let manifest = west.get("copyjob/from-east-again", ns, "{.status.manifest}")?;
    west.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: final-check\n  namespace: {ns}\nspec:\n  destination: {{root: dr, path: db}}\n  check: {{manifest: {manifest}}}\n"
    ))?;
    west.wait_succeeded(ns, "final-check", 120)?;
    let verified = west.get(
        "copyjob/final-check",
        ns,
        "{.status.conditions[?(@.type==\"Complete\")].reason}",
    )?;
    ensure!(verified == "Verified", "the check: {verified}");
    Ok(())
}

/// Unmounts what a test mounted, when it ends however it ends.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A claim of a CSI volume that no pod mounts, exported: the operator starts the export's
/// holder pod (read-only, owned by the export, admitted by the chart's policy on the
/// operator's token) and says it waits for it; once it runs on east-1, the export is served
/// from there, by east-1's agent, which finds the kubelet's mount of the claim's volume
/// itself and serves it only while it is mounted: the empty directory under a mount that is
/// gone gets nothing. No scheduler, kubelet or CSI driver runs here: the test plays them
/// (the binding, the pod's phase, a tmpfs at the kubelet's mount directory), so it needs
/// root to mount.
pub fn a_csi_claims_export_is_served_where_its_holder_mounts_it(
    east: &ControlPlane,
    reader: &super::Reader,
) -> Result<()> {
    let _binder = east.start_volume_binder()?;
    east.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv-vault\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  csi: {{driver: fake.csi.ferry.dev, volumeHandle: vol-vault}}\n  claimRef: {{namespace: {NS}, name: vault}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: vault\n  namespace: {NS}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  volumeName: pv-vault\n  resources: {{requests: {{storage: 1Gi}}}}\n"
    ))?;
    east.wait_claim_bound(NS, "vault")?;
    east.apply(&export("vault", "{pvc: vault, path: keep}", "west", "1h"))?;
    let export_uid = east.get("copyexport/vault", NS, "{.metadata.uid}")?;
    let holder = format!("ferry-holder-{}-source", &export_uid.replace('-', "")[..8]);
    let mut r = String::new();
    wait_for("the export waiting for its holder pod", WITHIN, || {
        r = ready(east, "vault").unwrap_or_default();
        r.starts_with("NoAddress False")
            && r.contains(&format!("Ferry started holder pod {holder:?}"))
    })
    .with_context(|| format!("{r}\n{}", east.log_tail("operator.log", 20)))?;
    let shape = east.get(
        &format!("pod/{holder}"),
        NS,
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.spec.volumes[0].persistentVolumeClaim.claimName} {.spec.volumes[0].persistentVolumeClaim.readOnly} {.spec.containers[0].volumeMounts[0].readOnly}",
    )?;
    ensure!(
        shape == "CopyExport/vault vault true true",
        "the holder: {shape}"
    );
    // Scheduled to east-1, where the kubelet mounts the claim's volume and runs it.
    let binding = serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": holder, "namespace": NS},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "east-1"},
    });
    let bound = east.kubectl_stdin(
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{NS}/pods/{holder}/binding"),
            "-f",
            "-",
        ],
        &binding.to_string(),
    )?;
    ensure!(
        bound.status.success(),
        "binding the holder: {}",
        String::from_utf8_lossy(&bound.stderr)
    );
    let pod_uid = east.get(&format!("pod/{holder}"), NS, "{.metadata.uid}")?;
    let mount = reader.root.join(format!(
        "var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~csi/pv-vault/mount"
    ));
    // What is on the node's own disk under the mount: never served.
    std::fs::create_dir_all(mount.join("keep"))?;
    std::fs::write(mount.join("keep/under-the-mount"), b"the node's disk")?;
    if !ferry_e2e::is_root() {
        eprintln!(
            "skipped the rest of the CSI export (a mount at the kubelet's directory): not root"
        );
        return Ok(());
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "ferry-test-csi"])
        .arg(&mount)
        .status()?;
    ensure!(status.success(), "mounting a tmpfs at {}", mount.display());
    let mounted = Mounted(mount.clone());
    let data = mount.join("keep");
    std::fs::create_dir_all(data.join("wal"))?;
    std::fs::write(data.join("wal/0001"), vec![7u8; 300_000])?;
    std::fs::write(data.join("settings.conf"), b"durable = yes\n")?;
    std::fs::write(mount.join("beside-the-export"), b"not exported")?;
    east.kubectl_ok(&ferry_e2e::merge_patch(
        &format!("pod/{holder}"),
        NS,
        true,
        r#"{"status":{"phase":"Running"}}"#,
    ))?;
    wait_for("the CSI export Ready", WITHIN, || {
        r = ready(east, "vault").unwrap_or_default();
        r.starts_with("Ready True")
    })
    .with_context(|| r.clone())?;
    ensure!(
        east.get("copyexport/vault", NS, "{.status.address} {.status.node}")?
            == format!("{} east-1", reader.listen),
        "the export is not served from east-1, where its holder is"
    );

    let uid = east.get("copyexport/vault", NS, "{.metadata.uid}")?;
    let credential = credential(east, "vault-ferry-export")?;
    let hello = || ExportHello {
        version: VERSION,
        export: uid.as_bytes().to_vec(),
        credential,
        job: b"job-csi".to_vec(),
        namespace: b"shop-dr".to_vec(),
        shard: 0,
        epoch: 1,
        path: Vec::new(),
        bandwidth_limit: 0,
    };
    let refused = || -> Result<String> {
        let mut tls = super::connect(
            &reader.listen,
            &reader.west,
            &reader.east_ca,
            &reader.east_name,
        )?;
        match ask(&mut tls, &Frame::ExportHello(hello()))? {
            Frame::Refused { reason } => Ok(reason),
            other => anyhow::bail!("answered {other:?}"),
        }
    };
    // West's reader copies it over the peering port, verified by checksum.
    let copied = tempfile::tempdir()?;
    let summary = copy_over(reader, &hello(), &copied.path().join("vault"))?;
    ferry_e2e::assert_same_tree(&data, &copied.path().join("vault"))?;
    ensure!(
        (summary.files, summary.verified) == (2, 2),
        "the volume's two files, not the disk's under it: {summary:?}"
    );

    // The pod ends and the kubelet unmounts (the operator, which is not told, says the
    // export is Ready for a while): nothing is served from what is left on the node's disk.
    drop(mounted);
    wait_for("the unmounted volume refused", WITHIN, || {
        r = refused().unwrap_or_default();
        r.starts_with("NotReady:") && r.contains("is not mounted on node east-1")
    })
    .with_context(|| r.clone())?;
    east.kubectl_ok(&["delete", "copyexport", "vault", "-n", NS, "--wait=false"])?;
    Ok(())
}
