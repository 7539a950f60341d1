//! Raw block claims on two nodes (issue 36): the source claim's holder on node-a, the
//! destination's on node-b; node-b's agent runs the shard and reads the source's device by
//! range from node-a's agent (`ReadRange`), over mutual TLS with the shard's ticket.
//!
//! No kubelet runs here, so the test does a kubelet's part for the operator's holder pods:
//! it binds each to its node (`pods/binding`, as the scheduler does), makes the device node
//! the kubelet would make for the claim's volume and that pod (`mknod` under the node's
//! simulated host root, `plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>`), runs
//! `ferry-agent hold-block` on a loop device at the pod's `ferry-fd` emptyDir, and reports
//! the pod Running. The agents prove the device they are handed is that node's, as on a
//! real node.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use super::*;

/// Bytes of each device: 16 chunks of the block copy's 4 MiB.
const SIZE: u64 = 64 << 20;
const CHUNK: u64 = 4 << 20;

/// A CSI PV of `volumeMode: Block` pre-bound to claim `claim` in the tenant's namespace,
/// and that claim.
fn block_claim(claim: &str, pv: &str) -> String {
    format!("apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {pv}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteOnce]\n  volumeMode: Block\n  storageClassName: fake-block\n  csi: {{driver: fake.csi.ferry.dev, volumeHandle: {pv}}}\n  claimRef: {{namespace: {TEAM}, name: {claim}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {claim}\n  namespace: {TEAM}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: Block\n  storageClassName: fake-block\n  volumeName: {pv}\n  resources: {{requests: {{storage: 64Mi}}}}\n")
}

/// One end of a block job as the test holds it: the claim's PV, the node its holder is
/// bound to, and the loop device the kubelet would have attached there.
struct End<'a> {
    end: &'a str,
    pv: &'a str,
    node: &'a str,
    dev: &'a Path,
}

/// Do the kubelet's part for job `name`'s holder pods (see the module's comment), the
/// source's first (the destination's is made once the source's has a node). The holders'
/// processes run until the returned values are dropped.
fn hold(nodes: &Nodes, name: &str, ends: [End<'_>; 2]) -> Result<Vec<Proc>> {
    let cp = &nodes.cp;
    let uid = cp.get(&format!("copyjob/{name}"), TEAM, "{.metadata.uid}")?;
    let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    let agent = ferry_e2e::workspace_bin("ferry-agent", "ferry-agent")?;
    let mut held = Vec::new();
    for e in ends {
        let pod = format!("ferry-holder-{short}-{}", e.end);
        ferry_e2e::wait_for(
            &format!("holder pod {pod}"),
            Duration::from_secs(60),
            || {
                cp.get(&format!("pod/{pod}"), TEAM, "{.metadata.uid}")
                    .is_ok_and(|u| !u.is_empty())
            },
        )
        .with_context(|| {
            format!(
                "job {name}: {}\noperator:\n{}",
                nodes.status(name).unwrap_or_default(),
                cp.log_tail("operator.log", 20)
            )
        })?;
        let pod_uid = cp.get(&format!("pod/{pod}"), TEAM, "{.metadata.uid}")?;
        // The scheduler's part: bind it.
        let binding = cp.dir().join(format!("binding-{pod}.json"));
        std::fs::write(
            &binding,
            serde_json::json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"apiVersion": "v1", "kind": "Node", "name": e.node}}).to_string(),
        )?;
        cp.kubectl_ok(&[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{TEAM}/pods/{pod}/binding"),
            "-f",
            &binding.to_string_lossy(),
        ])?;
        // The kubelet's: the claim's device node for this pod, the pod's emptyDir, the
        // container (hold-block on the device), the pod Running.
        let host = nodes.hosts.join(e.node);
        let nodes_dir = host.join(format!(
            "var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/{}/dev",
            e.pv
        ));
        std::fs::create_dir_all(&nodes_dir)?;
        let rdev = std::fs::metadata(e.dev)?.rdev();
        let (major, minor) = (
            ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff),
            (rdev & 0xff) | ((rdev >> 12) & !0xff),
        );
        let made = Command::new("mknod")
            .arg(nodes_dir.join(&pod_uid))
            .args(["b", &major.to_string(), &minor.to_string()])
            .status()?;
        ensure!(made.success(), "mknod for {pod}'s device node failed");
        let fd_dir = host.join(format!(
            "var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~empty-dir/ferry-fd"
        ));
        std::fs::create_dir_all(&fd_dir)?;
        // Run from the directory: its path here is longer than a socket address may be.
        let log = std::fs::File::create(cp.dir().join(format!("{pod}.log")))?;
        let child = Command::new(&agent)
            .args(["hold-block", "--device"])
            .arg(e.dev)
            .args(["--dir", "."])
            .args((e.end == "destination").then_some("--write"))
            .current_dir(&fd_dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        held.push(Proc::from(child));
        cp.kubectl_ok(&ferry_e2e::merge_patch(
            &format!("pod/{pod}"),
            TEAM,
            true,
            r#"{"status":{"phase":"Running"}}"#,
        ))?;
    }
    Ok(held)
}

