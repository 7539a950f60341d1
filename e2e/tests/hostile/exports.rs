//! Export Secrets: with peering on, the operator may create and patch Secrets in every
//! namespace (each CopyExport's Secret is written into the export's namespace), narrowed
//! only by the chart's `-exports` admission policy. A stolen operator token must not be able
//! to write any other Secret, nor read one through a patch's answer. Here, on the operator's
//! own ServiceAccount token against the chart as rendered into `deploy/` (the grant peering
//! adds bound to it by hand, since that render has peering off):
//!
//! - the Secret `export::export_secret` builds is admitted, and with any one field added or
//!   changed refused naming the field, but for what varies from export to export;
//! - the peering CA's Secret as the operator makes it is admitted in the release namespace
//!   only, with nothing added;
//! - the tickets namespace is its own Role's, not this policy's;
//! - patches: the expiry of an export's Secret is admitted, anything else (another key, a
//!   label), and any patch of a Secret that is not an export's (even an empty one, whose
//!   answer would be the Secret), refused;
//! - a tenant's own Secrets are not this policy's;
//! - the policy's validations type-check against Secrets.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use ferry_crds::{CopyExport, CopyExportSpec, ExportReader, ExportSource};
use ferry_e2e::{ControlPlane, CHART_NAMESPACE};
use ferry_operator::export::{self, decide::NewSecret};
use serde_json::{json, Value};

use super::holder::{
    answered, ask, ask_all, ask_until, check_coverage, row, set, type_checked, Answer, Row, TEAM,
};

/// The CopyExport, and another.
const EXPORT: &str = "3e4f5a6b-7c8d-4e9f-8a0b-1c2d3e4f5a6b";
const OTHER: &str = "8b9c0d1e-2f3a-4b5c-9d6e-7f8a9b0c1d2e";
/// The policy's refusal of a Secret that is not the peering CA's shape.
const NOT_THE_CA: &str = "creates ferry-peering-ca with the keys";

/// Which object a row starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    /// The export Secret the code builds.
    Export,
    /// The peering CA's Secret as the operator makes it.
    Ca,
    /// A Secret in the tickets namespace.
    Ticket,
}

fn copy_export(name: &str, uid: &str) -> CopyExport {
    let mut e = CopyExport::new(
        name,
        CopyExportSpec {
            source: ExportSource {
                pvc: Some("data".into()),
                ..ExportSource::default()
            },
            readers: vec![ExportReader {
                peer: "west".into(),
                namespace: "shop-dr".into(),
            }],
            expires: None,
            ttl: Some("24h".into()),
            renew: 0,
            max_readers: 1,
            rotate: 0,
            bandwidth_limit: None,
        },
    );
    e.metadata.namespace = Some(TEAM.into());
    e.metadata.uid = Some(uid.into());
    e
}

/// The Secret the code writes for export `db`.
fn export_secret() -> Result<Value> {
    let own = export::Own::from_env(
        CHART_NAMESPACE,
        "east",
        "-----BEGIN CERTIFICATE-----\n...\n",
    )
    .map_err(anyhow::Error::msg)?;
    let new = NewSecret {
        name: ferry_crds::export_secret_name("db"),
        credential: [9; 32],
        expires: "2026-12-05T00:00:00Z".into(),
        address: "192.0.2.10:7451".into(),
    };
    let mut v = serde_json::to_value(export::export_secret(
        &copy_export("db", EXPORT),
        &new,
        &own,
    ))?;
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("Secret");
    Ok(v)
}

fn b64(s: &str) -> Value {
    use base64::Engine;
    json!(base64::engine::general_purpose::STANDARD.encode(s))
}

/// The peering CA's Secret as `peering::own_identity` makes it.
fn ca_secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ferry-peering-ca", "namespace": CHART_NAMESPACE},
        "data": {"tls.crt": b64("c"), "tls.key": b64("k"), "install": b64("east")}})
}

