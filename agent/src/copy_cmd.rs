//! `ferry-agent copy`: the engine with a terminal progress bar (indicatif) and a summary.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Duration;

use ferry_engine::{Failure, Options, Preserve, Progress, Strategy, Summary};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cli::CopyArgs;

/// Failures printed on stderr; the JSON summary and the count carry the rest.
const FAILURES_SHOWN: usize = 20;
/// How often the bar is moved from the copy's counters (indicatif throttles the drawing).
const BAR_EVERY: Duration = Duration::from_millis(100);

/// Build engine options from the flags, or a message saying what to change.
pub fn options(args: &CopyArgs) -> Result<Options, String> {
    let mut preserve = Preserve::ALL;
    for name in args
        .no_preserve
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
    {
        preserve = preserve.without(name).ok_or_else(|| {
            format!("--no-preserve: unknown metadata kind '{name}'; use a comma-separated list of {}, or all (or the short names mode, links, sparse)", Preserve::NAMES.join(", "))
        })?;
    }
    let filter =
        ferry_engine::Filter::new(&args.include, &args.exclude).map_err(|e| format!("--{e}"))?;
    if args.compare == ferry_engine::Compare::Checksum
        && args.overwrite != ferry_engine::Overwrite::IfChanged
    {
        return Err("--compare checksum decides what --overwrite if-changed replaces: add --overwrite if-changed, or drop --compare".into());
    }
    Ok(Options {
        filter,
        workers: args.workers,
        reflink: args.reflink,
        verify: args.verify,
        overwrite: args.overwrite,
        compare: args.compare,
        preserve,
        manifest: args.manifest.clone(),
        records: args.records.as_ref().map(|r| ferry_engine::Records {
            earlier: r.clone(),
            write: {
                let mut w = r.clone().into_os_string();
                w.push(format!(".{}.tmp", std::process::id()));
                w.into()
            },
        }),
        resume: args.resume,
        staging_tag: args.staging_tag.clone(),
        sync: args.sync,
        privileged: match args.keep_privileged_files {
            true => ferry_engine::Privileged::Keep,
            false => ferry_engine::Privileged::Drop,
        },
        faults: ferry_engine::Faults {
            delay_per_file: args.fault_delay_per_file_ms.map(Duration::from_millis),
            ..ferry_engine::Faults::default()
        },
        ..Options::default()
    })
}

/// Counters the progress bar reads.
#[derive(Default)]
struct Live {
    entries: AtomicU64,
    bytes: AtomicU64,
    failed: AtomicU64,
}

impl Progress for Live {
    fn bytes_copied(&self, bytes: u64, _strategy: Strategy) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    fn entry_done(&self) {
        self.entries.fetch_add(1, Ordering::Relaxed);
    }
    fn failed(&self, _failure: &Failure) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
}

pub fn run(args: &CopyArgs) -> ExitCode {
    let opts = match options(args) {
        Ok(o) => o,
        Err(msg) => return usage(&msg),
    };
    let live = Arc::new(Live::default());
    let show_bar = !args.no_progress && !args.json && std::io::stderr().is_terminal();
    let bar = show_bar.then(|| Bar::start(&args.src, live.clone()));
    let result = match args.two_halves {
        true => two_halves(args, &opts, &*live),
        false => ferry_engine::copy(&args.src, &args.dst, &opts, &*live),
    };
    if let Some(bar) = bar {
        bar.finish();
    }
    let mut summary = match result {
        Ok(s) => s,
        Err(e) => return usage(&crate::with_causes(&e)),
    };
    // A copy that ran to its end recorded every file it listed.
    if let Some(r) = &opts.records {
        let kept = match summary.aborted.is_none() {
            true => std::fs::rename(&r.write, &r.earlier),
            false => std::fs::remove_file(&r.write),
        };
        if let Err(e) = kept {
            eprintln!(
                "ferry-agent copy: keeping the records in {}: {e}",
                r.earlier.display()
            );
        }
    }
    // The mirror, after a copy without failures (as rsync skips deletions after errors).
    let mut deleted = 0;
    if args.delete && summary.failed == 0 && summary.aborted.is_none() && args.src.is_dir() {
        let prune = ferry_engine::PruneOptions {
            filter: opts.filter.clone(),
            delete_excluded: args.delete_excluded,
            reserved_top: std::ffi::CString::new(ferry_crds::STATE_DIR).ok(),
            ..ferry_engine::PruneOptions::default()
        };
        match ferry_engine::prune(&args.src, &args.dst, &prune) {
            Ok(p) => {
                deleted = p.deleted;
                summary.failed += p.failed;
                summary.failures.extend(p.failures);
            }
            Err(e) => return usage(&crate::with_causes(&e)),
        }
    }
    report(&summary, deleted, args.json);
    if summary.failed == 0 && summary.aborted.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The copy through both halves of a copy between nodes, joined by two socket pairs (the
/// streams an agent opens): a source half serves SRC on each, on threads of their own, and
/// the destination half copies from both.
fn two_halves(
    args: &CopyArgs,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Summary, ferry_engine::Error> {
    use ferry_engine::send::{serve, SendOptions, SourceTop};
    let io = |op: &'static str| {
        let path = args.src.clone();
        move |e: std::io::Error| ferry_engine::Error::io(op, path, e)
    };
    let send_opts = SendOptions {
        // As an agent serves a source: the default pool, its depth adaptive.
        workers: opts.workers,
        reserved_top: opts.reserved_top.clone(),
        xattrs: opts.preserve.xattrs,
        ..SendOptions::default()
    };
    // Two streams, as an agent opens (transfer::STREAMS): each served by a source half of
    // its own, as two connections are on the sender's node.
    let mut senders = Vec::new();
    let mut streams: Vec<ferry_engine::recv::Stream> = Vec::new();
    let mut ours_all = Vec::new();
    for _ in 0..2 {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(io("socketpair"))?;
        let reader = theirs.try_clone().map_err(io("socketpair"))?;
        let (top, send_opts) = (
            SourceTop::open(&args.src).map_err(io("open source"))?,
            send_opts.clone(),
        );
        senders.push(std::thread::spawn(move || {
            serve(&top, reader, theirs, &send_opts)
        }));
        streams.push((
            Box::new(ours.try_clone().map_err(io("socketpair"))?),
            Box::new(ours.try_clone().map_err(io("socketpair"))?),
        ));
        ours_all.push(ours);
    }
    let conn = ferry_engine::recv::Connection::start_streams(streams)
        .map_err(io("start the destination half"))?;
    let result = ferry_engine::copy_from(&conn, &args.src, &args.dst, opts, progress);
    // The receiver is done: closing its side ends the senders' loops.
    drop(conn);
    for ours in &ours_all {
        let _ = ours.shutdown(std::net::Shutdown::Both);
    }
    for sender in senders {
        match sender.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                eprintln!("ferry-agent copy: the source half: {e}");
            }
            Err(_) => eprintln!("ferry-agent copy: the source half panicked"),
        }
    }
    result
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("ferry-agent copy: {msg}");
    eprintln!("usage: ferry-agent copy [OPTIONS] SRC DST   (see --help)");
    ExitCode::from(2)
}

