//! Command-line interface of `ferry-agent`.

use std::path::PathBuf;

use clap::builder::PossibleValue;
use clap::{Parser, Subcommand};
use ferry_crds::{Compare, Overwrite, Policy, Reflink, Verify};

#[derive(Debug, Parser)]
#[command(
    name = "ferry-agent",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("FERRY_GIT_REV"), ")"),
    about = "Ferry node agent and local copy tool"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Copy SRC to DST with cp -a fidelity, in parallel.
    ///
    /// If DST does not exist it becomes a copy of SRC (like `cp -a SRC DST`). If DST is an
    /// existing directory, SRC's contents are merged into it (a file SRC lands as
    /// DST/NAME); entries DST already has are handled by --overwrite. Files appear under
    /// their final names only when complete.
    ///
    /// Exit status: 0 all copied, 1 some entries failed (listed on stderr), 2 bad usage.
    Copy(CopyArgs),
    /// Copy a block device (or a disk image) onto another, in parallel chunks.
    ///
    /// Every chunk is hashed (xxHash3-128) and every written chunk read back from DST unless
    /// --verify none; chunks of zeros are punched (discard, write-zeroes, or a hole in an
    /// image) where DST guarantees they read back as zeros (the first one is read back to
    /// check; --verify full reads every one back), written otherwise. With `--overwrite if-changed --compare
    /// checksum` only chunks whose hashes differ are written. DST must be at least as large
    /// as SRC; a missing DST becomes an image file. Its bytes past SRC's size are left alone.
    ///
    /// Exit status: 0 copied, 1 the copy failed, 2 bad usage.
    CopyBlock(CopyBlockArgs),
    /// Hold a claim's block device for the agent: open DEVICE and hand its descriptor
    /// (SCM_RIGHTS) to whoever connects to DIR/block.sock, until SIGTERM or SIGINT. The
    /// holder pod of a block claim runs it; the agent checks that the descriptor is the
    /// claim's device before it reads or writes anything.
    HoldBlock(HoldBlockArgs),
    /// Run the node agent: heartbeat, watch CopyJobs assigned to this node, copy them.
    Run(RunArgs),
    /// Do nothing until SIGTERM or SIGINT, then exit 0: the image's default command, for a
    /// pod that only has to hold something (a volume mounted, a sandbox).
    Pause,
    /// Print what this agent may do on its node, read from the kernel: its user,
    /// capabilities (and what a copy loses for each one missing), no_new_privs and seccomp;
    /// with --device, whether a device node can be opened and created; with --calls, which
    /// of a copy's system calls the seccomp profile lets through.
    ///
    /// Run it in the agent's container: `kubectl exec -n ferry-system ds/ferry-agent --
    /// ferry-agent confinement --device /host/dev/loop0 --calls`.
    Confinement(ConfinementArgs),
}

