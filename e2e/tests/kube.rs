//! Ferry as real pods on a real node (the tier of `e2e/kube/`, `make kube-up`): the image
//! `make image` builds, installed by the Helm chart, on a kubelet with containerd. One test
//! brings the tier up once (about 15 s) and runs every check against it, reporting each
//! check that fails; the tier is removed when it ends, passed or not.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::kube::{KubeTier, NODE};
use ferry_e2e::{assert_same_tree, wait_for, Tmpfs};

#[path = "kube/block.rs"]
mod block;
#[path = "kube/cbt.rs"]
mod cbt;
#[path = "kube/clusters.rs"]
mod clusters;
#[path = "kube/csi.rs"]
mod csi;
#[path = "kube/migrate.rs"]
mod migrate;
#[path = "kube/populate.rs"]
mod populate;
#[path = "../../engine/tests/common/mod.rs"]
mod tree;

const NS: &str = "ferry-system";

type Check = fn(&KubeTier, &Path) -> Result<()>;

#[test]
fn ferry_runs_as_pods_on_a_real_node() -> Result<()> {
    let Some(tier) = KubeTier::up_or_skip()? else {
        return Ok(());
    };
    // Data on the host's real filesystem (not a tmpfs): what a StorageRoot on a node is.
    let data = tempfile::Builder::new()
        .prefix("ferry-kube-data-")
        .tempdir_in("/var/tmp")?;
    // What each check shows (the failure message names it).
    let checks: [(&str, Check); 36] = [
        ("agent Ready by its probes", agent_ready),
        (
            "the agent's transfer port: a certificate for its node, its pod IP advertised",
            transfer_port,
        ),
        (
            "operator restricted; agent not privileged, baseline only for hostPath and SYS_ADMIN",
            pod_security,
        ),
        (
            "the agent's confinement, from inside: seven capabilities, seccomp, the node's disk not opened",
            confinement,
        ),
        ("identical copy on the node's disk", copy_on_the_node),
        (
            "everything cp -a keeps and what only root keeps, copied identical by the unprivileged agent",
            adversarial_copy,
        ),
        (
            "HostToContainer: a later mount is copied",
            mounted_after_the_agent_started,
        ),
        ("nothing leaves the machine", nothing_leaves),
        (
            "NetworkPolicies: only named peers in, only the API server out",
            network_policies,
        ),
        ("one leader; its deletion hands over", leader_handover),
        (
            "Prometheus finds the pods as the monitors say",
            prometheus_scrapes_the_pods,
        ),
        (
            "a copy into tmpfs over the memory limit is refused",
            tmpfs_under_a_memory_limit,
        ),
        (
            "CSI claims no pod mounts: held by the operator, copied, let go",
            csi::claims_no_pod_mounts,
        ),
        (
            "a CSI claim in use: copied where its pod has it",
            csi::claim_in_use,
        ),
        (
            "a ReadWriteOncePod claim in use: waits for its user to stop",
            csi::exclusive_claim_in_use,
        ),
        (
            "another namespace's claim or snapshot: not found, not held",
            csi::other_namespaces_claim,
        ),
        (
            "a snapshot source while the app writes: the snapshot's contents exactly",
            csi::snapshot_while_writing,
        ),
        (
            "copyMethod Snapshot: the source at the snapshot, what it made deleted",
            csi::copy_method_snapshot,
        ),
        (
            "block claims: a restricted holder hands its device over, checked by the kubelet's node, copied",
            block::held_and_handed_over,
        ),
        (
            "block claims: a CopyJob copies an ext4 claim exactly and sparse, re-runs by chunk hashes, refuses what a device cannot do",
            block::copyjob_between_claims,
        ),
        (
            "block claims: a block claim's snapshot (taken while a pod has it, or the user's) copied onto a block claim",
            block::copyjob_from_block_snapshot,
        ),
        (
            "changed-block tracking: the driver's sidecar tells a snapshot's data and what changed, to a caller that may read the snapshots only",
            cbt::changed_blocks_through_the_sidecar,
        ),
        (
            "changed-block tracking: a block copy from a later snapshot reads only the chunks the driver says changed",
            cbt::a_rerun_from_a_later_snapshot_reads_only_what_changed,
        ),
        (
            "changed-block tracking: copyMethod Snapshot keeps its snapshot as the destination's base, and the next run reads only what changed",
            cbt::copymethod_snapshot_keeps_its_base_for_the_next_run,
        ),
        ("populator: a claim from another claim", populate::from_a_claim),
        (
            "populator: from a VolumeSnapshot, on a WaitForFirstConsumer class",
            populate::from_a_snapshot_on_first_use,
        ),
        (
            "populator: another namespace's source refused",
            populate::another_namespaces_source,
        ),
        (
            "populator: a claim deleted mid-population leaves nothing",
            populate::deleted_mid_population,
        ),
        (
            "migration: a StatefulSet's claim moved to another class while it writes (kubectl ferry migrate), then verified",
            migrate::statefulset_with_a_writer,
        ),
        (
            "migration: the operator's leader killed at each step",
            migrate::operator_killed_at_each_step,
        ),
        (
            "migration: a Deployment's claim moved while it writes",
            migrate::deployment_with_a_writer,
        ),
        (
            "migration: hooks before the scale-down and the final sync; a hook past its timeout rolls back",
            migrate::hooks_run_at_their_points,
        ),
        (
            "migration: a claim a bare pod uses is refused",
            migrate::a_bare_pod_is_refused,
        ),
        (
            "migration bench: a claim of 100,000 files (make bench-migrate)",
            migrate::bench_100k_files,
        ),
        // Late: they slow the agent down (and put it back).
        (
            "agent deleted or rolled mid-copy: resumed; a CSI job deleted mid-copy lets go; a block copy killed mid-way resumes by chunk",
            slowed_agent,
        ),
        // Last: it turns peering on.
        (
            "between clusters: a second cluster beside this one reads an export of a CSI claim through its holder, at the node's port",
            clusters::export_of_a_csi_claim_copied_to_another_cluster,
        ),
    ];
    // FERRY_KUBE_ONLY=<words>: only the checks whose description has them (while working on
    // one; `make test` runs all).
    let only = std::env::var("FERRY_KUBE_ONLY").unwrap_or_default();
    let mut failed = Vec::new();
    for (what, check) in checks.into_iter().filter(|(what, _)| what.contains(&only)) {
        let started = Instant::now();
        match check(&tier, data.path()) {
            Ok(()) => eprintln!("ok ({:.1} s): {what}", started.elapsed().as_secs_f64()),
            Err(e) => failed.push(format!("{what}: {e:#}")),
        }
    }
    ensure!(failed.is_empty(), "failed:\n- {}", failed.join("\n- "));
    Ok(())
}

