//! A CopyJob's life beyond the happy path, on the real control plane with agents as
//! processes: a tree on a shared root split across two agents; suspend and resume; a job
//! deleted while it copies. Agents run with a test-only per-file delay so the tests can act
//! while a copy runs; every wait is on a status field, never a fixed sleep.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{
    assert_same_tree, http_get, is_root, merge_patch, metric, BindMount, ControlPlane, PACED,
};

const NODES: [&str; 2] = ["node-a", "node-b"];

/// `dirs` directories of `per_dir` files, with their own modes and mtimes, a symlink and
/// a hard-linked pair. Returns the regular file names.
fn make_tree(root: &Path, dirs: usize, per_dir: usize) -> Result<Vec<PathBuf>> {
    let mut names = Vec::new();
    for d in 0..dirs {
        let dir = root.join(format!("dir{d:02}"));
        std::fs::create_dir_all(dir.join("sub"))?;
        for f in 0..per_dir {
            let rel = if f % 5 == 0 {
                PathBuf::from(format!("dir{d:02}/sub/f{f:03}"))
            } else {
                PathBuf::from(format!("dir{d:02}/f{f:03}"))
            };
            let body: Vec<u8> = (0..(d * 311 + f * 97) % 5000)
                .map(|i| (i * 13 + f + d) as u8)
                .collect();
            std::fs::write(root.join(&rel), body)?;
            names.push(rel);
        }
        std::os::unix::fs::symlink("../f001", dir.join("sub/link"))?;
        std::fs::set_permissions(dir.join("sub"), std::fs::Permissions::from_mode(0o750))?;
        set_mtime(&dir.join("sub"), 1_600_000_000 + d as i64)?;
        set_mtime(&dir, 1_500_000_000 + d as i64)?;
    }
    std::fs::write(root.join("linked"), b"two names, one inode")?;
    std::fs::hard_link(root.join("linked"), root.join("dir00/linked-too"))?;
    names.push("linked".into());
    names.push("dir00/linked-too".into());
    set_mtime(root, 1_400_000_000)?;
    Ok(names)
}

fn set_mtime(path: &Path, secs: i64) -> Result<()> {
    let out = Command::new("touch")
        .arg("-h")
        .arg("-d")
        .arg(format!("@{secs}.123456789"))
        .arg(path)
        .output()?;
    ensure!(out.status.success(), "touch {}", path.display());
    Ok(())
}

/// Regular files under `root` (relative paths), and the staging names among all entries.
fn files_and_staging(root: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let (mut files, mut staging) = (Vec::new(), Vec::new());
    for rel in ferry_e2e::tree_meta(root)?.into_keys() {
        let name = rel.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| n.starts_with(".ferry-") && n.ends_with(".tmp")) {
            staging.push(rel.clone());
        }
        let is_file = std::fs::symlink_metadata(root.join(&rel))?.is_file();
        if is_file {
            files.push(rel);
        }
    }
    Ok((files, staging))
}

