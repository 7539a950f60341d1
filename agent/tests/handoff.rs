//! A block device handed from its holder (`ferry-agent hold-block`) to a process that may not
//! open it, as the agent in its device cgroup: the copy through the handed descriptors is
//! identical, the wrong device and a read-only one for a destination are refused before any
//! I/O, and what is not a socket or not a block device is refused by name.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use anyhow::{bail, ensure, Result};
use common::{is_root, which, Loop, BIN};
use ferry_agent::handoff::{claim_rdev, fetch, Expect, HandoffError, SOCKET};
use ferry_engine::block::{copy_device, BlockOptions};
use ferry_engine::NoProgress;

const CHILD: &str = "FERRY_HANDOFF_CHILD";
const MIB: u64 = 1 << 20;

/// A holder process, stopped with SIGTERM on drop.
struct Holding(Child);

impl Holding {
    fn start(device: &Path, dir: &Path, write: bool) -> Result<Holding> {
        let mut cmd = Command::new(BIN);
        cmd.args(["hold-block", "--device"])
            .arg(device)
            .arg("--dir")
            .arg(dir);
        if write {
            cmd.arg("--write");
        }
        let child = Holding(cmd.stdin(Stdio::null()).spawn()?);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dir.join(SOCKET).exists() {
            ensure!(
                Instant::now() < deadline,
                "no socket from the holder of {}",
                device.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(child)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// A devices cgroup (v1) refusing every block device, removed on drop.
struct NoBlockDevices(PathBuf);

impl NoBlockDevices {
    fn make() -> Result<Option<NoBlockDevices>> {
        let root = Path::new("/sys/fs/cgroup/devices");
        if !root.join("devices.deny").exists() {
            return Ok(None);
        }
        let dir = root.join(format!("ferry-handoff-{}", std::process::id()));
        std::fs::create_dir(&dir)?;
        let cg = NoBlockDevices(dir);
        std::fs::write(cg.0.join("devices.deny"), "b *:* rwm")?;
        Ok(Some(cg))
    }
}

impl Drop for NoBlockDevices {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_holders_device_is_copied_by_a_process_whose_device_cgroup_refuses_it() -> Result<()> {
    if let Ok(args) = std::env::var(CHILD) {
        return child(&args);
    }
    if !is_root() || which("losetup").is_none() {
        eprintln!("skipped: a handoff between loop devices needs root and losetup");
        return Ok(());
    }
    let Some(cgroup) = NoBlockDevices::make()? else {
        eprintln!("skipped: no cgroup v1 devices controller to refuse block devices in");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let (src_file, dst_file) = (dir.path().join("src"), dir.path().join("dst"));
    let f = std::fs::File::create(&src_file)?;
    f.set_len(64 * MIB)?;
    for i in 0..16u64 {
        f.write_all_at(&vec![i as u8 + 1; MIB as usize], i * 4 * MIB)?;
    }
    std::fs::File::create(&dst_file)?.set_len(64 * MIB)?;
    let (src, dst) = (Loop::over(&src_file)?, Loop::over(&dst_file)?);
    let (src_dir, dst_dir) = (dir.path().join("src-holder"), dir.path().join("dst-holder"));
    std::fs::create_dir(&src_dir)?;
    std::fs::create_dir(&dst_dir)?;
    let _holders = (
        Holding::start(&src.dev, &src_dir, false)?,
        Holding::start(&dst.dev, &dst_dir, true)?,
    );
    let rdev = |p: &Path| claim_rdev(p).map_err(anyhow::Error::from);
    let args = format!(
        "{} {} {} {} {} {}",
        src.dev.display(),
        src_dir.display(),
        dst_dir.display(),
        rdev(&src.dev)?,
        rdev(&dst.dev)?,
        std::fs::metadata("/dev/null")?.rdev()
    );
    // The receiving process joins the cgroup before it runs a line of the test.
    let join = format!(
        "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
        cgroup.0.display()
    );
    let exe = std::env::current_exe()?;
    let out = Command::new("sh")
        .args(["-c", &join])
        .arg(&exe)
        .args([
            "--exact",
            "a_holders_device_is_copied_by_a_process_whose_device_cgroup_refuses_it",
            "--nocapture",
        ])
        .env(CHILD, &args)
        .output()?;
    ensure!(
        out.status.success(),
        "the receiving process failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains("handoff child: copied"),
        "the child did not run the handoff: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        std::fs::read(&src.dev)? == std::fs::read(&dst.dev)?,
        "the copy differs"
    );
    Ok(())
}

/// The receiving side, run in the cgroup that refuses block devices.
fn child(args: &str) -> Result<()> {
    let a: Vec<&str> = args.split(' ').collect();
    let [src_dev, src_dir, dst_dir, src_rdev, dst_rdev, null_rdev] = a[..] else {
        bail!("{CHILD}={args:?}");
    };
    let (src_rdev, dst_rdev): (u64, u64) = (src_rdev.parse()?, dst_rdev.parse()?);
    // The cgroup is in force: this process cannot open the device itself.
    let err = std::fs::File::open(src_dev).expect_err("a block device opened in the cgroup");
    ensure!(
        err.raw_os_error() == Some(libc::EPERM),
        "open {src_dev}: {err}"
    );

    let src = fetch(
        Path::new(src_dir),
        Expect {
            rdev: src_rdev,
            write: false,
        },
    )?;
    // Another device's number, a read-only descriptor for a destination: refused.
    match fetch(
        Path::new(src_dir),
        Expect {
            rdev: dst_rdev,
            write: false,
        },
    ) {
        Err(HandoffError::NotTheClaimsDevice { got, want }) => {
            ensure!((got, want) == (src_rdev, dst_rdev), "{got} {want}")
        }
        other => bail!("the wrong device was not refused: {other:?}"),
    }
    match fetch(
        Path::new(src_dir),
        Expect {
            rdev: src_rdev,
            write: true,
        },
    ) {
        Err(HandoffError::Refused(m)) if m.contains("read-only") => {}
        other => bail!("a read-only descriptor for a destination was not refused: {other:?}"),
    }
    let null: u64 = null_rdev.parse()?;
    ensure!(
        null != src_rdev,
        "a character device's number is never a block claim's"
    );
    let mut dst = fetch(
        Path::new(dst_dir),
        Expect {
            rdev: dst_rdev,
            write: true,
        },
    )?;
    let sum = copy_device(&src, &mut dst, &BlockOptions::default(), &NoProgress)?;
    ensure!(sum.written == 16 && sum.verified == 16, "{sum:?}");
    eprintln!(
        "handoff child: copied {} chunks through handed-over descriptors",
        sum.written
    );
    Ok(())
}

#[test]
fn what_is_not_a_socket_or_not_a_block_device_is_refused_by_name() -> Result<()> {
    if std::env::var(CHILD).is_ok() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    // A regular file where the socket belongs: neither side uses it.
    std::fs::write(dir.path().join(SOCKET), "")?;
    let err = fetch(
        dir.path(),
        Expect {
            rdev: 1,
            write: false,
        },
    )
    .expect_err("not a socket");
    ensure!(err.to_string().contains("is not a socket"), "{err}");
    let out = Command::new(BIN)
        .args(["hold-block", "--device", "/dev/null", "--dir"])
        .arg(dir.path())
        .output()?;
    let text = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1) && text.contains("character device"),
        "{text}"
    );
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)?.set_len(MIB)?;
    let out = Command::new(BIN)
        .arg("hold-block")
        .arg("--device")
        .arg(&image)
        .arg("--dir")
        .arg(dir.path())
        .output()?;
    let text = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1) && text.contains("is not a block device"),
        "{text}"
    );
    // A descriptor of a regular file handed over is not a device.
    let fd = std::fs::File::open(&image)?.into();
    let err = ferry_agent::handoff::check(
        fd,
        Expect {
            rdev: 1,
            write: false,
        },
    )
    .expect_err("a file");
    ensure!(err.to_string().contains("regular file"), "{err}");
    let err = claim_rdev(&image).expect_err("not a node");
    ensure!(err.to_string().contains("not a block device node"), "{err}");
    Ok(())
}