fn pods(tier: &KubeTier, component: &str) -> Result<Vec<String>> {
    let names = tier.get(
        "pods",
        NS,
        &format!(
            "{{.items[?(@.metadata.labels.app\\.kubernetes\\.io/component==\"{component}\")].metadata.name}}"
        ),
    )?;
    Ok(names.split_whitespace().map(str::to_string).collect())
}

fn agent_ready(tier: &KubeTier, _: &Path) -> Result<()> {
    let agents = pods(tier, "agent")?;
    ensure!(agents.len() == 1, "agent pods: {agents:?}");
    let pod = format!("pod/{}", agents[0]);
    let ready = tier.get(
        &pod,
        NS,
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    )?;
    ensure!(ready == "True", "agent pod Ready={ready:?}");
    // The probes are the chart's HTTP probes on the metrics port, and what they ask answers
    // 200 from inside the pod network: Ready is the kubelet's verdict, not a default.
    let probe = tier.get(
        &pod,
        NS,
        "{.spec.containers[0].readinessProbe.httpGet.path}",
    )?;
    ensure!(probe == "/readyz", "readiness probe path {probe:?}");
    let ip = tier.get(&pod, NS, "{.status.podIP}")?;
    let port = tier.get(&pod, NS, "{.spec.containers[0].ports[0].containerPort}")?;
    let out = tier
        .in_netns("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg(format!("http://{ip}:{port}/readyz"))
        .output()?;
    let code = String::from_utf8_lossy(&out.stdout);
    ensure!(code == "200", "GET /readyz on the agent pod: {code:?}");
    let restarts = tier.get(&pod, NS, "{.status.containerStatuses[0].restartCount}")?;
    ensure!(restarts == "0", "the agent restarted {restarts} times");
    Ok(())
}

/// The agent pod, on its pod-bound token, gets a transfer certificate from the operator's
/// signer for the node it runs on, and publishes `<pod IP>:<transferPort>` in its heartbeat
/// Lease, where a receiver on another node would find it.
fn transfer_port(tier: &KubeTier, _: &Path) -> Result<()> {
    let agents = pods(tier, "agent")?;
    let pod = format!("pod/{}", agents.first().context("no agent pod")?);
    let (ip, node) = (
        tier.get(&pod, NS, "{.status.podIP}")?,
        tier.get(&pod, NS, "{.spec.nodeName}")?,
    );
    let port = tier.get(
        &pod,
        NS,
        "{.spec.containers[0].ports[?(@.name==\"transfer\")].containerPort}",
    )?;
    ensure!(port == "7450", "transfer port {port:?}");
    let lease = format!("lease/ferry-agent-{node}");
    let want = format!("{ip}:{port}");
    let annotation = "{.metadata.annotations.ferry\\.dev/transfer-address}";
    tier.wait_until(&lease, NS, annotation, Duration::from_secs(60), |a| {
        a == want
    })
    .with_context(|| format!("the Lease does not advertise {want}"))?;
    let csrs: serde_json::Value =
        serde_json::from_str(&tier.kubectl_ok(&["get", "csr", "-o", "json"])?)?;
    let issued = csrs["items"].as_array().into_iter().flatten().any(|c| {
        c["spec"]["signerName"] == "ferry.dev/transfer"
            && c["spec"]["username"] == format!("system:serviceaccount:{NS}:ferry-agent")
            && c["spec"]["extra"]["authentication.kubernetes.io/node-name"][0] == node
            && !c["status"]["certificate"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
    });
    ensure!(
        issued,
        "no transfer certificate issued for {node}: {}",
        csrs["items"]
    );
    // The port serves under the agent's confinement: a TLS 1.3 handshake from the pod
    // network shows its node's certificate and asks for a client's (which this one lacks).
    let out = tier
        .in_netns("timeout")
        .args(["10", "openssl", "s_client", "-connect", &want])
        .stdin(std::process::Stdio::null())
        .output()?;
    let hello = String::from_utf8_lossy(&out.stdout);
    ensure!(
        hello.contains(&format!("subject=CN = {node}"))
            && hello.contains("Acceptable client certificate CA names")
            && hello.contains("TLSv1.3"),
        "TLS on {want}:\n{hello}"
    );
    Ok(())
}

fn pod_security(tier: &KubeTier, _: &Path) -> Result<()> {
    let warnings = violations(tier, "restricted")?;
    let operators = pods(tier, "operator")?;
    ensure!(operators.len() == 2, "operator pods: {operators:?}");
    for op in &operators {
        ensure!(
            !warnings.contains(op.as_str()),
            "{op} violates restricted:\n{warnings}"
        );
    }
    let agents = pods(tier, "agent")?;
    ensure!(
        agents.iter().all(|a| warnings.contains(a.as_str())),
        "the agent should be the one violation:\n{warnings}"
    );
    // Under `baseline`, the agent violates only by its hostPath volumes and SYS_ADMIN (its
    // other capabilities are on baseline's list); it is not a privileged container.
    let warnings = violations(tier, "baseline")?;
    for agent in &agents {
        let line = warnings
            .lines()
            .find(|l| l.contains(agent.as_str()))
            .with_context(|| format!("{agent} passes baseline?\n{warnings}"))?;
        ensure!(
            line.contains("hostPath volumes")
                && line.contains("non-default capabilities")
                && !line.contains("privileged"),
            "{agent} under baseline: {line}"
        );
    }
    for op in &operators {
        ensure!(
            !warnings.contains(op.as_str()),
            "{op} violates baseline:\n{warnings}"
        );
    }
    has_fields(
        tier,
        &agents[0],
        &[
            ("{.spec.containers[0].securityContext.privileged}", "false"),
            (
                "{.spec.containers[0].securityContext.capabilities.add}",
                "[\"CHOWN\",\"DAC_OVERRIDE\",\"FOWNER\",\"FSETID\",\"MKNOD\",\"SETFCAP\",\"SYS_ADMIN\"]",
            ),
            (
                "{.spec.containers[0].securityContext.seccompProfile.type}",
                "RuntimeDefault",
            ),
        ],
    )?;
    has_fields(
        tier,
        &operators[0],
        &[
            ("{.spec.securityContext.runAsNonRoot}", "true"),
            (
                "{.spec.containers[0].securityContext.readOnlyRootFilesystem}",
                "true",
            ),
            (
                "{.spec.containers[0].securityContext.capabilities.drop}",
                "[\"ALL\"]",
            ),
        ],
    )
}

/// The warnings of a server-side dry run of enforcing Pod Security `level` on Ferry's
/// namespace: one line per pod that would violate it, with why.
fn violations(tier: &KubeTier, level: &str) -> Result<String> {
    let out = tier.kubectl(&[
        "label",
        "--dry-run=server",
        "--overwrite",
        "namespace",
        NS,
        &format!("pod-security.kubernetes.io/enforce={level}"),
    ])?;
    ensure!(out.status.success(), "{out:?}");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Each jsonpath of pod `pod` (in Ferry's namespace) reads as wanted.
fn has_fields(tier: &KubeTier, pod: &str, fields: &[(&str, &str)]) -> Result<()> {
    for (path, want) in fields {
        let got = tier.get(&format!("pod/{pod}"), NS, path)?;
        ensure!(got == *want, "{pod} {path} = {got:?}, want {want}");
    }
    Ok(())
}

/// A tree with what `cp -a` keeps: modes with special bits, owners, ns times on files,
/// directories and symlinks, xattrs, hard links across directories, a sparse file.
fn rich_tree(src: &Path) -> Result<()> {
    std::fs::create_dir_all(src.join("a/b"))?;
    std::fs::create_dir_all(src.join("c"))?;
    for i in 0..40 {
        std::fs::write(
            src.join(format!("a/f{i}")),
            format!("file {i}\n").repeat(i + 1),
        )?;
    }
    std::fs::write(src.join("a/b/linked"), b"one inode, two names")?;
    std::fs::hard_link(src.join("a/b/linked"), src.join("c/also-linked"))?;
    std::os::unix::fs::symlink("../a/f1", src.join("c/link"))?;
    let sparse = std::fs::File::create(src.join("sparse"))?;
    sparse.set_len(64 << 20)?;
    std::os::unix::fs::FileExt::write_at(&sparse, b"data at 32 MiB", 32 << 20)?;
    drop(sparse);
    let sh = |args: &[&str]| -> Result<()> {
        let st = Command::new(args[0]).args(&args[1..]).status()?;
        ensure!(st.success(), "{args:?} failed");
        Ok(())
    };
    let p = |rel: &str| src.join(rel).to_string_lossy().into_owned();
    sh(&["chmod", "4750", &p("a/f3")])?;
    sh(&["chmod", "1777", &p("c")])?;
    sh(&["chown", "1234:5678", &p("a/f4")])?;
    sh(&["chown", "-h", "4321:8765", &p("c/link")])?;
    sh(&["setfattr", "-n", "user.ferry", "-v", "kept", &p("a/f5")])?;
    sh(&[
        "touch",
        "-h",
        "-d",
        "2001-02-03 04:05:06.123456789",
        &p("a/f6"),
        &p("c/link"),
    ])?;
    sh(&["touch", "-d", "2002-03-04 05:06:07.987654321", &p("a/b")])?;
    Ok(())
}

/// The block device under /dev whose number is `dev` (the disk a directory is on).
fn device_node_of(dev: u64) -> Result<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    for e in std::fs::read_dir("/dev")? {
        let e = e?;
        let m = std::fs::symlink_metadata(e.path())?;
        if m.file_type().is_block_device() && m.rdev() == dev {
            return Ok(e.path());
        }
    }
    bail!("no block device {dev:#x} in /dev")
}

/// `ferry-agent confinement` run in the agent's container (`kubectl exec`): the kernel's
/// account of what it may do, and which of a copy's calls its seccomp profile lets
/// through. It tries the node's own disk (the device the test data is on,
/// seen at /host/dev/...): open for reading is refused by the device cgroup, and a node of
/// the same number can be created (the copy of a device node) but not opened either.
fn confinement(tier: &KubeTier, data: &Path) -> Result<()> {
    let disk = device_node_of(std::fs::metadata(data)?.dev())?;
    let in_container = Path::new("/host").join(disk.strip_prefix("/")?);
    let agents = pods(tier, "agent")?;
    let agent = agents.first().context("no agent pod")?;
    let report = tier.kubectl_ok(&[
        "exec",
        "-n",
        NS,
        agent,
        "-c",
        "agent",
        "--",
        "ferry-agent",
        "confinement",
        "--device",
        &in_container.to_string_lossy(),
        "--calls",
    ])?;
    eprintln!("ferry-agent confinement in {agent}:\n{report}");
    let line = |prefix: &str| {
        report
            .lines()
            .find(|l| l.starts_with(prefix))
            .with_context(|| format!("no {prefix:?} line in:\n{report}"))
    };
    for (prefix, want) in [
        ("uid ", "uid 0 gid 0"),
        (
            "capabilities: ",
            "capabilities: CHOWN DAC_OVERRIDE FOWNER FSETID SYS_ADMIN MKNOD SETFCAP",
        ),
        ("lost from copies", "lost from copies: nothing"),
        ("no_new_privs: ", "no_new_privs: yes"),
        ("seccomp: ", "seccomp: filter"),
    ] {
        let got = line(prefix)?;
        ensure!(got == want, "{got:?}, want {want:?}");
    }
    let open = line("open /host/dev/")?;
    ensure!(
        open.ends_with("for reading: refused (Operation not permitted (os error 1))"),
        "the node's disk, from the agent: {open}"
    );
    let made = line("mknod ")?;
    ensure!(made.ends_with(": made"), "{made}");
    let reopen = line("open that node")?;
    ensure!(
        reopen.ends_with("refused (Operation not permitted (os error 1))"),
        "{reopen}"
    );
    // The runtime's seccomp profile lets every call of a copy through.
    let calls: Vec<&str> = report.lines().filter(|l| l.starts_with("call ")).collect();
    ensure!(calls.len() >= 10, "calls probed:\n{report}");
    for call in calls {
        ensure!(
            call.contains(": allowed"),
            "under the seccomp profile: {call}"
        );
    }
    Ok(())
}

/// The adversarial tree of the engine's tests and what only root keeps (a trusted.*
/// attribute, file capabilities, a setgid file of another group, device nodes, another
/// user's 0000 file and 0700 directory), copied by a CopyJob through the agent pod: the
/// copy equals the source's snapshot in every entry, attribute and byte.
fn adversarial_copy(tier: &KubeTier, data: &Path) -> Result<()> {
    let root = data.join("adversarial");
    let src = root.join("src");
    tree::adversarial_tree(&src)?;
    tree::root_only_tree(&src)?;
    let before = tree::snapshot(&src)?;
    tier.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata: {{name: adversarial}}\nspec: {{path: {}, nodeSelector: {{kubernetes.io/hostname: {NODE}}}, namespaces: {{names: [default]}}, allowPrivilegedFiles: true}}\n",
        root.display()
    ))?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: adversarial, namespace: default}\nspec:\n  source: {root: adversarial, path: src}\n  destination: {root: adversarial, path: copy}\n  verify: Full\n")?;
    tier.wait_succeeded("default", "adversarial", 120)?;
    tree::compare(&before, &root.join("copy"), tree::Check::default())?;
    Ok(())
}