#[derive(Debug, clap::Args)]
pub struct ConfinementArgs {
    /// A device node of the host to try: opened for reading (no byte read) and closed, then
    /// a node with its number made in --scratch, opened the same way, and removed.
    #[arg(long)]
    pub device: Option<PathBuf>,
    /// Also make each call of a copy that a seccomp profile could refuse (openat2,
    /// copy_file_range, FICLONE, ...) once, on two small files in --scratch, and say which
    /// were refused (EPERM) and which reached the filesystem.
    #[arg(long)]
    pub calls: bool,
    /// Where to make that node and those files (removed after): a writable directory of the
    /// container (its /dev is one even with a read-only root).
    #[arg(long, default_value = "/dev")]
    pub scratch: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// This node's name (the downward API's spec.nodeName in the DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    pub node: String,
    /// Where the node's root filesystem is mounted inside the agent's container.
    #[arg(long, default_value = "/host")]
    pub host_root: PathBuf,
    /// Namespace for the heartbeat Lease (the agent's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "ferry-system")]
    pub namespace: String,
    /// Namespace of the tickets of copies between nodes (Secrets read by name); unset: the
    /// agent's own namespace. The chart gives them one of their own, so that the agent's
    /// `get` on Secrets reaches nothing else.
    #[arg(long, env = "FERRY_TICKET_NAMESPACE")]
    pub ticket_namespace: Option<String>,
    /// Copy workers per shard unless the job sets parallelism.workersPerAgent (0: 16, or the
    /// CPUs if more, at most 64: a worker waits in every read of uncached data; of these only
    /// as many as CPUs run while the copy reads nothing from storage).
    #[arg(long, env = "FERRY_WORKERS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub workers: u16,
    /// Shards this agent runs at once; more wait (Pending) for one to finish. With at most
    /// 64 workers a shard and a 1 MiB buffer a worker, this bounds the copy buffers at
    /// 64 MiB a shard.
    #[arg(long, env = "FERRY_MAX_SHARDS", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub max_shards: u16,
    /// Address for /metrics (Prometheus), /healthz and /readyz.
    #[arg(long, env = "FERRY_LISTEN", default_value = "0.0.0.0:9090")]
    pub listen: std::net::SocketAddr,
    /// Duration of the heartbeat Lease, in seconds: the operator gives this node's work on
    /// shared roots to another agent once it has not been renewed for this long. It is
    /// renewed every third of it, and the agent stops committing files two thirds of it
    /// after its last renewal, before anyone else may take over.
    #[arg(long, env = "FERRY_LEASE_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(i32).range(3..=3600))]
    pub lease_seconds: i32,
    /// Address of the transfer port, where other agents reach the sources this node sends
    /// (mutual TLS with a certificate the operator issues for this node; asked for at
    /// start). Unset: no transfer port, no certificate request.
    #[arg(long, env = "FERRY_TRANSFER_LISTEN")]
    pub transfer_listen: Option<std::net::SocketAddr>,
    /// Where other agents reach the transfer port (`address:port`), published in this
    /// node's heartbeat Lease. Unset: the --transfer-listen address, or, when that is
    /// 0.0.0.0 or [::], the pod's IP (POD_IP) with its port.
    #[arg(long, env = "FERRY_TRANSFER_ADDRESS", requires = "transfer_listen")]
    pub transfer_address: Option<String>,
    /// Address of the peering port, where agents of other installs (trusted by a FerryPeer)
    /// connect (chart `peering.enabled`; mutual TLS with a peering certificate the operator
    /// issues for this node, asked for at start). Unset: no peering port, no request.
    #[arg(long, env = "FERRY_PEERING_LISTEN")]
    pub peering_listen: Option<std::net::SocketAddr>,
    /// Where agents of other installs reach the peering port (an IP address and port: the
    /// readers dial it as given), published in this node's heartbeat Lease and written into
    /// the Secrets of the exports it serves. Unset: the --peering-listen address, or, when
    /// that is 0.0.0.0 or [::], the pod's IP (POD_IP) with its port.
    #[arg(long, env = "FERRY_PEERING_ADDRESS", requires = "peering_listen")]
    pub peering_address: Option<std::net::SocketAddr>,
    /// Changed-block tracking: this agent's ServiceAccount (in its namespace). Set, a block
    /// copy from a VolumeSnapshot onto a destination that holds an earlier snapshot of the
    /// same volume asks the driver's snapshot-metadata sidecar which ranges changed, with a
    /// token of this account, and reads only those. Unset: every chunk is compared.
    #[arg(long, env = "FERRY_CHANGED_BLOCKS_ACCOUNT")]
    pub changed_blocks_account: Option<String>,
}

/// A policy flag: the command line's spelling (`if-changed`), or the API's (`IfChanged`).
fn policy<P: Policy + Default + Send + Sync>() -> impl clap::builder::TypedValueParser<Value = P> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(
        P::ALL
            .iter()
            .map(|v| PossibleValue::new(v.cli_name()).alias(v.api_name())),
    )
    .map(|s: String| P::parse(&s).unwrap_or_default())
}

#[derive(Debug, clap::Args)]
pub struct HoldBlockArgs {
    /// The device node (the pod's volumeDevices devicePath).
    #[arg(long, default_value = "/dev/ferry-block")]
    pub device: PathBuf,
    /// Where to make the socket (the pod's emptyDir, which the agent reaches through the
    /// kubelet's pod directory).
    #[arg(long, default_value = "/ferry-fd")]
    pub dir: PathBuf,
    /// Open the device for writing too (a copy's destination).
    #[arg(long)]
    pub write: bool,
}