/// A block CopyJob `name` from claim `src` to claim `dst`, with `extra` spec lines.
fn block_job(nodes: &Nodes, name: &str, extra: &str) -> Result<()> {
    nodes.cp.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {TEAM}\nspec:\n  source: {{pvc: src}}\n  destination: {{pvc: dst}}\n{extra}"
    ))
}

/// Deterministic bytes that do not compress.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn read_all(path: &Path) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut v)?;
    Ok(v)
}

/// The first chunk where `a` and `b` differ, for a failure message.
fn first_difference(a: &[u8], b: &[u8]) -> Option<u64> {
    a.chunks(CHUNK as usize)
        .zip(b.chunks(CHUNK as usize))
        .position(|(x, y)| x != y)
        .map(|i| i as u64)
}

/// node-b's account of a block shard: the last "block shard copied" line of its log.
fn copied_line(nodes: &Nodes, job: &str) -> Result<String> {
    let log = std::fs::read_to_string(nodes.cp.dir().join("agent-node-b.log"))?;
    log.lines()
        .rev()
        .find(|l| l.contains("block shard copied") && l.contains(&format!("{TEAM}/{job}")))
        .map(str::to_string)
        .with_context(|| format!("node-b logged no block shard copied for {job}"))
}

/// `key=value` from a log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn raw_block_claims_on_two_nodes_are_copied_by_range_resumed_after_the_sender_dies_and_rerun_by_changed_chunks(
) -> Result<()> {
    if !ferry_e2e::is_root() {
        eprintln!(
            "skipped: needs root (loop devices, and device nodes under the nodes' host roots)"
        );
        return Ok(());
    }
    // node-b's copy waits two seconds before each chunk, so that the sender can be killed
    // while the copy runs.
    let Some(mut nodes) = Nodes::start(&[("node-b", &[("FERRY_FAULT_CHUNK_DELAY_MS", "2000")])])?
    else {
        return Ok(());
    };
    let _binder = nodes.cp.start_volume_binder()?;
    // The source: noise, a run of zeros 6 chunks long, noise. The destination: junk
    // everywhere, so that zeros not written would show.
    // Each image on its node's filesystem, as a CSI driver's loop devices' are (the agent
    // witnesses the destination by its backing file, which it finds beneath its host root).
    let image = |node: &str, name: &str| -> Result<PathBuf> {
        let dir = nodes.hosts.join(node).join("var/lib/fake-csi");
        std::fs::create_dir_all(&dir)?;
        Ok(dir.join(name))
    };
    let (src_img, dst_img) = (image("node-a", "src.img")?, image("node-b", "dst.img")?);
    let mut data = noise(7, SIZE as usize);
    data[(5 * CHUNK) as usize..(11 * CHUNK) as usize].fill(0);
    std::fs::write(&src_img, &data)?;
    std::fs::write(&dst_img, vec![0xab; SIZE as usize])?;
    let (src_dev, dst_dev) = (tree::Loop::over(&src_img)?, tree::Loop::over(&dst_img)?);
    let cp = &nodes.cp;
    cp.apply(&block_claim("src", "pv-src"))?;
    cp.apply(&block_claim("dst", "pv-dst"))?;
    cp.wait_claim_bound(TEAM, "src")?;
    cp.wait_claim_bound(TEAM, "dst")?;
    let ends = || {
        [
            End {
                end: "source",
                pv: "pv-src",
                node: "node-a",
                dev: &src_dev.dev,
            },
            End {
                end: "destination",
                pv: "pv-dst",
                node: "node-b",
                dev: &dst_dev.dev,
            },
        ]
    };

    // 1. The first copy; node-a's agent (the sender) killed while it runs.
    block_job(&nodes, "whole", "  overwrite: Always\n")?;
    let held = hold(&nodes, "whole", ends())?;
    let start = Instant::now();
    loop {
        let s = nodes.status("whole")?;
        let done = s["shards"][0]["bytesDone"].as_i64().unwrap_or(0);
        if done > 0 {
            ensure!(
                (
                    s["shards"][0]["sender"].as_str(),
                    s["shards"][0]["node"].as_str()
                ) == (Some("node-a"), Some("node-b")),
                "not paired node-a -> node-b: {s}"
            );
            ensure!(
                done < SIZE as i64,
                "the copy ended before the sender could be killed: {s}"
            );
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(90),
            "the block copy made no progress: {s}\nnode-b:\n{}\nnode-a:\n{}",
            cp.log_tail("agent-node-b.log", 30),
            cp.log_tail("agent-node-a.log", 20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes.kill_and_restart("node-a", Duration::from_secs(2))?;
    nodes.succeeded("whole", Duration::from_secs(120))?;
    drop(held);
    let cp = &nodes.cp;
    let log = std::fs::read_to_string(cp.dir().join("agent-node-b.log"))?;
    ensure!(
        log.contains("dialling again to resume from the journal"),
        "node-b did not dial the sender again:\n{}",
        cp.log_tail("agent-node-b.log", 30)
    );
    let line = copied_line(&nodes, "whole")?;
    let resumed: u64 = field(&line, "resumed").unwrap_or("0").parse()?;
    ensure!(
        resumed >= 1,
        "no chunk was resumed from the journal: {line}"
    );
    let got = read_all(&dst_img)?;
    ensure!(
        got == data,
        "the destination differs from the source from chunk {:?} ({line})",
        first_difference(&got, &data)
    );
    // The zeros were punched, not left as junk, and not sent: the destination's image has
    // holes there.
    let allocated = std::fs::metadata(&dst_img)?.blocks() * 512;
    ensure!(
        allocated <= SIZE - 6 * CHUNK + CHUNK,
        "the destination image has {allocated} bytes allocated: the zero chunks were written ({line})"
    );

    // 2. 1 MiB changed in the middle of the source's noise; a re-run by checksums moves the
    // one chunk: hashes cross for the rest. (node-b reads its destination for its hashes:
    // the kernel names the loop device's file by its path on this machine, which is not
    // beneath the simulated host root, so the agent has no witness to trust a kept manifest
    // by; the real-node tier shows that part.)
    let changed = 12 * CHUNK + (1 << 20);
    let patch = noise(99, 1 << 20);
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&src_dev.dev)?;
        f.seek(SeekFrom::Start(changed))?;
        f.write_all(&patch)?;
        f.sync_all()?;
    }
    data[changed as usize..changed as usize + patch.len()].copy_from_slice(&patch);
    block_job(
        &nodes,
        "again",
        "  overwrite: IfChanged\n  compare: Checksum\n",
    )?;
    let held = hold(&nodes, "again", ends())?;
    nodes.succeeded("again", Duration::from_secs(120))?;
    drop(held);
    let line = copied_line(&nodes, "again")?;
    ensure!(
        field(&line, "written") == Some("1"),
        "the re-run wrote other than the one changed chunk: {line}"
    );
    let crossed = nodes.metric(
        "node-b",
        "ferry_agent_network_bytes_total",
        &[("direction", "received"), ("copyjob", "again")],
    )?;
    ensure!(
        (1 << 20..=CHUNK).contains(&(crossed as u64)),
        "{crossed} bytes crossed for a re-run with one changed chunk ({line})"
    );
    let got = read_all(&dst_img)?;
    ensure!(
        got == data,
        "the re-run's destination differs from the source from chunk {:?} ({line})",
        first_difference(&got, &data)
    );
    Ok(())
}
