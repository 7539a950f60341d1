//! The CRDs as the real kube-apiserver enforces them: accepted, served with the printer
//! columns, and bad specs refused at admission with a message that says what to change.
//! One control plane for the file; each case is checked in turn.

use anyhow::{ensure, Result};
use ferry_e2e::{merge_patch, ControlPlane};

fn copyjob(name: &str, source: &str, destination: &str, extra: &str) -> String {
    format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {source}\n  destination: {destination}\n{extra}"
    )
}

/// Apply `yaml` and return (accepted, stderr).
fn apply(cp: &ControlPlane, yaml: &str) -> Result<(bool, String)> {
    let out = cp.kubectl_stdin(&["apply", "-f", "-"], yaml)?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn refused_with(cp: &ControlPlane, case: &str, yaml: &str, message: &str) -> Result<()> {
    let (ok, err) = apply(cp, yaml)?;
    ensure!(!ok, "{case}: accepted, but must be refused");
    ensure!(
        err.contains(message),
        "{case}: refused, but the message does not say {message:?}: {err}"
    );
    Ok(())
}

#[test]
fn crds_are_served_and_bad_specs_are_refused_at_admission_with_what_to_change() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;

    // A good job is accepted and listed with the printer columns.
    let (ok, err) = apply(
        &cp,
        &copyjob(
            "good",
            "{root: data, path: in}",
            "{root: data, path: out}",
            "",
        ),
    )?;
    ensure!(ok, "a valid CopyJob was refused: {err}");
    let out = cp.kubectl(&["get", "cpj", "good", "-n", "default"])?;
    ensure!(
        out.status.success(),
        "kubectl get failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    for col in ["PHASE", "PROGRESS", "RATE", "ETA", "AGE"] {
        ensure!(
            header.contains(col),
            "column {col} missing from `kubectl get cj`: {header}"
        );
    }

    let path_msg = "path must be relative, without '..' components or NUL bytes";
    refused_with(
        &cp,
        "dotdot path",
        &copyjob(
            "b1",
            "{root: data, path: ../etc}",
            "{root: data, path: out}",
            "",
        ),
        path_msg,
    )?;
    refused_with(
        &cp,
        "nested dotdot",
        &copyjob(
            "b2",
            "{root: data, path: in}",
            "{root: data, path: a/../../b}",
            "",
        ),
        path_msg,
    )?;
    refused_with(
        &cp,
        "absolute path",
        &copyjob(
            "b3",
            "{root: data, path: /etc}",
            "{root: data, path: out}",
            "",
        ),
        path_msg,
    )?;
    refused_with(
        &cp,
        "root and pvc",
        &copyjob("b4", "{root: data, pvc: claim}", "{root: data}", ""),
        "set exactly one of root, pvc, snapshot or export",
    )?;
    refused_with(
        &cp,
        "neither root nor pvc",
        &copyjob("b5", "{path: x}", "{root: data}", ""),
        "set exactly one of root, pvc, snapshot or export",
    )?;
    refused_with(
        &cp,
        "pvc and snapshot",
        &copyjob("b5s", "{pvc: claim, snapshot: s}", "{root: data}", ""),
        "set exactly one of root, pvc, snapshot or export",
    )?;
    refused_with(
        &cp,
        "a snapshot as destination",
        &copyjob("b5d", "{root: data}", "{snapshot: s}", ""),
        "snapshot, copyMethod and volumeSnapshotClassName are for the source",
    )?;
    refused_with(
        &cp,
        "copyMethod Snapshot of a root",
        &copyjob(
            "b5r",
            "{root: data, copyMethod: Snapshot}",
            "{root: out}",
            "",
        ),
        "copyMethod Snapshot snapshots a claim: it needs pvc",
    )?;
    refused_with(
        &cp,
        "a snapshot class without copyMethod Snapshot",
        &copyjob(
            "b5c",
            "{pvc: claim, volumeSnapshotClassName: fast}",
            "{root: out}",
            "",
        ),
        "volumeSnapshotClassName is for copyMethod Snapshot",
    )?;
    refused_with(
        &cp,
        "an unknown copyMethod",
        &copyjob("b5u", "{pvc: claim, copyMethod: Clone}", "{root: out}", ""),
        "Unsupported value: \"Clone\"",
    )?;
    let (ok, out) = apply(
        &cp,
        &copyjob(
            "g5",
            "{pvc: claim, copyMethod: Snapshot, volumeSnapshotClassName: fast}",
            "{pvc: other}",
            "",
        ),
    )?;
    ensure!(ok, "copyMethod Snapshot of a claim refused: {out}");
    let (ok, out) = apply(
        &cp,
        &copyjob("g6", "{snapshot: nightly, path: data}", "{pvc: other}", ""),
    )?;
    ensure!(ok, "a snapshot source refused: {out}");
    // A check job: a destination and an earlier job's manifest, no source.
    let check = |name: &str, source: &str, manifest: &str| {
        format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{source}  destination: {{pvc: copy}}\n  check: {{manifest: {manifest:?}}}\n"
        )
    };
    let good = ".ferry/0b6a2f0c-3d1e-4c55-9f3a-2b7d6e8c9a10.xxh128";
    let (ok, out) = apply(&cp, &check("c1", "", good))?;
    ensure!(ok, "a check job refused: {out}");
    refused_with(
        &cp,
        "a check with a source",
        &check("c2", "  source: {pvc: data}\n", good),
        "one of the two, not both",
    )?;
    for (case, manifest) in [
        ("a manifest outside .ferry", "../../etc/shadow"),
        (
            "a manifest path with a directory",
            ".ferry/a/0b6a2f0c-3d1e-4c55-9f3a-2b7d6e8c9a10.xxh128",
        ),
        ("a manifest that is not a uid", ".ferry/passwd.xxh128"),
    ] {
        refused_with(
            &cp,
            case,
            &check("c3", "", manifest),
            "check.manifest is a job's status.manifest",
        )?;
    }
    refused_with(
        &cp,
        "neither source nor check",
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: c4\n  namespace: default\nspec:\n  destination: {pvc: copy}\n",
        "set spec.source (what to copy), or spec.check",
    )?;
    refused_with(
        &cp,
        "maxAgents 0",
        &copyjob(
            "b6",
            "{root: data}",
            "{root: out}",
            "  parallelism: {maxAgents: 0}\n",
        ),
        "maxAgents must be between 1 and 64",
    )?;
    refused_with(
        &cp,
        "unknown reflink mode",
        &copyjob(
            "b7",
            "{root: data}",
            "{root: out}",
            "  reflink: Sometimes\n",
        ),
        "Unsupported value",
    )?;

    // StorageRoots: absolute paths only, and either node-local or shared.
    let root = |name: &str, spec: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {name}\nspec:\n{spec}")
    };
    let (ok, err) = apply(&cp, &root("data", "  path: /srv/data\n  shared: true\n"))?;
    ensure!(ok, "a valid StorageRoot was refused: {err}");
    refused_with(
        &cp,
        "relative root path",
        &root("r1", "  path: srv\n  shared: true\n"),
        "path must be absolute",
    )?;
    refused_with(
        &cp,
        "root neither shared nor node-local",
        &root("r2", "  path: /srv\n"),
        "set nodeSelector (which nodes have this path) or shared: true",
    )?;

    // Once started, the spec is frozen except suspend, parallelism and the TTL.
    let out = cp.kubectl(&merge_patch(
        "cpj/good",
        "default",
        true,
        r#"{"status":{"phase":"Running"}}"#,
    ))?;
    ensure!(
        out.status.success(),
        "status patch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cp.kubectl(&merge_patch(
        "cpj/good",
        "default",
        false,
        r#"{"spec":{"source":{"path":"elsewhere"}}}"#,
    ))?;
    ensure!(!out.status.success(), "a running job's source was changed");
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        err.contains("cannot change except suspend"),
        "unclear refusal: {err}"
    );
    let out = cp.kubectl(&merge_patch(
        "cpj/good",
        "default",
        false,
        r#"{"spec":{"suspend":true}}"#,
    ))?;
    ensure!(
        out.status.success(),
        "suspend refused on a running job: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