/// `cd DST && xxh128sum -c MANIFEST`, and how many times each path is listed.
fn check_manifest(manifest: &Path, dst: &Path) -> Result<BTreeMap<String, usize>> {
    let out = Command::new("xxh128sum")
        .args(["--quiet", "-c"])
        .arg(manifest)
        .current_dir(dst)
        .output()
        .context("run xxh128sum")?;
    ensure!(
        out.status.success(),
        "manifest {} does not check: {}{}",
        manifest.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut listed = BTreeMap::new();
    for line in std::fs::read_to_string(manifest)?.lines() {
        let (_, path) = line
            .split_once("  ")
            .context("manifest line without a path")?;
        *listed.entry(path.to_string()).or_insert(0) += 1;
    }
    Ok(listed)
}

fn ensure_listed_once(listed: &BTreeMap<String, usize>, names: &[PathBuf]) -> Result<()> {
    for n in names {
        let n = n.to_string_lossy();
        ensure!(
            listed.get(n.as_ref()) == Some(&1),
            "{n} is listed {:?} times in the manifest",
            listed.get(n.as_ref())
        );
    }
    ensure!(
        listed.len() == names.len(),
        "the manifest lists extra paths"
    );
    Ok(())
}

fn files_done(cp: &ControlPlane, name: &str) -> Result<i64> {
    Ok(cp
        .get(
            &format!("copyjob/{name}"),
            "default",
            "{.status.progress.filesDone}",
        )?
        .parse()
        .unwrap_or(0))
}

#[test]
fn a_tree_on_a_shared_root_is_split_across_two_agents_and_equals_the_source() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    if !is_root() {
        eprintln!(
            "skipped: a shared root is a bind mount into both nodes' host roots (needs root)"
        );
        return Ok(());
    }
    cp.install_crds()?;
    let (_ferry, hosts) =
        cp.start_ferry_with(&NODES, &[("FERRY_FAULT_FILE_DELAY_MS", "5"), PACED])?;
    // One filesystem, mounted at /srv/shared on both nodes (NFS on a real cluster).
    let shared = cp.dir().join("nfs");
    std::fs::create_dir_all(&shared)?;
    let _mounts: Vec<BindMount> = NODES
        .iter()
        .map(|n| BindMount::new(&shared, &hosts.join(n).join("srv/shared")))
        .collect::<Result<_>>()?;
    let names = make_tree(&shared.join("src"), 16, 25)?;
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: nfs\nspec:\n  path: /srv/shared\n  shared: true\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: split\n  namespace: default\nspec:\n  source: {root: nfs, path: src}\n  destination: {root: nfs, path: copy}\n  parallelism: {maxAgents: 2, workersPerAgent: 1}\n",
    )?;
    cp.wait_succeeded("default", "split", 180)?;
    // A dry run of the same job reports the split it would make, and copies nothing.
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: split-plan\n  namespace: default\nspec:\n  source: {root: nfs, path: src}\n  destination: {root: nfs, path: planned}\n  parallelism: {maxAgents: 2}\n  dryRun: true\n",
    )?;
    cp.wait_succeeded("default", "split-plan", 60)?;
    let plan = cp.get(
        "copyjob/split-plan",
        "default",
        "{.status.plan.shards} {.status.plan.nodes} {.status.plan.files}",
    )?;
    ensure!(
        plan == format!("9 [\"node-a\",\"node-b\"] {}", names.len() - 1),
        "dry-run plan: {plan}"
    );
    ensure!(!shared.join("planned").exists(), "the dry run copied");

    assert_same_tree(&shared.join("src"), &shared.join("copy"))?;
    // Both agents did part of the work, and the parts add up to every file once.
    let shards = cp.get(
        "copyjob/split",
        "default",
        r#"{range .status.shards[*]}{.part}{" "}{.node}{" "}{.state}{" "}{.filesDone}{"\n"}{end}"#,
    )?;
    let mut by_node: BTreeMap<String, i64> = BTreeMap::new();
    let mut parts = 0;
    for line in shards.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        ensure!(
            f.len() == 4 && f[2] == "Succeeded",
            "shard not done: {line}"
        );
        if f[0] != "directories" {
            parts += 1;
            *by_node.entry(f[1].to_string()).or_default() += f[3].parse::<i64>()?;
        }
    }
    ensure!(parts == 8, "expected 8 parts, status has:\n{shards}");
    // No shard was handed out twice: across both agents' logs, each started exactly once.
    let logs: String = NODES
        .iter()
        .map(|n| std::fs::read_to_string(cp.dir().join(format!("agent-{n}.log"))))
        .collect::<std::io::Result<_>>()?;
    for id in (0..8)
        .map(|i| i.to_string())
        .chain(["directories".to_string()])
    {
        let starts = logs
            .lines()
            .filter(|l| l.contains("starting shard") && l.contains("job=default/split "))
            .filter(|l| l.contains(&format!(" shard={id} ")))
            .count();
        ensure!(starts == 1, "shard {id} started {starts} times:\n{logs}");
    }
    ensure!(
        by_node.len() == 2 && by_node.values().all(|&n| n > 0),
        "both agents should have copied files: {by_node:?}\n{shards}"
    );
    let total: i64 = by_node.values().sum();
    // Two of the names are one hard-linked file.
    ensure!(
        total == names.len() as i64 - 1,
        "the parts committed {total} files; the tree has {}",
        names.len() - 1
    );
    // Each agent's /metrics counted what it copied; together, the tree.
    let mut metric_files = 0.0;
    for node in NODES {
        let port = cp.agent_port(node)?;
        for path in ["/healthz", "/readyz"] {
            let r = http_get(port, path).unwrap_or_default();
            ensure!(ferry_e2e::http_code(&r) == "200", "{node} {path}: {r}");
        }
        let m = http_get(port, "/metrics").unwrap_or_default();
        let files = metric(
            &m,
            "ferry_agent_files_total",
            &[("result", "copied"), ("node", node)],
        )
        .with_context(|| format!("{node} /metrics lacks the files counter:\n{m}"))?;
        ensure!(files > 0.0, "{node} exported no copied files:\n{m}");
        metric_files += files;
        let bytes: f64 = ["copy_file_range", "read_write", "reflink"]
            .iter()
            .filter_map(|s| metric(&m, "ferry_agent_bytes_copied_total", &[("strategy", s)]))
            .sum();
        ensure!(bytes > 0.0, "{node} exported no copied bytes:\n{m}");
        // The job's progress gauge on this agent: its shards' committed files, and the
        // total once they finished (they all did).
        let job = [("copyjob_namespace", "default"), ("copyjob", "split")];
        let (done, total) = (
            metric(&m, "ferry_agent_job_bytes_done", &job),
            metric(&m, "ferry_agent_job_bytes_total", &job),
        );
        ensure!(
            done.is_some_and(|d| d > 0.0) && done == total,
            "{node}: job gauges done {done:?}, total {total:?}:\n{m}"
        );
    }
    ensure!(
        metric_files == (names.len() - 1) as f64,
        "the agents' metrics count {metric_files} files, the tree has {}",
        names.len() - 1
    );
    let manifest = cp.get("copyjob/split", "default", "{.status.manifest}")?;
    let listed = check_manifest(&shared.join(&manifest), &shared.join("copy"))?;
    ensure_listed_once(&listed, &names)?;
    let leftovers: Vec<_> = std::fs::read_dir(shared.join(".ferry"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".part-"))
        .collect();
    ensure!(leftovers.is_empty(), "part manifests left: {leftovers:?}");
    Ok(())
}

