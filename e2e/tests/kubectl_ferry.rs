//! `kubectl ferry` against the local control plane with the operator and two agents: a copy
//! created and followed to its end from the command line (the copy identical, the exit
//! status 0), `get` showing it, a job that cannot resolve explained by `why` with what to
//! change, `watch` giving up after its timeout with the job left running, refusals of bad
//! endpoints before anything is created, `verify` (the copy checked whole, then with a file
//! changed, one removed and one a symlink: exit 1, each named, nothing touched), `migrate` making a ClaimMigration (and the API
//! server's refusal of a bad one passed on), and the completion scripts.

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{ensure, Result};
use ferry_e2e::{assert_same_contents, workspace_bin, ControlPlane};

fn plugin(kubeconfig: &Path, args: &[&str]) -> Result<Output> {
    let bin = workspace_bin("kubectl-ferry", "kubectl-ferry")?;
    Ok(Command::new(bin)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()?)
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn kubectl_ferry_copies_follows_explains_and_refuses_through_the_api() -> Result<()> {
    // The completion scripts need no cluster.
    for shell in ["bash", "zsh"] {
        let o = plugin(Path::new("/nonexistent"), &["completion", shell])?;
        let script = String::from_utf8_lossy(&o.stdout);
        ensure!(
            o.status.success() && script.contains("kubectl-ferry") && script.contains("copy"),
            "completion {shell}: {}",
            text(&o)
        );
    }
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a", "node-b"])?;
    let kc = cp.kubeconfig.clone();
    let tree = hosts.join("node-a/srv/data/src");
    for d in 0..5 {
        std::fs::create_dir_all(tree.join(format!("d{d}")))?;
        for f in 0..40 {
            std::fs::write(
                tree.join(format!("d{d}/f{f}")),
                vec![(d * 40 + f) as u8; 1000 + f * 97],
            )?;
        }
    }
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n",
    )?;

    // A copy from the command line, followed to Succeeded.
    let o = plugin(
        &kc,
        &[
            "-n",
            "default",
            "copy",
            "root:data:src",
            "root:data:copy",
            "--name",
            "cli",
            "--exclude",
            "d4/",
        ],
    )?;
    ensure!(o.status.success(), "copy: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    ensure!(
        out.contains("copyjob.ferry.dev/cli created")
            && (out.contains("succeeded: 160/160 files") || out.contains("succeeded: 160 files")),
        "copy said: {}",
        text(&o)
    );
    ensure!(
        out.contains("checksum manifest: .ferry/"),
        "no manifest named: {}",
        text(&o)
    );
    std::fs::remove_dir_all(tree.join("d4"))?;
    assert_same_contents(&tree, &hosts.join("node-a/srv/data/copy"))?;

    let o = plugin(&kc, &["-n", "default", "get", "cli"])?;
    let out = String::from_utf8_lossy(&o.stdout);
    ensure!(
        o.status.success() && out.contains("Succeeded") && out.contains("160"),
        "get: {}",
        text(&o)
    );

    // A job that cannot resolve: `watch` gives up at its timeout (the job goes on), and `why`
    // names the reason and what to change.
    let o = plugin(
        &kc,
        &[
            "-n",
            "default",
            "copy",
            "missing:x",
            "root:data:y",
            "--name",
            "stuck",
            "--timeout",
            "5",
        ],
    )?;
    ensure!(
        o.status.code() == Some(2)
            && String::from_utf8_lossy(&o.stderr).contains("did not finish within 5 s"),
        "a job that cannot run: {}",
        text(&o)
    );
    let o = plugin(&kc, &["-n", "default", "why", "stuck"])?;
    let out = String::from_utf8_lossy(&o.stdout);
    ensure!(
        o.status.success()
            && out.contains("PVCNotFound")
            && out.contains(&format!(
                "what to change: {}",
                ferry_crds::Reason::PVCNotFound.remedy()
            )),
        "why: {}",
        text(&o)
    );

    // Refused before anything is made: a snapshot as destination, a path out of the volume,
    // a verification that does not exist; and the API server's own refusal passed on.
    for (args, says) in [
        (
            vec!["copy", "root:data:src", "snapshot:s"],
            "a snapshot is a source only",
        ),
        (vec!["copy", "root:data:/etc", "root:data:z"], "relative"),
        (
            vec!["copy", "root:data:src", "root:data:z", "--verify", "Maybe"],
            "use one of None, Checksum, Full",
        ),
        (
            vec!["copy", "root:data:src", "root:data:.ferry/x"],
            "the API server refused the CopyJob",
        ),
    ] {
        let mut all = vec!["-n", "default"];
        all.extend(args.iter());
        let o = plugin(&kc, &all)?;
        ensure!(
            !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(says),
            "{args:?}: {}",
            text(&o)
        );
    }
    let jobs = cp.kubectl_ok(&["get", "copyjobs", "-n", "default", "-o", "name"])?;
    ensure!(
        jobs.lines().count() == 2,
        "only the two jobs above exist: {jobs}"
    );

    // `verify`: the copy's destination read against its manifest on the node, first whole,
    // then with a file changed (same size), one removed and one a symlink in a file's place.
    let o = plugin(
        &kc,
        &["-n", "default", "verify", "cli", "--name", "cli-check"],
    )?;
    ensure!(
        o.status.success()
            && String::from_utf8_lossy(&o.stdout)
                .contains("copyjob.ferry.dev/cli-check Verified: all 160 files .ferry/"),
        "verify cli: {}",
        text(&o)
    );
    let copy = hosts.join("node-a/srv/data/copy");
    let changed = copy.join("d0/f0");
    let len = std::fs::metadata(&changed)?.len() as usize;
    std::fs::write(&changed, vec![0xee; len])?;
    std::fs::remove_file(copy.join("d1/f1"))?;
    std::fs::remove_file(copy.join("d2/f2"))?;
    std::os::unix::fs::symlink("f3", copy.join("d2/f2"))?;
    let manifest = cp.kubectl_ok(&[
        "get",
        "copyjob",
        "cli",
        "-n",
        "default",
        "-o",
        "jsonpath={.status.manifest}",
    ])?;
    let o = plugin(
        &kc,
        &[
            "-n",
            "default",
            "verify",
            "root:data:copy",
            "--manifest",
            &manifest,
        ],
    )?;
    let err = String::from_utf8_lossy(&o.stderr);
    ensure!(
        o.status.code() == Some(1)
            && String::from_utf8_lossy(&o.stdout)
                .contains("copyjob.ferry.dev/root-data-copy-verify-")
            && err.contains("Failed True: Differs 3 of the 160 files")
            && err.contains("ChecksumMismatch d0/f0")
            && err.contains("NotFound d1/f1")
            && err.contains("DestinationConflict d2/f2")
            && err.contains("Warning Differs: 3 of the 160 files"),
        "verify of a changed copy: {}",
        text(&o)
    );
    ensure!(
        std::fs::read_link(copy.join("d2/f2"))? == Path::new("f3")
            && std::fs::read(&changed)? == vec![0xee; len],
        "a check changes nothing"
    );
    // A refusal: exit status 2, and what to change on stderr.
    let refused = |args: &[&str], says: &str| -> Result<()> {
        let mut all = vec!["-n", "default"];
        all.extend(args.iter());
        let o = plugin(&kc, &all)?;
        ensure!(
            o.status.code() == Some(2) && String::from_utf8_lossy(&o.stderr).contains(says),
            "{args:?}: {}",
            text(&o)
        );
        Ok(())
    };
    for (args, says) in [
        (vec!["verify", "stuck"], "names no manifest"),
        (
            vec!["verify", "root:data:copy", "--manifest", "../x.xxh128"],
            "is not a job's status.manifest",
        ),
    ] {
        refused(&args, says)?;
    }

    // `migrate`: the ClaimMigration it makes, and the API server's refusal passed on.
    let o = plugin(
        &kc,
        &[
            "-n",
            "default",
            "migrate",
            "data-db-0",
            "--to-class",
            "fast",
            "--detach",
        ],
    )?;
    ensure!(o.status.success(), "migrate: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let made = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("claimmigration.ferry.dev/"))
        .unwrap_or_default()
        .to_string();
    ensure!(
        made.starts_with("data-db-0-migrate-"),
        "migrate: {}",
        text(&o)
    );
    let spec = cp.kubectl_ok(&[
        "get",
        "claimmigration",
        &made,
        "-n",
        "default",
        "-o",
        "jsonpath={.spec.claim} {.spec.to.storageClassName} {.spec.quiesceTimeoutSeconds}",
    ])?;
    ensure!(
        spec == "data-db-0 fast 300",
        "the ClaimMigration made: {spec:?}"
    );
    // `verify --migration`: only a migration that succeeded has a claim to check.
    for (args, says) in [
        (
            vec!["verify", "--migration", made.as_str()],
            "not Succeeded: its claim is checked once it is on the new volume",
        ),
        (
            vec!["verify", "--migration", "nope"],
            "no ClaimMigration nope",
        ),
        (
            vec!["verify", "cli", "--migration", made.as_str()],
            "cannot be used with",
        ),
    ] {
        refused(&args, says)?;
    }
    let o = plugin(
        &kc,
        &[
            "-n",
            "default",
            "migrate",
            "data-db-0",
            "--to-class",
            "fast",
            "--quiesce-timeout",
            "5",
        ],
    )?;
    ensure!(
        o.status.code() == Some(2)
            && String::from_utf8_lossy(&o.stderr).contains("refused the ClaimMigration: ")
            && String::from_utf8_lossy(&o.stderr)
                .contains("quiesceTimeoutSeconds must be between 10 and 3600"),
        "migrate --quiesce-timeout 5: {}",
        text(&o)
    );
    Ok(())
}
