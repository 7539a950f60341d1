//! A local stat and the transfer protocol's records in each other's terms, for the two
//! halves of a copy between nodes: the record the source half sends of an entry
//! ([`entry_of`]), the stat the destination half reads back from it ([`stat_of`]), the
//! fingerprint both compare to tell a file changed, and the paths from the top both
//! name entries by ([`child`]).

use std::ffi::CString;

use ferry_transfer::frame::Fingerprint;
use ferry_transfer::{Entry, Kind, Time, Xattr};

use crate::sys::{self, Stat};

/// The path of entry `name` of directory `dir` (both from the top, `/` between components):
/// the paths both halves name entries by.
pub(crate) fn child(dir: &[u8], name: &[u8]) -> Vec<u8> {
    match dir.is_empty() {
        true => name.to_vec(),
        false => [dir, b"/", name].concat(),
    }
}

/// What tells a file changed (its inode, size, mtime and ctime): compared by the sender
/// with what a read request expects, and before and after each read.
pub(crate) fn fingerprint(st: &Stat) -> Fingerprint {
    Fingerprint {
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime: to_time(st.st_mtime, st.st_mtime_nsec),
        ctime: to_time(st.st_ctime, st.st_ctime_nsec),
    }
}

/// The record of entry `name` of stat `st`, with its symlink `target` (for a symlink) and
/// extended attributes as read.
pub(crate) fn entry_of(
    name: &[u8],
    st: &Stat,
    target: Option<CString>,
    xattrs: Vec<Xattr>,
) -> Entry {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Kind::Regular,
        libc::S_IFDIR => Kind::Directory,
        libc::S_IFLNK => Kind::Symlink(target.map(CString::into_bytes).unwrap_or_default()),
        libc::S_IFIFO => Kind::Fifo,
        libc::S_IFSOCK => Kind::Socket,
        libc::S_IFCHR => Kind::CharDevice(st.st_rdev),
        _ => Kind::BlockDevice(st.st_rdev),
    };
    Entry {
        name: name.to_vec(),
        size: match kind {
            Kind::Regular => st.st_size as u64,
            _ => 0,
        },
        kind,
        perm: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        blocks: st.st_blocks as u64,
        atime: to_time(st.st_atime, st.st_atime_nsec),
        mtime: to_time(st.st_mtime, st.st_mtime_nsec),
        ctime: to_time(st.st_ctime, st.st_ctime_nsec),
        nlink: st.st_nlink as u32,
        dev: st.st_dev,
        ino: st.st_ino,
        xattrs,
    }
}

/// The stat a record stands for (what the destination half reads of a stat: type, mode,
/// owner, size, blocks, times, links, identity, device number).
pub(crate) fn stat_of(e: &Entry) -> Stat {
    let mut st = sys::zeroed_stat();
    let kind = match &e.kind {
        Kind::Regular => libc::S_IFREG,
        Kind::Directory => libc::S_IFDIR,
        Kind::Symlink(_) => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDevice(_) => libc::S_IFCHR,
        Kind::BlockDevice(_) => libc::S_IFBLK,
    };
    st.st_mode = kind | e.perm;
    st.st_uid = e.uid;
    st.st_gid = e.gid;
    st.st_size = e.size as i64;
    st.st_blocks = e.blocks as i64;
    st.st_nlink = e.nlink.into();
    st.st_dev = e.dev;
    st.st_ino = e.ino;
    if let Kind::CharDevice(r) | Kind::BlockDevice(r) = e.kind {
        st.st_rdev = r;
    }
    (st.st_atime, st.st_atime_nsec) = secs(e.atime);
    (st.st_mtime, st.st_mtime_nsec) = secs(e.mtime);
    (st.st_ctime, st.st_ctime_nsec) = secs(e.ctime);
    st
}

fn to_time(secs: i64, nanos: i64) -> Time {
    Time {
        secs,
        nanos: nanos.clamp(0, 999_999_999) as u32,
    }
}

fn secs(t: Time) -> (i64, i64) {
    (t.secs, i64::from(t.nanos))
}
