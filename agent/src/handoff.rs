//! A claim's block device handed from its holder pod to the agent. The agent may not open a
//! block device (its device cgroup allows none: security.md, "Devices"); the kubelet lets
//! the holder pod open its claim's device, because the pod asked for it as
//! `volumeDevices`. So the holder (`ferry-agent hold-block`) opens the device and hands the
//! descriptor over a Unix socket in its emptyDir (`SCM_RIGHTS`), and the agent takes it and
//! proves, before any I/O, that it is the claim's device: its `st_rdev` must equal the one
//! of the node the kubelet made for that volume and pod. The device cgroup checks at open,
//! not at read, so the descriptor works in the agent, and only that one.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_engine::block::{Device, DeviceKind};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The socket's name in the holder's directory.
pub const SOCKET: &str = "block.sock";

/// How long either side waits for the other on one handoff.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Device(#[from] ferry_engine::Error),
    /// The descriptor handed over is a block device, but not the claim's.
    #[error("the holder handed over device {}:{}, not the claim's device {}:{} (the node the kubelet made for this volume and pod): nothing was read or written", major(*.got), minor(*.got), major(*.want), minor(*.want))]
    NotTheClaimsDevice { got: u64, want: u64 },
    #[error("{0}")]
    Refused(String),
}

fn major(dev: u64) -> u32 {
    libc::major(dev)
}

fn minor(dev: u64) -> u32 {
    libc::minor(dev)
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> HandoffError + 'a {
    move |source| HandoffError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The holder's side: a claim's device, open, and the socket it is handed over on.
#[derive(Debug)]
pub struct Holder {
    dev: Device,
    listener: UnixListener,
}

impl Holder {
    /// Open `device` (read-only unless `write`), refuse anything but a block device, and
    /// listen on `dir/block.sock`.
    pub fn open(device: &Path, write: bool, dir: &Path) -> Result<Holder, HandoffError> {
        let dev = Device::open(device, write, false)?;
        if dev.kind() != DeviceKind::Block {
            return Err(HandoffError::Refused(format!(
                "{} is not a block device: a holder hands over only its claim's device (volumeDevices)",
                device.display()
            )));
        }
        let path = dir.join(SOCKET);
        // A socket left by an earlier holder of this pod (a restarted container) is
        // replaced; anything else at the name is left, and refused.
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                std::fs::remove_file(&path).map_err(io("remove the old socket", &path))?
            }
            Ok(_) => {
                return Err(HandoffError::Refused(format!(
                    "{} exists and is not a socket: remove it",
                    path.display()
                )))
            }
            Err(_) => {}
        }
        let listener = UnixListener::bind(&path).map_err(io("listen on", &path))?;
        Ok(Holder { dev, listener })
    }

    /// Hand the descriptor to every connection, one at a time, until the process ends.
    pub fn serve(&self) {
        for conn in self.listener.incoming() {
            // One connection's failure (a peer gone at once) does not end the holder.
            let Ok(conn) = conn else { continue };
            let _ = conn.set_write_timeout(Some(WAIT));
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut cmsg = SendAncillaryBuffer::new(&mut space);
            let fds = [self.dev.as_fd()];
            if cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
                let _ = rustix::net::sendmsg(
                    &conn,
                    &[IoSlice::new(b"D")],
                    &mut cmsg,
                    SendFlags::empty(),
                );
            }
        }
    }
}

/// What the agent expects of the descriptor a holder hands over.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// The claim's device number: `st_rdev` of the node the kubelet made for this volume and
    /// this holder pod ([`claim_rdev`]).
    pub rdev: u64,
    /// Whether the copy writes to it (the descriptor must be open for writing).
    pub write: bool,
}

/// The agent's side: connect to the holder's socket in `dir` (the holder's emptyDir, seen
/// through the kubelet's pod directory), take the one descriptor it sends, and return it as
/// a [`Device`] only if it is a block device with `expect.rdev`, open for what the copy
/// does. Nothing is read or written through it before that.
pub fn fetch(dir: &Path, expect: Expect) -> Result<Device, HandoffError> {
    // The directory is opened first (no symlink as its last component).
    let dir_fd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(io("open the holder's directory", dir))?;
    fetch_at(std::os::fd::AsFd::as_fd(&dir_fd), dir, expect)
}

