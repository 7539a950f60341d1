//! What proves that nothing wrote a block destination since this agent's last copy onto it,
//! so that a re-run (`overwrite: IfChanged`, `compare: Checksum`) may take the
//! destination's chunk hashes from the manifest that copy kept instead of reading the whole
//! device. Pods are not the only writers (the node's own processes, a CSI operation, another
//! attachment of a network volume), so the proof is the kernel's, not a record of pods:
//!
//! - a loop device (ferry-csi's, and file-backed volumes generally) stands for its backing
//!   file, which outlives the device: the file's `(st_dev, st_ino)` from the device itself
//!   (`LOOP_GET_STATUS64`), and its size, mtime and ctime, which any write through any loop
//!   device over it, or to the file, moves;
//! - any other device only while it stays attached: the boot, the device number, its
//!   `diskseq` (a re-attached device gets a new one) and the kernel's write and discard
//!   counters (`/sys/dev/block/<maj>:<min>/stat`). Not for a partition (writes to its disk
//!   bypass its counters) or a device whose counters stand still (`queue/iostats` 0).
//!
//! The witness is taken after the copy's flush and kept with the manifest in the agent's
//! per-destination records (never on the volume); the next run takes the manifest only if
//! the witness it takes then is the same. Writes below the device by root on the node (the
//! disk under a device-mapper volume) are outside what this sees, as the agent's state
//! directory is outside what a tenant can write (docs/design/block-volumes.md).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ferry_engine::block::{ChunkManifest, Device};
use serde::{Deserialize, Serialize};

/// Where sysfs shows block devices by number.
const SYS_DEV_BLOCK: &str = "/sys/dev/block";
/// The first line of a record: the witness, as JSON. Longer is not one.
const WITNESS_MAX: u64 = 4096;

/// Where the bytes a record's manifest describes came from, when they were a snapshot's:
/// what a delta (changed-block tracking) must start from to be usable on this destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Snapshot {
    /// The CSI driver that took it.
    pub driver: String,
    /// Its VolumeSnapshotContent's `status.snapshotHandle`.
    pub handle: String,
    /// The CSI volume it was taken of (`spec.source.volumeHandle`), when the content says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

/// A record's first line.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    witness: Witness,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    copied_from: Option<Snapshot>,
}

/// The state of a destination device that any write would change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub(super) enum Witness {
    /// A loop device's backing file.
    #[serde(rename_all = "camelCase")]
    LoopFile {
        dev: u64,
        ino: u64,
        size: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
        device_size: u64,
    },
    /// Any other device, while attached.
    #[serde(rename_all = "camelCase")]
    Attached {
        boot_id: String,
        rdev: u64,
        diskseq: u64,
        /// Writes, sectors written, discards, sectors discarded.
        counters: [u64; 4],
        device_size: u64,
    },
}

/// The witness of `device` now, or why it has none (then a re-run reads the destination).
/// `host_root`: where the node's filesystem is, for a loop device's backing file.
pub(super) fn of(device: &Device, host_root: &Path) -> Result<Witness, String> {
    let rdev = device.rdev().ok_or("not a block device")?;
    if let Some((dev, ino)) = device
        .loop_backing()
        .map_err(|e| format!("LOOP_GET_STATUS64: {e}"))?
    {
        let path = sysfs(rdev, "loop/backing_file")?;
        let meta = backing_file(host_root, &path)?;
        if (meta.dev(), meta.ino()) != (dev, ino) {
            return Err(format!(
                "{path} is not the loop device's backing file (renamed or replaced since it was bound)"
            ));
        }
        return Ok(Witness::LoopFile {
            dev,
            ino,
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            device_size: device.size(),
        });
    }
    attached(rdev, device.size())
}

/// The witness of the attached device `rdev` (of `device_size` bytes) by its counters.
fn attached(rdev: u64, device_size: u64) -> Result<Witness, String> {
    let read = |name: &str| sysfs(rdev, name);
    if sysfs_dir(rdev).join("partition").exists() {
        return Err("a partition: writes to its disk are not counted on it".into());
    }
    if read("queue/iostats")? != "1" {
        return Err("the device does not count its I/O (queue/iostats is 0)".into());
    }
    let diskseq = read("diskseq")?
        .parse()
        .map_err(|_| "diskseq is not a number".to_string())?;
    let counters =
        write_counters(&read("stat")?).ok_or("stat has fewer fields than Linux 4.18's")?;
    Ok(Witness::Attached {
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map_err(|e| format!("boot_id: {e}"))?
            .trim()
            .to_string(),
        rdev,
        diskseq,
        counters,
        device_size,
    })
}