#[derive(Debug, clap::Args)]
pub struct CopyBlockArgs {
    /// Source: a block device or an image file.
    pub src: PathBuf,
    /// Destination: a block device at least as large, or an image file (made if missing).
    pub dst: PathBuf,
    /// Chunks in flight at once (default 4; see bench/BLOCK.md).
    #[arg(
        long,
        short = 'w',
        value_name = "N",
        default_value_t = 0,
        hide_default_value = true
    )]
    pub workers: usize,
    /// Bytes per chunk: a power of two from 65536 to 67108864 (the unit of hashing and of
    /// re-runs).
    #[arg(long, value_name = "BYTES", default_value_t = ferry_engine::block::CHUNK)]
    pub chunk: u64,
    /// `checksum`: read every written chunk back and compare its hash; `none`: do not.
    #[arg(long, value_parser = policy::<Verify>(), default_value = Verify::default().cli_name())]
    pub verify: Verify,
    /// `always` writes every chunk; `if-changed` (with `--compare checksum`) only the chunks
    /// whose hashes differ from DST's.
    #[arg(long, value_parser = policy::<Overwrite>(), default_value = "always")]
    pub overwrite: Overwrite,
    /// How `--overwrite if-changed` tells a changed chunk: only `checksum` (a device has no
    /// sizes or times to compare).
    #[arg(long, value_parser = policy::<Compare>(), default_value = Compare::default().cli_name())]
    pub compare: Compare,
    /// Write the chunk-hash manifest (and the device's hash) to FILE when the copy ends.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// A manifest an earlier run wrote of DST (--manifest): with `--overwrite if-changed`
    /// its hashes stand in for reading DST. Believed: give it only if nothing else has
    /// written DST since.
    #[arg(long, value_name = "FILE")]
    pub kept: Option<PathBuf>,
    /// With --kept: the byte ranges of SRC that changed since the state --kept describes,
    /// one `offset length` a line (as a CSI driver's changed-block tracking reports them
    /// between two snapshots). Chunks no range touches are read on neither side. Believed.
    #[arg(long, value_name = "FILE", requires = "kept")]
    pub changed: Option<PathBuf>,
    /// `auto`: direct I/O (no page cache) where both ends take it and the size is a
    /// multiple of 4096 bytes, as measured faster; `direct`: that or refuse; `buffered`.
    #[arg(long, value_parser = ["auto", "direct", "buffered"], default_value = "auto")]
    pub cache: String,
    /// Write chunks of zeros instead of punching them.
    #[arg(long)]
    pub write_zeros: bool,
    /// Keep the chunks finished so far in FILE while copying: run the same command again
    /// after a kill or a crash and the chunks FILE lists (with the hash the source still
    /// has) are neither written again nor read on DST. Removed when the copy completes.
    /// Keep it where only you can write: it is believed.
    #[arg(long, value_name = "FILE")]
    pub journal: Option<PathBuf>,
    /// No progress bar (it is shown only on a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Debug, clap::Args)]
