//! The `xxh128sum -c` manifest: a line written per committed file, and read back by a
//! resumed copy to know which files an interrupted run finished.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, Write};
use std::sync::atomic::Ordering;

use twox_hash::XxHash3_64;

use super::records::Record;
use super::{lock, Ctx};
use crate::sys::Stat;

impl<'a> Ctx<'a> {
    /// Flush the manifest (its lines were written as files committed): the workers'
    /// pending lines, then the file. With `Options::sync` it is also flushed to stable
    /// storage: it may live on another filesystem than the destination's.
    pub(super) fn finish_manifest(&self) -> io::Result<()> {
        let Some(m) = &self.manifest else {
            return Ok(());
        };
        let files = std::iter::once(m).chain(&self.records);
        if self.fenced.load(Ordering::Relaxed) {
            // Not ours to write any more (the new owner may be appending): drop the
            // pending and buffered lines; the new owner verifies those files and lists
            // them itself.
            for slot in &self.pending {
                *lock(slot) = Pending::default();
            }
            for w in files {
                let mut w = lock(w);
                let file = w.get_ref().try_clone()?;
                let (_, _unwritten) = std::mem::replace(&mut *w, BufWriter::new(file)).into_parts();
            }
            return Ok(());
        }
        for slot in &self.pending {
            self.write_pending(&mut lock(slot))?;
        }
        for w in files {
            let mut w = lock(w);
            w.flush()?;
            if self.opts.sync {
                w.get_ref().sync_data()?;
            }
        }
        Ok(())
    }

    /// Whether this copy writes records of what it lists (see `records`).
    pub(super) fn records_on(&self) -> bool {
        self.records.is_some()
    }

    /// List `path` with `hash` in the manifest, and record it with the size and mtime of
    /// `st` (the source's, which the destination file was given) when records are kept.
    /// A worker gathers its lines and records in its own buffers and writes them out a
    /// [`PENDING`] at a time: one shared buffer written per file by every worker was a
    /// measurable part of listing 100k kept files (its lock and cache lines went back and
    /// forth between the cores).
    pub(super) fn manifest_line(&self, hash: u128, path: &[u8], st: Option<&Stat>) {
        if self.manifest.is_none() {
            return;
        }
        let slot = rayon::current_thread_index().and_then(|i| self.pending.get(i));
        let mut own = Pending::default();
        let mut guard = slot.map(lock);
        let p = guard.as_deref_mut().unwrap_or(&mut own);
        if let (Some(_), Some(st)) = (&self.records, st) {
            p.records
                .extend_from_slice(&Record::of(path, hash, st).bytes());
        }
        push_line(&mut p.lines, hash, path);
        if p.lines.len() >= PENDING || slot.is_none() {
            let _ = self.write_pending(p);
        }
    }

    /// Write out what a worker gathered (see [`Ctx::manifest_line`]).
    fn write_pending(&self, p: &mut Pending) -> io::Result<()> {
        if let Some(m) = &self.manifest {
            if !p.lines.is_empty() {
                lock(m).write_all(&p.lines)?;
                p.lines.clear();
            }
        }
        if let Some(r) = &self.records {
            if !p.records.is_empty() {
                lock(r).write_all(&p.records)?;
                p.records.clear();
            }
        }
        Ok(())
    }
}

/// A worker's manifest lines and records not written yet, written out at this size.
pub(super) const PENDING: usize = 64 << 10;

/// What one worker has gathered for the manifest and the records.
#[derive(Debug, Default)]
pub(super) struct Pending {
    lines: Vec<u8>,
    records: Vec<u8>,
}

/// Append the manifest line of `path` with `hash` to `line`.
fn push_line(line: &mut Vec<u8>, hash: u128, path: &[u8]) {
    // A newline would end the line: such names are escaped GNU-style (a leading
    // backslash marks the line; `\\` and `\n` inside), which xxhsum 0.8.2+ and the
    // coreutils *sum tools read. Other names are written raw, which is what xxhsum
    // 0.8.1 (Debian 12) expects even for backslashes.
    let needs_escape = path.contains(&b'\n');
    if needs_escape {
        line.push(b'\\');
    }
    // The hash as 32 lowercase hex digits (by hand: a formatter call per line was a
    // measurable part of listing 100k kept files).
    const HEX: &[u8; 16] = b"0123456789abcdef";
    line.extend(
        (0..32)
            .rev()
            .map(|i| HEX[((hash >> (4 * i)) & 0xf) as usize]),
    );
    line.extend_from_slice(b"  ");
    for &b in path {
        match b {
            b'\n' if needs_escape => line.extend_from_slice(b"\\n"),
            b'\\' if needs_escape => line.extend_from_slice(b"\\\\"),
            _ => line.push(b),
        }
    }
    line.push(b'\n');
}