#[test]
fn a_suspended_job_stops_mid_copy_and_resumes_to_an_identical_tree() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) =
        cp.start_ferry_with(&NODES, &[("FERRY_FAULT_FILE_DELAY_MS", "25"), PACED])?;
    let root = hosts.join("node-a/srv/data");
    let names = make_tree(&root.join("src"), 10, 40)?;
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: pausing\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n  parallelism: {workersPerAgent: 2}\n",
    )?;
    // A copy that runs for more than a few seconds gets its totals counted: PROGRESS and
    // ETA fill in while it runs.
    let progress = cp.wait_until(
        "copyjob/pausing",
        "default",
        "{.status.progress.percent} {.status.progress.eta} {.status.progress.filesTotal}",
        Duration::from_secs(120),
        |v| v.split(' ').all(|f| !f.is_empty()),
    )?;
    ensure!(
        progress.ends_with(&format!(" {}", names.len() - 1)),
        "filesTotal should count the tree's {} files: {progress}",
        names.len() - 1
    );
    let table = cp.kubectl_ok(&["get", "copyjob", "pausing", "-n", "default"])?;
    let row = table.lines().nth(1).unwrap_or_default();
    ensure!(
        table.contains("PROGRESS") && table.contains("ETA") && row.contains('%'),
        "kubectl get shows no progress:\n{table}"
    );
    cp.kubectl_ok(&merge_patch(
        "copyjob/pausing",
        "default",
        false,
        r#"{"spec":{"suspend":true}}"#,
    ))?;
    // The agent stops at a file boundary and says so; the job is Suspended.
    cp.wait_until(
        "copyjob/pausing",
        "default",
        "{.status.phase} {.status.shards[0].state}",
        Duration::from_secs(60),
        |v| v == "Suspended Suspended",
    )?;
    let copy = root.join("copy");
    let (present, staging) = files_and_staging(&copy)?;
    ensure!(
        staging.is_empty(),
        "staging names while suspended: {staging:?}"
    );
    ensure!(
        !present.is_empty() && present.len() < names.len(),
        "suspend should stop the copy part-way: {} of {} files present",
        present.len(),
        names.len()
    );
    for rel in &present {
        ensure!(
            std::fs::read(copy.join(rel))? == std::fs::read(root.join("src").join(rel))?,
            "{} is not a whole copy of its source",
            rel.display()
        );
    }
    let before_resume = files_done(&cp, "pausing")?;
    cp.kubectl_ok(&merge_patch(
        "copyjob/pausing",
        "default",
        false,
        r#"{"spec":{"suspend":false}}"#,
    ))?;
    cp.wait_succeeded("default", "pausing", 180)?;
    assert_same_tree(&root.join("src"), &copy)?;
    let manifest = cp.get("copyjob/pausing", "default", "{.status.manifest}")?;
    ensure_listed_once(&check_manifest(&root.join(&manifest), &copy)?, &names)?;
    // Progress went on from where it stopped instead of starting over.
    let after = files_done(&cp, "pausing")?;
    // (Two of the names are one hard-linked file.)
    ensure!(
        before_resume > 0 && after == names.len() as i64 - 1,
        "filesDone {after} after resuming from {before_resume}; the tree has {} files",
        names.len() - 1
    );
    Ok(())
}

