//! A block copy's manifest: the xxHash3-128 of every chunk, in order, and the device's hash
//! (the hash of that list). Kept by the agent, where it keeps job state, never on the
//! volume: a re-run trusts it for the destination's hashes only because nothing but the
//! agent could have written it. Read back bounded and checked all the same.

use std::fmt::Write as _;
use std::io::{self, Read};

use twox_hash::XxHash3_128;

/// Most chunks a manifest may list: 16 TiB at 4 MiB chunks, 64 MiB of hashes in memory.
pub const MAX_CHUNKS: u64 = 1 << 22;
/// The chunk sizes a copy may use: powers of two from 64 KiB to 64 MiB.
pub const MIN_CHUNK: u64 = 64 << 10;
pub const MAX_CHUNK: u64 = 64 << 20;

const MAGIC: &str = "# ferry block manifest v1";

/// The chunk hashes of one device's first `size` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkManifest {
    pub chunk: u64,
    pub size: u64,
    pub hashes: Vec<u128>,
}

impl ChunkManifest {
    /// Chunks a device of `size` bytes has at `chunk` bytes each (the last may be short).
    pub fn chunks(size: u64, chunk: u64) -> u64 {
        size.div_ceil(chunk)
    }

    /// Whether `size` and `chunk` make a manifest Ferry would write (and so read).
    pub fn check_shape(size: u64, chunk: u64) -> Result<(), String> {
        if !chunk.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return Err(format!(
                "chunk size {chunk}: must be a power of two from {MIN_CHUNK} to {MAX_CHUNK} bytes"
            ));
        }
        if Self::chunks(size, chunk) > MAX_CHUNKS {
            return Err(format!(
                "{size} bytes in {chunk}-byte chunks is more than {MAX_CHUNKS} chunks: use larger chunks"
            ));
        }
        Ok(())
    }

    /// The whole device's hash: xxHash3-128 of the chunk hashes (little-endian, in order),
    /// so workers hash chunks in any order and nobody re-reads the device for it.
    pub fn digest(&self) -> u128 {
        let mut h = XxHash3_128::new();
        for c in &self.hashes {
            h.write(&c.to_le_bytes());
        }
        h.finish_128()
    }

    pub fn to_text(&self) -> String {
        let mut s = String::with_capacity(self.hashes.len() * 33 + 128);
        let _ = writeln!(s, "{MAGIC}");
        let _ = writeln!(s, "chunk {}", self.chunk);
        let _ = writeln!(s, "size {}", self.size);
        let _ = writeln!(s, "device {:032x}", self.digest());
        for h in &self.hashes {
            let _ = writeln!(s, "{h:032x}");
        }
        s
    }

    /// Read a manifest written by [`to_text`](Self::to_text): at most what the largest
    /// manifest takes is read, and every line is checked (shape, count, device hash).
    pub fn read_from(r: impl Read) -> io::Result<ChunkManifest> {
        let bound = 256 + MAX_CHUNKS * 33;
        let mut text = String::new();
        r.take(bound + 1).read_to_string(&mut text)?;
        if text.len() as u64 > bound {
            return Err(bad("longer than any manifest"));
        }
        Self::parse(&text).map_err(bad)
    }

    fn parse(text: &str) -> Result<ChunkManifest, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("the first line is not {MAGIC:?}"));
        }
        let mut field = |name: &str| -> Result<&str, String> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .ok_or_else(|| format!("no {name:?} line where one belongs"))
        };
        let number = |v: &str, name: &str| v.parse::<u64>().map_err(|_| format!("{name} {v:?}"));
        let chunk = number(field("chunk")?, "chunk")?;
        let size = number(field("size")?, "size")?;
        let device = hex(field("device")?)?;
        Self::check_shape(size, chunk)?;
        let want = Self::chunks(size, chunk);
        let hashes = lines.map(hex).collect::<Result<Vec<_>, _>>()?;
        if hashes.len() as u64 != want {
            return Err(format!(
                "{} chunk hashes where {size} bytes in {chunk}-byte chunks have {want}",
                hashes.len()
            ));
        }
        let m = ChunkManifest {
            chunk,
            size,
            hashes,
        };
        if m.digest() != device {
            return Err("the device hash is not the hash of its chunk hashes".into());
        }
        Ok(m)
    }
}

fn hex(s: &str) -> Result<u128, String> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{s:?} is not a 128-bit hash in 32 hex digits"));
    }
    u128::from_str_radix(s, 16).map_err(|e| e.to_string())
}

fn bad(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not a block manifest Ferry wrote: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ChunkManifest {
        ChunkManifest {
            chunk: 1 << 20,
            size: (3 << 20) + 5,
            hashes: vec![1, u128::MAX, 0xabc, 7],
        }
    }

    #[test]
    fn a_manifest_reads_back_as_written() {
        let m = sample();
        assert_eq!(
            ChunkManifest::read_from(m.to_text().as_bytes()).expect("reads back"),
            m
        );
    }

    #[test]
    fn a_changed_hash_a_missing_line_or_a_wrong_shape_is_refused() {
        let text = sample().to_text();
        let changed = text.replacen(&format!("{:032x}", 0xabc), &format!("{:032x}", 0xabd), 1);
        let short = text
            .rsplit_once(&format!("{:032x}\n", 7))
            .expect("the last line")
            .0
            .to_owned();
        let odd = text.replace("chunk 1048576", "chunk 1000000");
        for (what, t) in [("changed", changed), ("short", short), ("odd chunk", odd)] {
            let err = ChunkManifest::read_from(t.as_bytes()).expect_err("refused");
            assert!(
                err.to_string().contains("not a block manifest"),
                "{what}: {err}"
            );
        }
        let huge = format!(
            "{MAGIC}\nchunk 65536\nsize {}\ndevice {:032x}\n",
            u64::MAX,
            0
        );
        assert!(ChunkManifest::read_from(huge.as_bytes()).is_err());
    }
}