/// [`fetch`] from the holder's directory opened already (`dir`, shown as `shown`).
pub fn fetch_at(
    dir: std::os::fd::BorrowedFd<'_>,
    shown: &Path,
    expect: Expect,
) -> Result<Device, HandoffError> {
    // The socket is reached through /proc/self/fd: a kubelet pod path is longer than a
    // socket address may be (108 bytes), and the name is looked at as what it is before
    // connecting.
    let via = PathBuf::from(format!(
        "/proc/self/fd/{}/{SOCKET}",
        std::os::fd::AsRawFd::as_raw_fd(&dir)
    ));
    let shown = shown.join(SOCKET);
    let meta = std::fs::symlink_metadata(&via).map_err(io("look at", &shown))?;
    if !meta.file_type().is_socket() {
        return Err(HandoffError::Refused(format!(
            "{} is not a socket: the holder has not started, or something else took its place",
            shown.display()
        )));
    }
    let conn = UnixStream::connect(&via).map_err(io("connect to", &shown))?;
    conn.set_read_timeout(Some(WAIT))
        .map_err(io("set a timeout on", &shown))?;
    let fd = receive_one(&conn).map_err(|e| match e {
        HandoffError::Refused(m) => HandoffError::Refused(format!("{}: {m}", shown.display())),
        e => e,
    })?;
    check(fd, expect)
}

fn receive_one(conn: &UnixStream) -> Result<OwnedFd, HandoffError> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let msg = rustix::net::recvmsg(
        conn,
        &mut [IoSliceMut::new(&mut byte)],
        &mut cmsg,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| HandoffError::Io {
        what: "receive from",
        path: PathBuf::from("the holder's socket"),
        source: e.into(),
    })?;
    // Every descriptor that arrived is owned here, so those not kept are closed.
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) || fds.len() != 1 || byte != *b"D" {
        return Err(HandoffError::Refused(format!(
            "the holder sent {} descriptors{} where one device belongs",
            fds.len(),
            if msg.flags.contains(ReturnFlags::CTRUNC) {
                " and more that did not fit"
            } else {
                ""
            }
        )));
    }
    Ok(fds.remove(0))
}

/// The descriptor as a [`Device`], only if it is the claim's device, open as needed.
pub fn check(fd: OwnedFd, expect: Expect) -> Result<Device, HandoffError> {
    let mode = rustix::fs::fcntl_getfl(&fd).map_err(|e| HandoffError::Io {
        what: "F_GETFL of",
        path: PathBuf::from("the handed-over descriptor"),
        source: e.into(),
    })?;
    let writable = mode & rustix::fs::OFlags::RWMODE != rustix::fs::OFlags::RDONLY;
    let dev = Device::from_fd(fd)?;
    match dev.rdev() {
        None => {
            return Err(HandoffError::Refused(
                "the holder handed over a regular file, not a block device".into(),
            ))
        }
        Some(got) if got != expect.rdev => {
            return Err(HandoffError::NotTheClaimsDevice {
                got,
                want: expect.rdev,
            })
        }
        Some(_) => {}
    }
    if expect.write && !writable {
        return Err(HandoffError::Refused(
            "the holder handed over its device read-only, and this copy writes to it (a destination's holder runs with --write)".into(),
        ));
    }
    Ok(dev)
}

/// The device number of `node` (a block device node the kubelet made, looked at by
/// `O_PATH`, never opened for I/O): what [`Expect::rdev`] is set to.
pub fn claim_rdev(node: &Path) -> Result<u64, HandoffError> {
    use std::os::unix::fs::MetadataExt;
    // O_NOFOLLOW: a symlink there is looked at as the link, which is no block device.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(node)
        .map_err(io("open", node))?;
    let meta = f.metadata().map_err(io("fstat", node))?;
    if !meta.file_type().is_block_device() {
        return Err(HandoffError::Refused(format!(
            "{} is not a block device node: it cannot say which device is the claim's",
            node.display()
        )));
    }
    Ok(meta.rdev())
}