/// A suspend is heard inside one large file, not only between files: a job suspended
/// while its agent hashes an 8 TiB sparse file (verify: Checksum hashes the holes as
/// zeros) is Suspended within seconds, with nothing of that file visible. (Before, the
/// agent finished the file first: hours.)
#[test]
fn a_job_suspended_inside_an_8_tib_sparse_file_stops_within_seconds() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry_with(&NODES, &[])?;
    let root = hosts.join("node-a/srv/data");
    let src = root.join("src");
    std::fs::create_dir_all(&src)?;
    let huge = std::fs::File::create(src.join("huge"))?;
    {
        use std::os::unix::fs::FileExt;
        huge.write_all_at(&[7u8; 1 << 20], 0)?;
        huge.set_len(8 << 40)?;
    }
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: sparse\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n  verify: Checksum\n",
    )?;
    // The agent is inside the file once it exists in the copy's staging directory.
    let inside = || {
        std::fs::read_dir(&root).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(".ferry-")
                    && e.path().join("huge").exists()
            })
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !inside() {
        ensure!(
            std::time::Instant::now() < deadline,
            "the agent never started on the sparse file"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cp.kubectl_ok(&merge_patch(
        "copyjob/sparse",
        "default",
        false,
        r#"{"spec":{"suspend":true}}"#,
    ))?;
    cp.wait_until(
        "copyjob/sparse",
        "default",
        "{.status.phase} {.status.shards[0].state}",
        Duration::from_secs(30),
        |v| v == "Suspended Suspended",
    )
    .context("the suspend was not heard inside the file")?;
    ensure!(
        !root.join("copy/huge").exists(),
        "a partial copy of the sparse file is visible"
    );
    Ok(())
}

#[test]
fn a_job_deleted_mid_copy_stops_before_it_is_gone_and_leaves_only_whole_files() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) =
        cp.start_ferry_with(&NODES, &[("FERRY_FAULT_FILE_DELAY_MS", "10"), PACED])?;
    let root = hosts.join("node-b/srv/data");
    let names = make_tree(&root.join("src"), 10, 40)?;
    // The destination exists and holds a user's file that is not in the source.
    let copy = root.join("copy");
    std::fs::create_dir_all(&copy)?;
    std::fs::write(copy.join("users-notes.txt"), b"not Ferry's")?;
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-b}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: doomed\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n  parallelism: {workersPerAgent: 2}\n",
    )?;
    cp.wait_until(
        "copyjob/doomed",
        "default",
        "{.status.progress.filesDone}",
        Duration::from_secs(120),
        |v| v.parse::<i64>().unwrap_or(0) >= 40,
    )?;
    cp.kubectl_ok(&[
        "delete",
        "copyjob",
        "doomed",
        "-n",
        "default",
        "--wait=false",
    ])?;
    cp.wait_until(
        "copyjob/doomed",
        "default",
        "{.metadata.name}",
        Duration::from_secs(60),
        str::is_empty,
    )?;
    // The finalizer held the job until its agent had stopped writing.
    let log = std::fs::read_to_string(cp.dir().join("agent-node-b.log"))?;
    ensure!(
        log.contains("state=\"Stopped\"") || log.contains("state=Stopped"),
        "the job was gone before its agent reported the shard stopped:\n{}",
        cp.log_tail("agent-node-b.log", 15)
    );
    let (present, staging) = files_and_staging(&copy)?;
    ensure!(staging.is_empty(), "staging names left: {staging:?}");
    ensure!(
        std::fs::read(copy.join("users-notes.txt"))? == b"not Ferry's",
        "the user's file changed"
    );
    let copied: Vec<_> = present
        .iter()
        .filter(|p| p.as_os_str() != "users-notes.txt")
        .collect();
    ensure!(
        !copied.is_empty() && copied.len() < names.len(),
        "deletion should stop the copy part-way: {} of {} files present",
        copied.len(),
        names.len()
    );
    for rel in copied {
        ensure!(
            std::fs::read(copy.join(rel))? == std::fs::read(root.join("src").join(rel))?,
            "{} is not a whole copy of its source",
            rel.display()
        );
    }
    Ok(())
}
