//! A CopyJob from `kubectl apply` to `Succeeded` through the real kube-apiserver, the
//! operator and two node agents running as processes, each agent a simulated node with its
//! own host-root directory. The copy must be identical to the source, with a manifest that
//! `xxh128sum -c` accepts.

use std::process::Command;

use anyhow::{ensure, Result};
use ferry_e2e::{assert_same_contents, ControlPlane};

#[test]
fn local_root_copyjob_runs_on_the_node_that_has_the_root_and_succeeds_with_an_identical_copy(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a", "node-b"])?;
    // node-b has the data; node-a does not have the path at all.
    let tree = hosts.join("node-b/srv/data/src");
    for d in 0..10 {
        std::fs::create_dir_all(tree.join(format!("d{d}/sub")))?;
        for f in 0..30 {
            let body: Vec<u8> = (0..(d * 977 + f * 131))
                .map(|i| (i * 7 + f) as u8)
                .collect();
            std::fs::write(tree.join(format!("d{d}/f{f}")), body)?;
        }
        std::os::unix::fs::symlink(format!("../f{d}"), tree.join(format!("d{d}/sub/link")))?;
    }
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: local-data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-b}\n  namespaces: {names: [default]}\n",
    )?;

    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: first\n  namespace: default\nspec:\n  source: {root: local-data, path: src}\n  destination: {root: local-data, path: copy}\n",
    )?;
    cp.wait_succeeded("default", "first", 120)?;

    let shard_node = cp.get("copyjob/first", "default", "{.status.shards[0].node}")?;
    ensure!(
        shard_node == "node-b",
        "the job ran on {shard_node:?}, not on the node that has the root"
    );
    let files = cp.get("copyjob/first", "default", "{.status.progress.filesDone}")?;
    ensure!(
        files.parse::<i64>().unwrap_or(0) >= 300,
        "progress reports {files} files done, expected at least 300"
    );

    let copy = hosts.join("node-b/srv/data/copy");
    assert_same_contents(&tree, &copy)?;
    let manifest = cp.get("copyjob/first", "default", "{.status.manifest}")?;
    let check = Command::new("xxh128sum")
        .args(["--quiet", "-c"])
        .arg(hosts.join("node-b/srv/data").join(&manifest))
        .current_dir(&copy)
        .output()?;
    ensure!(
        check.status.success(),
        "manifest {manifest} does not check: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    ensure!(
        !hosts.join("node-a/srv").exists(),
        "the agent on node-a touched its host root"
    );

    // Overwrite policy through a CopyJob: a second job into the same destination keeps what
    // is there under Never (the default), and replaces changed files under IfChanged.
    let user_file = copy.join("d0/f0");
    std::fs::write(&user_file, b"edited by a user")?;
    let again = |name: &str, overwrite: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: local-data, path: src}}\n  destination: {{root: local-data, path: copy}}\n  overwrite: {overwrite}\n")
    };
    for (name, overwrite) in [("keep", "Never"), ("refresh", "IfChanged")] {
        cp.apply(&again(name, overwrite))?;
        cp.wait_succeeded("default", name, 90)?;
        let now = std::fs::read(&user_file)?;
        if overwrite == "Never" {
            ensure!(
                now == b"edited by a user",
                "overwrite: Never replaced an existing file"
            );
        } else {
            ensure!(
                now == std::fs::read(tree.join("d0/f0"))?,
                "overwrite: IfChanged did not replace a changed file"
            );
        }
    }

    // A job no node can take says why, in its Scheduled condition and a Warning event:
    // its volumes on two nodes, or a root on no node at all.
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: a-data\nspec:\n  path: /srv/a\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: nowhere\nspec:\n  path: /srv/x\n  nodeSelector: {ferry.dev/node: node-z}\n  namespaces: {names: [default]}\n",
    )?;
    for (name, dst_root, says) in [
        (
            "apart",
            "a-data",
            "spec.source is on node-b, spec.destination on node-a, and no node reaches both; a copy between them needs a transfer port on both agents, and the agent on node-b, node-a serves none",
        ),
        (
            "nowhere",
            "nowhere",
            "spec.destination: no Node has this volume",
        ),
    ] {
        cp.apply(&format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: local-data, path: src}}\n  destination: {{root: {dst_root}, path: copy}}\n"))?;
        let jsonpath = "{.status.conditions[?(@.type==\"Scheduled\")].message}";
        let msg = cp.wait_until(
            &format!("copyjob/{name}"),
            "default",
            jsonpath,
            std::time::Duration::from_secs(30),
            |m| !m.is_empty(),
        )?;
        ensure!(msg.starts_with(says), "{name}: {msg:?}");
        // (Published right after the status that explains it.)
        let start = std::time::Instant::now();
        let mut reasons = cp.event_reasons("default", name)?;
        while !reasons.contains("NoAgent") && start.elapsed().as_secs() < 15 {
            std::thread::sleep(std::time::Duration::from_millis(200));
            reasons = cp.event_reasons("default", name)?;
        }
        ensure!(reasons.contains("NoAgent"), "{name}: events {reasons:?}");
    }
    Ok(())
}

