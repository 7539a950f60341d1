//! The memory cgroup this process is charged to: its limit, and how much of it is taken by
//! memory the kernel cannot reclaim.
//!
//! Why the agent asks: a file written to tmpfs (or ramfs) is charged to the memory cgroup
//! of the process that writes it, and without swap it cannot be reclaimed. A copy into a
//! memory-backed root therefore counts against the agent container's memory limit, and one
//! that crosses it gets the agent OOM-killed; worse, the pages stay charged to the pod after
//! the restart, so the new container is killed too, until the files are deleted or the pod
//! is. The agent refuses such a copy up front instead (see `daemon::shard`).
//!
//! cgroup v1 and v2 are both read. Inside a container the cgroup filesystem is mounted at
//! the container's own cgroup, so the path in /proc/self/cgroup is tried under the mount
//! first (a process on the host) and then the mount itself (a process in a container).

use std::path::{Path, PathBuf};

/// Beyond this a limit means "none": v1 reports an unlimited cgroup as the largest page
/// count in bytes (9223372036854771712).
const UNLIMITED: u64 = 1 << 60;

/// A memory cgroup with a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memcg {
    /// The lowest limit on the way to the root, in bytes.
    pub limit: u64,
    /// Charged memory the kernel cannot give back under pressure: anonymous memory and
    /// shmem/tmpfs pages (what is charged minus the file page cache).
    pub unreclaimable: u64,
}

impl Memcg {
    /// How much more unreclaimable memory fits before the limit.
    pub fn headroom(&self) -> u64 {
        self.limit.saturating_sub(self.unreclaimable)
    }

    /// This process's memory cgroup, if it has a limit. `None` when there is none, or when
    /// it cannot be read (no cgroup filesystem mounted): nothing to guard against then.
    pub fn own() -> Option<Memcg> {
        let procs = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        Self::find(Path::new("/sys/fs/cgroup"), &procs)
    }

    /// The cgroup `proc_cgroup` (the text of /proc/PID/cgroup) names, read under `mount`.
    fn find(mount: &Path, proc_cgroup: &str) -> Option<Memcg> {
        for line in proc_cgroup.lines() {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let rel = path.trim_start_matches('/');
            if controllers.split(',').any(|c| c == "memory") {
                let base = mount.join("memory");
                return candidates(&base, rel).find_map(|dir| v1(&dir));
            }
            if controllers.is_empty() && mount.join("cgroup.controllers").exists() {
                return candidates(mount, rel).find_map(|dir| v2(mount, &dir));
            }
        }
        None
    }
}

/// Where a cgroup at `rel` may be: under the mount (on the host), or the mount itself (a
/// container's own cgroup).
fn candidates(base: &Path, rel: &str) -> impl Iterator<Item = PathBuf> {
    let under = (!rel.is_empty()).then(|| base.join(rel));
    under.into_iter().chain([base.to_path_buf()])
}

/// A v1 memory cgroup: `hierarchical_memory_limit` in memory.stat is already the lowest
/// limit of it and its ancestors.
fn v1(dir: &Path) -> Option<Memcg> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let usage = std::fs::read_to_string(dir.join("memory.usage_in_bytes")).ok()?;
    parse_v1(&usage, &stat)
}

fn parse_v1(usage: &str, stat: &str) -> Option<Memcg> {
    let limit = key(stat, "hierarchical_memory_limit")?;
    if limit >= UNLIMITED {
        return None;
    }
    let usage: u64 = usage.trim().parse().ok()?;
    let file =
        key(stat, "total_active_file").unwrap_or(0) + key(stat, "total_inactive_file").unwrap_or(0);
    Some(Memcg {
        limit,
        unreclaimable: usage.saturating_sub(file),
    })
}