/// The progress bar on a terminal. The engine's workers only bump [`Live`]'s atomics; a
/// ticker thread moves the bar from them every [`BAR_EVERY`], and indicatif throttles the
/// drawing.
struct Bar {
    bar: ProgressBar,
    /// Dropped when the copy is done: wakes the ticker at once, so it stops without
    /// waiting out its interval.
    done: std::sync::mpsc::Sender<()>,
    ticker: std::thread::JoinHandle<()>,
}

/// Until the source is counted: what is done so far, without a total.
const COUNTING: &str = "{spinner} {bytes} {binary_bytes_per_sec} {msg}";
/// Counted: bytes done of the total, rate and ETA; entries in the message.
const BYTES: &str =
    "[{wide_bar}] {percent:>3}% {msg} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}";
/// Counted, but nothing but empty files: entries done of the total.
const ENTRIES: &str = "[{wide_bar}] {percent:>3}% {msg}";

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#.")
}

impl Bar {
    /// Show the bar, and count the source in the background so it gets a total; the copy
    /// does not wait for the count.
    fn start(src: &Path, live: Arc<Live>) -> Self {
        let total_entries = Arc::new(AtomicU64::new(0));
        let total_bytes = Arc::new(AtomicU64::new(0));
        let counted = Arc::new(AtomicBool::new(false));
        {
            let (te, tb, counted, src) = (
                total_entries.clone(),
                total_bytes.clone(),
                counted.clone(),
                src.to_path_buf(),
            );
            std::thread::spawn(move || {
                count_tree(&src, &te, &tb);
                counted.store(true, Ordering::Relaxed);
            });
        }
        let bar = ProgressBar::no_length().with_style(style(COUNTING));
        let (done, stopped) = std::sync::mpsc::channel::<()>();
        let ticker = {
            let bar = bar.clone();
            std::thread::spawn(move || {
                // Once counted: whether the bar counts bytes (else entries).
                let mut by_bytes = None;
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(BAR_EVERY) {
                    let (n, b) = (
                        live.entries.load(Ordering::Relaxed),
                        live.bytes.load(Ordering::Relaxed),
                    );
                    let (tn, tb) = (
                        total_entries.load(Ordering::Relaxed),
                        total_bytes.load(Ordering::Relaxed),
                    );
                    if by_bytes.is_none() && counted.load(Ordering::Relaxed) {
                        by_bytes = Some(tb > 0);
                        bar.set_style(style(if tb > 0 { BYTES } else { ENTRIES }));
                        bar.set_length(if tb > 0 { tb } else { tn });
                    }
                    match by_bytes {
                        None => {
                            bar.set_position(b);
                            bar.set_message(format!("{n} entries (counting...)"));
                        }
                        Some(true) => {
                            bar.set_position(b.min(tb));
                            bar.set_message(format!("{n}/{tn} entries"));
                        }
                        Some(false) => {
                            bar.set_position(n.min(tn));
                            bar.set_message(format!("{n}/{tn} entries"));
                        }
                    }
                }
            })
        };
        Self { bar, done, ticker }
    }