fn storage_root(tier: &KubeTier, name: &str, path: &Path) -> Result<()> {
    tier.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata: {{name: {name}}}\nspec: {{path: {}, nodeSelector: {{kubernetes.io/hostname: {NODE}}}, namespaces: {{names: [default]}}}}\n",
        path.display()
    ))
}

fn copy_on_the_node(tier: &KubeTier, data: &Path) -> Result<()> {
    let root = data.join("root");
    let src = root.join("src");
    rich_tree(&src)?;
    // The tree has a setuid file (cp -a keeps it), which a root receives only with
    // allowPrivilegedFiles: by default the bit is dropped.
    tier.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata: {{name: node-disk}}\nspec: {{path: {}, nodeSelector: {{kubernetes.io/hostname: {NODE}}}, namespaces: {{names: [default]}}, allowPrivilegedFiles: true}}\n",
        root.display()
    ))?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: on-the-node, namespace: default}\nspec:\n  source: {root: node-disk, path: src}\n  destination: {root: node-disk, path: copy}\n")?;
    tier.wait_succeeded("default", "on-the-node", 120)?;
    let dst = root.join("copy");
    assert_same_tree(&src, &dst)?;
    let xattr = Command::new("getfattr")
        .args(["--only-values", "-n", "user.ferry"])
        .arg(dst.join("a/f5"))
        .output()?;
    ensure!(
        xattr.stdout == b"kept",
        "xattr user.ferry: {:?}",
        String::from_utf8_lossy(&xattr.stdout)
    );
    let (one, two) = (
        std::fs::metadata(dst.join("a/b/linked"))?,
        std::fs::metadata(dst.join("c/also-linked"))?,
    );
    ensure!(one.ino() == two.ino(), "the hard link became two files");
    let sparse = std::fs::metadata(dst.join("sparse"))?;
    ensure!(
        sparse.len() == 64 << 20 && sparse.blocks() * 512 < 1 << 20,
        "sparse file: {} bytes, {} allocated",
        sparse.len(),
        sparse.blocks() * 512
    );
    Ok(())
}

