//! The last step of a split job: joining the parts' manifests into one.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use ferry_crds::{ManifestName, ManifestPart};

use super::journal::{copy_hashing, open_tenant_file};

/// The last step of a split job: the parts' manifests (`<uid>.part-<i>.xxh128`) become
/// one `<uid>.xxh128`, written under a temporary name and renamed, then the parts go.
/// `expected`: each slice's index and the part it said it wrote (its shard status).
///
/// The parts sit in the tenant's `.ferry/`, where anything may have been planted: a part
/// is read only if it is a regular file (never a FIFO, never through a link), only up to
/// the length its slice wrote, and joined only if its bytes still hash to what the slice
/// wrote; anything else fails the join with a message instead of hanging it, filling the
/// volume or putting lines no slice wrote into the job's manifest.
///
/// It may be run again after being killed at any point: the joined file appears whole
/// (rename) before any part is removed, so a missing part next to a joined manifest of
/// the parts' total length means an earlier run joined them and only removal is left.
pub(super) fn join_manifests(
    state: &Path,
    names: &ManifestName,
    expected: &[(u32, ManifestPart)],
) -> io::Result<()> {
    let joined = state.join(names.joined());
    let total: i64 = expected.iter().map(|(_, p)| p.bytes).sum();
    let missing = expected
        .iter()
        .find(|(i, _)| std::fs::symlink_metadata(state.join(names.part(*i))).is_err());
    if let Some((index, _)) = missing {
        let joined_len = std::fs::symlink_metadata(&joined)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len() as i64);
        if joined_len != Some(total) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} is missing from the destination's .ferry/ (removed after its slice wrote it?)",
                    names.part(*index)
                ),
            ));
        }
        return remove_parts(state, names, expected);
    }
    let tmp = state.join(names.tmp(&names.joined()));
    let _ = std::fs::remove_file(&tmp);
    // Never written through a link a tenant planted at the name.
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let mut out = io::BufWriter::new(out);
    for (index, want) in expected {
        let name = names.part(*index);
        let bytes = u64::try_from(want.bytes).unwrap_or(0);
        let got = copy_hashing(&mut open_tenant_file(&state.join(&name), bytes)?, &mut out)?;
        if got != *want {
            let _ = std::fs::remove_file(&tmp);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{name} in the destination's .ferry/ is not what its slice wrote ({} bytes, xxh3 {}; it has {} bytes, xxh3 {}): it was changed since",
                    want.bytes, want.xxh3, got.bytes, got.xxh3
                ),
            ));
        }
    }
    out.into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .sync_all()?;
    std::fs::rename(&tmp, &joined)?;
    remove_parts(state, names, expected)
}

fn remove_parts(
    state: &Path,
    names: &ManifestName,
    expected: &[(u32, ManifestPart)],
) -> io::Result<()> {
    for (index, _) in expected {
        match std::fs::remove_file(state.join(names.part(*index))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::journal::copy_hashing;

    fn part(bytes: &[u8]) -> ManifestPart {
        copy_hashing(&mut &bytes[..], &mut std::io::sink()).expect("hash")
    }

    /// Two slices' parts as they wrote them, in a fresh `.ferry/`.
    fn two_parts() -> (tempfile::TempDir, ManifestName, Vec<(u32, ManifestPart)>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let names = ManifestName::new("uid-1");
        let (p0, p1) = (b"h0  a\n".as_slice(), b"h1  b\n".as_slice());
        std::fs::write(tmp.path().join(names.part(0)), p0).expect("write");
        std::fs::write(tmp.path().join(names.part(1)), p1).expect("write");
        (tmp, names, vec![(0, part(p0)), (1, part(p1))])
    }

    #[test]
    fn parts_as_their_slices_wrote_them_are_joined_and_removed() {
        let (tmp, names, parts) = two_parts();
        join_manifests(tmp.path(), &names, &parts).expect("join");
        let joined = std::fs::read(tmp.path().join(names.joined())).expect("joined");
        assert_eq!(joined, b"h0  a\nh1  b\n");
        assert!(!tmp.path().join(names.part(0)).exists());
        // Run again after a kill between the rename and the removals: nothing to do.
        join_manifests(tmp.path(), &names, &parts).expect("join again");
    }

    #[test]
    fn a_planted_fifo_a_longer_file_or_changed_bytes_fail_the_join_without_reading_past_it() {
        type Plant = fn(&Path);
        let planted: [(&str, Plant); 3] = [
            ("not a regular file", |p| {
                std::fs::remove_file(p).expect("rm");
                let ok = std::process::Command::new("mkfifo").arg(p).status();
                assert!(ok.expect("mkfifo").success());
            }),
            ("bytes, more than", |p| {
                std::fs::write(p, vec![b'x'; 1 << 20]).expect("write");
            }),
            ("not what its slice wrote", |p| {
                std::fs::write(p, b"h9  z\n").expect("write");
            }),
        ];
        for (says, plant) in planted {
            let (tmp, names, parts) = two_parts();
            plant(&tmp.path().join(names.part(1)));
            let err = join_manifests(tmp.path(), &names, &parts).expect_err(says);
            assert!(err.to_string().contains(says), "{says}: {err}");
            assert!(
                !tmp.path().join(names.joined()).exists(),
                "{says}: joined anyway"
            );
        }
    }
}
