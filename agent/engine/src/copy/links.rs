//! Hard-link groups: the first name of a multiply-linked inode is copied, the other names
//! become links to it (waiting while it is copied); a resumed copy rejoins names an earlier
//! run made to their group.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::data;
use crate::sys::{self, Stat};

use super::failure::not_owner;
use super::{is_type, lock, Ctx, DirNode, Fail, Local, Skip};

/// What a finished hard-link group leader left for its followers.
pub(super) enum Link {
    /// The first path is being copied; these entries wait to be linked to it.
    /// (directory, name, replace): `replace` for a name a resumed copy adopted, which
    /// becomes a link to the leader in place of its own inode.
    Copying(Vec<(Arc<DirNode>, CString, bool)>),
    Done {
        dir: Arc<DirNode>,
        name: CString,
        hash: Option<u128>,
    },
    Failed(String),
}

impl<'a> Ctx<'a> {
    /// Copy an entry that may be one name of a hard-link group (regular file, symlink or
    /// special file, as `cp -a` keeps them all): the first name seen is copied by
    /// `copy_leader`, which answers `Some(hash)` once committed (`None` when chunk workers
    /// finish it); the other names become links to it, made as soon as it exists.
    pub(super) fn in_link_group(
        &self,
        dir: &Arc<DirNode>,
        dst_name: &CStr,
        st: &Stat,
        copy_leader: impl FnOnce() -> Result<Option<Option<u128>>, Fail>,
    ) -> Result<Option<Skip>, Fail> {
        if !(self.opts.preserve.hard_links && st.st_nlink > 1) {
            return copy_leader().map(|_| None);
        }
        let key = (st.st_dev, st.st_ino);
        {
            let mut links = lock(&self.links);
            match links.get_mut(&key) {
                None => {
                    links.insert(key, Link::Copying(Vec::new()));
                }
                Some(Link::Copying(waiters)) => {
                    dir.pending.fetch_add(1, Ordering::Relaxed);
                    waiters.push((dir.clone(), dst_name.to_owned(), false));
                    return Ok(Some(Skip::Deferred));
                }
                Some(Link::Done {
                    dir: leader,
                    name,
                    hash,
                }) => {
                    let (leader, name, hash) = (leader.clone(), name.clone(), *hash);
                    drop(links);
                    return self
                        .link_to(&leader, &name, dir, dst_name, hash, false)
                        .map(|()| None);
                }
                Some(Link::Failed(why)) => {
                    return Err((
                        "link",
                        io::Error::other(format!("first link of this file failed: {why}")),
                    ));
                }
            }
        }
        let result = copy_leader();
        // Finish the hard-link group whatever happened to its leader.
        let outcome = match &result {
            Ok(Some(hash)) => Ok(*hash),
            // Never: linked files are not chunked, so their leader is done here.
            Ok(None) => Err("internal: hard-linked file was chunked".to_string()),
            Err((op, e)) => Err(format!("{op}: {e}")),
        };
        self.finish_group(key, dir, dst_name, outcome);
        result.map(|_| None)
    }

    /// Record how a hard-link group's leader `dir/name` ended (its hash, or why it failed)
    /// and settle the names that waited for it: linked to it, or failed.
    fn finish_group(
        &self,
        key: (u64, u64),
        dir: &Arc<DirNode>,
        name: &CStr,
        outcome: Result<Option<u128>, String>,
    ) {
        let next = match &outcome {
            Ok(hash) => Link::Done {
                dir: dir.clone(),
                name: name.to_owned(),
                hash: *hash,
            },
            Err(why) => Link::Failed(why.clone()),
        };
        let waiters = match lock(&self.links).insert(key, next) {
            Some(Link::Copying(w)) => w,
            _ => Vec::new(),
        };
        for (wdir, wname, replace) in waiters {
            let r = match &outcome {
                Ok(hash) => self.link_to(dir, name, &wdir, &wname, *hash, replace),
                Err(_) => Err(("link", io::Error::other("first link of this file failed"))),
            };
            if let Err((op, e)) = r {
                self.fail(&wdir.child_path(&wname), op, &e);
            }
            self.release(wdir);
        }
    }