fn nothing_leaves(tier: &KubeTier, _: &Path) -> Result<()> {
    // The namespace has no route beyond the veth to the host...
    let routes = tier.in_netns("ip").args(["route", "show"]).output()?;
    let routes = String::from_utf8_lossy(&routes.stdout);
    ensure!(
        !routes.contains("default"),
        "the tier's namespace has a default route:\n{routes}"
    );
    // ...so an attempt to reach an outside address fails at once, and the host's counter of
    // packets it refused to forward out of the namespace stays at zero.
    let out = tier
        .in_netns("curl")
        .args(["-s", "--max-time", "3", "http://192.0.2.1/"])
        .output()?;
    ensure!(
        !out.status.success(),
        "a request to an outside address was answered"
    );
    let dropped = tier.packets_that_tried_to_leave()?;
    ensure!(
        dropped == 0,
        "{dropped} packets tried to leave through the host"
    );
    Ok(())
}

/// The HTTP status a GET of `url` from inside pod `ns/pod` gets, or "000" when no connection
/// is made within 3 s (a policy drops the packets).
fn http_from_pod(tier: &KubeTier, (ns, pod): (&str, &str), url: &str) -> Result<String> {
    let out = tier
        .in_pod_netns(ns, pod, "curl")?
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["--connect-timeout", "3", url])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The chart's NetworkPolicies, enforced by kube-router's firewall in this tier: the metrics
/// port admits only the Prometheus values.yaml names (pods labelled
/// app.kubernetes.io/name=prometheus in namespace `monitoring`), not a pod with that label in
/// another namespace nor any other pod; an agent connects to the API server and nothing
/// else; the node (probes, the tier's Prometheus) still reaches both. With the policies
/// turned off the same requests pass, so what refused them was the policies.
fn network_policies(tier: &KubeTier, _: &Path) -> Result<()> {
    let agent = pods(tier, "agent")?.remove(0);
    let operator = pods(tier, "operator")?.remove(0);
    let image = tier.get(&format!("pod/{agent}"), NS, "{.spec.containers[0].image}")?;
    tier.kubectl_ok(&["create", "namespace", "monitoring"])?;
    let clients = [
        (
            "monitoring",
            "prometheus",
            "app.kubernetes.io/name: prometheus",
        ),
        (
            "default",
            "prometheus",
            "app.kubernetes.io/name: prometheus",
        ),
        ("default", "tenant", "app: tenant"),
    ];
    for (ns, name, label) in clients {
        tier.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{{label}}}}}\nspec:\n  containers: [{{name: c, image: {image}, imagePullPolicy: Never, command: [ferry-agent, pause]}}]\n"
        ))?;
    }
    for (ns, name, _) in clients {
        tier.wait_pod_ready(ns, name, 60)?;
    }
    let ip = |ns: &str, pod: &str| tier.get(&format!("pod/{pod}"), ns, "{.status.podIP}");
    let agent_metrics = format!("http://{}:9090/metrics", ip(NS, &agent)?);
    let operator_metrics = format!("http://{}:9090/metrics", ip(NS, &operator)?);
    // A listener in the tenant's pod (no policy selects it), for the agent's egress.
    let mut listener = tier
        .in_pod_netns("default", "tenant", "python3")?
        .args(["-m", "http.server", "8080", "--bind", "0.0.0.0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let tenant_web = format!("http://{}:8080/", ip("default", "tenant")?);
    let result = (|| -> Result<()> {
        let prometheus = ("monitoring", "prometheus");
        let impostor = ("default", "prometheus");
        let tenant = ("default", "tenant");
        let from_agent = (NS, agent.as_str());
        wait_for("the tenant's listener", Duration::from_secs(10), || {
            http_from_pod(tier, impostor, &tenant_web).is_ok_and(|c| c == "200")
        })?;
        let mut wrong = Vec::new();
        let mut expect = |who: (&str, &str), url: &str, want: &str| -> Result<()> {
            let got = http_from_pod(tier, who, url)?;
            if got != want {
                wrong.push(format!("{}/{} GET {url}: {got}, want {want}", who.0, who.1));
            }
            Ok(())
        };
        expect(prometheus, &agent_metrics, "200")?;
        expect(prometheus, &operator_metrics, "200")?;
        expect(impostor, &agent_metrics, "000")?;
        expect(impostor, &operator_metrics, "000")?;
        expect(tenant, &agent_metrics, "000")?;
        expect(from_agent, &tenant_web, "000")?;
        expect(from_agent, &operator_metrics, "000")?;
        // The API server answers (its status is about authentication, not the network).
        let api = http_from_pod(tier, from_agent, "https://10.253.0.1:443/readyz")?;
        if api == "000" {
            wrong.push("the agent cannot reach the API server through its Service".into());
        }
        ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
        // The node still reaches both (the kubelet's probes; this tier's Prometheus).
        agent_ready(tier, Path::new(""))?;

        // Without the policies, the refused requests pass.
        upgrade(tier, &["--set", "networkPolicy.enabled=false"])?;
        let opened = wait_for("the policies to be lifted", Duration::from_secs(30), || {
            http_from_pod(tier, impostor, &agent_metrics).is_ok_and(|c| c == "200")
                && http_from_pod(tier, from_agent, &tenant_web).is_ok_and(|c| c == "200")
        });
        upgrade(tier, &["--set", "networkPolicy.enabled=true"])?;
        opened
    })();
    let _ = listener.kill();
    let _ = listener.wait();
    for (ns, name, _) in clients {
        let _ = tier.kubectl(&["delete", "pod", name, "-n", ns, "--wait=false"]);
    }
    result
}

fn leader_handover(tier: &KubeTier, _: &Path) -> Result<()> {
    let holder = || tier.get("lease/ferry-operator", NS, "{.spec.holderIdentity}");
    let operators = pods(tier, "operator")?;
    let first = holder()?;
    ensure!(
        operators.contains(&first),
        "the Lease holder {first:?} is not one of the operator pods {operators:?}"
    );
    tier.kubectl_ok(&["delete", "pod", &first, "-n", NS, "--wait=false"])?;
    let mut next = String::new();
    wait_for(
        "another operator pod to hold the Lease",
        Duration::from_secs(60),
        || {
            next = holder().unwrap_or_default();
            !next.is_empty() && next != first
        },
    )
    .with_context(|| format!("the Lease stayed with {first:?}"))?;
    let now = pods(tier, "operator")?;
    if !now.contains(&next) {
        bail!("the new holder {next:?} is not a running operator pod ({now:?})");
    }
    Ok(())
}

/// Mount propagation (`HostToContainer` on the agent's `/host`): a filesystem mounted on the
/// node after the agent pod started is seen by the agent, as a volume the kubelet mounts
/// later is. Here a tmpfs on the directory of a `local` PersistentVolume.
fn mounted_after_the_agent_started(tier: &KubeTier, data: &Path) -> Result<()> {
    let pv_dir = data.join("pv");
    std::fs::create_dir_all(&pv_dir)?;
    tier.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: ferry-pv}}\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  local: {{path: {}}}\n  claimRef: {{namespace: default, name: data}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {{key: kubernetes.io/hostname, operator: In, values: [{NODE}]}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: data, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  volumeName: ferry-pv\n  resources: {{requests: {{storage: 1Gi}}}}\n",
        pv_dir.display()
    ))?;
    // The PV controller binds them; Ferry uses a claim only once it is Bound.
    tier.wait_claim_bound("default", "data")?;
    // Unmounted lazily if need be when it drops: the agent can still hold the source root
    // open for a moment after the job reads Succeeded (it closes it once the shard is
    // wrapped up).
    let _tmpfs = Tmpfs::mount(&pv_dir, "size=16m")?;
    let src = pv_dir.join("src");
    std::fs::create_dir_all(src.join("d"))?;
    for i in 0..20 {
        std::fs::write(
            src.join(format!("d/on-tmpfs-{i}")),
            format!("{i}").repeat(100),
        )?;
    }
    let dst_root = data.join("from-pv");
    std::fs::create_dir_all(&dst_root)?;
    storage_root(tier, "from-pv", &dst_root)?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: from-pv, namespace: default}\nspec:\n  source: {pvc: data, path: src}\n  destination: {root: from-pv, path: copy}\n")?;
    tier.wait_succeeded("default", "from-pv", 120)?;
    assert_same_tree(&src, &dst_root.join("copy"))
}

