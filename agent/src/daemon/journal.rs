//! What a shard's runs on this node have committed: the list a resumed run trusts to keep
//! a file without reading it again. It lives on the node, under the agent's own state
//! directory, never in a tenant's volume: anything under a root's `.ferry/` can have been
//! written by the tenant (a pod that mounts the volume), so nothing Ferry reports as
//! copied or verified may rest on it. The tenant's copy of the manifest is exported there
//! when a shard succeeds ([`export`]).
//!
//! Layout: `<host-root>/var/lib/ferry/agent/jobs/<job uid>/<manifest name>`. A job's
//! directory goes when the job is finished or deleted ([`Journals::retain`]).
//!
//! Beside the journals, the records of what jobs listed in each destination
//! (`<host-root>/var/lib/ferry/agent/records/<key>`, see `ferry_engine::Records`), which
//! outlive the jobs: the next job into the same destination lists the files it keeps from
//! them. A job writes its records beside its journal (`<manifest name>.records`) and they
//! replace the destination's once its copy has run to the end. Records not written for
//! [`RECORDS_KEPT`] go.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ferry_crds::{ManifestName, ManifestPart};

/// Where the agent keeps its state, below the node's filesystem.
pub(super) const STATE_UNDER_HOST: &str = "var/lib/ferry/agent";

/// Records no job has written for this long are removed (a destination copied into less
/// often than that lists the files its next job keeps only if it compares them).
pub(super) const RECORDS_KEPT: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);

/// The journals of every job this node has run shards of.
#[derive(Debug)]
pub(super) struct Journals {
    jobs: PathBuf,
    records: PathBuf,
}

impl Journals {
    /// Create (0700, root's) `<host-root>/var/lib/ferry/agent/jobs`.
    pub(super) fn open(host_root: &Path) -> io::Result<Self> {
        let jobs = host_root.join(STATE_UNDER_HOST).join("jobs");
        let records = host_root.join(STATE_UNDER_HOST).join("records");
        for dir in [&jobs, &records] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        Ok(Self { jobs, records })
    }

    /// The records of the destination `path` beneath the host directory `root` (as this
    /// agent resolved it: no tenant names it), for part `part` of a job (a split job's
    /// slices each have their own): named by a hash of the three.
    pub(super) fn records(&self, root: &str, path: &str, part: &str) -> PathBuf {
        // `a//b/./c/` and `a/b/c` are one destination.
        let path: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let key = format!("{root}\0{}\0{part}", path.join("/"));
        self.records.join(format!(
            "{:032x}",
            twox_hash::XxHash3_128::oneshot(key.as_bytes())
        ))
    }

    /// Remove the records no job has written for `older` (by their mtime).
    pub(super) fn forget_records(&self, older: std::time::Duration) -> io::Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.records)? {
            let entry = entry?;
            let age = entry.metadata()?.modified()?.elapsed().unwrap_or_default();
            if age > older {
                std::fs::remove_file(entry.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The agent's state directory (`jobs`' parent), which no root may contain.
    pub(super) fn state_dir(&self) -> &Path {
        self.jobs.parent().unwrap_or(&self.jobs)
    }

    /// The journal a run of the shard writes `name` (its manifest's name) to, its job's
    /// directory created. Only API-server uids name directories: anything else is refused
    /// rather than joined to a path.
    pub(super) fn path(&self, uid: &str, name: &str) -> io::Result<PathBuf> {
        let plain = |s: &str| {
            !s.is_empty()
                && s.len() <= 128
                && !s.starts_with('.')
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        };
        if !plain(uid) || !plain(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("job uid {uid:?} or manifest name {name:?} is not a plain file name"),
            ));
        }
        let dir = self.jobs.join(uid);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .or_else(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })?;
        Ok(dir.join(name))
    }

    /// Remove the journals of every job but `keep` (uids of jobs that exist and are not
    /// finished). Only called with a complete list of the jobs.
    pub(super) fn retain(&self, keep: &HashSet<String>) -> io::Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.jobs)? {
            let entry = entry?;
            let uid = entry.file_name();
            if keep.contains(uid.to_string_lossy().as_ref()) {
                continue;
            }
            std::fs::remove_dir_all(entry.path())?;
            removed += 1;
        }
        Ok(removed)
    }
}

