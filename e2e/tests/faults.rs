//! Faults, on a real control plane with the operator and agents as processes: an agent
//! that stops heartbeating loses its shared work to another agent, which resumes it; the
//! stale agent, when it comes back, commits nothing more; node-local work waits for its
//! node and then fails `NodeUnavailable`; a full destination fails `DestinationFull` and
//! says how much more is needed; a source partly unreadable fails `PartiallyFailed` with
//! the rest copied.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{
    assert_same_tree, http_get, metric, staging_leftovers, BindMount, ControlPlane, Tmpfs, PACED,
};

/// Agents renew every second and lose their work after 3 s without renewal.
const LEASE: (&str, &str) = ("FERRY_LEASE_SECONDS", "3");

/// `n` files of `size` bytes in `dirs` directories under `root`.
fn make_tree(root: &Path, dirs: usize, n: usize, size: usize) -> Result<()> {
    for i in 0..n {
        let dir = root.join(format!("d{}", i % dirs));
        std::fs::create_dir_all(&dir)?;
        let body: Vec<u8> = (0..size).map(|b| (b * 31 + i * 7) as u8).collect();
        std::fs::write(dir.join(format!("f{i}")), body)?;
    }
    Ok(())
}

/// Relative paths of the regular files under `root` (none if it does not exist).
fn files(root: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    if !root.exists() {
        return Ok(out);
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(e.path().strip_prefix(root)?.to_path_buf());
            }
        }
    }
    Ok(out)
}

fn copied_files(cp: &ControlPlane, node: &str) -> Result<f64> {
    let m = http_get(cp.agent_port(node)?, "/metrics").unwrap_or_default();
    metric(&m, "ferry_agent_files_total", &[("result", "copied")])
        .with_context(|| format!("{node} exports no files counter"))
}