#[rustfmt::skip]
fn export_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::Export as E;
    let owner = |uid: &str, kind: &str| json!({"apiVersion": "ferry.dev/v1alpha1", "kind": kind, "name": "db", "uid": uid, "controller": true});
    vec![
        // What varies from export to export.
        row(E, "another namespace", vec![set("/metadata/namespace", json!("team-b"))], Admitted),
        row(E, "another export", vec![
            set("/metadata/name", json!("web-ferry-export")),
            set("/metadata/ownerReferences/0/name", json!("web")),
            set("/metadata/ownerReferences/0/uid", json!(OTHER)),
            set("/metadata/labels/ferry.dev~1export", json!(OTHER)),
        ], Admitted),
        row(E, "another install, CA, expiry and credential", vec![
            set("/data/install", b64("west")),
            set("/data/ca.crt", b64("another")),
            set("/data/expires", b64("2027-01-01T00:00:00Z")),
            set("/data/credential", b64("x")),
            set("/data/export", b64(OTHER)),
            set("/data/address", b64("198.51.100.7:31451")),
        ], Admitted),
        // Metadata.
        row(E, "a name not made from the owner", vec![set("/metadata/name", json!("db-credentials"))], Refused("metadata.name")),
        row(E, "an owner other than the label's", vec![set("/metadata/ownerReferences/0/uid", json!(OTHER))], Refused("metadata.labels")),
        row(E, "labelled for another export", vec![set("/metadata/labels/ferry.dev~1export", json!(OTHER))], Refused("metadata.labels")),
        row(E, "managed by someone else", vec![set("/metadata/labels/app.kubernetes.io~1managed-by", json!("helm"))], Refused("metadata.labels")),
        row(E, "another label", vec![set("/metadata/labels/app", json!("db"))], Refused("metadata.labels")),
        row(E, "no labels", vec![("/metadata/labels", None)], Refused("metadata.labels")),
        row(E, "an annotation", vec![set("/metadata/annotations", json!({"kubernetes.io/service-account.name": "default"}))], Refused("metadata.annotations")),
        row(E, "an owner of another API version", vec![set("/metadata/ownerReferences/0/apiVersion", json!("ferry.dev/v1"))], Refused("metadata.ownerReferences")),
        row(E, "an owner of another kind", vec![set("/metadata/ownerReferences/0/kind", json!("CopyJob"))], Refused("metadata.ownerReferences")),
        row(E, "an owner that is not the controller", vec![set("/metadata/ownerReferences/0/controller", json!(false))], Refused("metadata.ownerReferences")),
        row(E, "an owner blocking deletion", vec![set("/metadata/ownerReferences/0/blockOwnerDeletion", json!(true))], Refused("metadata.ownerReferences")),
        row(E, "a second owner", vec![set("/metadata/ownerReferences/1", owner(OTHER, "CopyExport"))], Refused("metadata.ownerReferences")),
        row(E, "no owner", vec![("/metadata/ownerReferences", None)], Refused("metadata.ownerReferences")),
        row(E, "a generated name", vec![set("/metadata/generateName", json!("db-"))], Refused("metadata.generateName")),
        row(E, "a finalizer", vec![set("/metadata/finalizers", json!(["example.com/never"]))], Refused("metadata.finalizers")),
        // The Secret itself.
        row(E, "another type", vec![set("/type", json!("Opaque"))], Refused("type")),
        row(E, "no type (Opaque)", vec![("/type", None)], Refused("type")),
        row(E, "a key more", vec![set("/data/.dockerconfigjson", b64("{}"))], Refused("data")),
        row(E, "a key more, as stringData", vec![set("/stringData", json!({"token": "x"}))], Refused("data")),
        row(E, "a key fewer", vec![("/data/credential", None)], Refused("data")),
        row(E, "immutable", vec![set("/immutable", json!(true))], Refused("immutable")),
    ]
}

#[rustfmt::skip]
fn ca_rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{Ca as C, Ticket as T};
    vec![
        row(C, "in another namespace (then an export Secret it is not)", vec![set("/metadata/namespace", json!(TEAM))], Refused("type")),
        row(C, "another name in the release namespace", vec![set("/metadata/name", json!("sh.helm.release.v1.ferry.v2"))], Refused("type")),
        row(C, "a key more", vec![set("/data/extra", b64("x"))], Refused(NOT_THE_CA)),
        row(C, "a key fewer", vec![("/data/install", None)], Refused(NOT_THE_CA)),
        row(C, "a label", vec![set("/metadata/labels", json!({"a": "b"}))], Refused("metadata.labels")),
        row(C, "another type", vec![set("/type", json!("example.com/other"))], Refused("type")),
        row(T, "any Secret in the tickets namespace", vec![set("/data/anything", b64("x"))], Admitted),
    ]
}

fn ticket() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ferry-ticket-x", "namespace": format!("{CHART_NAMESPACE}-tickets")},
        "data": {"ticket": b64("t")}})
}

/// The grant the chart gives the operator with peering on (rbac.yaml), bound by hand.
fn grant_peering_secrets(cp: &ControlPlane) -> Result<()> {
    cp.kubectl_ok(&[
        "create",
        "clusterrole",
        "ferry-operator-exports",
        "--verb=create,patch",
        "--resource=secrets",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "ferry-operator-exports",
        "--clusterrole=ferry-operator-exports",
        &format!("--serviceaccount={CHART_NAMESPACE}:ferry-operator"),
    ])?;
    Ok(())
}

