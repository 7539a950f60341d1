//! Parallelism must not change the result: large flat directories (split into batches),
//! large files (split into chunks) and hard-link groups come out the same whatever the
//! worker count.

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{ensure, Result};
use common::*;

#[test]
fn flat_directory_with_20000_files_is_copied_completely_with_4_workers() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    for i in 0..20_000u64 {
        write(
            &src.join(format!("file{i:05}")),
            &pattern(i * 64, (i % 200) as usize),
        )?;
    }
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &["--workers", "4"], Check::default())?;
    ensure!(
        num(&json, "files") == 20_000 && num(&json, "dirs") == 1,
        "{json}"
    );
    Ok(())
}

/// Nested directories, a directory big enough to be split into batches, a file big enough
/// to be split into chunks, hard links across directories, symlinks and a sparse file.
fn mixed_tree(src: &Path) -> Result<()> {
    for d in 0..12u64 {
        let dir = src.join(format!("d{d}/inner{}", d % 3));
        mkdir(&dir)?;
        for f in 0..60u64 {
            write(
                &dir.join(format!("f{f}")),
                &pattern(d * 1000 + f, (f * 37 % 5000) as usize),
            )?;
        }
        symlink(format!("f{}", d % 60), &dir.join("link"))?;
    }
    mkdir(&src.join("wide"))?;
    for f in 0..1500u64 {
        write(
            &src.join(format!("wide/w{f}")),
            &pattern(f, (f % 300) as usize),
        )?;
    }
    write_pattern_file(&src.join("big"), 130 * (1 << 20) + 4097)?;
    for d in 0..5 {
        let name = src.join(format!("d{d}/shared"));
        if d == 0 {
            write(&name, b"one inode, five names")?;
        } else {
            std::fs::hard_link(src.join("d0/shared"), name)?;
        }
    }
    let sparse = File::create(src.join("sparse"))?;
    sparse.set_len(200 << 20)?;
    sparse.write_all_at(&pattern(0, 8192), 100 << 20)?;
    Ok(())
}

#[test]
fn workers_1_and_workers_8_produce_identical_trees() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    mixed_tree(&src)?;
    let one = tmp.path().join("one");
    let eight = tmp.path().join("eight");
    let j1 = copy_and_compare(&src, &one, &["--workers", "1"], Check::default())?;
    let j8 = copy_and_compare(&src, &eight, &["--workers", "8"], Check::default())?;
    // The first copy read the source and so moved its atimes (relatime), which the second
    // copy then kept: atimes are compared with the source above, not between the copies.
    let one_tree = snapshot(&one)?;
    compare(
        &one_tree,
        &eight,
        Check {
            atime: false,
            ..Check::default()
        },
    )?;
    for field in ["files", "dirs", "symlinks", "hardlinks", "bytes"] {
        ensure!(
            num(&j1, field) == num(&j8, field),
            "{field} differs: {j1} vs {j8}"
        );
    }
    Ok(())
}