#[test]
fn dry_run_fills_the_plan_and_copies_nothing_and_a_finished_job_is_deleted_after_its_ttl(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let tree = hosts.join("node-a/srv/data/src");
    std::fs::create_dir_all(tree.join("sub"))?;
    for f in 0..25u64 {
        std::fs::write(
            tree.join(format!("sub/f{f}")),
            vec![1u8; (f * 100) as usize],
        )?;
    }
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: plan\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n  dryRun: true\n")?;
    cp.wait_succeeded("default", "plan", 90)?;
    let plan = cp.get(
        "copyjob/plan",
        "default",
        "{.status.plan.files} {.status.plan.bytes} {.status.plan.nodes[0]} {.status.plan.shards}",
    )?;
    let expected_bytes: u64 = (0..25u64).map(|f| f * 100).sum();
    ensure!(
        plan == format!("25 {expected_bytes} node-a 1"),
        "plan is {plan:?}"
    );
    ensure!(
        !hosts.join("node-a/srv/data/copy").exists(),
        "a dry run created the destination"
    );
    ensure!(
        !hosts.join("node-a/srv/data/.ferry").exists(),
        "a dry run wrote state on the destination"
    );
    Ok(())
}

#[test]
fn pvc_on_a_local_pv_is_copied_on_the_pv_node_and_claims_of_other_namespaces_are_refused(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a", "node-b"])?;
    let tree = hosts.join("node-b/mnt/disks/pv1/src");
    std::fs::create_dir_all(tree.join("x"))?;
    for f in 0..40u64 {
        std::fs::write(
            tree.join(format!("x/f{f}")),
            vec![(f % 251) as u8; (f * 333) as usize],
        )?;
    }
    // A local PV on node-b, pre-bound to claim "data" in namespace default; the PV
    // controller binds them.
    let _binder = cp.start_volume_binder()?;
    cp.apply(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv1\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  local: {path: /mnt/disks/pv1}\n  claimRef: {namespace: default, name: data}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {key: ferry.dev/node, operator: In, values: [node-b]}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  volumeName: pv1\n  resources: {requests: {storage: 1Gi}}\n",
    )?;
    cp.wait_claim_bound("default", "data")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-pvc\n  namespace: default\nspec:\n  source: {pvc: data, path: src}\n  destination: {pvc: data, path: copy}\n")?;
    cp.wait_succeeded("default", "from-pvc", 90)?;
    let node = cp.get("copyjob/from-pvc", "default", "{.status.shards[0].node}")?;
    ensure!(node == "node-b", "ran on {node:?}, not on the PV's node");
    assert_same_contents(&tree, &hosts.join("node-b/mnt/disks/pv1/copy"))?;

    // Another namespace cannot reach that claim: a name only resolves in the job's namespace.
    cp.kubectl_ok(&["create", "namespace", "other"])?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: steal\n  namespace: other\nspec:\n  source: {pvc: data, path: src}\n  destination: {pvc: data, path: stolen}\n")?;
    let out = cp.kubectl(&[
        "wait",
        "--for=jsonpath={.status.conditions[?(@.type==\"Resolved\")].reason}=PVCNotFound",
        "--timeout=60s",
        "copyjob/steal",
        "-n",
        "other",
    ])?;
    ensure!(
        out.status.success(),
        "cross-namespace claim not refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let msg = cp.get(
        "copyjob/steal",
        "other",
        "{.status.conditions[?(@.type==\"Resolved\")].message}",
    )?;
    ensure!(
        msg.contains("other namespaces cannot be used"),
        "unclear message: {msg}"
    );
    ensure!(
        !hosts.join("node-b/mnt/disks/pv1/stolen").exists(),
        "a job from another namespace wrote into the volume"
    );
    Ok(())
}