/// Merge-patch Secret `name` of `TEAM` as the operator does (one PATCH, no GET first, which
/// kubectl would need and the operator may not do), a dry run, on `kc`'s server and token;
/// `Err` with the answer when it is not `answer`.
fn raw_merge_patch(kc: &Path, name: &str, patch: &Value, answer: Answer) -> Result<()> {
    let config = std::fs::read_to_string(kc)?;
    let field = |key: &str| {
        config
            .lines()
            .find_map(|l| l.trim().strip_prefix(key).map(str::to_string))
            .with_context(|| format!("{key} in {}", kc.display()))
    };
    let (server, token) = (field("server: ")?, field("token: ")?);
    let out = std::process::Command::new("curl")
        .args(["-sk", "-X", "PATCH", "-o", "-", "-w", "\n%{http_code}"])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Content-Type: application/merge-patch+json"])
        .args(["--data-binary", &patch.to_string()])
        .arg(format!(
            "{server}/api/v1/namespaces/{TEAM}/secrets/{name}?dryRun=All"
        ))
        .output()
        .context("run curl")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').context("curl's answer")?;
    let ok = code.starts_with('2');
    match answer {
        Answer::Admitted => ensure!(ok, "refused ({code}): {body}"),
        Answer::Refused(why) => ensure!(
            !ok && body.contains(why),
            "expected a refusal naming {why:?}, got {code}: {body}"
        ),
    }
    Ok(())
}

/// Create `obj` for real on `kc`.
fn create(cp: &ControlPlane, kc: &Path, obj: &Value) -> Result<()> {
    let kc = kc.to_string_lossy();
    let out = cp.kubectl_stdin(
        &["--kubeconfig", &kc, "create", "-f", "-"],
        &obj.to_string(),
    )?;
    answered(&out, Answer::Admitted)
        .with_context(|| format!("creating {}", obj["metadata"]["name"]))
}

#[test]
fn exports_policy_admits_exactly_the_secrets_the_operator_writes_and_no_patch_of_another_secret(
) -> Result<()> {
    let exact = export_secret()?;
    let rows = export_rows();
    check_coverage(&[(Base::Export, exact.clone())], &rows, &["/data"])?;
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let checker =
        cp.start_controller_manager_or_skip(&["validatingadmissionpolicy-status-controller"])?;
    let mut typed = exact.clone();
    typed["type"] = json!("Opaque");
    // The chart, and the grant peering adds; the policies are in force once an Opaque
    // Secret of the operator's is refused (RBAC lets it through to admission).
    cp.install_rendered(CHART_NAMESPACE, "ferry.yaml")?;
    for ns in [TEAM, "team-b"] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    grant_peering_secrets(&cp)?;
    let kc = cp.service_account_kubeconfig(CHART_NAMESPACE, "ferry-operator", None)?;
    ask_until(&cp, &kc, &typed, Answer::Refused("type"))
        .context("the chart's policies in force")?;
    if checker.is_some() {
        type_checked(&cp, "ferry-exports")?;
    }
    ask(&cp, &kc, &exact, Answer::Admitted)
        .with_context(|| format!("the Secret the code builds: {exact}"))?;
    ask_all(&cp, &kc, &[(Base::Export, exact.clone())], &rows)?;
    ask_all(
        &cp,
        &kc,
        &[(Base::Ca, ca_secret()), (Base::Ticket, ticket())],
        &ca_rows(),
    )?;
    ask(&cp, &kc, &ca_secret(), Answer::Admitted).context("the peering CA's Secret")?;

    // Patches: of the export's Secret as written, and of Secrets that are not exports'.
    create(&cp, &kc, &exact)?;
    let admin = cp.kubeconfig.clone();
    create(
        &cp,
        &admin,
        &json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db-credentials", "namespace": TEAM}, "data": {"password": b64("hunter2")}}),
    )?;
    let mut dressed = exact.clone();
    dressed["metadata"]["name"] = json!("old-ferry-export");
    dressed["metadata"]["labels"]["ferry.dev/export"] = json!(OTHER);
    dressed["metadata"]
        .as_object_mut()
        .context("metadata")?
        .remove("ownerReferences");
    create(&cp, &admin, &dressed)?;
    let patch = |name: &str, p: Value, answer| {
        raw_merge_patch(&kc, name, &p, answer).with_context(|| format!("patch {name} with {p}"))
    };
    let secret = "db-ferry-export";
    patch(
        secret,
        json!({"data": {"expires": b64("2027-01-01T00:00:00Z")}}),
        Answer::Admitted,
    )?;
    patch(
        secret,
        json!({"data": {"extra": b64("x")}}),
        Answer::Refused("data"),
    )?;
    patch(
        secret,
        json!({"metadata": {"labels": {"a": "b"}}}),
        Answer::Refused("metadata.labels"),
    )?;
    patch(
        secret,
        json!({"metadata": {"annotations": {"a": "b"}}}),
        Answer::Refused("metadata.annotations"),
    )?;
    for p in [json!({}), json!({"data": {"password": b64("x")}})] {
        patch("db-credentials", p, Answer::Refused("type"))?;
    }
    // Made to look like this export's Secret, but not it before the change.
    let owner = json!({"metadata": {"ownerReferences": exact["metadata"]["ownerReferences"],
        "labels": {"ferry.dev/export": EXPORT}}});
    patch(
        "old-ferry-export",
        owner,
        Answer::Refused("the Secret it changes"),
    )?;

    // A tenant's own Secrets are not this policy's.
    let mut own = exact.clone();
    own["type"] = json!("Opaque");
    own["metadata"]["name"] = json!("mine");
    ask(&cp, &admin, &own, Answer::Admitted).context("an admin's Secret")?;
    Ok(())
}
