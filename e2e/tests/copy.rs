//! A CopyJob from `kubectl apply` to `Succeeded` through the real kube-apiserver, the
//! operator and two node agents running as processes, each agent a simulated node with its
//! own host-root directory. The copy must be identical to the source, with a manifest that
//! `xxh128sum -c` accepts.

use std::process::Command;

use anyhow::{ensure, Result};
use ferry_e2e::{workspace_bin, ControlPlane};

fn kubectl_ok(cp: &ControlPlane, args: &[&str]) -> Result<String> {
    let out = cp.kubectl(args)?;
    ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn apply(cp: &ControlPlane, yaml: &str) -> Result<()> {
    let out = cp.kubectl_stdin(&["apply", "-f", "-"], yaml)?;
    ensure!(
        out.status.success(),
        "apply refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn local_root_copyjob_runs_on_the_node_that_has_the_root_and_succeeds_with_an_identical_copy(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    kubectl_ok(&cp, &["create", "namespace", "ferry-system"])?;
    for node in ["node-a", "node-b"] {
        apply(&cp, &format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    ferry.dev/node: {node}\n"))?;
    }
    // node-b has the data; node-a does not have the path at all.
    let hosts = cp.dir().join("hosts");
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
    std::fs::create_dir_all(hosts.join("node-a"))?;
    apply(
        &cp,
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: local-data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-b}\n  namespaces: {names: [default]}\n",
    )?;

    let agent = workspace_bin("ferry-agent", "ferry-agent")?;
    let operator = workspace_bin("ferry-operator", "ferry-operator")?;
    let _op = cp.spawn(&operator, &[], &[], "operator.log")?;
    let mut agents = Vec::new();
    for node in ["node-a", "node-b"] {
        let root = hosts.join(node);
        let root = root.to_string_lossy();
        let args = [
            "run",
            "--node",
            node,
            "--host-root",
            &root,
            "--namespace",
            "ferry-system",
        ];
        agents.push(cp.spawn(&agent, &args, &[], &format!("agent-{node}.log"))?);
    }

    apply(
        &cp,
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: first\n  namespace: default\nspec:\n  source: {root: local-data, path: src}\n  destination: {root: local-data, path: copy}\n",
    )?;
    let out = cp.kubectl(&[
        "wait",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=120s",
        "copyjob/first",
        "-n",
        "default",
    ])?;
    if !out.status.success() {
        let status = kubectl_ok(
            &cp,
            &[
                "get",
                "copyjob",
                "first",
                "-n",
                "default",
                "-o",
                "jsonpath={.status}",
            ],
        )
        .unwrap_or_default();
        anyhow::bail!(
            "job did not succeed: {}\nstatus: {status}\noperator:\n{}\nagent node-b:\n{}",
            String::from_utf8_lossy(&out.stderr),
            cp.log_tail("operator.log", 4),
            cp.log_tail("agent-node-b.log", 8)
        );
    }

    let shard_node = kubectl_ok(
        &cp,
        &[
            "get",
            "copyjob",
            "first",
            "-n",
            "default",
            "-o",
            "jsonpath={.status.shards[0].node}",
        ],
    )?;
    ensure!(
        shard_node == "node-b",
        "the job ran on {shard_node:?}, not on the node that has the root"
    );
    let files = kubectl_ok(
        &cp,
        &[
            "get",
            "copyjob",
            "first",
            "-n",
            "default",
            "-o",
            "jsonpath={.status.progress.filesDone}",
        ],
    )?;
    ensure!(
        files.parse::<i64>().unwrap_or(0) >= 300,
        "progress reports {files} files done, expected at least 300"
    );

    let copy = hosts.join("node-b/srv/data/copy");
    let diff = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&tree)
        .arg(&copy)
        .output()?;
    ensure!(
        diff.status.success(),
        "copy differs from source: {}",
        String::from_utf8_lossy(&diff.stdout)
    );
    let manifest = kubectl_ok(
        &cp,
        &[
            "get",
            "copyjob",
            "first",
            "-n",
            "default",
            "-o",
            "jsonpath={.status.manifest}",
        ],
    )?;
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
    Ok(())
}
