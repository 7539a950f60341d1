//! `SRC` and `DST` as the command line writes them, to a CopyJob's endpoints: `NAME[:PATH]`
//! or `pvc:NAME[:PATH]` a claim of the namespace, `snapshot:NAME` a VolumeSnapshot (a source
//! only), `root:NAME[:PATH]` a StorageRoot. Refusals say what to write instead.

use anyhow::{bail, Result};
use ferry_crds::Endpoint;

/// The longest name Kubernetes gives an object.
const MAX_NAME: usize = 253;

/// Parse one endpoint; `source` says whether a snapshot is allowed.
pub fn parse(text: &str, source: bool) -> Result<Endpoint> {
    let (kind, rest) = match text.split_once(':') {
        Some((k @ ("pvc" | "root" | "snapshot"), rest)) => (k, rest),
        _ => ("pvc", text),
    };
    let (name, path) = rest.split_once(':').unwrap_or((rest, ""));
    if name.is_empty() || name.len() > MAX_NAME {
        bail!("{text:?}: name a claim (NAME[:PATH]), a snapshot (snapshot:NAME) or a StorageRoot (root:NAME[:PATH])");
    }
    if path.starts_with('/') || path.split('/').any(|c| c == "..") || path.contains('\0') {
        bail!("{text:?}: the path after the name is relative to the volume or root, without .. (write data/x, not /data/x)");
    }
    let mut e = Endpoint {
        path: path.to_string(),
        ..Default::default()
    };
    match kind {
        "root" => e.root = Some(name.into()),
        "snapshot" if !source => {
            bail!("{text:?}: a snapshot is a source only; copy into a claim or a root")
        }
        "snapshot" if !path.is_empty() => {
            bail!("{text:?}: a snapshot is copied whole: write snapshot:NAME, and choose the path on the destination")
        }
        "snapshot" => e.snapshot = Some(name.into()),
        _ => e.pvc = Some(name.into()),
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_a_claim_and_prefixes_name_the_other_kinds() {
        let e = parse("data:in/here", true).expect("claim");
        assert_eq!(
            (e.pvc.as_deref(), e.path.as_str()),
            (Some("data"), "in/here")
        );
        let e = parse("root:shared:x", true).expect("root");
        assert_eq!((e.root.as_deref(), e.path.as_str()), (Some("shared"), "x"));
        let e = parse("snapshot:nightly", true).expect("snapshot");
        assert_eq!(e.snapshot.as_deref(), Some("nightly"));
        assert_eq!(
            parse("pvc:data", false).expect("pvc").pvc.as_deref(),
            Some("data")
        );
    }

    #[test]
    fn refusals_say_what_to_write() {
        for (text, source, says) in [
            ("", true, "name a claim"),
            ("data:/abs", true, "relative"),
            ("data:a/../b", true, "without .."),
            ("snapshot:s", false, "source only"),
            ("snapshot:s:path", true, "copied whole"),
        ] {
            let e = parse(text, source).expect_err(text).to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