/// A tree of `n` files whose times are set in the past: a copied file has those times only
/// once it is finished (times are applied last), so they tell finished files apart.
fn dated_tree(src: &Path, n: usize) -> Result<()> {
    for d in 0..10 {
        std::fs::create_dir_all(src.join(format!("d{d}")))?;
    }
    for i in 0..n {
        std::fs::write(
            src.join(format!("d{}/f{i}", i % 10)),
            format!("{i}\n").repeat(50),
        )?;
    }
    let st = Command::new("sh")
        .arg("-c")
        .arg("find \"$1\" -type f -exec touch -d '2003-04-05 06:07:08' {} +")
        .arg("sh")
        .arg(src)
        .status()?;
    ensure!(st.success(), "touch the tree");
    Ok(())
}

/// Files already finished under `root` (in the job's staging directory): relative path
/// within the destination → inode.
fn finished_files(root: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = std::fs::read_dir(root)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".ferry-"))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    let tops = stack.clone();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)?.flatten() {
            let m = e.metadata()?;
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && m.mtime() == 1_049_522_828 {
                let top = tops
                    .iter()
                    .find(|t| e.path().starts_with(t))
                    .context("top")?;
                out.push((e.path().strip_prefix(top)?.to_path_buf(), m.ino()));
            }
        }
    }
    Ok(out)
}

