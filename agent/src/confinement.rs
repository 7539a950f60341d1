//! What the agent may do on its node, read from the kernel rather than assumed:
//! `ferry-agent confinement` prints it (capabilities, no_new_privs, seccomp, and whether a
//! device node can be created and opened), and `ferry-agent run` logs at startup what a
//! copy would lose for each capability it lacks.
//!
//! The chart runs the agent as root without `privileged: true`, with the capabilities of
//! [`FIDELITY`] only (charts/ferry/values.yaml). Each entry here says what
//! `e2e/tests/capabilities.rs` finds missing from a copy without it.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The capabilities a copy with `cp -a` fidelity needs as root, by bit number, and what is
/// lost without each (measured by e2e/tests/capabilities.rs).
pub const FIDELITY: [(u32, &str, &str); 7] = [
    (
        0,
        "CHOWN",
        "copies keep the agent's owner and group, not the source's",
    ),
    (
        1,
        "DAC_OVERRIDE",
        "files and directories the agent may not read or write by their mode fail",
    ),
    (
        3,
        "FOWNER",
        "modes, times and ACLs of copies owned by others cannot be set (those entries fail)",
    ),
    (
        4,
        "FSETID",
        "setgid bits of files whose group is not the agent's are dropped",
    ),
    (
        27,
        "MKNOD",
        "device nodes cannot be made (those entries fail)",
    ),
    (
        31,
        "SETFCAP",
        "file capabilities (security.capability) are dropped",
    ),
    (
        21,
        "SYS_ADMIN",
        "trusted.* attributes are hidden from the agent, so copies lack them",
    ),
];

/// Capability names by bit number (linux/capability.h), for the report.
const NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// This process's credentials and confinement, from `/proc/self/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    /// Effective capabilities (a bit per capability number).
    pub effective: u64,
    pub no_new_privs: bool,
    /// 0: no seccomp, 1: strict, 2: a filter (the runtime's profile).
    pub seccomp: u8,
}

impl Confinement {
    pub fn current() -> std::io::Result<Self> {
        Self::parse(&std::fs::read_to_string("/proc/self/status")?)
    }

    /// Parse the text of `/proc/<pid>/status`.
    pub fn parse(status: &str) -> std::io::Result<Self> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("/proc/self/status has no {name}"),
                    )
                })
        };
        let bad = |name: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/self/status: {name} unreadable"),
            )
        };
        // Uid and Gid list real, effective, saved and filesystem ids: the effective one counts.
        let effective_id = |name: &str| -> std::io::Result<u32> {
            field(name)?
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(name))
        };
        Ok(Self {
            uid: effective_id("Uid")?,
            gid: effective_id("Gid")?,
            effective: u64::from_str_radix(field("CapEff")?, 16).map_err(|_| bad("CapEff"))?,
            // Kernels before 4.10 do not say; they had no way to set it either way we use.
            no_new_privs: field("NoNewPrivs").is_ok_and(|v| v == "1"),
            seccomp: field("Seccomp")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        })
    }

    pub fn has(&self, bit: u32) -> bool {
        self.effective & (1u64 << bit) != 0
    }

    /// The names of the effective capabilities (`ALL` when every known one is held).
    pub fn capability_names(&self) -> Vec<String> {
        (0..64u32)
            .filter(|&b| self.has(b))
            .map(|b| match NAMES.get(b as usize) {
                Some(n) => (*n).to_string(),
                None => format!("CAP_{b}"),
            })
            .collect()
    }

    /// What a copy as root would lose: the [`FIDELITY`] capabilities this process lacks,
    /// with the loss of each. Empty when not root: a user's copy keeps what a user may, as
    /// `cp -a` does.
    pub fn losses(&self) -> Vec<(&'static str, &'static str)> {
        if self.uid != 0 {
            return Vec::new();
        }
        FIDELITY
            .iter()
            .filter(|(bit, _, _)| !self.has(*bit))
            .map(|&(_, name, loss)| (name, loss))
            .collect()
    }

    /// The report's first lines.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "uid {} gid {}", self.uid, self.gid);
        let names = self.capability_names();
        let _ = writeln!(
            out,
            "capabilities: {}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(" ")
            }
        );
        let losses = self.losses();
        if losses.is_empty() {
            let _ = writeln!(out, "lost from copies: nothing");
        }
        for (name, loss) in losses {
            let _ = writeln!(out, "lost from copies without {name}: {loss}");
        }
        let _ = writeln!(
            out,
            "no_new_privs: {}",
            if self.no_new_privs { "yes" } else { "no" }
        );
        let seccomp = match self.seccomp {
            0 => "none",
            1 => "strict",
            _ => "filter",
        };
        let _ = writeln!(out, "seccomp: {seccomp}");
        out
    }
}

/// `major:minor` of a device number (glibc's encoding).
fn numbers(rdev: u64) -> String {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    format!("{major}:{minor}")
}

/// Open `path` for reading and close it at once (no byte is read; `O_NONBLOCK` so that a
/// tty or FIFO does not wait): "opened", or "refused (<the error>)".
fn try_open(path: &Path) -> String {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(_) => "opened".into(),
        Err(e) => format!("refused ({e})"),
    }
}