/// The job's manifest (under `root`) lists `count` files once each, and `xxh128sum -c`
/// run in the copy `copy` accepts it.
fn check_manifest(
    cp: &ControlPlane,
    root: &Path,
    copy: &Path,
    job: &str,
    count: usize,
) -> Result<()> {
    let manifest = cp.get(&format!("copyjob/{job}"), "default", "{.status.manifest}")?;
    let text = std::fs::read_to_string(root.join(&manifest))
        .with_context(|| format!("read the manifest {manifest}"))?;
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once("  ").map(|(_, n)| n))
        .collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    ensure!(
        names.len() == count && unique.len() == count,
        "the manifest has {} lines for {} names; the tree has {count} files",
        names.len(),
        unique.len()
    );
    let out = std::process::Command::new("xxh128sum")
        .args(["-c", "--quiet"])
        .arg(root.join(&manifest))
        .current_dir(copy)
        .output()?;
    ensure!(
        out.status.success(),
        "xxh128sum -c: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

#[test]
fn a_lost_agents_shared_work_moves_to_another_agent_and_the_stale_agent_commits_nothing(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    cp.kubectl_ok(&["create", "namespace", "ferry-system"])?;
    let hosts = cp.dir().join("hosts");
    for node in ["node-a", "node-b"] {
        cp.add_node(node)?;
    }
    // One filesystem seen by both nodes, as NFS would be.
    let shared = cp.dir().join("nfs");
    make_tree(&shared.join("src"), 10, 300, 2000)?;
    let _mounts = ["node-a", "node-b"]
        .iter()
        .map(|n| BindMount::new(&shared, &hosts.join(n).join("srv/shared")))
        .collect::<Result<Vec<_>>>()?;
    let _operator = cp.spawn_operator("operator", &[])?;
    // The job goes to node-a (the first eligible node). node-b's agent starts a minute
    // before each file, so that until it is restarted, every file that appears was
    // committed by node-a.
    let slow = ("FERRY_FAULT_FILE_DELAY_MS", "20");
    let mut agent_a = cp.spawn_agent("node-a", &[LEASE, slow, PACED])?;
    let mut agent_b = cp.spawn_agent("node-b", &[LEASE, ("FERRY_FAULT_FILE_DELAY_MS", "60000")])?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: nfs\nspec:\n  path: /srv/shared\n  shared: true\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: moving\n  namespace: default\nspec:\n  source: {root: nfs, path: src}\n  destination: {root: nfs, path: copy}\n  verify: Checksum\n  parallelism: {workersPerAgent: 2}\n")?;
    cp.wait_until(
        "copyjob/moving",
        "default",
        "{.status.shards[0].node}/{.status.shards[0].filesDone}",
        Duration::from_secs(60),
        |v| {
            v.split_once('/')
                .is_some_and(|(n, f)| n == "node-a" && f.parse::<u32>().unwrap_or(0) >= 30)
        },
    )?;
    // node-a hangs (a lost node: the process is there, its heartbeat is not).
    agent_a.signal("STOP")?;
    let copy = shared.join("copy");
    // The copy is still under its staging name: every file on the volume but the
    // source's and the manifests, by name (unique in this tree), finished ones only: inside
    // a staging directory files are written under their final names, data first and times
    // last, so one being written has neither its source's size nor its mtime yet.
    let source: std::collections::BTreeMap<PathBuf, (u64, i64)> = files(&shared.join("src"))?
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(shared.join("src").join(&p))?;
            use std::os::unix::fs::MetadataExt;
            Ok((
                p.file_name().map(PathBuf::from).unwrap_or_default(),
                (m.size(), m.mtime_nsec() + m.mtime() * 1_000_000_000),
            ))
        })
        .collect::<Result<_>>()?;
    let copied = |shared: &Path| -> Result<BTreeSet<PathBuf>> {
        let mut out = BTreeSet::new();
        for p in files(shared)? {
            if p.starts_with("src") || p.starts_with(".ferry") {
                continue;
            }
            let name = p.file_name().map(PathBuf::from).unwrap_or_default();
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(shared.join(&p))?;
            let here = (m.size(), m.mtime_nsec() + m.mtime() * 1_000_000_000);
            if source.get(&name) == Some(&here) {
                out.insert(name);
            }
        }
        Ok(out)
    };
    let before = copied(&shared)?;
    ensure!(
        !before.is_empty(),
        "nothing was committed before node-a hung"
    );
    // Its lease expires and the operator gives the shard to node-b, at a new epoch.
    cp.wait_until(
        "copyjob/moving",
        "default",
        "{.status.shards[0].node}/{.status.shards[0].epoch}",
        Duration::from_secs(30),
        |v| v == "node-b/2",
    )?;
    ensure!(
        cp.event_reasons("default", "moving")?
            .contains("Reassigned"),
        "no Reassigned event"
    );
    // node-a comes back: it must notice its heartbeat is stale and commit nothing more,
    // although its copy was mid-way and its workers wake up with files in hand.
    agent_a.signal("CONT")?;
    std::thread::sleep(Duration::from_secs(2));
    let after = copied(&shared)?;
    ensure!(
        after == before,
        "the stale agent committed {} files after it came back",
        after.difference(&before).count()
    );
    let log = std::fs::read_to_string(cp.dir().join("agent-node-a.log"))?;
    ensure!(
        log.contains("heartbeat not renewed") || log.contains("given to another node or epoch"),
        "node-a did not say why it stopped:\n{}",
        cp.log_tail("agent-node-a.log", 20)
    );
    // node-a goes for good; node-b's agent restarts at full speed and resumes the shard.
    agent_a.kill()?;
    agent_b.kill()?;
    let _agent_b = cp.spawn_agent("node-b", &[LEASE])?;
    cp.wait_succeeded("default", "moving", 120)?;
    let shard = cp.get(
        "copyjob/moving",
        "default",
        "{.status.shards[0].node}/{.status.shards[0].epoch}/{.status.shards[0].filesDone}",
    )?;
    ensure!(
        shard == "node-b/2/300",
        "the shard should end on node-b at epoch 2 with all 300 files: {shard}"
    );
    assert_same_tree(&shared.join("src"), &copy)?;
    ensure!(staging_leftovers(&copy)?.is_empty(), "staging names left");
    // node-b copied only what node-a had not committed.
    let by_b = copied_files(&cp, "node-b")?;
    ensure!(
        by_b as usize == 300 - before.len(),
        "node-b copied {by_b} files; {} were missing when it took over",
        300 - before.len()
    );
    check_manifest(&cp, &shared, &copy, "moving", 300)?;
    Ok(())
}