/// `helm upgrade` of the release with its values and `sets`.
fn upgrade(tier: &KubeTier, sets: &[&str]) -> Result<String> {
    let mut args = vec![
        "upgrade",
        "ferry",
        "charts/ferry",
        "-n",
        NS,
        "--reuse-values",
    ];
    args.extend_from_slice(sets);
    tier.helm(&args)
}

/// Restarts of the agent pods' containers, by pod.
fn agent_restarts(tier: &KubeTier) -> Result<String> {
    tier.get(
        "pods",
        NS,
        "{range .items[?(@.metadata.labels.app\\.kubernetes\\.io/component==\"agent\")]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}",
    )
}

/// Files written to a tmpfs are charged to the writer's memory cgroup and cannot be
/// reclaimed: under a memory limit, the agent refuses a copy into tmpfs that would not fit
/// (instead of being OOM-killed, again after every restart), and still copies one that fits.
fn tmpfs_under_a_memory_limit(tier: &KubeTier, data: &Path) -> Result<()> {
    let root = data.join("in-memory");
    let _tmpfs = Tmpfs::mount(&root, "size=512m")?;
    let result = (|| {
        upgrade_and_roll(
            tier,
            &["--set-string", "agent.resources.limits.memory=160Mi"],
        )?;
        // 192 MiB for a 160 MiB limit; 8 MiB fits.
        for (dir, files, size) in [("big", 8u8, 24usize << 20), ("small", 1, 8 << 20)] {
            std::fs::create_dir_all(root.join(dir))?;
            for i in 0..files {
                let block: Vec<u8> = (0..size).map(|b| (b % 251) as u8 ^ i).collect();
                std::fs::write(root.join(format!("{dir}/f{i}")), block)?;
            }
        }
        storage_root(tier, "in-memory", &root)?;
        let restarts = agent_restarts(tier)?;
        tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: into-memory, namespace: default}\nspec:\n  source: {root: in-memory, path: big}\n  destination: {root: in-memory, path: big-copy}\n")?;
        tier.wait_until(
            "copyjob/into-memory",
            "default",
            "{.status.phase}/{.status.conditions[?(@.type==\"Failed\")].reason}",
            Duration::from_secs(60),
            |v| v == "Failed/DestinationFull",
        )?;
        let message = tier.get(
            "copyjob/into-memory",
            "default",
            "{.status.conditions[?(@.type==\"Failed\")].message}",
        )?;
        ensure!(
            message.contains("is a tmpfs") && message.contains("agent.resources.limits.memory"),
            "the condition does not say why or what to change: {message}"
        );
        ensure!(
            !root.join("big-copy").exists(),
            "the refused copy wrote {}",
            root.join("big-copy").display()
        );
        tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: fits-in-memory, namespace: default}\nspec:\n  source: {root: in-memory, path: small}\n  destination: {root: in-memory, path: small-copy}\n")?;
        tier.wait_succeeded("default", "fits-in-memory", 60)?;
        assert_same_tree(&root.join("small"), &root.join("small-copy"))?;
        let after = agent_restarts(tier)?;
        ensure!(
            after == restarts,
            "the agent restarted: {restarts} before, {after} after"
        );
        Ok(())
    })();
    // Jobs first (their agent holds the root open until they are wrapped up), then the limit.
    for job in ["into-memory", "fits-in-memory"] {
        let _ = tier.kubectl(&["delete", "copyjob", job, "-n", "default", "--wait=true"]);
    }
    upgrade_and_roll(tier, &["--set", "agent.resources.limits=null"])?;
    result
}