/// Device `rdev`'s directory in sysfs.
fn sysfs_dir(rdev: u64) -> PathBuf {
    PathBuf::from(format!(
        "{SYS_DEV_BLOCK}/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    ))
}

/// Attribute `name` of device `rdev` in sysfs, trimmed.
fn sysfs(rdev: u64, name: &str) -> Result<String, String> {
    let path = sysfs_dir(rdev).join(name);
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The backing file at host path `path` (as sysfs shows it), looked at without following a
/// final link: its parent opened beneath `host_root`, the name taken in it.
fn backing_file(host_root: &Path, path: &str) -> Result<std::fs::Metadata, String> {
    if path.ends_with(" (deleted)") {
        return Err(format!("the backing file {path} was deleted"));
    }
    let (parent, name) = path
        .rsplit_once('/')
        .filter(|(_, n)| !n.is_empty() && *n != "." && *n != "..")
        .ok_or_else(|| format!("backing file {path:?} is not an absolute path to a file"))?;
    let host =
        std::fs::File::open(host_root).map_err(|e| format!("{}: {e}", host_root.display()))?;
    let dir = ferry_engine::open_host_path(std::os::fd::AsFd::as_fd(&host), parent)
        .map_err(|e| format!("{parent}: {e}"))?;
    std::fs::symlink_metadata(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()))
        .map_err(|e| format!("{path}: {e}"))
}

/// Writes, sectors written, discards and sectors discarded from a `stat` line of sysfs
/// (Documentation/block/stat.rst: fields 5, 7, 12 and 14).
fn write_counters(stat: &str) -> Option<[u64; 4]> {
    let f: Vec<u64> = stat
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() >= 15).then(|| [f[4], f[6], f[11], f[13]])
}

/// Keep `manifest` for the destination, with the witness taken after the copy that wrote
/// it: written beside the record and renamed over it.
pub(super) fn keep(
    record: &Path,
    witness: &Witness,
    manifest: &ChunkManifest,
    copied_from: Option<&Snapshot>,
) -> io::Result<()> {
    let tmp = record.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    let header = Header {
        witness: witness.clone(),
        copied_from: copied_from.cloned(),
    };
    let line = serde_json::to_string(&header).map_err(io::Error::other)?;
    f.write_all(format!("{line}\n{}", manifest.to_text()).as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, record)
}

/// What a record keeps for a destination: its chunk hashes, and the snapshot they were
/// copied from, if they were.
pub(super) type Kept = (ChunkManifest, Option<Snapshot>);

/// The manifest kept for the destination (and the snapshot it was copied from), if the
/// witness it was kept with is `now`'s; else why not. The record is removed either way: the
/// run about to start writes the device, and keeps a new one only when it completes.
pub(super) fn take(record: &Path, now: Result<Witness, String>) -> Result<Kept, String> {
    let kept = read(record);
    match std::fs::remove_file(record) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            tracing::warn!(record = %record.display(), error = %e, "could not remove the kept manifest");
        }
        _ => {}
    }
    let (then, manifest) = kept?;
    let now = now.map_err(|why| format!("the destination's state cannot be witnessed: {why}"))?;
    if then.witness != now {
        return Err(format!(
            "the destination changed since the manifest was kept (then {:?}, now {now:?})",
            then.witness
        ));
    }
    Ok((manifest, then.copied_from))
}