#[test]
fn node_local_work_waits_for_its_node_then_fails_node_unavailable() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    cp.kubectl_ok(&["create", "namespace", "ferry-system"])?;
    let root = cp.add_node("node-a")?.join("srv/data");
    make_tree(&root.join("src"), 4, 200, 100)?;
    let _operator = cp.spawn_operator("operator", &[("FERRY_NODE_UNAVAILABLE_AFTER", "4")])?;
    let slow = ("FERRY_FAULT_FILE_DELAY_MS", "50");
    let mut agent = cp.spawn_agent("node-a", &[LEASE, slow, PACED])?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: stranded\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n")?;
    cp.wait_until(
        "copyjob/stranded",
        "default",
        "{.status.shards[0].state}",
        Duration::from_secs(60),
        |v| v == "Running",
    )?;
    agent.kill()?;
    // First it waits for the node, saying so.
    cp.wait_until(
        "copyjob/stranded",
        "default",
        "{.status.conditions[?(@.type==\"Scheduled\")].reason}",
        Duration::from_secs(30),
        |v| v == "WaitingForNode",
    )?;
    // Then it gives up, with the reason, an event and the message in status.
    cp.wait_until(
        "copyjob/stranded",
        "default",
        "{.status.phase}/{.status.conditions[?(@.type==\"Failed\")].reason}",
        Duration::from_secs(30),
        |v| v == "Failed/NodeUnavailable",
    )?;
    let message = cp.get(
        "copyjob/stranded",
        "default",
        "{.status.failures[0].message}",
    )?;
    ensure!(
        message.contains("node-a") && message.contains("re-create the job"),
        "the failure does not say what happened and what to do: {message}"
    );
    ensure!(
        cp.event_reasons("default", "stranded")?
            .contains("NodeUnavailable"),
        "no NodeUnavailable event"
    );
    // The agent that comes back does not run the failed shard (its epoch moved on).
    let epoch = cp.get("copyjob/stranded", "default", "{.status.shards[0].epoch}")?;
    ensure!(epoch == "2", "the failed shard's epoch is {epoch}, not 2");
    let _agent = cp.spawn_agent("node-a", &[LEASE])?;
    std::thread::sleep(Duration::from_secs(4));
    let log = std::fs::read_to_string(cp.dir().join("agent-node-a.log"))?;
    let starts = log.matches("starting shard").count();
    ensure!(
        starts == 1,
        "the shard was started {starts} times; the returning agent must leave it failed"
    );
    let phase = cp.get("copyjob/stranded", "default", "{.status.phase}")?;
    ensure!(phase == "Failed", "the job is {phase} again");
    Ok(())
}

#[test]
fn a_full_destination_fails_destination_full_and_says_how_much_more_is_needed() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_procs, hosts) = cp.start_ferry(&["node-a"])?;
    let data = hosts.join("node-a/srv/data");
    // 8 MiB of files for a 2 MiB volume.
    make_tree(&data.join("src"), 2, 16, 512 * 1024)?;
    let small = hosts.join("node-a/srv/small");
    let _tmpfs = Tmpfs::mount(&small, "size=2m")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: small\nspec:\n  path: /srv/small\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: overflow\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: small, path: copy}\n")?;
    cp.wait_until(
        "copyjob/overflow",
        "default",
        "{.status.phase}/{.status.conditions[?(@.type==\"Failed\")].reason}",
        Duration::from_secs(60),
        |v| v == "Failed/DestinationFull",
    )?;
    let message = cp.get(
        "copyjob/overflow",
        "default",
        "{.status.conditions[?(@.type==\"Failed\")].message}",
    )?;
    ensure!(
        message.contains("more are needed") && message.contains("free"),
        "the condition does not say how much more is needed: {message}\n{}",
        cp.get("copyjob/overflow", "default", "{.status}")?
    );
    ensure!(
        cp.event_reasons("default", "overflow")?
            .contains("DestinationFull"),
        "no DestinationFull event"
    );
    // What is there is whole: every file at its final name equals its source.
    let copy = small.join("copy");
    let there = files(&copy)?;
    ensure!(
        !there.is_empty() && there.len() < 16,
        "{} files copied",
        there.len()
    );
    for rel in &there {
        ensure!(
            std::fs::read(copy.join(rel))? == std::fs::read(data.join("src").join(rel))?,
            "{} is partial",
            rel.display()
        );
    }
    ensure!(staging_leftovers(&copy)?.is_empty(), "staging names left");
    Ok(())
}

