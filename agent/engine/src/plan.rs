//! Counting what a copy would carry, without copying (dry runs, progress totals).

use std::os::fd::AsFd;
use std::path::Path;

use crate::copy::{cstring, open_source_dir, part_of};
use crate::options::Part;
use crate::{dirent, sys, Error};

/// What a copy of `src` would carry: regular files, their bytes, and directories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub files: u64,
    pub bytes: u64,
    pub dirs: u64,
    /// Symlinks and special files.
    pub others: u64,
}

/// Count `src` without copying anything (a CopyJob's dry run, a progress bar's total).
/// Walks through directory fds like the copy does, never following a symlink; entries
/// that cannot be read are skipped, so the totals are a lower bound.
pub fn plan(src: &Path) -> Result<Totals, Error> {
    plan_part(src, Part::All, true)
}

/// [`plan`] for the entries a copy with this `select` (and hard links kept or not) would
/// carry: one part of a split copy counts the files it owns.
pub fn plan_part(src: &Path, select: Part, links: bool) -> Result<Totals, Error> {
    let src_c = cstring(src)?;
    let st = sys::stat_path(&src_c, false).map_err(|e| Error::io("stat source", src, e))?;
    let mut totals = Totals::default();
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        if select != Part::All {
            return Ok(totals);
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            totals.files = 1;
            totals.bytes = st.st_size as u64;
        } else {
            totals.others = 1;
        }
        return Ok(totals);
    }
    let owned = |rel: &[u8], est: &libc::stat| match select {
        Part::All => true,
        Part::Directories => false,
        Part::Slice { index, count } => {
            let inode = (links && est.st_nlink > 1).then_some((est.st_dev, est.st_ino));
            part_of(rel, inode, count) == index
        }
    };
    let mut stack = vec![(open_source_dir(src)?, Vec::new())];
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen = std::collections::HashSet::new();
    while let Some((dir, rel)) = stack.pop() {
        totals.dirs += 1;
        let Ok(entries) = dirent::read_all(dir.as_fd(), &mut buf) else {
            continue;
        };
        for e in entries {
            let Ok(est) = sys::lstatat(dir.as_fd(), &e.name) else {
                continue;
            };
            let mut path = rel.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(e.name.to_bytes());
            match est.st_mode & libc::S_IFMT {
                libc::S_IFDIR => {
                    // O_NOATIME as the copy does: a plan must not move the source's atimes
                    // (a copy running next to it preserves them).
                    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                    let fd = sys::open_beneath(dir.as_fd(), &e.name, flags | libc::O_NOATIME)
                        .or_else(|_| sys::open_beneath(dir.as_fd(), &e.name, flags));
                    if let Ok(fd) = fd {
                        stack.push((fd, path));
                    }
                }
                _ if !owned(&path, &est) => {}
                libc::S_IFREG => {
                    // A hard-linked file counts once, as the copy counts it.
                    if !(links && est.st_nlink > 1) || seen.insert((est.st_dev, est.st_ino)) {
                        totals.files += 1;
                        totals.bytes += est.st_size as u64;
                    }
                }
                _ => totals.others += 1,
            }
        }
    }
    Ok(totals)
}
