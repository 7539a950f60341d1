//! A source's privileged files (device nodes, setuid/setgid bits, file capabilities) are
//! recreated only where the copy keeps them (`Options::privileged`): dropped by default, a
//! device node reported as a failure that says what allows it (nothing lost silently),
//! and, even kept, setuid/setgid bits and capabilities never given to a copy whose owner is
//! not the source's (as GNU cp drops them). Local copies and the two halves of a copy
//! between nodes alike.

// Raw libc calls here: lgetxattr, to read back what the copy set, independent of the engine.
#![allow(unsafe_code)]

mod common;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::recv::Connection;
use ferry_engine::send::{serve, SendOptions, SourceTop};
use ferry_engine::{
    copy_beneath, copy_from_beneath, NoProgress, Options, Privileged, Reason, Summary,
};

/// `src` with a device node, setuid, setgid and setuid+setgid files, a file with
/// capabilities, a setgid directory, and plain entries beside them.
fn privileged_tree(src: &Path) -> Result<()> {
    mkdir(&src.join("shared"))?;
    mknod(&src.join("null"), 'c', 0o666, 1, 3)?;
    mknod(&src.join("disk"), 'b', 0o660, 7, 200)?;
    for (name, mode) in [
        ("suid", 0o4755),
        ("sgid", 0o2755),
        ("both", 0o6711),
        ("plain", 0o640),
        ("caps", 0o755),
        ("shared/f", 0o644),
    ] {
        write(&src.join(name), name.as_bytes())?;
        chmod(&src.join(name), mode)?;
    }
    set_xattr(&src.join("caps"), "security.capability", &FILE_CAPS)?;
    set_xattr(&src.join("caps"), "user.kept", b"always")?;
    mkfifo(&src.join("fifo"), 0o640)?;
    chmod(&src.join("shared"), 0o2775)?;
    Ok(())
}

fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let (p, n) = (cpath(p), cname(name.as_bytes()));
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings; the kernel writes at most buf.len() bytes.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

fn mode(p: &Path) -> Result<u32> {
    Ok(lstat(p)?.st_mode & 0o7777)
}

/// `copy_beneath` of `roots/src/tree` to `roots/dst/<dst>`, or the same through the two
/// halves of a copy between nodes.
fn copy(tmp: &Path, dst: &str, opts: &Options, halves: bool) -> Result<Summary> {
    let (s, d) = (open_dir(&tmp.join("src"))?, open_dir(&tmp.join("dst"))?);
    if !halves {
        return Ok(copy_beneath(
            s.as_fd(),
            Path::new("tree"),
            d.as_fd(),
            Path::new(dst),
            opts,
            &NoProgress,
        )?);
    }
    let top = SourceTop::beneath(s.as_fd(), Path::new("tree"))?;
    let (ours, theirs) = UnixStream::pair()?;
    let sender = {
        let r = theirs.try_clone()?;
        let send = SendOptions {
            workers: 2,
            ..SendOptions::default()
        };
        std::thread::spawn(move || serve(&top, r, theirs, &send))
    };
    let conn = Connection::start(ours.try_clone()?, ours.try_clone()?)?;
    let summary = copy_from_beneath(
        &conn,
        Path::new("tree"),
        d.as_fd(),
        Path::new(dst),
        opts,
        &NoProgress,
    );
    drop(conn);
    ours.shutdown(std::net::Shutdown::Both)?;
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))?
        .map_err(|e| anyhow::anyhow!("sender: {e}"))?;
    Ok(summary?)
}

fn setup() -> Result<Option<tempfile::TempDir>> {
    if !require_root("mknod, and setting security.capability") {
        return Ok(None);
    }
    let tmp = tempdir()?;
    std::fs::create_dir_all(tmp.path().join("src/tree"))?;
    std::fs::create_dir_all(tmp.path().join("dst"))?;
    privileged_tree(&tmp.path().join("src/tree"))?;
    Ok(Some(tmp))
}

#[test]
fn privileged_files_are_dropped_by_default_and_each_device_is_reported() -> Result<()> {
    let Some(tmp) = setup()? else {
        return Ok(());
    };
    for halves in [false, true] {
        let name = format!("dropped-{halves}");
        let s = copy(tmp.path(), &name, &Options::default(), halves)?;
        let out = tmp.path().join("dst").join(&name);
        // Each device node is a failure of its own that says what would allow it.
        let mut failed: Vec<_> = s.failures.iter().map(|f| f.path.clone()).collect();
        failed.sort();
        ensure!(
            failed == [Path::new("disk"), Path::new("null")],
            "halves {halves}: {:?}",
            s.failures
        );
        for f in &s.failures {
            ensure!(f.kind == Reason::PermissionDenied, "{f}");
            ensure!(
                f.message.contains("spec.allowPrivilegedFiles") && f.message.contains("device ("),
                "{f}"
            );
        }
        ensure!(!out.join("null").exists() && !out.join("disk").exists());
        // The files are there, without setuid/setgid and capabilities.
        ensure!(
            mode(&out.join("suid"))? == 0o755,
            "{:o}",
            mode(&out.join("suid"))?
        );
        ensure!(mode(&out.join("sgid"))? == 0o755);
        ensure!(mode(&out.join("both"))? == 0o711);
        ensure!(std::fs::read(out.join("suid"))? == b"suid");
        ensure!(get_xattr(&out.join("caps"), "security.capability").is_none());
        ensure!(get_xattr(&out.join("caps"), "user.kept").as_deref() == Some(&b"always"[..]));
        // What is not privileged is copied as ever: a setgid directory passes its group on.
        ensure!(mode(&out.join("shared"))? == 0o2775);
        ensure!(mode(&out.join("plain"))? == 0o640);
        ensure!(lstat(&out.join("fifo"))?.st_mode & libc::S_IFMT == libc::S_IFIFO);
        ensure!(s.files == 6 && s.specials == 1, "halves {halves}: {s:?}");
    }
    Ok(())
}

