//! What a test checks in a copied tree: staging leftovers, metadata and contents against
//! the source; and bind mounts that show one filesystem under several simulated nodes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

/// Every path under `root` whose name starts with `.ferry-` (staging names): none may be
/// left once a job has finished.
pub fn staging_leftovers(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with(".ferry-") {
                out.push(e.path());
            }
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(out)
}

/// A bind mount, undone when dropped: one filesystem seen under several simulated nodes'
/// host roots, as NFS is on real nodes (needs root).
#[derive(Debug)]
pub struct BindMount(PathBuf);

impl BindMount {
    pub fn new(from: &Path, to: &Path) -> Result<Self> {
        std::fs::create_dir_all(to)?;
        let status = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(to)
            .status()
            .context("run mount")?;
        if !status.success() {
            bail!("mount --bind {} {} failed", from.display(), to.display());
        }
        Ok(Self(to.to_path_buf()))
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A tmpfs mounted at a directory (made if missing) with mount `options` such as
/// `size=16m`, unmounted when dropped, also on error: plainly, else lazily (a process may
/// still hold it open). Needs root.
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(at: &Path, options: &str) -> Result<Self> {
        std::fs::create_dir_all(at)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "ferry-e2e"])
            .arg(at)
            .status()
            .context("run mount")?;
        if !status.success() {
            bail!(
                "mount -t tmpfs -o {options} on {} failed (root needed)",
                at.display()
            );
        }
        Ok(Self(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if !unmount(&self.0) {
            eprintln!("could not unmount the tmpfs at {}", self.0.display());
        }
    }
}

/// Unmount `at` plainly, else lazily (a process may still hold it open); whether either did.
fn unmount(at: &Path) -> bool {
    let umount = |lazy: bool| {
        Command::new("umount")
            .args(lazy.then_some("-l"))
            .arg(at)
            .status()
            .is_ok_and(|s| s.success())
    };
    umount(false) || umount(true)
}

/// A new ext4 filesystem (`mkfs.ext4` defaults: a journal, as on a node's disk) in a sparse
/// image file of `size` (`truncate -s` syntax) at `img`, loop-mounted at `at` (made if
/// missing) with direct I/O on the image file; when dropped it is unmounted (plainly, else
/// lazily) and the image deleted. Needs root and loop devices.
#[derive(Debug)]
pub struct LoopExt4 {
    at: PathBuf,
    img: PathBuf,
}

impl LoopExt4 {
    pub fn mount(at: &Path, img: &Path, size: &str) -> Result<Self> {
        let run = |cmd: &str, args: &[&std::ffi::OsStr]| -> Result<()> {
            let out = Command::new(cmd)
                .args(args)
                .output()
                .with_context(|| format!("run {cmd}"))?;
            if !out.status.success() {
                bail!(
                    "{cmd} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(())
        };
        std::fs::create_dir_all(at)?;
        run("truncate", &["-s".as_ref(), size.as_ref(), img.as_os_str()])?;
        // From here on, Drop removes the image (and unmounts it, once mounted).
        let fs = Self {
            at: at.to_path_buf(),
            img: img.to_path_buf(),
        };
        run(
            "mkfs.ext4",
            &["-q".as_ref(), "-F".as_ref(), img.as_os_str()],
        )?;
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                img.as_os_str(),
                at.as_os_str(),
            ],
        )?;
        // Direct I/O on the image file: buffered, the loop device reads the image one
        // request at a time through the image's own page cache, which caps every copier at
        // the same rate (bench/README.md, "Cold page cache").
        let dev = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE", "--mountpoint"])
            .arg(at)
            .output()
            .context("run findmnt")?;
        let dev = String::from_utf8_lossy(&dev.stdout).trim().to_string();
        run("losetup", &["--direct-io=on".as_ref(), dev.as_ref()])?;
        Ok(fs)
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        // Not mounted (mkfs or mount failed): nothing to unmount.
        let mounted = Command::new("mountpoint")
            .arg("-q")
            .arg(&self.at)
            .status()
            .is_ok_and(|s| s.success());
        if mounted && !unmount(&self.at) {
            eprintln!("could not unmount the ext4 image at {}", self.at.display());
        }
        let _ = std::fs::remove_file(&self.img);
    }
}

/// Every entry under `root` (relative path → what a user would compare: type, mode,
/// owner, size, mtime, symlink target), walked without following links.
pub fn tree_meta(root: &Path) -> Result<std::collections::BTreeMap<PathBuf, String>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let m =
            std::fs::symlink_metadata(&path).with_context(|| format!("stat {}", path.display()))?;
        let target = if m.file_type().is_symlink() {
            std::fs::read_link(&path)?.display().to_string()
        } else {
            String::new()
        };
        let size = if m.is_dir() { 0 } else { m.len() };
        out.insert(
            rel.clone(),
            format!(
                "mode {:o} owner {}:{} size {size} mtime {}.{:09} nlink-group {} {target}",
                m.mode(),
                m.uid(),
                m.gid(),
                m.mtime(),
                m.mtime_nsec(),
                if m.is_dir() { 1 } else { m.nlink() },
            ),
        );
        if m.is_dir() {
            for e in std::fs::read_dir(&path)? {
                stack.push(rel.join(e?.file_name()));
            }
        }
    }
    Ok(out)
}

/// `diff -r --no-dereference a b` finds nothing: the same names, symlink targets and
/// bytes (metadata is `assert_same_tree`'s job); the error carries diff's report.
pub fn assert_same_contents(a: &Path, b: &Path) -> Result<()> {
    let diff = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .context("run diff")?;
    ensure!(
        diff.status.success(),
        "{} differs from {}: {}{}",
        b.display(),
        a.display(),
        String::from_utf8_lossy(&diff.stdout),
        String::from_utf8_lossy(&diff.stderr)
    );
    Ok(())
}

/// The destination equals the source: same entries with the same metadata (the top
/// directory's own metadata too) and the same bytes in every file.
pub fn assert_same_tree(src: &Path, dst: &Path) -> Result<()> {
    let (a, b) = (tree_meta(src)?, tree_meta(dst)?);
    let mut diffs = Vec::new();
    for (p, m) in &a {
        match b.get(p) {
            None => diffs.push(format!("missing {}", p.display())),
            Some(n) if n != m => diffs.push(format!("{}: source {m}, copy {n}", p.display())),
            Some(_) => {
                let sp = src.join(p);
                if std::fs::symlink_metadata(&sp)?.is_file()
                    && std::fs::read(&sp)? != std::fs::read(dst.join(p))?
                {
                    diffs.push(format!("{}: contents differ", p.display()));
                }
            }
        }
    }
    for p in b.keys().filter(|p| !a.contains_key(*p)) {
        diffs.push(format!("extra {}", p.display()));
    }
    if !diffs.is_empty() {
        diffs.truncate(20);
        bail!("copy differs from the source:\n  {}", diffs.join("\n  "));
    }
    Ok(())
}

/// Bytes of the regular files under `root`, each inode once.
pub fn tree_bytes(root: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            let m = std::fs::symlink_metadata(&p)?;
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() && seen.insert(m.ino()) {
                total += m.len();
            }
        }
    }
    Ok(total)
}
