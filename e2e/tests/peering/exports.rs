//! A tenant's CopyExport on a paired install, with the real operator on the chart's token
//! and the chart's `-exports` policy in force: it is Ready, and the operator wrote the
//! export Secret beside it (type `ferry.dev/export`, its five keys, this install's name and
//! peering CA) whose credential only the status's SHA-256 names; a rotation writes a new
//! credential and keeps the previous one's hash until its grace ends; an unknown reader, a
//! time beyond the install's longest and a missing source are each refused with what to
//! change; a namespace's editors may write exports but not their status.

use anyhow::{ensure, Context, Result};
use ferry_e2e::{wait_for, ControlPlane, CHART_NAMESPACE};
use ferry_operator::export::decide::sha256_hex;

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
    east_name: &str,
) -> Result<()> {
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
    let ca = east.get(
        "configmap/ferry-peering",
        CHART_NAMESPACE,
        "{.data.ca\\.crt}",
    )?;
    ensure!(String::from_utf8(secret_key(east, secret, "ca.crt")?)?.trim() == ca.trim());
    let first = secret_key(east, secret, "credential")?;
    ensure!(first.len() == 32, "a credential of {} bytes", first.len());
    ensure!(
        hashes(east)? == [sha256_hex(&first)],
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
    let second = secret_key(east, secret, "credential")?;
    ensure!(second != first, "the Secret kept its credential");
    ensure!(
        hashes(east)? == [sha256_hex(&second), sha256_hex(&first)],
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