/// Whether the host directory `dir` is `root` or below it: walked up by `..` from `dir`
/// (device and inode at each step) until the node's `/`, so no path spelling, symlink or
/// bind of the same directory under another name is missed.
pub(super) fn is_within(dir: &Path, root: &OwnedFd) -> io::Result<bool> {
    let want = std::fs::metadata(format!("/proc/self/fd/{}", root.as_raw_fd()))?;
    let key = |m: &std::fs::Metadata| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    };
    let mut at = dir.to_path_buf();
    let mut last = None;
    for _ in 0..4096 {
        let m = std::fs::metadata(&at)?;
        if key(&m) == key(&want) {
            return Ok(true);
        }
        // `/..` is `/`: the top is reached.
        if last == Some(key(&m)) {
            return Ok(false);
        }
        last = Some(key(&m));
        at.push("..");
    }
    Ok(false)
}

/// Copy the journal at `from` into the tenant's `.ferry/` (the directory `state`, an fd
/// path) as `name`: written under a temporary name beside it (never through a link a
/// tenant planted there) and renamed over whatever has the name, so a reader sees the
/// whole file or none. Returns what was written, for a part the directories pass joins.
pub(super) fn export(
    from: &Path,
    state: &Path,
    names: &ManifestName,
    name: &str,
) -> io::Result<ManifestPart> {
    let mut src = std::fs::File::open(from)?;
    let tmp = state.join(names.tmp(name));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let part = copy_hashing(&mut src, &mut out)?;
    out.flush()?;
    std::fs::rename(&tmp, state.join(name))?;
    Ok(part)
}

/// Copy `from` to `to`, and say what went through.
pub(super) fn copy_hashing(from: &mut impl Read, to: &mut impl Write) -> io::Result<ManifestPart> {
    let mut hash = twox_hash::XxHash3_64::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut bytes = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        std::hash::Hasher::write(&mut hash, &buf[..n]);
        to.write_all(&buf[..n])?;
        bytes += n as u64;
    }
    Ok(ManifestPart {
        bytes: bytes as i64,
        xxh3: format!("{:016x}", std::hash::Hasher::finish(&hash)),
    })
}

/// Open a file in the tenant's `.ferry/` to read: never through a link, and only a regular
/// file (a device or FIFO a tenant planted at the name is never opened: see
/// `ferry_engine::volume::open_regular_to_read`) of at most `limit` bytes, so reading it
/// is bounded in time and memory.
pub(super) fn open_tenant_file(path: &Path, limit: u64) -> io::Result<impl Read> {
    let Some((f, len)) = ferry_engine::volume::open_regular_to_read(path)? else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    };
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} has {len} bytes, more than the {limit} its files' lines can take",
                path.display(),
            ),
        ));
    }
    // Bounded even if it grows while read.
    Ok(f.take(limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_holds_the_state_directory_whatever_it_is_called() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let journals = Journals::open(tmp.path()).expect("open");
        let state = journals.state_dir();
        let open = |p: &Path| -> OwnedFd { std::fs::File::open(p).expect("open").into() };
        std::os::unix::fs::symlink(tmp.path().join("var/lib"), tmp.path().join("alias"))
            .expect("symlink");
        for holds in ["var", "var/lib/ferry", "var/lib/ferry/agent", "alias", "."] {
            let root = open(&tmp.path().join(holds));
            assert!(is_within(state, &root).expect("walk"), "{holds}");
        }
        std::fs::create_dir_all(tmp.path().join("srv/data")).expect("mkdir");
        for apart in ["srv", "srv/data", "var/lib/ferry/agent/jobs"] {
            let root = open(&tmp.path().join(apart));
            assert!(!is_within(state, &root).expect("walk"), "{apart}");
        }
    }

    #[test]
    fn journals_are_named_only_by_plain_names_and_kept_only_for_live_jobs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let journals = Journals::open(tmp.path()).expect("open");
        for (uid, name) in [
            ("../x", "a.xxh128"),
            ("u", "../../etc/passwd"),
            ("", "a"),
            (".", "a"),
        ] {
            assert!(journals.path(uid, name).is_err(), "{uid:?} {name:?}");
        }
        let a = journals.path("uid-a", "uid-a.xxh128").expect("path");
        let b = journals.path("uid-b", "uid-b.part-0.xxh128").expect("path");
        std::fs::write(&a, "x").expect("write");
        std::fs::write(&b, "x").expect("write");
        let keep = HashSet::from(["uid-b".to_string()]);
        assert_eq!(journals.retain(&keep).expect("retain"), 1);
        assert!(!a.exists() && b.exists());
    }
}