pub struct CopyArgs {
    /// Source file or directory.
    pub src: PathBuf,
    /// Destination: a new name, or an existing directory to merge into.
    pub dst: PathBuf,
    /// Worker threads (default: 16, or the number of CPUs if more; see docs/engine.md).
    #[arg(
        long,
        short = 'w',
        value_name = "N",
        default_value_t = 0,
        hide_default_value = true
    )]
    pub workers: usize,
    /// Share data blocks with the source where the filesystem can (XFS, btrfs).
    /// `never` also avoids copy_file_range where it would clone implicitly.
    #[arg(long, value_parser = policy::<Reflink>(), default_value = Reflink::default().cli_name())]
    pub reflink: Reflink,
    /// `checksum`: hash source and destination bytes (xxHash3-128) and compare;
    /// `full`: also flush the destination and re-read it from the disk; `none`: neither.
    /// The default is a CopyJob's.
    #[arg(long, value_parser = policy::<Verify>(), default_value = Verify::default().cli_name())]
    pub verify: Verify,
    /// What to do with entries that already exist in DST: keep them (`never`), replace
    /// them unless size and mtime match (`if-changed`), or replace them (`always`).
    #[arg(long, value_parser = policy::<Overwrite>(), default_value = Overwrite::default().cli_name())]
    pub overwrite: Overwrite,
    /// How `--overwrite if-changed` tells a changed file: `size-and-time` (reads no data)
    /// or `checksum` (reads files of equal size on both sides and compares their bytes).
    #[arg(long, value_parser = policy::<Compare>(), default_value = Compare::default().cli_name())]
    pub compare: Compare,
    /// Metadata NOT to keep, comma-separated: permissions, ownership, timestamps, xattrs,
    /// hard-links, sparseness, or all (the short names mode, links and sparse work too).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub no_preserve: Vec<String>,
    /// Write an `xxh128sum -c` compatible manifest of the copied files to FILE (paths
    /// relative to DST; check with `cd DST && xxh128sum -c FILE`).
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Keep records of the files the manifest lists in FILE (read first, replaced when
    /// the copy ends), so that a re-run with `--overwrite if-changed` lists the files it
    /// keeps unchanged without reading them. Needs --manifest. Keep FILE where only you
    /// can write: its hashes are believed.
    #[arg(long, value_name = "FILE", requires = "manifest")]
    pub records: Option<PathBuf>,
    /// Copy only what matches PATTERN (repeatable): gitignore syntax, relative to SRC; a
    /// file is copied when it or a parent directory matches. Directories are still walked
    /// and made. See docs/copyjob.md#include-and-exclude.
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<String>,
    /// Skip what matches PATTERN (repeatable; gitignore syntax, relative to SRC): a
    /// matching directory is not entered. Wins over --include.
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Mirror: after a copy without failures, remove from DST what SRC (a directory) does
    /// not have: only beneath DST, never through a symlink, never `.ferry/` at the top or a
    /// staging name, never what --include/--exclude leave out (unless --delete-excluded).
    #[arg(long)]
    pub delete: bool,
    /// With --delete: also remove what --include/--exclude leave out, even where SRC has it.
    #[arg(long, requires = "delete")]
    pub delete_excluded: bool,
    /// No progress bar, even on a terminal.
    #[arg(long)]
    pub no_progress: bool,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Continue a copy into DST that was interrupted (killed, cancelled, or stopped by a
    /// full disk): files already there are kept (and counted as resumed when they are the
    /// interrupted run's), unfinished directories get their metadata, the manifest is
    /// appended to (lines the interrupted run lost are added for files equal to their
    /// source). Give the interrupted run's --staging-tag to also finish its staging
    /// directories and remove its staging files.
    #[arg(long)]
    pub resume: bool,
    /// Name staging entries `.ferry-TAG-*.tmp` (1 to 32 letters and digits) instead of by
    /// process id, so that `--resume --staging-tag TAG` can find what an interrupted run
    /// left. Only entries with this tag are ever removed.
    #[arg(long, value_name = "TAG")]
    pub staging_tag: Option<String>,
    /// Flush the destination filesystem (syncfs) before reporting; a failed flush fails the
    /// copy.
    #[arg(long)]
    pub sync: bool,
    /// Keep SRC's privileged files: make its device nodes, keep the setuid and setgid bits
    /// of files and their capabilities (`security.capability`). Without it they are
    /// dropped, as a CopyJob drops them unless its destination allows them: a device node
    /// is not made (reported as a failure), setuid/setgid bits are cleared, capabilities are
    /// not copied. Even kept, setuid/setgid bits and capabilities are dropped from a copy
    /// whose owner could not be kept, as GNU cp does.
    #[arg(long)]
    pub keep_privileged_files: bool,
    /// Copy as a copy between nodes does, on this machine: the source half (walk beneath
    /// SRC, read, hash) and the destination half (everything that writes DST) in one
    /// process, joined by a local socket and the transfer protocol instead of shared
    /// descriptors. For checking that path; slower than a plain local copy (no reflink or
    /// copy_file_range).
    #[arg(long)]
    pub two_halves: bool,
    /// Test only: sleep this many milliseconds before copying each file.
    #[arg(long, hide = true, value_name = "MS")]
    pub fault_delay_per_file_ms: Option<u64>,
}
