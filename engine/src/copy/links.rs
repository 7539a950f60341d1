//! Hard-link groups: the first name of a multiply-linked inode is copied, the other names
//! become links to it (waiting while it is copied); a resumed copy rejoins names an earlier
//! run made to their group.
//!
//! A group is remembered only while names of it are still to come: each name that arrives
//! counts down from the file's link count, and the group is forgotten with its last one.
//! Names outside the tree (or outside this part of a split copy) never arrive, so a group
//! may be remembered to the end; what a finished one holds is small: the leader's
//! directory as a [`DirNode`] (its name and parents, no descriptor: see `dirs`, which opens
//! it again for a late follower), the leader's name and its hash.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::data;
use crate::sys::{self, Stat};

use super::failure::not_owner;
use super::{is_type, lock, Ctx, DirNode, Fail, Local, OpenDir, Skip, SrcFile};

/// A hard-link group some of whose names have not arrived yet.
pub(super) struct Group {
    link: Link,
    /// Names of the file not seen yet: its link count when the first arrived, less each
    /// one since.
    unseen: u64,
}

/// Where a hard-link group is.
enum Link {
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

/// What a name that arrives at its group does.
enum Arrival {
    /// It is the first: it leads the group (now recorded as being copied).
    Leader,
    /// The leader is being copied: it waits (queued), settled when the leader is.
    Waits,
    /// The leader is committed: link to it.
    LinkTo(Arc<DirNode>, CString, Option<u128>),
    /// The leader failed, for this reason.
    Failed(String),
}

/// A name of group `key` (of a file with `nlink` names) arrives; `waiter` is how it waits
/// if the leader is still being copied. The group is forgotten with its last name once it
/// is settled (while it is copied, `finish_group` does that).
fn arrive(
    links: &mut HashMap<(u64, u64), Group>,
    key: (u64, u64),
    nlink: u64,
    waiter: impl FnOnce() -> (Arc<DirNode>, CString, bool),
) -> Arrival {
    let Some(group) = links.get_mut(&key) else {
        let link = Link::Copying(Vec::new());
        let unseen = nlink.saturating_sub(1);
        links.insert(key, Group { link, unseen });
        return Arrival::Leader;
    };
    group.unseen = group.unseen.saturating_sub(1);
    let arrival = match &mut group.link {
        Link::Copying(waiters) => {
            waiters.push(waiter());
            return Arrival::Waits;
        }
        Link::Done { dir, name, hash } => Arrival::LinkTo(dir.clone(), name.clone(), *hash),
        Link::Failed(why) => Arrival::Failed(why.clone()),
    };
    if group.unseen == 0 {
        links.remove(&key);
    }
    arrival
}

fn leader_failed(why: &str) -> Fail {
    (
        "link",
        io::Error::other(format!("first link of this file failed: {why}")),
    )
}

impl<'a> Ctx<'a> {
    /// Copy an entry that may be one name of a hard-link group (regular file, symlink or
    /// special file, as `cp -a` keeps them all): the first name seen is copied by
    /// `copy_leader`, which answers `Some(hash)` once committed (`None` when chunk workers
    /// finish it); the other names become links to it, made as soon as it exists.
    pub(super) fn in_link_group(
        &self,
        dir: &Arc<OpenDir>,
        dst_name: &CStr,
        st: &Stat,
        copy_leader: impl FnOnce() -> Result<Option<Option<u128>>, Fail>,
    ) -> Result<Option<Skip>, Fail> {
        if !(self.opts.preserve.hard_links && st.st_nlink > 1) {
            return copy_leader().map(|_| None);
        }
        let key = (st.st_dev, st.st_ino);
        let waiter = || {
            dir.pending.fetch_add(1, Ordering::Relaxed);
            (dir.node.clone(), dst_name.to_owned(), false)
        };
        // (Bound first: the lock is held only while the group is looked at.)
        let arrival = arrive(&mut lock(&self.links), key, st.st_nlink, waiter);
        match arrival {
            Arrival::Leader => {}
            Arrival::Waits => return Ok(Some(Skip::Deferred)),
            Arrival::LinkTo(leader, name, hash) => {
                let leader = self.open_dir(&leader)?;
                return self
                    .link_to(&leader, &name, dir, dst_name, hash, false)
                    .map(|()| None);
            }
            Arrival::Failed(why) => return Err(leader_failed(&why)),
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
        dir: &Arc<OpenDir>,
        name: &CStr,
        outcome: Result<Option<u128>, String>,
    ) {
        let next = match &outcome {
            Ok(hash) => Link::Done {
                dir: dir.node.clone(),
                name: name.to_owned(),
                hash: *hash,
            },
            Err(why) => Link::Failed(why.clone()),
        };
        let waiters = {
            let mut links = lock(&self.links);
            let (was, forget) = match links.get_mut(&key) {
                Some(group) => (std::mem::replace(&mut group.link, next), group.unseen == 0),
                None => (Link::Copying(Vec::new()), false),
            };
            if forget {
                links.remove(&key);
            }
            match was {
                Link::Copying(w) => w,
                _ => Vec::new(),
            }
        };
        for (wdir, wname, replace) in waiters {
            let r = match &outcome {
                Ok(hash) => self
                    .open_dir(&wdir)
                    .and_then(|w| self.link_to(dir, name, &w, &wname, *hash, replace)),
                Err(_) => Err(("link", io::Error::other("first link of this file failed"))),
            };
            if let Err((op, e)) = r {
                self.fail(&wdir.child_path(&wname), op, &e);
            }
            self.release(&wdir);
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
        dir: &Arc<OpenDir>,
        src: &SrcFile,
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
        let waiter = || {
            dir.pending.fetch_add(1, Ordering::Relaxed);
            (dir.node.clone(), name.to_owned(), true)
        };
        // (Bound first: the lock is held only while the group is looked at.)
        let arrival = arrive(&mut lock(&self.links), key, st.st_nlink, waiter);
        match arrival {
            // The leader. Other names that arrive meanwhile wait for it.
            Arrival::Leader => {
                // Hash what is there, so the other names get manifest lines.
                let result = if let Some(hash) = proven {
                    self.manifest_line(hash, &path, Some(st));
                    Ok(Some(hash))
                } else if self.hash {
                    // O_NOATIME: reading it must not undo the atime it was given. Only the
                    // regular file the lstat saw is opened: anything swapped in since (a
                    // device, a FIFO) is never opened, and fails the group.
                    let flags = libc::O_RDONLY | libc::O_NOATIME;
                    match sys::open_regular(dir.dst.as_fd(), name, flags) {
                        Ok(sys::Opened::Open(fd, _)) => Ok(fd),
                        Ok(sys::Opened::Other(_)) => Err(std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            "the destination stopped being a regular file while it was adopted",
                        )),
                        Err(e) => Err(e),
                    }
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
            Arrival::Waits => Ok(Some(Skip::Deferred)),
            Arrival::LinkTo(leader, leader_name, hash) => {
                let leader = self.open_dir(&leader)?;
                self.link_to(&leader, &leader_name, dir, name, hash, true)
                    .map(|()| None)
            }
            Arrival::Failed(why) => Err(leader_failed(&why)),
        }
    }

    /// Make `dst_dir/dst_name` a hard link to the already committed `leader_dir/leader`.
    fn link_to(
        &self,
        leader_dir: &OpenDir,
        leader: &CStr,
        dst_dir: &OpenDir,
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
            // The link has the leader's size and mtime: recorded from what it is.
            let st = match self.records_on() {
                true => sys::lstatat(dst_dir.dst.as_fd(), dst_name).ok(),
                false => None,
            };
            self.manifest_line(h, &path, st.as_ref());
        }
        self.progress.entry_done();
        Ok(())
    }
}
