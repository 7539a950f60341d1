//! `ferry-agent copy` from a source whose reads fail with EIO (a FUSE filesystem,
//! engine/tests/fuse/eiofs.py): the CLI's view of what the engine tests check in
//! `engine/tests/faults_while_copying.rs` (each such file retried once, then reported
//! as `IOError` in the JSON summary and left out of the manifest).

mod common;

use std::collections::BTreeSet;

use anyhow::{ensure, Result};
use common::*;

#[test]
fn eio_reading_a_source_is_retried_once_then_reported_as_ioerror_by_the_cli() -> Result<()> {
    let tmp = tempdir()?;
    let Some((base, mnt)) = eio_source(tmp.path())? else {
        return Ok(());
    };
    let dst = tmp.path().join("dst");
    let manifest = tmp.path().join("m.xxh128");
    let out = copy([
        "--json".as_ref(),
        "--verify".as_ref(),
        "checksum".as_ref(),
        "--manifest".as_ref(),
        manifest.as_os_str(),
        mnt.dir.as_os_str(),
        dst.as_os_str(),
    ])?;
    out.expect_code(1)?;
    let json = out.json()?;
    let failed: BTreeSet<_> = failures(&json).into_iter().collect();
    let expected: BTreeSet<_> = [("bad-0", "IOError"), ("sub/bad-1", "IOError")]
        .into_iter()
        .map(|(p, r)| (p.to_string(), r.to_string()))
        .collect();
    ensure!(failed == expected, "failures {failed:?}:\n{out}");
    for f in json["failures"].as_array().into_iter().flatten() {
        let (op, msg) = (
            f["op"].as_str().unwrap_or(""),
            f["message"].as_str().unwrap_or(""),
        );
        ensure!(
            !op.is_empty() && msg.contains("again"),
            "the failure does not say it was tried twice: {f}"
        );
    }
    ensure!(
        num(&json, "files") == 11 && num(&json, "verified") == 11,
        "{out}"
    );
    check_eio_copy(&base, &dst)?;
    let lines = manifest_lines(&manifest)?;
    ensure!(
        lines.len() == 11 && !lines.iter().any(|l| l.contains("bad-")),
        "{lines:?}"
    );
    drop(mnt);
    Ok(())
}
