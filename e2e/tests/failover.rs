//! Two operator replicas: one leads (a Lease), and when it is killed the other takes over
//! and finishes new work, without assigning a job twice.

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

fn job(name: &str, dst: &str) -> String {
    format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: data, path: src}}\n  destination: {{root: data, path: {dst}}}\n")
}

#[test]
fn killing_the_leading_operator_lets_the_other_replica_finish_new_jobs() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (mut procs, hosts) = cp.start_ferry(&["node-a"])?;
    let op_b = cp.spawn_operator("operator-b", &[("POD_NAME", "op-b")])?;
    std::fs::create_dir_all(hosts.join("node-a/srv/data/src/d"))?;
    for f in 0..20 {
        std::fs::write(
            hosts.join(format!("node-a/srv/data/src/d/f{f}")),
            format!("file {f}"),
        )?;
    }
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    cp.apply(&job("one", "copy1"))?;
    cp.wait_succeeded("default", "one", 90)?;
    let holder = |cp: &ControlPlane| {
        cp.get(
            "lease/ferry-operator",
            "ferry-system",
            "{.spec.holderIdentity}",
        )
    };
    let first = holder(&cp)?;
    ensure!(!first.is_empty(), "no operator holds the lease");

    // Kill the leader (SIGKILL: no chance to hand over).
    let mut op_b = Some(op_b);
    if first == "op-b" {
        op_b.take();
    } else {
        procs.remove(0);
    }
    cp.apply(&job("two", "copy2"))?;
    cp.wait_succeeded("default", "two", 90)?;
    let second_holder = holder(&cp)?;
    ensure!(
        second_holder != first && !second_holder.is_empty(),
        "the lease did not move: {first} -> {second_holder}"
    );
    let shards = cp.get(
        "copyjob/two",
        "default",
        "{.status.shards[*].id}:{.status.shards[*].epoch}",
    )?;
    ensure!(
        shards == "0:1",
        "job two was assigned more than once: {shards}"
    );
    for copy in ["copy1", "copy2"] {
        let got = std::fs::read_to_string(hosts.join(format!("node-a/srv/data/{copy}/d/f7")))?;
        ensure!(got == "file 7", "{copy} is wrong");
    }
    drop(op_b);
    Ok(())
}
