//! A copy's two ends as the copy takes them, opened: its source ([`SrcAt`]: a directory, an
//! entry of one, or a top on another node) and its destination ([`DstAt`]: an existing
//! directory, or a name in one), each opened from a path the caller names. `beneath` opens
//! the same two from a tenant's path inside a root.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use ferry_transfer::Xattr;

use crate::open::{cstring, final_name, open_dir, open_source_dir, parent_of};
use crate::options::{Options, Part, Reflink};
use crate::record::stat_of;
use crate::recv::Connection;
use crate::{sys, Error};

/// A copy's source, opened.
pub(crate) enum SrcAt {
    /// A directory, and its metadata.
    Dir { fd: OwnedFd, st: sys::Stat },
    /// Anything else: entry `name` of directory `parent`.
    Entry { parent: OwnedFd, name: CString },
    /// On another node, served at the other end of `conn`: a directory, with its record's
    /// stat and attributes; or one regular file (the top is the file, at path "").
    Remote {
        conn: Arc<Connection>,
        st: sys::Stat,
        xattrs: Vec<Xattr>,
    },
}

impl SrcAt {
    /// The source `src` names (a symlink at its last component is the entry itself, never
    /// followed): a directory, or an entry of its parent.
    pub(crate) fn open(src: &Path) -> Result<Self, Error> {
        let src_c = cstring(src)?;
        let src_st = sys::stat_path(&src_c, false).map_err(|e| Error::io("stat source", src, e))?;
        Ok(if src_st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            SrcAt::Dir {
                fd: open_source_dir(src)?,
                st: src_st,
            }
        } else {
            SrcAt::Entry {
                parent: open_source_dir(parent_of(src))?,
                name: final_name(src)?,
            }
        })
    }

    /// The top that the source half at the other end of `conn` serves (its hello already
    /// accepted), for a copy with `options` (`src` labels messages). Refused: a part of a
    /// split copy (a copy across nodes is one part) and `reflink: Always` (no blocks can
    /// be shared across nodes).
    pub(crate) fn remote(
        conn: &Arc<Connection>,
        src: &Path,
        options: &Options,
    ) -> Result<Self, Error> {
        if options.select != Part::All {
            return Err(Error::Usage(
                "a copy from another node is not split into parts; copy the whole tree".into(),
            ));
        }
        if options.reflink == Reflink::Always {
            return Err(Error::Usage(
                "reflink: Always cannot be met across nodes (no blocks are shared between them); use Auto or Never".into(),
            ));
        }
        let top = conn
            .stat(&[])
            .map_err(|e| Error::io("stat source", src, e))?;
        Ok(SrcAt::Remote {
            conn: conn.clone(),
            st: stat_of(&top),
            xattrs: top.xattrs,
        })
    }
}

/// A copy's destination, opened as far as it exists.
pub(crate) enum DstAt {
    /// An existing directory: the source is merged into it.
    Dir(OwnedFd),
    /// Entry `name` of directory `parent`: absent, or an existing non-directory.
    Entry {
        parent: OwnedFd,
        name: CString,
        exists: bool,
    },
}

impl DstAt {
    /// Open `dst` as far as it exists. The user named it: a symlink to a directory is
    /// followed, as `cp` follows it.
    pub(crate) fn open(dst: &Path) -> Result<Self, Error> {
        let dst_c = cstring(dst)?;
        let dst_at = match sys::stat_path(&dst_c, true) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                DstAt::Dir(open_dir(dst, "open destination")?)
            }
            Ok(_) => DstAt::Entry {
                parent: open_dir(parent_of(dst), "open destination parent")?,
                name: final_name(dst)?,
                exists: true,
            },
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                if sys::stat_path(&dst_c, false).is_ok() {
                    return Err(Error::Usage(format!(
                        "{} is a dangling symlink; Ferry never writes through links: remove it or choose another destination",
                        dst.display()
                    )));
                }
                DstAt::Entry {
                    parent: open_dir(parent_of(dst), "open destination parent")?,
                    name: final_name(dst)?,
                    exists: false,
                }
            }
            Err(e) => return Err(Error::io("stat destination", dst, e)),
        };
        Ok(dst_at)
    }
}
