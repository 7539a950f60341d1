//! Counting what a copy would carry, without copying (dry runs, progress totals), walking
//! as the copy does: listings streamed, subdirectories opened when their turn comes, and
//! hard-link groups forgotten with their last name, so a wide, deep or hard-linked tree
//! costs no more memory or descriptors than it does the copy.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;

use crate::open::{cstring, open_source_dir};
use crate::options::{part_of, Filter, Part};
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
    plan_part(src, Part::All, true, &Filter::default())
}

/// [`plan`] for the entries a copy with this `select`, hard links kept or not, and this
/// `filter` would carry: one part of a split copy counts the files it owns.
pub fn plan_part(src: &Path, select: Part, links: bool, filter: &Filter) -> Result<Totals, Error> {
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
    Ok(count_dir(
        open_source_dir(src)?,
        select,
        links,
        filter,
        None,
    ))
}

/// Count the tree beneath the open directory `top` as [`plan_part`] counts a directory,
/// leaving out the entry named `reserved` at the top (Ferry's own state, which a copy never
/// carries).
pub(crate) fn count_dir(
    top: OwnedFd,
    select: Part,
    links: bool,
    filter: &Filter,
    reserved: Option<&CStr>,
) -> Totals {
    let mut totals = Totals::default();
    let owned = |rel: &[u8], est: &libc::stat| match select {
        Part::All => true,
        Part::Directories => false,
        Part::Slice { index, count } => {
            let inode = (links && est.st_nlink > 1).then_some((est.st_dev, est.st_ino));
            part_of(rel, inode, count) == index
        }
    };
    // Subdirectories still to count, each opened when its turn comes beneath its parent's
    // descriptor (shared by its waiting siblings): what is open at once does not grow with a
    // directory's width. Paths are built only where a split copy's parts need them.
    let paths = matches!(select, Part::Slice { .. }) || !filter.is_all();
    let mut stack: Vec<(Rc<OwnedFd>, Option<CString>, Vec<u8>)> =
        vec![(Rc::new(top), None, Vec::new())];
    let mut buf = vec![0u8; 64 * 1024];
    // Hard-linked files counted, with how many of their names are still to come: each is
    // forgotten with its last name.
    let mut linked: HashMap<(u64, u64), u64> = HashMap::new();
    while let Some((parent, name, rel)) = stack.pop() {
        let at_top = name.is_none();
        let dir = match name {
            None => parent,
            Some(name) => {
                // O_NOATIME as the copy does: a plan must not move the source's atimes
                // (a copy running next to it preserves them).
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                let fd = sys::open_beneath(parent.as_fd(), &name, flags | libc::O_NOATIME)
                    .or_else(|_| sys::open_beneath(parent.as_fd(), &name, flags));
                match fd {
                    Ok(fd) => Rc::new(fd),
                    Err(_) => continue,
                }
            }
        };
        totals.dirs += 1;
        // A buffer of entries at a time: a directory is never held whole.
        let mut listing = dirent::Listing::new(dir.as_fd(), &mut buf);
        while let Ok(Some((name, _))) = listing.next_entry() {
            if at_top && reserved == Some(name) {
                continue;
            }
            let Ok(est) = sys::lstatat(dir.as_fd(), name) else {
                continue;
            };
            let mut path = Vec::new();
            if paths {
                path.extend_from_slice(&rel);
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(name.to_bytes());
            }
            let is_dir = est.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if !filter.admits(&path, is_dir) {
                continue;
            }
            match est.st_mode & libc::S_IFMT {
                libc::S_IFDIR => stack.push((dir.clone(), Some(name.to_owned()), path)),
                _ if !owned(&path, &est) => {}
                libc::S_IFREG => {
                    // A hard-linked file counts once, as the copy counts it.
                    if !(links && est.st_nlink > 1)
                        || first_name(&mut linked, (est.st_dev, est.st_ino), est.st_nlink)
                    {
                        totals.files += 1;
                        totals.bytes += est.st_size as u64;
                    }
                }
                _ => totals.others += 1,
            }
        }
    }
    totals
}

/// Whether this is the first name of hard-linked file `key` (of `nlink` names) to be seen.
fn first_name(linked: &mut HashMap<(u64, u64), u64>, key: (u64, u64), nlink: u64) -> bool {
    match linked.get_mut(&key) {
        None => {
            linked.insert(key, nlink.saturating_sub(1));
            true
        }
        Some(left) => {
            *left = left.saturating_sub(1);
            if *left == 0 {
                linked.remove(&key);
            }
            false
        }
    }
}