#[test]
fn unreadable_and_changing_source_files_fail_partially_failed_and_the_rest_is_copied() -> Result<()>
{
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    cp.kubectl_ok(&["create", "namespace", "ferry-system"])?;
    let root = cp.add_node("node-a")?.join("srv/data");
    make_tree(&root.join("src"), 3, 30, 100)?;
    // Files of another user that only they may read; the agent runs as root without
    // CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, as on an NFS export with root_squash.
    use std::os::unix::fs::PermissionsExt;
    let private = root.join("src/d1/private");
    std::fs::create_dir_all(&private)?;
    for name in ["a", "b"] {
        std::fs::write(private.join(name), "secret")?;
        std::fs::set_permissions(private.join(name), std::fs::Permissions::from_mode(0o600))?;
        std::os::unix::fs::chown(private.join(name), Some(1000), Some(1000))?;
    }
    let _operator = cp.spawn_operator("operator", &[])?;
    // And one file that changes each time it is copied (the test-only hook appends a byte).
    let caps = ferry_e2e::agent_capabilities()?;
    let fewer: Vec<&str> = caps
        .iter()
        .map(String::as_str)
        .filter(|c| *c != "DAC_OVERRIDE")
        .collect();
    let wrapper = ferry_e2e::setpriv_holding(&fewer);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let _agent =
        cp.spawn_agent_under("node-a", &[("FERRY_FAULT_CHANGE_SOURCE", "f7")], &wrapper)?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: partial\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n")?;
    cp.wait_until(
        "copyjob/partial",
        "default",
        "{.status.phase}/{.status.conditions[?(@.type==\"Failed\")].reason}",
        Duration::from_secs(60),
        |v| v == "Failed/PartiallyFailed",
    )?;
    let failures = cp.get(
        "copyjob/partial",
        "default",
        "{range .status.failures[*]}{.path}:{.reason};{end}",
    )?;
    let mut listed: Vec<&str> = failures.split(';').filter(|f| !f.is_empty()).collect();
    listed.sort_unstable();
    ensure!(
        listed
            == [
                "d1/f7:SourceChanged",
                "d1/private/a:PermissionDenied",
                "d1/private/b:PermissionDenied"
            ],
        "status.failures should list the two unreadable files and the changing one: {failures}"
    );
    let message = cp.get(
        "copyjob/partial",
        "default",
        "{.status.conditions[?(@.type==\"Failed\")].message}",
    )?;
    ensure!(
        message.contains("29 files were copied")
            && message.contains("PermissionDenied 2")
            && message.contains("SourceChanged 1"),
        "the condition does not say what failed and what was copied: {message}"
    );
    ensure!(
        cp.event_reasons("default", "partial")?
            .contains("PartiallyFailed"),
        "no PartiallyFailed event"
    );
    // Everything readable was copied.
    let copy = root.join("copy");
    for rel in files(&root.join("src"))? {
        let there = copy.join(&rel);
        if rel.starts_with("d1/private") || rel.ends_with("f7") {
            ensure!(!there.exists(), "{} was copied", rel.display());
        } else {
            ensure!(
                std::fs::read(&there)? == std::fs::read(root.join("src").join(&rel))?,
                "{} was not copied",
                rel.display()
            );
        }
    }
    Ok(())
}

/// `engine/tests/fuse/eiofs.py` serving `root` at `at` (reads of `bad-*` files fail with
/// EIO, `flaky-*` files fail through their first open only); unmounted when dropped.
struct Eiofs(PathBuf, std::process::Child);

impl Eiofs {
    /// `None` (after saying why) where FUSE cannot be used.
    fn mount(root: &Path, at: &Path) -> Result<Option<Self>> {
        let script = ferry_e2e::repo_root().join("engine/tests/fuse/eiofs.py");
        let usable = Path::new("/dev/fuse").exists()
            && std::process::Command::new("/usr/bin/python3")
                .args(["-c", "import fusepy"])
                .status()
                .is_ok_and(|s| s.success());
        if !usable {
            eprintln!(
                "skipped: no /dev/fuse or no python3-fusepy (apt install python3-fusepy fuse3)"
            );
            return Ok(None);
        }
        std::fs::create_dir_all(at)?;
        let child = std::process::Command::new("/usr/bin/python3")
            .arg(script)
            .arg(root)
            .arg(at)
            .spawn()?;
        let mounted = Self(at.to_path_buf(), child);
        let parent = std::fs::metadata(at.parent().context("mount point")?)?;
        use std::os::unix::fs::MetadataExt;
        ferry_e2e::wait_for("eiofs to mount", Duration::from_secs(10), || {
            std::fs::metadata(at).is_ok_and(|m| m.dev() != parent.dev())
        })?;
        Ok(Some(mounted))
    }
}

impl Drop for Eiofs {
    fn drop(&mut self) {
        // Lazily: an agent may still hold the root open.
        let _ = std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.0)
            .status();
        let _ = self.1.kill();
        let _ = self.1.wait();
    }
}