    /// Stop the ticker and clear the bar, so the summary is printed on a clean line.
    fn finish(self) {
        drop(self.done);
        let _ = self.ticker.join();
        self.bar.finish_and_clear();
    }
}

fn count_tree(path: &Path, entries: &AtomicU64, bytes: &AtomicU64) {
    let Ok(md) = std::fs::symlink_metadata(path) else {
        return;
    };
    entries.fetch_add(1, Ordering::Relaxed);
    if md.is_file() {
        bytes.fetch_add(md.len(), Ordering::Relaxed);
    } else if md.is_dir() {
        if let Ok(rd) = std::fs::read_dir(path) {
            for e in rd.flatten() {
                count_tree(&e.path(), entries, bytes);
            }
        }
    }
}

pub use ferry_crds::human_bytes as human;

#[derive(Serialize)]
struct JsonFailure<'a> {
    path: String,
    op: &'a str,
    reason: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct JsonSummary<'a> {
    ok: bool,
    files: u64,
    dirs: u64,
    symlinks: u64,
    specials: u64,
    hardlinks: u64,
    skipped: u64,
    listed_from_records: u64,
    unlisted: u64,
    deleted: u64,
    files_resumed: u64,
    bytes_resumed: u64,
    verified: u64,
    bytes: u64,
    bytes_reflinked: u64,
    bytes_copy_file_range: u64,
    bytes_read_write: u64,
    elapsed_seconds: f64,
    bytes_per_second: f64,
    failed: u64,
    failures: Vec<JsonFailure<'a>>,
    aborted: Option<&'a str>,
}

fn report(s: &Summary, deleted: u64, json: bool) {
    let secs = s.elapsed.as_secs_f64();
    let rate = s.bytes as f64 / secs.max(1e-9);
    if json {
        let out = JsonSummary {
            ok: s.failed == 0 && s.aborted.is_none(),
            files: s.files,
            dirs: s.dirs,
            symlinks: s.symlinks,
            specials: s.specials,
            hardlinks: s.hardlinks,
            skipped: s.skipped,
            listed_from_records: s.listed_from_records,
            unlisted: s.unlisted,
            deleted,
            files_resumed: s.files_resumed,
            bytes_resumed: s.bytes_resumed,
            verified: s.verified,
            bytes: s.bytes,
            bytes_reflinked: s.bytes_reflinked,
            bytes_copy_file_range: s.bytes_copy_file_range,
            bytes_read_write: s.bytes_read_write,
            elapsed_seconds: secs,
            bytes_per_second: rate,
            failed: s.failed,
            failures: s
                .failures
                .iter()
                .map(|f| JsonFailure {
                    path: f.path.to_string_lossy().into_owned(),
                    op: f.op,
                    reason: f.kind.as_str(),
                    message: &f.message,
                })
                .collect(),
            aborted: s.aborted.as_deref(),
        };
        match serde_json::to_string(&out) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("ferry-agent copy: cannot encode summary: {e}"),
        }
    } else {
        let mut extra = String::new();
        if s.skipped > 0 {
            extra.push_str(&format!(", {} kept (already in destination)", s.skipped));
        }
        if s.unlisted > 0 {
            extra.push_str(&format!(
                ", {} of the kept files not in the manifest (no record of them: --records, or --compare checksum)",
                s.unlisted
            ));
        }
        if s.files_resumed > 0 {
            extra.push_str(&format!(
                ", {} of them copied by the interrupted run ({})",
                s.files_resumed,
                human(s.bytes_resumed)
            ));
        }
        if s.verified > 0 {
            extra.push_str(&format!(", {} verified", s.verified));
        }
        if deleted > 0 {
            extra.push_str(&format!(", {deleted} removed from DST (not in SRC)"));
        }
        eprintln!(
            "copied {} files, {} dirs, {} symlinks, {} special, {} hard links: {} ({} reflinked) in {:.2}s, {}/s{extra}",
            s.files,
            s.dirs,
            s.symlinks,
            s.specials,
            s.hardlinks,
            human(s.bytes),
            human(s.bytes_reflinked),
            secs,
            human(rate as u64)
        );
    }
    for f in s.failures.iter().take(FAILURES_SHOWN) {
        eprintln!("failed [{}]: {f}", f.kind.as_str());
    }
    if s.failed > FAILURES_SHOWN as u64 {
        eprintln!("... and {} more failures", s.failed - FAILURES_SHOWN as u64);
    }
    if let Some(why) = &s.aborted {
        eprintln!("stopped early: {why}; free space on the destination and run the same command with --resume (or --overwrite if-changed) to finish");
    } else if s.failed > 0 {
        eprintln!("{} entries failed; fix the causes above and re-run with --overwrite if-changed to copy only what is missing", s.failed);
    }
}