    /// A resumed copy found one name of a hard-linked source file already at the
    /// destination. If it is the interrupted run's copy (same size and mtime as the
    /// source), it rejoins its link group: it becomes the group's leader when the group
    /// has none yet, or is replaced by a link to the leader (an identical copy) when it has.
    /// Anything else at that name is kept as it is. With a manifest, a name it does not
    /// list must also equal the source byte for byte (and is listed now).
    pub(super) fn adopt_linked(
        &self,
        dir: &Arc<DirNode>,
        src: &OwnedFd,
        name: &CStr,
        st: &Stat,
        local: &mut Local,
    ) -> Result<Option<Skip>, Fail> {
        let existing = sys::lstatat(dir.dst.as_fd(), name).map_err(|e| ("stat destination", e))?;
        let ours = is_type(&existing, libc::S_IFREG)
            && existing.st_size == st.st_size
            && (existing.st_mtime, existing.st_mtime_nsec) == (st.st_mtime, st.st_mtime_nsec);
        if !ours {
            return Ok(Some(Skip::Kept));
        }
        let path = dir.child_path(name);
        let proven = match self.manifest.is_some() && !self.is_listed(&path) {
            true => match self.same_as_source(dir, name, src, st, local)? {
                Some(hash) => Some(hash),
                None => return Ok(Some(Skip::Kept)),
            },
            false => None,
        };
        let key = (st.st_dev, st.st_ino);
        let mut links = lock(&self.links);
        match links.get_mut(&key) {
            None => {
                // The leader. Other names that arrive meanwhile wait for it.
                links.insert(key, Link::Copying(Vec::new()));
                drop(links);
                // Hash what is there, so the other names get manifest lines.
                let result = if let Some(hash) = proven {
                    self.manifest_line(hash, &path);
                    Ok(Some(hash))
                } else if self.hash {
                    // O_NOATIME: reading it must not undo the atime it was given.
                    let flags = libc::O_RDONLY | libc::O_NOFOLLOW;
                    sys::open_beneath(dir.dst.as_fd(), name, flags | libc::O_NOATIME)
                        .or_else(|_| sys::open_beneath(dir.dst.as_fd(), name, flags))
                        .map_err(|e| ("open destination", e))
                        .and_then(|fd| {
                            data::hash_fd(
                                fd.as_fd(),
                                existing.st_size as u64,
                                &mut local.buf,
                                &self.guard(),
                            )
                            .map(|(h, _)| Some(h))
                            .map_err(|e| ("read destination", e))
                        })
                } else {
                    Ok(None)
                };
                let outcome = match &result {
                    Ok(hash) => {
                        self.count_resumed(st.st_size as u64);
                        Ok(*hash)
                    }
                    Err((op, e)) => Err(format!("{op}: {e}")),
                };
                self.finish_group(key, dir, name, outcome);
                result.map(|_| Some(Skip::Kept))
            }
            Some(Link::Copying(waiters)) => {
                dir.pending.fetch_add(1, Ordering::Relaxed);
                waiters.push((dir.clone(), name.to_owned(), true));
                Ok(Some(Skip::Deferred))
            }
            Some(Link::Done {
                dir: leader,
                name: leader_name,
                hash,
            }) => {
                let (leader, leader_name, hash) = (leader.clone(), leader_name.clone(), *hash);
                drop(links);
                self.link_to(&leader, &leader_name, dir, name, hash, true)
                    .map(|()| None)
            }
            Some(Link::Failed(why)) => Err((
                "link",
                io::Error::other(format!("first link of this file failed: {why}")),
            )),
        }
    }

    /// Make `dst_dir/dst_name` a hard link to the already committed `leader_dir/leader`.
    fn link_to(
        &self,
        leader_dir: &DirNode,
        leader: &CStr,
        dst_dir: &DirNode,
        dst_name: &CStr,
        hash: Option<u128>,
        replace: bool,
    ) -> Result<(), Fail> {
        if !self.owns() {
            return Err(("link", not_owner()));
        }
        // linkat cannot replace; a kept or replaced name was settled by keep_existing.
        if replace || self.may_replace(dst_dir) {
            match sys::unlinkat(dst_dir.dst.as_fd(), dst_name, false) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(("remove replaced entry", e)),
            }
        }
        match sys::linkat(
            leader_dir.dst.as_fd(),
            leader,
            dst_dir.dst.as_fd(),
            dst_name,
        ) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && self.keeps_newcomer(dst_dir) => {
                self.count_skipped();
                return Ok(());
            }
            Err(e) => return Err(("link", e)),
        }
        self.counters.hardlinks.fetch_add(1, Ordering::Relaxed);
        // A relinked name was listed by the run that first committed it, unless its line
        // was lost with that run's process.
        let path = dst_dir.child_path(dst_name);
        if let Some(h) = hash.filter(|_| !replace || !self.is_listed(&path)) {
            self.manifest_line(h, &path);
        }
        self.progress.entry_done();
        Ok(())
    }
}
