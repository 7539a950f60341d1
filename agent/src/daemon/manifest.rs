//! The last step of a split job: joining the parts' manifests into one.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ferry_crds::ManifestName;

/// The last step of a split job: the parts' manifests (`<base>.part-<i>.xxh128`) become
/// one `<base>.xxh128`, written under a temporary name and renamed, then the parts go.
///
/// It may be run again after being killed at any point: the joined file appears whole
/// (rename) before any part is removed, so fewer parts than `expected` next to a joined
/// manifest means an earlier run joined them all and only the removal is left to do.
pub(super) fn join_manifests(
    state: &Path,
    names: &ManifestName,
    expected: usize,
) -> std::io::Result<()> {
    let mut parts: Vec<(u32, PathBuf)> = std::fs::read_dir(state)?
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((names.slice_of(e.file_name().to_str()?)?, e.path())))
        .collect();
    parts.sort();
    let joined = state.join(names.joined());
    if parts.len() < expected && std::fs::symlink_metadata(&joined).is_ok() {
        for (_, p) in &parts {
            std::fs::remove_file(p)?;
        }
        return Ok(());
    }
    // Never through a link a tenant planted in the state directory.
    let no_follow = |p: &Path, write: bool| {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .create_new(write)
            .custom_flags(libc::O_NOFOLLOW)
            .open(p)
    };
    let tmp = state.join(names.joined_tmp());
    let _ = std::fs::remove_file(&tmp);
    let mut out = std::io::BufWriter::new(no_follow(&tmp, true)?);
    for (_, p) in &parts {
        std::io::copy(&mut no_follow(p, false)?, &mut out)?;
    }
    out.into_inner()
        .map_err(std::io::IntoInnerError::into_error)?
        .sync_all()?;
    std::fs::rename(&tmp, &joined)?;
    for (_, p) in &parts {
        std::fs::remove_file(p)?;
    }
    Ok(())
}
