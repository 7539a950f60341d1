//! Symlinks (copied verbatim, never followed), FIFOs, sockets and devices (recreated with
//! mknod, never opened; a device only where privileged content is kept).

use std::ffi::CStr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::device_dropped;
use crate::meta;
use crate::options::Privileged;
use crate::sys::{self, Stat};

use super::{is_type, Ctx, Fail, OpenDir, Rec, Skip};

impl<'a> Ctx<'a> {
    /// Symlinks (copied verbatim, never followed), FIFOs, sockets and devices (recreated
    /// with mknod, never opened).
    pub(super) fn non_regular(
        &self,
        dir: &Arc<OpenDir>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
        rec: Option<&Rec>,
    ) -> Result<Option<Skip>, Fail> {
        if self.keep_existing(dir, dst_name, st)? {
            return Ok(Some(Skip::Kept));
        }
        // Links and specials have no hash: the group's leader is "committed" with None.
        let make = || {
            self.make_special(dir, src_name, dst_name, st, rec)
                .map(|_| Some(None))
        };
        self.in_link_group(dir, dst_name, st, make)
    }

    /// Create a symlink or special file (the leader of its link group, if any).
    fn make_special(
        &self,
        dir: &Arc<OpenDir>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
        rec: Option<&Rec>,
    ) -> Result<Option<Skip>, Fail> {
        // Inside a staged directory the final name is not visible yet: create it directly.
        let direct = self.names_directly(dir);
        let tmp = if direct {
            dst_name.to_owned()
        } else {
            self.tmp_name()
        };
        let is_link = is_type(st, libc::S_IFLNK);
        if is_link {
            let target = self
                .src_readlink(dir, src_name, rec)
                .map_err(|e| ("read link", e))?;
            sys::symlinkat(&target, dir.dst.as_fd(), &tmp).map_err(|e| ("create symlink", e))?;
        } else {
            let kind = st.st_mode & libc::S_IFMT;
            let device = kind == libc::S_IFCHR || kind == libc::S_IFBLK;
            if device && self.opts.privileged == Privileged::Drop {
                return Err(("mknod", device_dropped(st)));
            }
            sys::mknodat(dir.dst.as_fd(), &tmp, kind | 0o600, st.st_rdev)
                .map_err(|e| ("mknod", e))?;
        }
        let staged = meta::apply_at(dir.dst.as_fd(), &tmp, st, self.rules()).and_then(|()| {
            if direct {
                Ok(true)
            } else {
                self.commit(dir, &tmp, dst_name)
            }
        });
        match staged {
            Ok(true) => {}
            Ok(false) => return Ok(Some(Skip::Kept)),
            Err(err) => {
                let _ = sys::unlinkat(dir.dst.as_fd(), &tmp, false);
                return Err(err);
            }
        }
        if is_link {
            self.counters.symlinks.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.specials.fetch_add(1, Ordering::Relaxed);
        }
        self.progress.entry_done();
        Ok(None)
    }
}