/// A v2 cgroup: memory.max of it and each ancestor below the mount, the lowest wins.
fn v2(mount: &Path, dir: &Path) -> Option<Memcg> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let current = std::fs::read_to_string(dir.join("memory.current")).ok()?;
    let mut limits = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| d.starts_with(mount)) {
        if let Ok(max) = std::fs::read_to_string(d.join("memory.max")) {
            limits.push(max);
        }
        at = d.parent();
    }
    parse_v2(&current, &stat, limits.iter().map(String::as_str))
}

fn parse_v2<'a>(current: &str, stat: &str, maxes: impl Iterator<Item = &'a str>) -> Option<Memcg> {
    let limit = maxes.filter_map(|m| m.trim().parse::<u64>().ok()).min()?;
    if limit >= UNLIMITED {
        return None;
    }
    let current: u64 = current.trim().parse().ok()?;
    // active_file and inactive_file leave shmem out (it lives on the anonymous lists).
    let file = key(stat, "active_file").unwrap_or(0) + key(stat, "inactive_file").unwrap_or(0);
    Some(Memcg {
        limit,
        unreclaimable: current.saturating_sub(file),
    })
}

/// The value of `name` in a memory.stat ("name value" lines).
fn key(stat: &str, name: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_STAT: &str = "cache 712000000\nrss 20000000\nshmem 711000000\n\
        active_file 8192\ninactive_file 1982464\n\
        hierarchical_memory_limit 1073741824\n\
        total_cache 712000000\ntotal_rss 20000000\ntotal_shmem 711000000\n\
        total_inactive_file 1982464\ntotal_active_file 8192\n";

    #[test]
    fn v1_counts_tmpfs_pages_as_taken_and_the_page_cache_as_free() {
        let m = parse_v1("854913024\n", V1_STAT).expect("a limit");
        assert_eq!(m.limit, 1 << 30);
        assert_eq!(m.unreclaimable, 854913024 - 1982464 - 8192);
        assert_eq!(m.headroom(), (1 << 30) - m.unreclaimable);
    }

    #[test]
    fn an_unlimited_cgroup_is_no_limit() {
        let stat = V1_STAT.replace("1073741824", "9223372036854771712");
        assert_eq!(parse_v1("100", &stat), None);
        assert_eq!(parse_v2("100", "", ["max\n", "max\n"].into_iter()), None);
    }

    #[test]
    fn v2_takes_the_lowest_limit_on_the_way_up() {
        let stat = "anon 1000\nfile 9000\nshmem 4000\nactive_file 2000\ninactive_file 3000\n";
        let m = parse_v2(
            "10000\n",
            stat,
            ["max\n", "65536\n", "131072\n"].into_iter(),
        )
        .expect("a limit");
        assert_eq!(m.limit, 65536);
        assert_eq!(m.unreclaimable, 10000 - 5000);
    }

    #[test]
    fn a_container_reads_the_mount_itself_and_the_host_the_path_under_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let mem = root.path().join("memory");
        let write = |dir: &Path, limit: &str| {
            std::fs::create_dir_all(dir).expect("mkdir");
            std::fs::write(dir.join("memory.usage_in_bytes"), "4096\n").expect("write");
            let stat = V1_STAT.replace("1073741824", limit);
            std::fs::write(dir.join("memory.stat"), stat).expect("write");
        };
        let procs = "5:cpu:/elsewhere\n4:memory:/kubepods/pod1/c1\n0::/\n";
        // In a container: the mount is the container's own cgroup.
        write(&mem, "1048576");
        assert_eq!(
            Memcg::find(root.path(), procs).map(|m| m.limit),
            Some(1048576)
        );
        // On the host: the cgroup's directory under the mount.
        write(&mem.join("kubepods/pod1/c1"), "2097152");
        assert_eq!(
            Memcg::find(root.path(), procs).map(|m| m.limit),
            Some(2097152)
        );
        // No memory controller listed: nothing to read.
        assert_eq!(Memcg::find(root.path(), "5:cpu:/x\n"), None);
    }
}
