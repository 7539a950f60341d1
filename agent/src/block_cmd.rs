//! `ferry-agent copy-block`: the engine's block copy from the command line, for a device
//! (or disk image) on this machine, and for the benchmark against `dd` and `qemu-img`.

use std::io::IsTerminal;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};

use ferry_engine::block::{copy_device, BlockOptions, BlockSummary, ChunkManifest, Device};
use ferry_engine::block::{Cache, Rerun, Zeros};
use ferry_engine::{Compare, NoProgress, Overwrite, Progress, Strategy, Verify};

use crate::cli::CopyBlockArgs;

/// Build the engine's options from the flags, or a message saying what to change.
pub fn options(args: &CopyBlockArgs) -> Result<BlockOptions, String> {
    let rerun = match (args.overwrite, args.compare) {
        (Overwrite::Always, Compare::SizeAndTime) => Rerun::WriteAll,
        (Overwrite::Always, Compare::Checksum) => {
            return Err("--compare checksum decides what --overwrite if-changed writes: add --overwrite if-changed, or drop --compare".into())
        }
        (Overwrite::IfChanged, Compare::Checksum) => Rerun::OnlyChanged,
        (Overwrite::IfChanged, Compare::SizeAndTime) => {
            return Err("a device has no sizes or times to compare: use --overwrite if-changed --compare checksum (only chunks whose hashes differ are written)".into())
        }
        (Overwrite::Never, _) => {
            return Err("--overwrite never keeps what DST holds, which for a device is all of it: use always, or if-changed --compare checksum".into())
        }
    };
    let verify = args.verify != Verify::None;
    if args.verify == Verify::Full && args.cache == "buffered" {
        return Err("--verify full reads every chunk back from the device itself: it cannot with --cache buffered; use --cache direct (or auto)".into());
    }
    ChunkManifest::check_shape(0, args.chunk).map_err(|e| format!("--chunk: {e}"))?;
    if args.kept.is_some() && rerun != Rerun::OnlyChanged {
        return Err("--kept stands in for reading DST when only changed chunks are written: add --overwrite if-changed --compare checksum".into());
    }
    let kept = match &args.kept {
        None => None,
        Some(path) => Some(
            std::fs::File::open(path)
                .and_then(ChunkManifest::read_from)
                .map_err(|e| format!("--kept {}: {e}", path.display()))?,
        ),
    };
    Ok(BlockOptions {
        chunk: args.chunk,
        workers: args.workers,
        rerun,
        kept,
        changed: None,
        verify,
        verify_punched: args.verify == Verify::Full,
        cache: match args.cache.as_str() {
            _ if args.verify == Verify::Full => Cache::Direct,
            "direct" => Cache::Direct,
            "buffered" => Cache::Buffered,
            _ => Cache::Auto,
        },
        zeros: if args.write_zeros {
            Zeros::Write
        } else {
            Zeros::Punch
        },
        cancel: None,
        journal: args.journal.clone(),
        delay_per_chunk: fault_chunk_delay(),
    })
}

/// The test hook the agent's file copies have too (FERRY_FAULT_FILE_DELAY_MS): a pause
/// per chunk, for copy-block and the agent's block shards alike.
pub fn fault_chunk_delay() -> Option<std::time::Duration> {
    std::env::var("FERRY_FAULT_CHUNK_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis)
}

/// At most this many lines in a --changed file (2^20 ranges; a 4 TiB device's chunks).
const MAX_CHANGED_RANGES: usize = 1 << 20;

/// The --changed file's ranges, or what to change.
fn changed_ranges(args: &CopyBlockArgs) -> Result<Option<ferry_cbt::Ranges>, String> {
    let Some(path) = &args.changed else {
        return Ok(None);
    };
    // ~40 bytes a line at most: the file is read only that far.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            std::io::Read::read_to_string(
                &mut std::io::Read::take(f, MAX_CHANGED_RANGES as u64 * 42),
                &mut text,
            )
        })
        .map_err(|e| format!("--changed {}: {e}", path.display()))?;
    ferry_cbt::Ranges::parse(&text, MAX_CHANGED_RANGES)
        .map(Some)
        .map_err(|e| format!("--changed {}: {e}", path.display()))
}

