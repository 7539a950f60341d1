//! Resuming an interrupted copy: adopting the staging directories it left, sweeping its
//! staging leftovers, and telling the files it committed (listed in its manifest, or equal
//! to the source) from one it was still writing when it died.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;

use twox_hash::XxHash3_64;

use crate::dirent::{DType, Listing};
use crate::options::{Compare, Overwrite};
use crate::sys::{self, Stat};
use crate::{data, meta};

use super::{is_type, patch, Ctx, Fail, Local, OpenDir, SrcFile};

impl<'a> Ctx<'a> {
    /// The staging directory an interrupted run with this copy's tag left in `parent` for
    /// `name`, opened, and its staging name; only for a resumed copy, and only while `name`
    /// itself is free (a directory made there since is merged into instead).
    pub(super) fn adopt_staged(
        &self,
        parent: BorrowedFd<'_>,
        name: &CStr,
    ) -> Option<(OwnedFd, CString)> {
        if !self.opts.resume || self.opts.staging_tag.is_none() {
            return None;
        }
        let tmp = self.dir_tmp_name(name);
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let fd = sys::open_beneath(parent, &tmp, flags).ok()?;
        match sys::lstatat(parent, name) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Some((fd, tmp)),
            _ => None,
        }
    }

    /// Remove the staging files, symlinks and special files an interrupted attempt with
    /// this copy's tag left in `node`, a directory that existed before this run (its
    /// staging directories are adopted by `open_subdir` instead). Names without our tag are
    /// never touched, whatever they look like: they may be a tenant's, or another copy's.
    pub(super) fn sweep_leftovers(&self, node: &OpenDir, local: &mut Local) {
        let Some(tag) = &self.opts.staging_tag else {
            return;
        };
        let prefix = format!(".ferry-{tag}-");
        // A buffer at a time, removing as it goes: never the whole directory in memory.
        let mut listing = Listing::new(node.dst.as_fd(), &mut local.dents);
        loop {
            let (name, dtype) = match listing.next_entry() {
                Ok(Some(entry)) => entry,
                Ok(None) => return,
                Err(e) => return self.fail(&node.path(), "read destination directory", &e),
            };
            let n = name.to_bytes();
            if !(n.starts_with(prefix.as_bytes()) && n.ends_with(b".tmp")) {
                continue;
            }
            let is_dir = match dtype {
                DType::Dir => true,
                DType::Unknown => sys::lstatat(node.dst.as_fd(), name)
                    .map_or(true, |st| is_type(&st, libc::S_IFDIR)),
                _ => false,
            };
            if is_dir {
                continue;
            }
            match sys::unlinkat(node.dst.as_fd(), name, false) {
                Ok(()) => {}
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
                Err(err) => self.fail(&node.child_path(name), "remove staging leftover", &err),
            }
        }
    }

    /// Whether `dir/name`, found by a resumed copy in one of its own staging directories,
    /// may be a finished copy of `st`: a regular file of its size, and (when times are
    /// kept) its mtime, which is applied after the data. A file caught mid-write has
    /// neither yet.
    pub(super) fn may_be_finished(
        &self,
        dir: &OpenDir,
        name: &CStr,
        st: &Stat,
    ) -> Result<bool, Fail> {
        let d = match sys::lstatat(dir.dst.as_fd(), name) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(("stat destination", e)),
        };
        Ok(is_type(&d, libc::S_IFREG)
            && d.st_size == st.st_size
            && (!self.opts.preserve.timestamps
                || (d.st_mtime, d.st_mtime_nsec) == (st.st_mtime, st.st_mtime_nsec)))
    }

    /// Whether `path` is in the manifest an interrupted run wrote.
    pub(super) fn is_listed(&self, path: &[u8]) -> bool {
        self.listed.contains(&XxHash3_64::oneshot(path))
    }

    /// A resumed copy keeps regular file `dir/name`: count it as committed by an earlier
    /// attempt if it is. Listed in the manifest, it is. Not listed (its line was lost with
    /// the process that committed it, or it is a tenant's file), it is if it equals the
    /// source byte for byte, and then gets its line now, so the manifest lists every file
    /// once. Without a manifest there is nothing to tell them apart: every kept file counts.
    pub(super) fn committed_earlier(
        &self,
        dir: &OpenDir,
        name: &CStr,
        src: &SrcFile,
        st: &Stat,
        local: &mut Local,
    ) -> Result<bool, Fail> {
        let path = dir.child_path(name);
        let ours = if self.manifest.is_none() || self.is_listed(&path) {
            true
        } else {
            match self.same_as_source(dir, name, src, st, local)? {
                Some(hash) => {
                    self.manifest_line(hash, &path, Some(st));
                    true
                }
                None => false,
            }
        };
        if ours {
            self.count_resumed(st.st_size as u64);
        }
        Ok(ours)
    }

    /// `compare: Checksum` under if-changed, in a directory that existed: files are told
    /// apart by their bytes.
    pub(super) fn compares_content(&self, dir: &OpenDir) -> bool {
        self.opts.compare == Compare::Checksum
            && self.opts.overwrite == Overwrite::IfChanged
            && !dir.fresh
    }

    /// Under `compare: Checksum`: whether destination file `dir/name` has the source's
    /// bytes, and is then kept: listed in the manifest with the hash both sides gave (or,
    /// resumed, already listed by this copy), and given the source's mode, owner and times
    /// where they differ (xattrs are not compared).
    pub(super) fn kept_if_same(
        &self,
        dir: &OpenDir,
        name: &CStr,
        src: &SrcFile,
        st: &Stat,
        local: &mut Local,
    ) -> Result<bool, Fail> {
        let path = dir.child_path(name);
        if self.opts.resume && self.is_listed(&path) && self.may_be_finished(dir, name, st)? {
            self.count_resumed(st.st_size as u64);
            return Ok(true);
        }
        let Some(hash) = self.same_as_source(dir, name, src, st, local)? else {
            return Ok(false);
        };
        // Only the regular file that was compared: anything swapped in at the name since
        // is never opened, and is replaced as a file that differs would be.
        let (dst, d) = match sys::open_regular(dir.dst.as_fd(), name, libc::O_RDONLY) {
            Ok(sys::Opened::Open(fd, d)) => (fd, d),
            Ok(sys::Opened::Other(_)) => return Ok(false),
            Err(e) => return Err(("open destination", e)),
        };
        let p = &self.opts.preserve;
        // (The mode the copy would get: without setuid/setgid where they are dropped.)
        let differs = (p.permissions && d.st_mode & 0o7777 != self.rules().mode(st, true))
            || (p.ownership && (d.st_uid, d.st_gid) != (st.st_uid, st.st_gid))
            || (p.timestamps && (d.st_mtime, d.st_mtime_nsec) != (st.st_mtime, st.st_mtime_nsec));
        if differs {
            // A copy that no longer owns the destination changes nothing more in it.
            self.may_finish()?;
            meta::apply_fd(
                src.xattrs(),
                dst.as_fd(),
                st,
                self.rules(),
                false,
                &mut local.xattrs,
            )?;
            meta::apply_times(dst.as_fd(), st, p)?;
        }
        self.manifest_line(hash, &path, Some(st));
        Ok(true)
    }

    pub(super) fn count_resumed(&self, size: u64) {
        self.counters.files_resumed.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_resumed
            .fetch_add(size, Ordering::Relaxed);
        self.progress.resumed(size);
    }

    /// The xxHash3-128 of destination file `dir/name` if it is a regular file with the same
    /// bytes as the source `src`, `None` if it is anything else.
    pub(super) fn same_as_source(
        &self,
        dir: &OpenDir,
        name: &CStr,
        src: &SrcFile,
        st: &Stat,
        local: &mut Local,
    ) -> Result<Option<u128>, Fail> {
        // O_NOATIME: reading it must not undo the atime it was given. Only a regular file
        // is opened (see `sys::open_regular`): a symlink, FIFO or device there (a tenant's,
        // or swapped in) is not our file, and is never opened.
        let flags = libc::O_RDONLY | libc::O_NOATIME;
        let size = st.st_size as u64;
        let (dst, dst_size) = match sys::open_regular(dir.dst.as_fd(), name, flags) {
            Ok(sys::Opened::Open(fd, d)) => (fd, d.st_size as u64),
            Ok(_) => return Ok(None),
            Err(e) => return Err(("open destination", e)),
        };
        // From another node, a large file: by its chunks, so that one that differs in a
        // few places is mended rather than sent whole (see `patch.rs`); under `compare:
        // Checksum` also one the destination has at another size (a database or a log
        // that grew: its common part kept, the rest sent), never the same then.
        if let SrcFile::Remote(r) = src {
            let resized = dst_size != size
                && self.opts.compare == Compare::Checksum
                && patch::by_chunks(dst_size);
            if patch::by_chunks(size) && (dst_size == size || resized) {
                return self.same_by_chunks(r, dst, dst_size, local);
            }
        }
        if dst_size != size {
            return Ok(None);
        }
        let (want, n) = self
            .src_hash(src, size, local)
            .map_err(|e| ("read source", e))?;
        let (got, m) = data::hash_fd(dst.as_fd(), size, &mut local.buf, &self.guard())
            .map_err(|e| ("read destination", e))?;
        Ok((n == size && m == size && got == want).then_some(want))
    }
}