fn read(record: &Path) -> Result<(Header, ChunkManifest), String> {
    let f = match std::fs::File::open(record) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err("no manifest was kept for the destination".into())
        }
        Err(e) => return Err(format!("{}: {e}", record.display())),
    };
    let mut r = BufReader::new(f);
    let mut line = String::new();
    (&mut r)
        .take(WITNESS_MAX)
        .read_line(&mut line)
        .map_err(|e| format!("{}: {e}", record.display()))?;
    let header = serde_json::from_str(line.trim_end())
        .map_err(|e| format!("{}: the witness: {e}", record.display()))?;
    let manifest = ChunkManifest::read_from(r)
        .map_err(|e| format!("{}: the manifest: {e}", record.display()))?;
    Ok((header, manifest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loop_file(ctime: i64) -> Witness {
        Witness::LoopFile {
            dev: 2049,
            ino: 77,
            size: 1 << 20,
            mtime: (5, 0),
            ctime: (ctime, 9),
            device_size: 1 << 20,
        }
    }

    fn manifest() -> ChunkManifest {
        ChunkManifest {
            chunk: 64 << 10,
            size: 1 << 20,
            hashes: (0..16).map(|i| i * 7 + 1).collect(),
        }
    }

    #[test]
    fn the_counters_are_the_writes_and_discards_of_a_stat_line() {
        let line =
            "  4107   12  230744  1210  9001  3  72016  811  0  1820  2021  5  0  80  2  0  0";
        assert_eq!(write_counters(line), Some([9001, 72016, 5, 80]));
        // Before Linux 4.18 there were no discard fields: no witness from it.
        assert_eq!(write_counters("1 2 3 4 5 6 7 8 9 10 11"), None);
        assert_eq!(write_counters("1 2 x"), None);
    }

    #[test]
    fn a_kept_manifest_is_taken_once_and_only_with_the_same_witness() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let record = dir.path().join("rec");
        keep(&record, &loop_file(100), &manifest(), None).map_err(|e| e.to_string())?;
        assert_eq!(take(&record, Ok(loop_file(100)))?, (manifest(), None));
        // Taken: gone, so a run that stops half-way leaves nothing to trust.
        assert!(take(&record, Ok(loop_file(100))).is_err_and(|why| why.contains("no manifest")));

        keep(&record, &loop_file(100), &manifest(), None).map_err(|e| e.to_string())?;
        let why = take(&record, Ok(loop_file(101))).expect_err("a written file");
        assert!(why.contains("changed since"), "{why}");
        assert!(!record.exists(), "the record stays after a mismatch");

        keep(&record, &loop_file(100), &manifest(), None).map_err(|e| e.to_string())?;
        let why = take(&record, Err("a partition".into())).expect_err("no witness");
        assert!(why.contains("a partition"), "{why}");
        Ok(())
    }

    #[test]
    fn the_snapshot_a_destination_was_copied_from_is_kept_with_its_manifest() -> Result<(), String>
    {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let record = dir.path().join("rec");
        let from = Snapshot {
            driver: "csi.example".into(),
            handle: "snap-1".into(),
            volume: Some("vol-7".into()),
        };
        keep(&record, &loop_file(100), &manifest(), Some(&from)).map_err(|e| e.to_string())?;
        assert_eq!(
            take(&record, Ok(loop_file(100)))?,
            (manifest(), Some(from.clone()))
        );
        // Written since: neither the manifest nor where it came from is trusted.
        keep(&record, &loop_file(100), &manifest(), Some(&from)).map_err(|e| e.to_string())?;
        assert!(take(&record, Ok(loop_file(101))).is_err());
        // A record of before (a bare witness line) is not read as one.
        let old = format!(
            "{}\n{}",
            serde_json::to_string(&loop_file(100)).map_err(|e| e.to_string())?,
            manifest().to_text()
        );
        std::fs::write(&record, old).map_err(|e| e.to_string())?;
        assert!(take(&record, Ok(loop_file(100))).is_err());
        Ok(())
    }

    /// A loop device's counters, as any other device's would be used: the same while nothing
    /// writes it, moved by a write through it (root and losetup; skipped otherwise).
    #[test]
    fn an_attached_devices_witness_moves_with_a_write_through_it() -> Result<(), String> {
        let e = |e: io::Error| e.to_string();
        if !nix_root()
            || std::process::Command::new("losetup")
                .arg("--version")
                .output()
                .is_err()
        {
            eprintln!("skipped: needs root and losetup for a loop device");
            return Ok(());
        }
        let dir = tempfile::tempdir().map_err(e)?;
        let file = dir.path().join("disk");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(4 << 20))
            .map_err(e)?;
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .map_err(e)?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || dev.is_empty() {
            eprintln!("skipped: losetup: {}", String::from_utf8_lossy(&out.stderr));
            return Ok(());
        }
        let result = (|| {
            let rdev = std::fs::metadata(&dev).map_err(e)?.rdev();
            let before = attached(rdev, 4 << 20)?;
            assert_eq!(attached(rdev, 4 << 20)?, before, "nothing wrote it");
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&dev)
                .map_err(e)?;
            std::os::unix::fs::FileExt::write_all_at(&f, &[7u8; 4096], 8192).map_err(e)?;
            f.sync_all().map_err(e)?;
            assert_ne!(attached(rdev, 4 << 20)?, before, "a write went through it");
            Ok(())
        })();
        let _ = std::process::Command::new("losetup")
            .args(["-d", &dev])
            .status();
        result
    }

    fn nix_root() -> bool {
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    #[test]
    fn a_damaged_record_is_not_trusted() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let record = dir.path().join("rec");
        keep(&record, &loop_file(100), &manifest(), None).map_err(|e| e.to_string())?;
        let text = std::fs::read_to_string(&record).map_err(|e| e.to_string())?;
        // One hash changed: the device hash no longer matches the list.
        let last = text
            .trim_end()
            .rsplit('\n')
            .next()
            .unwrap_or_default()
            .to_string();
        let damaged = text.replace(&last, &"f".repeat(32));
        std::fs::write(&record, damaged).map_err(|e| e.to_string())?;
        assert!(take(&record, Ok(loop_file(100))).is_err());
        // A witness line longer than any: refused, not read on.
        let long = format!(
            "{}\n{}",
            "x".repeat(WITNESS_MAX as usize + 10),
            manifest().to_text()
        );
        std::fs::write(&record, long).map_err(|e| e.to_string())?;
        assert!(take(&record, Ok(loop_file(100))).is_err());
        Ok(())
    }
}