#[test]
fn a_source_with_read_errors_fails_io_error_with_the_paths_after_one_rewrite() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_procs, hosts) = cp.start_ferry(&["node-a"])?;
    // The real files, and the failing view of them the node has as its source volume.
    let real = cp.dir().join("disk");
    make_tree(&real.join("src"), 2, 10, 3000)?;
    std::fs::write(real.join("src/d0/bad-sector"), vec![7u8; 5000])?;
    std::fs::write(real.join("src/d1/flaky-cable"), vec![9u8; 5000])?;
    let Some(_fuse) = Eiofs::mount(&real, &hosts.join("node-a/srv/eio"))? else {
        return Ok(());
    };
    std::fs::create_dir_all(hosts.join("node-a/srv/data"))?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: eio\nspec:\n  path: /srv/eio\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n  readOnly: true\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: eio\n  namespace: default\nspec:\n  source: {root: eio, path: src}\n  destination: {root: data, path: copy}\n  verify: Checksum\n")?;
    cp.wait_until(
        "copyjob/eio",
        "default",
        "{.status.phase}/{.status.conditions[?(@.type==\"Failed\")].reason}",
        Duration::from_secs(60),
        |v| v == "Failed/IOError",
    )?;
    let failures = cp.get(
        "copyjob/eio",
        "default",
        "{range .status.failures[*]}{.path}:{.reason};{end}",
    )?;
    ensure!(
        failures == "d0/bad-sector:IOError;",
        "status.failures should list the unreadable file once: {failures}"
    );
    ensure!(
        cp.event_reasons("default", "eio")?.contains("IOError"),
        "no IOError event"
    );
    // The flaky file was read again and copied; the bad one is nowhere; the rest is whole.
    let copy = hosts.join("node-a/srv/data/copy");
    ensure!(std::fs::read(copy.join("d1/flaky-cable"))? == vec![9u8; 5000]);
    ensure!(!copy.join("d0/bad-sector").exists(), "a partial bad file");
    for rel in files(&real.join("src"))? {
        if !rel.ends_with("bad-sector") {
            ensure!(
                std::fs::read(copy.join(&rel))? == std::fs::read(real.join("src").join(&rel))?,
                "{} differs",
                rel.display()
            );
        }
    }
    Ok(())
}

/// A root whose filesystem stops answering (an NFS server gone away; here a FUSE root whose
/// lookups never return) blocks the shards that open it, and nothing else: more such shards
/// than the agent's runtime has threads, and its heartbeat is still renewed and a job on a
/// healthy root still runs.
#[test]
fn roots_that_hang_on_open_stop_neither_the_heartbeat_nor_other_jobs() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    cp.kubectl_ok(&["create", "namespace", "ferry-system"])?;
    let node = cp.add_node("node-a")?;
    make_tree(&node.join("srv/data/src"), 2, 20, 100)?;
    let _operator = cp.spawn_operator("operator", &[])?;
    let _agent = cp.spawn_agent("node-a", &[LEASE])?;
    // Mounted after the agent started, so it is unmounted before the agent is stopped
    // (drops run in reverse): a process with threads blocked in a FUSE request cannot be
    // reaped until the filesystem goes away.
    let real = cp.dir().join("disk");
    std::fs::create_dir_all(&real)?;
    let Some(_fuse) = Eiofs::mount(&real, &node.join("srv/nfs"))? else {
        return Ok(());
    };
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    // The agent's runtime has 2 threads: 3 hung opens would stop it if they ran there.
    for i in 0..3 {
        cp.apply(&format!("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: gone-{i}\nspec:\n  path: /srv/nfs/hang-{i}\n  nodeSelector: {{ferry.dev/node: node-a}}\n  namespaces: {{names: [default]}}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: stuck-{i}\n  namespace: default\nspec:\n  source: {{root: gone-{i}, path: src}}\n  destination: {{root: data, path: out-{i}}}\n"))?;
    }
    for i in 0..3 {
        cp.wait_until(
            &format!("copyjob/stuck-{i}"),
            "default",
            "{.status.shards[0].node}",
            Duration::from_secs(60),
            |n| n == "node-a",
        )?;
    }
    let renewed = || {
        cp.get(
            "lease/ferry-agent-node-a",
            "ferry-system",
            "{.spec.renewTime}",
        )
    };
    let before = renewed()?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: healthy\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n")?;
    cp.wait_succeeded("default", "healthy", 60)?;
    assert_same_tree(&node.join("srv/data/src"), &node.join("srv/data/copy"))?;
    // Three leases (3 s each) later the heartbeat is still being renewed, and the stuck
    // jobs are still where they were (nothing gave up on them, or copied anything).
    std::thread::sleep(Duration::from_secs(9));
    let after = renewed()?;
    ensure!(
        after != before,
        "the heartbeat was not renewed ({before} -> {after})"
    );
    for i in 0..3 {
        let phase = cp.get(&format!("copyjob/stuck-{i}"), "default", "{.status.phase}")?;
        ensure!(phase != "Succeeded", "stuck-{i} is {phase}");
        ensure!(
            !node.join(format!("srv/data/out-{i}")).exists(),
            "out-{i} was made"
        );
    }
    Ok(())
}