/// Whether a device node can be opened and created here: open `device` (a node on the
/// host, e.g. /host/dev/loop0) for reading, then make a node with its number in `scratch`,
/// open that, and remove it. The report's lines; an error when `device` is not a device.
pub fn probe_device(device: &Path, scratch: &Path) -> Result<String, String> {
    let meta =
        std::fs::symlink_metadata(device).map_err(|e| format!("{}: {e}", device.display()))?;
    let ft = meta.file_type();
    let block = ft.is_block_device();
    if !block && !ft.is_char_device() {
        return Err(format!(
            "{} is not a device node: name a block or character device, e.g. /host/dev/loop0",
            device.display()
        ));
    }
    let what = format!(
        "{} {}",
        if block { "block" } else { "character" },
        numbers(meta.rdev())
    );
    let mut out = format!(
        "open {} ({what}) for reading: {}\n",
        device.display(),
        try_open(device)
    );
    let name = format!(".ferry-confinement-{}", std::process::id());
    let made = scratch.join(&name);
    let dir = std::fs::File::open(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let cname = CString::new(name.as_bytes()).expect("no NUL in a name we made");
    match ferry_engine::volume::make_device_node(dir.as_fd(), &cname, block, meta.rdev()) {
        Ok(()) => {
            let opened = try_open(&made);
            let removed = std::fs::remove_file(&made);
            let _ = writeln!(out, "mknod {what} in {}: made", scratch.display());
            let _ = writeln!(out, "open that node for reading: {opened}");
            if let Err(e) = removed {
                let _ = writeln!(out, "remove {}: {e}", made.display());
            }
        }
        Err(e) => {
            let _ = writeln!(out, "mknod {what} in {}: refused ({e})", scratch.display());
        }
    }
    Ok(out)
}

/// Each call of a copy that a seccomp profile could refuse, made once in `scratch`
/// ([`ferry_engine::volume::probe_calls`]): "allowed", "allowed (the filesystem said: ...)"
/// when it reached the filesystem and was declined there, or "refused (EPERM ...)", a
/// profile's answer.
pub fn probe_calls(scratch: &Path) -> Result<String, String> {
    let dir = std::fs::File::open(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let mut out = String::new();
    for (call, answer) in ferry_engine::volume::probe_calls(dir.as_fd()) {
        let _ = writeln!(out, "call {call}: {}", verdict(&answer));
    }
    Ok(out)
}

/// What one call's answer says of the profile: EPERM is its refusal (none of these calls
/// answers EPERM for a reason of its own on a scratch file the caller made).
fn verdict(answer: &std::io::Result<()>) -> String {
    match answer {
        Ok(()) => "allowed".to_string(),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            format!("refused ({e}: a seccomp profile's answer)")
        }
        Err(e) => format!("allowed (the filesystem said: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tferry-agent\nUmask:\t0022\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n\
        CapInh:\t0000000000000000\nCapPrm:\t000000008820001b\nCapEff:\t000000008820001b\n\
        CapBnd:\t000000008820001b\nNoNewPrivs:\t1\nSeccomp:\t2\n";

    #[test]
    fn the_charts_seven_capabilities_lose_nothing() {
        let c = Confinement::parse(STATUS).expect("parse");
        assert_eq!(
            c.capability_names(),
            [
                "CHOWN",
                "DAC_OVERRIDE",
                "FOWNER",
                "FSETID",
                "SYS_ADMIN",
                "MKNOD",
                "SETFCAP"
            ]
        );
        assert!(c.losses().is_empty());
        assert!(c.no_new_privs);
        assert_eq!(c.seccomp, 2);
        assert!(c.report().contains("lost from copies: nothing\n"));
    }

    #[test]
    fn a_missing_capability_is_named_with_what_copies_lose() {
        let without_sys_admin = STATUS.replace("8820001b", "8800001b");
        let c = Confinement::parse(&without_sys_admin).expect("parse");
        assert_eq!(c.losses().len(), 1);
        assert!(c
            .report()
            .contains("lost from copies without SYS_ADMIN: trusted.* attributes"));
        // A user's copy keeps what a user may: nothing is reported lost.
        let user = without_sys_admin.replace("Uid:\t0\t0", "Uid:\t1000\t1000");
        assert!(Confinement::parse(&user)
            .expect("parse")
            .losses()
            .is_empty());
    }

    #[test]
    fn device_numbers_read_as_major_and_minor() {
        assert_eq!(numbers(0x0700), "7:0");
        assert_eq!(numbers(0x0103), "1:3");
        // 259:1 (an NVMe partition): the major's bits above 8 are where glibc puts them.
        assert_eq!(numbers((259u64 << 8 & 0xfff00) | 1), "259:1");
    }

    #[test]
    fn every_call_is_allowed_without_a_seccomp_profile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = probe_calls(dir.path()).expect("probe");
        for call in ["openat2", "copy_file_range", "ioctl(FICLONE)", "renameat2"] {
            assert!(
                report.contains(&format!("call {call}: allowed")),
                "{call}:\n{report}"
            );
        }
        assert!(!report.contains("refused"), "{report}");
        // Nothing is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
        // What a profile answers, and what a filesystem does.
        let eperm = Err(std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(verdict(&eperm).starts_with("refused (Operation not permitted"));
        let unsupported = Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        assert!(verdict(&unsupported).starts_with("allowed (the filesystem said"));
    }

    #[test]
    fn a_file_is_not_probed_as_a_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").expect("write");
        let err = probe_device(&f, dir.path()).expect_err("a file");
        assert!(err.contains("is not a device node"), "{err}");
    }
}