#[test]
fn privileged_files_are_kept_where_the_copy_keeps_them() -> Result<()> {
    let Some(tmp) = setup()? else {
        return Ok(());
    };
    let keep = Options {
        privileged: Privileged::Keep,
        ..Options::default()
    };
    for halves in [false, true] {
        let name = format!("kept-{halves}");
        let s = copy(tmp.path(), &name, &keep, halves)?;
        ensure!(s.failures.is_empty(), "halves {halves}: {:?}", s.failures);
        let out = tmp.path().join("dst").join(&name);
        let null = lstat(&out.join("null"))?;
        ensure!(null.st_mode & libc::S_IFMT == libc::S_IFCHR);
        ensure!(null.st_rdev == libc::makedev(1, 3));
        let disk = lstat(&out.join("disk"))?;
        ensure!(disk.st_mode & libc::S_IFMT == libc::S_IFBLK);
        ensure!(mode(&out.join("suid"))? == 0o4755);
        ensure!(mode(&out.join("sgid"))? == 0o2755);
        ensure!(mode(&out.join("both"))? == 0o6711);
        ensure!(
            get_xattr(&out.join("caps"), "security.capability").as_deref() == Some(&FILE_CAPS[..]),
            "halves {halves}: capabilities lost"
        );
        ensure!(s.files == 6 && s.specials == 3, "halves {halves}: {s:?}");
    }
    Ok(())
}

#[test]
fn setuid_setgid_and_capabilities_are_dropped_from_a_copy_whose_owner_is_not_kept() -> Result<()> {
    let Some(tmp) = setup()? else {
        return Ok(());
    };
    let tree = tmp.path().join("src/tree");
    // A tenant's setuid program: owned by 1234, copied without its owner (owned by the
    // agent, root, then): a setuid root program if the bit were kept.
    for f in ["suid", "sgid", "caps"] {
        lchown(&tree.join(f), 1234, 5678)?;
    }
    // (chown cleared the bits and capabilities: set them again.)
    chmod(&tree.join("suid"), 0o4755)?;
    chmod(&tree.join("sgid"), 0o2755)?;
    set_xattr(&tree.join("caps"), "security.capability", &FILE_CAPS)?;
    let mut opts = Options {
        privileged: Privileged::Keep,
        ..Options::default()
    };
    opts.preserve.ownership = false;
    let s = copy(tmp.path(), "unowned", &opts, false)?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    let out = tmp.path().join("dst/unowned");
    for f in ["suid", "sgid", "caps"] {
        let st = lstat(&out.join(f))?;
        ensure!(st.st_uid == 0, "{f} is owned by {}", st.st_uid);
        ensure!(st.st_mode & 0o6000 == 0, "{f} is {:o}", st.st_mode & 0o7777);
    }
    ensure!(get_xattr(&out.join("caps"), "security.capability").is_none());
    // Where the owner is kept, so are they.
    opts.preserve.ownership = true;
    copy(tmp.path(), "owned", &opts, false)?;
    let out = tmp.path().join("dst/owned");
    ensure!(mode(&out.join("suid"))? == 0o4755);
    ensure!(get_xattr(&out.join("caps"), "security.capability").as_deref() == Some(&FILE_CAPS[..]));
    ensure!(lstat(&out.join("suid"))?.st_uid == 1234);
    Ok(())
}

#[test]
fn a_merge_that_drops_privileged_files_keeps_what_the_destination_had() -> Result<()> {
    let Some(tmp) = setup()? else {
        return Ok(());
    };
    // An existing destination entry at a device's name is not replaced by nothing.
    let out = tmp.path().join("dst/merge");
    mkdir(&out)?;
    write(&out.join("null"), b"the destination's own file")?;
    let opts = Options {
        overwrite: ferry_engine::Overwrite::Always,
        ..Options::default()
    };
    let s = copy(tmp.path(), "merge", &opts, false)?;
    ensure!(
        s.failures.iter().any(|f| f.path == Path::new("null")),
        "{:?}",
        s.failures
    );
    ensure!(std::fs::read(out.join("null"))? == b"the destination's own file");
    ensure!(mode(&out.join("suid"))? == 0o755);
    Ok(())
}