/// The longest line a manifest has: the hash, its separator and a path of PATH_MAX bytes
/// with every byte escaped, the escape mark and the newline.
pub(crate) const MAX_LINE: u64 = 1 + 32 + 2 + 2 * 4096 + 1;

/// Read the manifest an interrupted run wrote: the xxh3-64 of each path it lists (8 bytes
/// a file, however long the paths). A last line cut short (the process died while its
/// buffer was written out) is removed, so the lines appended next start on a line.
///
/// Only a regular file is read (a FIFO at its name would block the read forever), one
/// line at a time and never more than [`MAX_LINE`] of it (a huge file without newlines is
/// refused, not read into memory).
pub(super) fn read_manifest(file: &mut File) -> io::Result<HashSet<u64>> {
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file; a manifest is one",
        ));
    }
    file.rewind()?;
    let mut listed = HashSet::new();
    let mut whole = 0u64;
    let mut reader = BufReader::with_capacity(1 << 16, &*file);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line)?;
        if n as u64 == MAX_LINE && line.last() != Some(&b'\n') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a line longer than {MAX_LINE} bytes; not a manifest Ferry wrote"),
            ));
        }
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        whole += n as u64;
        if let Some((_, path)) = parse_line(&line[..n - 1]) {
            listed.insert(XxHash3_64::oneshot(&path));
        }
    }
    drop(reader);
    if file.metadata()?.len() > whole {
        file.set_len(whole)?;
    }
    Ok(listed)
}

/// The hash and path of one manifest line (without its newline), as `manifest_line` wrote
/// it: the path raw, or GNU-escaped (`\` first, `\\` and `\n` inside) for a name with a
/// newline. `None`: not such a line.
pub(crate) fn parse_line(line: &[u8]) -> Option<(u128, Vec<u8>)> {
    let (escaped, rest) = match line.strip_prefix(b"\\") {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let hex = rest.get(..32)?;
    let sep = rest.get(32..34)?;
    if !hex.iter().all(u8::is_ascii_hexdigit) || (sep != b"  " && sep != b" *") {
        return None;
    }
    let hash = u128::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
    let raw = &rest[34..];
    if !escaped {
        return Some((hash, raw.to_vec()));
    }
    let mut path = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        match (b, bytes.clone().next()) {
            (b'\\', Some(b'n')) => {
                path.push(b'\n');
                bytes.next();
            }
            (b'\\', Some(b'\\')) => {
                path.push(b'\\');
                bytes.next();
            }
            _ => path.push(b),
        }
    }
    Some((hash, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn manifest_paths_are_read_back_raw_or_unescaped() {
        let hash = "0123456789abcdef0123456789abcdef";
        let h = 0x0123456789abcdef0123456789abcdef;
        assert_eq!(
            parse_line(format!("{hash}  a/b c\\d").as_bytes()),
            Some((h, b"a/b c\\d".to_vec()))
        );
        assert_eq!(
            parse_line(format!("\\{hash}  new\\nline\\\\x").as_bytes()),
            Some((h, b"new\nline\\x".to_vec()))
        );
        assert_eq!(parse_line(b"not a manifest line"), None);
    }

    #[test]
    fn a_planted_fifo_or_newline_less_file_is_refused_not_read_whole_or_waited_on() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fifo = tmp.path().join("fifo");
        let dir = File::open(tmp.path()).expect("open dir");
        crate::sys::mknodat(
            std::os::fd::AsFd::as_fd(&dir),
            c"fifo",
            libc::S_IFIFO | 0o600,
            0,
        )
        .expect("mkfifo");
        // As the engine opens one to resume from: O_NONBLOCK keeps the open from waiting.
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&fifo)
            .expect("open fifo");
        let err = read_manifest(&mut f).expect_err("a FIFO is no manifest");
        assert!(err.to_string().contains("regular file"), "{err}");
        let mut big = tempfile::tempfile().expect("tempfile");
        big.write_all(&vec![b'a'; 1 << 20]).expect("write");
        let err = read_manifest(&mut big).expect_err("no line is that long");
        assert!(err.to_string().contains("longer than"), "{err}");
    }

    #[test]
    fn a_manifest_line_cut_short_is_dropped_and_removed() -> io::Result<()> {
        let mut f = tempfile::tempfile()?;
        let hash = "0123456789abcdef0123456789abcdef";
        f.write_all(format!("{hash}  one\n{hash}  two\n{hash}  thr").as_bytes())?;
        let listed = read_manifest(&mut f)?;
        assert_eq!(listed.len(), 2);
        assert!(
            listed.contains(&XxHash3_64::oneshot(b"one"))
                && listed.contains(&XxHash3_64::oneshot(b"two"))
        );
        let mut text = String::new();
        f.rewind()?;
        f.read_to_string(&mut text)?;
        assert_eq!(text, format!("{hash}  one\n{hash}  two\n"));
        Ok(())
    }
}
