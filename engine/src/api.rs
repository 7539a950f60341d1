//! The engine's entry points, what the agent and the CLI call: a copy between paths the
//! caller names ([`copy`]), from a source half on another node ([`copy_from`]), between
//! paths inside roots ([`copy_beneath`], [`copy_from_beneath`]), and the count of what a
//! copy inside a root would carry ([`plan_beneath`]). Each opens the two ends (`ends`,
//! `beneath`) and hands them to the copy (`copy::run`), or the top to the count (`plan`).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;

use crate::beneath::{check_relative, open_destination_in, open_source_in, resolve_beneath};
use crate::copy::run;
use crate::ends::{DstAt, SrcAt};
use crate::options::{Filter, Options, Part};
use crate::plan::{plan_part, Totals};
use crate::progress::Progress;
use crate::recv::Connection;
use crate::{sys, Error, Summary};

/// Copy `src` to `dst`.
///
/// - `dst` does not exist: it becomes a copy of `src` (as `cp -a src dst` makes it).
/// - `dst` is an existing directory: `src`'s contents (or, for a file `src`, the file) are
///   merged into it under `options.overwrite`; existing directories keep their own
///   metadata unless `overwrite` is `Always`.
/// - `dst` is an existing file and `src` a file: replaced according to `overwrite`.
///
/// Per-entry failures do not stop the copy; they are listed in the returned [`Summary`].
/// An `Err` means the copy could not start (bad paths, unreadable source root).
pub fn copy(
    src: &Path,
    dst: &Path,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Summary, Error> {
    let src_at = SrcAt::open(src)?;
    let dst_at = DstAt::open(dst)?;
    run(src_at, dst_at, src, dst, options, progress)
}

/// Copy what a source half on another node serves (see [`crate::send`]) to `dst`, over
/// `conn` (its hello already accepted), exactly as [`copy`] copies a local source: the
/// same destination rules (staging, overwrite, resume, metadata, manifest, records).
/// `src` only labels messages, and names a single file copied into an existing directory.
/// Refused: a part of a split copy (a copy across nodes is one part) and `reflink: Always`
/// (no blocks can be shared across nodes).
pub fn copy_from(
    conn: &Arc<Connection>,
    src: &Path,
    dst: &Path,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Summary, Error> {
    let src_at = SrcAt::remote(conn, src, options)?;
    let dst_at = DstAt::open(dst)?;
    run(src_at, dst_at, src, dst, options, progress)
}

/// Copy `src_path` inside `src_root` to `dst_path` inside `dst_root`, both relative and
/// resolved without symlinks from the roots' fds. Missing parents of the destination are
/// created (inside the root). The destination follows [`copy`]'s rules, except that a
/// symlink at the destination's name is refused instead of followed.
pub fn copy_beneath(
    src_root: BorrowedFd<'_>,
    src_path: &Path,
    dst_root: BorrowedFd<'_>,
    dst_path: &Path,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Summary, Error> {
    let src_parts = check_relative(src_path)?;
    let dst_parts = check_relative(dst_path)?;
    let src_at = open_source_in(src_root, &src_parts, src_path)?;
    let dst_at = open_destination_in(dst_root, &dst_parts, dst_path)?;
    run(src_at, dst_at, src_path, dst_path, options, progress)
}

/// Copy what the source half at the other end of `conn` serves (see [`copy_from`])
/// to `dst_path` inside `dst_root`, the destination resolved as [`copy_beneath`] resolves
/// its own: relative, no symlink at any depth nor at its name, missing parents made inside
/// the root. `src` only labels messages, and names a single file copied into an existing
/// directory.
pub fn copy_from_beneath(
    conn: &Arc<Connection>,
    src: &Path,
    dst_root: BorrowedFd<'_>,
    dst_path: &Path,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Summary, Error> {
    // A bad destination is refused before anything is asked of the sender.
    let dst_parts = check_relative(dst_path)?;
    let src_at = SrcAt::remote(conn, src, options)?;
    let dst_at = open_destination_in(dst_root, &dst_parts, dst_path)?;
    run(src_at, dst_at, src, dst_path, options, progress)
}

/// What a copy of `path` inside `root` would carry (the files of `select` that `filter`
/// selects, hard links kept or not), resolved as the copy resolves it.
pub fn plan_beneath(
    root: BorrowedFd<'_>,
    path: &Path,
    select: Part,
    links: bool,
    filter: &Filter,
) -> Result<Totals, Error> {
    let fd = resolve_beneath(root, path, libc::O_PATH)?;
    let st = sys::fstat(fd.as_fd()).map_err(|e| Error::io("stat", path, e))?;
    match st.st_mode & libc::S_IFMT {
        // "/." makes the walk go through the magic link to the directory itself.
        libc::S_IFDIR => plan_part(
            Path::new(&format!("/proc/self/fd/{}/.", fd.as_raw_fd())),
            select,
            links,
            filter,
        ),
        libc::S_IFREG if select == Part::All => Ok(Totals {
            files: 1,
            bytes: st.st_size as u64,
            ..Default::default()
        }),
        _ => Ok(Totals::default()),
    }
}