pub fn run(args: &CopyBlockArgs) -> ExitCode {
    let mut opts = match options(args) {
        Ok(o) => o,
        Err(msg) => return usage(&msg),
    };
    let changed = match changed_ranges(args) {
        Ok(c) => c,
        Err(msg) => return usage(&msg),
    };
    let show = !args.no_progress && std::io::stderr().is_terminal();
    let result = Device::open(&args.src, false, false).and_then(|src| {
        if let Some(c) = &changed {
            opts.changed = Some(c.chunks(opts.chunk, src.size()));
        }
        let mut dst = Device::open(&args.dst, true, true)?;
        if !show {
            return copy_device(&src, &mut dst, &opts, &NoProgress);
        }
        let bar = Bar::new(src.size(), opts.chunk);
        let result = copy_device(&src, &mut dst, &opts, &bar);
        bar.0.finish_and_clear();
        result
    });
    let summary = match result {
        Ok(s) => s,
        // DST too small is the caller's to change, like a flag: exit 2 too.
        Err(
            e @ (ferry_engine::Error::Usage(_)
            | ferry_engine::Error::Refused {
                reason: ferry_crds::Reason::DestinationTooSmall,
                ..
            }),
        ) => return usage(&e.to_string()),
        Err(e) => {
            eprintln!("ferry-agent copy-block: {}", crate::with_causes(&e));
            return ExitCode::FAILURE;
        }
    };
    if let (Some(path), Some(m)) = (&args.manifest, &summary.manifest) {
        if let Err(e) = std::fs::write(path, m.to_text()) {
            eprintln!(
                "ferry-agent copy-block: write the manifest {}: {e}",
                path.display()
            );
            return ExitCode::FAILURE;
        }
    }
    if changed.is_some() && !summary.delta_used {
        eprintln!("ferry-agent copy-block: --changed was not used (the --kept manifest is of another chunk size or device size): every chunk was compared");
    }
    println!("{}", report(&summary));
    ExitCode::SUCCESS
}

/// The progress bar on a terminal: bytes of the device done (written, punched, found
/// unchanged or finished by an earlier run) of its size, the rate and the time left.
struct Bar(ProgressBar, u64);

impl Bar {
    fn new(size: u64, chunk: u64) -> Bar {
        let style = ProgressStyle::with_template(
            "[{wide_bar}] {percent:>3}% {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#.");
        Bar(ProgressBar::new(size).with_style(style), chunk)
    }
}

impl Progress for Bar {
    fn bytes_copied(&self, bytes: u64, _: Strategy) {
        self.0.inc(bytes);
    }
    /// A chunk the destination already had (its last one may be shorter: the bar's
    /// position never passes its length).
    fn skipped(&self) {
        let left = self
            .0
            .length()
            .unwrap_or(0)
            .saturating_sub(self.0.position());
        self.0.inc(self.1.min(left));
    }
    fn resumed(&self, size: u64) {
        self.0.inc(size);
    }
}

/// One line a person reads, with the numbers a script greps.
fn report(s: &BlockSummary) -> String {
    let secs = s.elapsed.as_secs_f64();
    let device = s.manifest.as_ref().map_or_else(
        || "none (cancelled)".into(),
        |m| format!("{:032x}", m.digest()),
    );
    format!(
        "copied {} bytes in {:.3} s ({:.0} MB/s, {}): {} chunks of {} bytes: {} written, {} punched, {} zeros written, {} unchanged, {} resumed; read {} bytes of the source, {} of the destination; {} verified; device hash {device}",
        s.size,
        secs,
        s.size as f64 / secs.max(1e-9) / 1e6,
        if s.direct { "direct I/O" } else { "page cache" },
        s.chunks,
        s.chunk,
        s.written,
        s.punched,
        s.zeros_written,
        s.unchanged,
        s.resumed,
        s.bytes_read_source,
        s.bytes_read_destination,
        s.verified,
    )
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("ferry-agent copy-block: {msg}");
    eprintln!("usage: ferry-agent copy-block [OPTIONS] SRC DST   (see --help)");
    ExitCode::from(2)
}