/// [`upgrade`], then wait until the agent DaemonSet has rolled to it.
fn upgrade_and_roll(tier: &KubeTier, sets: &[&str]) -> Result<()> {
    upgrade(tier, sets)?;
    tier.kubectl_ok(&[
        "rollout",
        "status",
        "ds/ferry-agent",
        "-n",
        NS,
        "--timeout=120s",
    ])
    .map(drop)
}

/// The chart values that slow the agent down to 30 ms per file at 2 workers (a 400-file
/// copy takes long enough to act on mid-way).
const SLOW_FILES: [&str; 6] = [
    "--set",
    "agent.workers=2",
    "--set",
    "agent.extraEnv[0].name=FERRY_FAULT_FILE_DELAY_MS",
    "--set-string",
    "agent.extraEnv[0].value=30",
];

/// With the agent slowed down ([`SLOW_FILES`], and 1 s per chunk of a block copy), then
/// back to full speed for whatever runs next.
fn slowed_agent(tier: &KubeTier, data: &Path) -> Result<()> {
    let chunks = [
        "--set",
        "agent.extraEnv[1].name=FERRY_FAULT_CHUNK_DELAY_MS",
        "--set-string",
        "agent.extraEnv[1].value=1000",
    ];
    upgrade_and_roll(tier, &[&SLOW_FILES[..], &chunks[..]].concat())?;
    let result = agent_replaced_mid_copy(tier, data)
        .and_then(|()| csi::deleted_mid_copy(tier, data))
        .and_then(|()| block::agent_killed_mid_copy(tier, data));
    upgrade(
        tier,
        &["--set", "agent.extraEnv=null", "--set", "agent.workers=0"],
    )?;
    result
}

fn agent_replaced_mid_copy(tier: &KubeTier, data: &Path) -> Result<()> {
    for (job, how) in [("deleted", "delete"), ("rolled", "upgrade")] {
        let root = data.join(job);
        let src = root.join("src");
        dated_tree(&src, 400)?;
        storage_root(tier, job, &root)?;
        tier.apply(&format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: {job}, namespace: default}}\nspec:\n  source: {{root: {job}, path: src}}\n  destination: {{root: {job}, path: copy}}\n"))?;
        tier.wait_until(
            &format!("copyjob/{job}"),
            "default",
            "{.status.progress.filesDone}",
            Duration::from_secs(120),
            |n| n.parse::<u64>().is_ok_and(|n| n >= 60),
        )?;
        let before = pods(tier, "agent")?;
        let done = finished_files(&root)?;
        ensure!(
            done.len() >= 30,
            "{job}: only {} files finished before the agent was replaced",
            done.len()
        );
        match how {
            "delete" => {
                tier.kubectl_ok(&["delete", "pod", &before[0], "-n", NS, "--wait=false"])?;
            }
            _ => {
                upgrade(tier, &["--set-string", "agent.podAnnotations.rolled=yes"])?;
            }
        }
        tier.wait_succeeded("default", job, 180)?;
        let after = pods(tier, "agent")?;
        ensure!(
            after != before,
            "{job}: the agent pod was not replaced ({after:?})"
        );
        let dst = root.join("copy");
        assert_same_tree(&src, &dst)?;
        let mut recopied = Vec::new();
        for (rel, ino) in &done {
            if std::fs::metadata(dst.join(rel))?.ino() != *ino {
                recopied.push(rel.display().to_string());
            }
        }
        ensure!(
            recopied.is_empty(),
            "{job}: {} of {} files finished before the agent was replaced were copied again: {:?}",
            recopied.len(),
            done.len(),
            &recopied[..recopied.len().min(5)]
        );
    }
    Ok(())
}

/// `curl -s URL` from the host (the tier's node address is reachable over the veth); the body.
fn curl(url: &str) -> Result<serde_json::Value> {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-g", url])
        .output()?;
    ensure!(out.status.success(), "curl {url}: {out:?}");
    serde_json::from_slice(&out.stdout).with_context(|| format!("curl {url}: not JSON"))
}

/// `kubernetes_sd_configs` scrape jobs equivalent to the chart's rendered PodMonitor and
/// ServiceMonitor (their namespaces, label selectors, port, path and `job` relabeling).
fn scrape_configs(rendered: &str, sd: &str) -> Result<String> {
    let mut jobs = String::new();
    for doc in rendered.split("\n---") {
        let doc: serde_yaml::Value = serde_yaml::from_str(doc)?;
        let (role, meta, endpoints) = match doc["kind"].as_str() {
            Some("PodMonitor") => ("pod", "pod", "podMetricsEndpoints"),
            Some("ServiceMonitor") => ("endpoints", "service", "endpoints"),
            _ => continue,
        };
        let spec = &doc["spec"];
        let ep = &spec[endpoints][0];
        let job = ep["relabelings"]
            .as_sequence()
            .and_then(|r| r.iter().find(|r| r["targetLabel"].as_str() == Some("job")))
            .and_then(|r| r["replacement"].as_str())
            .context("a monitor without its job relabeling")?;
        let namespaces: Vec<&str> = spec["namespaceSelector"]["matchNames"]
            .as_sequence()
            .context("namespaceSelector.matchNames")?
            .iter()
            .filter_map(|n| n.as_str())
            .collect();
        jobs += &format!(
            "- job_name: {job}\n  scrape_interval: 1s\n  metrics_path: {}\n  kubernetes_sd_configs:\n  - role: {role}\n    namespaces: {{names: [{}]}}\n{sd}  relabel_configs:\n",
            ep["path"].as_str().unwrap_or("/metrics"),
            namespaces.join(", ")
        );
        for (k, v) in spec["selector"]["matchLabels"]
            .as_mapping()
            .context("selector.matchLabels")?
        {
            let k: String = k
                .as_str()
                .context("label")?
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            jobs += &format!(
                "  - {{action: keep, source_labels: [__meta_kubernetes_{meta}_label_{k}], regex: '{}'}}\n",
                v.as_str().context("label value")?
            );
        }
        let port_label = if role == "pod" {
            "__meta_kubernetes_pod_container_port_name"
        } else {
            "__meta_kubernetes_endpoint_port_name"
        };
        jobs += &format!(
            "  - {{action: keep, source_labels: [{port_label}], regex: '{}'}}\n  - {{target_label: job, replacement: {job}}}\n  - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}\n",
            ep["port"].as_str().context("port")?
        );
    }
    Ok(jobs)
}

fn prometheus_scrapes_the_pods(tier: &KubeTier, data: &Path) -> Result<()> {
    let rendered = tier.helm(&[
        "template",
        "ferry",
        "charts/ferry",
        "-n",
        NS,
        "--set",
        "podMonitor.enabled=true",
        "--set",
        "serviceMonitor.enabled=true",
        "--show-only",
        "templates/monitoring.yaml",
    ])?;
    let state = tier
        .kubelet_dir()
        .parent()
        .context("state dir")?
        .to_path_buf();
    let tokens = std::fs::read_to_string(state.join("pki/tokens.csv"))?;
    let token = tokens
        .lines()
        .find(|l| l.split(',').nth(1) == Some("admin"))
        .and_then(|l| l.split(',').next())
        .context("no admin token")?;
    let dir = data.join("prometheus");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("token"), token)?;
    let sd = format!(
        "    api_server: https://{}:6443\n    tls_config: {{ca_file: {}}}\n    authorization: {{credentials_file: {}}}\n",
        ferry_e2e::kube::NODE_IP,
        state.join("pki/ca.crt").display(),
        dir.join("token").display()
    );
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n{}",
        scrape_configs(&rendered, &sd)?
    );
    std::fs::write(dir.join("prometheus.yml"), &config)?;
    let listen = format!("{}:9099", ferry_e2e::kube::NODE_IP);
    // Built from its Go module by e2e/tools/install.sh: Debian's has no Kubernetes discovery.
    let Some(prometheus) = ferry_e2e::prometheus_k8s_or_skip()? else {
        return Ok(());
    };
    let mut prom = tier
        .in_netns(&prometheus.to_string_lossy())
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log"))?)
        .spawn()?;
    let result = (|| {
        let api = format!("http://{listen}/api/v1");
        let up = |job: &str| -> usize {
            curl(&format!("{api}/query?query=up{{job=\"{job}\"}}==1"))
                .ok()
                .and_then(|v| v["data"]["result"].as_array().map(Vec::len))
                .unwrap_or(0)
        };
        wait_for(
            "Prometheus to scrape 1 agent and 2 operator pods",
            Duration::from_secs(60),
            || up("ferry-agent") == 1 && up("ferry-operator") == 2,
        )
        .with_context(|| format!("config:\n{config}"))?;
        // A copy, then the overview dashboard's throughput over its time: above zero.
        let root = data.join("scraped");
        dated_tree(&root.join("src"), 300)?;
        storage_root(tier, "scraped", &root)?;
        let start = Instant::now();
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs_f64()
            - 5.0;
        tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: scraped, namespace: default}\nspec:\n  source: {root: scraped, path: src}\n  destination: {root: scraped, path: copy}\n")?;
        tier.wait_succeeded("default", "scraped", 120)?;
        let expr = "sum(rate(ferry_agent_bytes_copied_total[5s]))";
        let mut peak = 0.0f64;
        wait_for(
            "the throughput query to show the copy",
            Duration::from_secs(30),
            || {
                let t1 = t0 + start.elapsed().as_secs_f64() + 5.0;
                let url = format!(
                    "{api}/query_range?query={}&start={t0}&end={t1}&step=1",
                    expr.replace('+', "%2B")
                );
                peak = curl(&url)
                    .ok()
                    .and_then(|v| v["data"]["result"][0]["values"].as_array().cloned())
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| p[1].as_str()?.parse::<f64>().ok())
                    .fold(0.0, f64::max);
                peak > 0.0
            },
        )?;
        Ok(())
    })();
    let _ = prom.kill();
    let _ = prom.wait();
    result
}
