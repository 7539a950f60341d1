//! `ferry-agent copy` keeps every kind of metadata `cp -a` keeps, for every kind of entry,
//! whatever the names and however deep the tree.

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{ensure, Result};
use common::*;

#[test]
fn modes_including_setuid_setgid_sticky_and_0555_dirs_are_preserved() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let files: &[(&str, u32)] = &[
        ("suid", 0o4755),
        ("sgid", 0o2755),
        ("suid_sgid", 0o6711),
        ("plain", 0o644),
        ("private", 0o600),
        ("readonly", 0o444),
        ("exec", 0o751),
        ("odd", 0o1604),
    ];
    for (name, mode) in files {
        write(&src.join(name), name.as_bytes())?;
        chmod(&src.join(name), *mode)?;
    }
    // A read-only directory with children: its mode must come after the children exist.
    mkdir(&src.join("ro/sub"))?;
    write(&src.join("ro/child"), b"inside a 0555 dir")?;
    write(&src.join("ro/sub/grandchild"), b"deeper")?;
    chmod(&src.join("ro/sub"), 0o555)?;
    chmod(&src.join("ro"), 0o555)?;
    mkdir(&src.join("sticky"))?;
    write(&src.join("sticky/f"), b"in a sticky dir")?;
    chmod(&src.join("sticky"), 0o1777)?;
    mkdir(&src.join("setgid_dir"))?;
    write(&src.join("setgid_dir/f"), b"x")?;
    chmod(&src.join("setgid_dir"), 0o2750)?;
    mkdir(&src.join("tight"))?;
    chmod(&src.join("tight"), 0o700)?;
    if is_root() {
        write(&src.join("nothing"), b"mode 0000, readable only by root")?;
        chmod(&src.join("nothing"), 0o000)?;
        mkdir(&src.join("closed"))?;
        write(&src.join("closed/f"), b"in a 0000 dir")?;
        chmod(&src.join("closed"), 0o000)?;
    } else {
        eprintln!("note: the 0000 file and directory need root; left out");
    }
    chmod(&src, 0o750)?;
    let dst = tmp.path().join("dst");
    // (setuid/setgid bits are privileged: dropped unless asked for.)
    copy_and_compare(&src, &dst, &["--keep-privileged-files"], Check::default())?;
    // The point of the test, spelled out.
    ensure!(lstat(&dst.join("suid"))?.st_mode & 0o7777 == 0o4755);
    ensure!(lstat(&dst.join("sticky"))?.st_mode & 0o7777 == 0o1777);
    ensure!(lstat(&dst.join("ro"))?.st_mode & 0o7777 == 0o555);
    Ok(())
}

#[test]
fn ownership_is_preserved_when_running_as_root() -> Result<()> {
    if !require_root("chown to 1234:5678") {
        return Ok(());
    }
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("dir"))?;
    write(&src.join("dir/file"), b"owned by 1234")?;
    write(&src.join("group_only"), b"root:5678")?;
    write(&src.join("suid_user"), b"setuid for 1234")?;
    symlink("dir/file", &src.join("link"))?;
    mkfifo(&src.join("fifo"), 0o640)?;
    for p in ["dir/file", "dir", "link", "fifo", "suid_user"] {
        lchown(&src.join(p), 1234, 5678)?;
    }
    lchown(&src.join("group_only"), 0, 5678)?;
    // chown clears setuid, so the mode must be applied after the owner.
    chmod(&src.join("suid_user"), 0o4755)?;
    lchown(&src, 4321, 8765)?;
    let dst = tmp.path().join("dst");
    copy_and_compare(&src, &dst, &["--keep-privileged-files"], Check::default())?;
    let st = lstat(&dst.join("suid_user"))?;
    ensure!(
        (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 5678, 0o4755),
        "setuid file owned by 1234 lost its owner or setuid bit: {}:{} {:o}",
        st.st_uid,
        st.st_gid,
        st.st_mode & 0o7777
    );
    Ok(())
}

#[test]
fn nanosecond_timestamps_on_files_dirs_symlinks_and_fifos_are_preserved() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("dir/sub"))?;
    write(&src.join("dir/sub/file"), b"timestamps")?;
    write(&src.join("file"), b"top")?;
    write(&src.join("old"), b"before 1970")?;
    write(&src.join("future"), b"after 2038")?;
    symlink("file", &src.join("link"))?;
    symlink("nowhere", &src.join("dangling"))?;
    mkfifo(&src.join("fifo"), 0o600)?;
    let t = |s: i64, ns: i64| (s, ns);
    set_times(
        &src.join("dir/sub/file"),
        t(1_500_000_000, 111_111_111),
        t(1_400_000_000, 222_222_222),
    )?;
    set_times(
        &src.join("file"),
        t(1_600_000_001, 1),
        t(1_600_000_000, 999_999_999),
    )?;
    set_times(
        &src.join("old"),
        t(-86_400, 500_000_000),
        t(-1_000_000, 123_456_789),
    )?;
    set_times(
        &src.join("future"),
        t(4_102_444_800, 7),
        t(4_000_000_000, 987_654_321),
    )?;
    set_times(
        &src.join("link"),
        t(1_300_000_000, 333_333_333),
        t(1_200_000_000, 444_444_444),
    )?;
    set_times(
        &src.join("dangling"),
        t(1_300_000_001, 5),
        t(1_200_000_001, 6),
    )?;
    set_times(
        &src.join("fifo"),
        t(1_100_000_000, 777),
        t(1_000_000_000, 888),
    )?;
    // Directories last: creating their children moved their times.
    set_times(
        &src.join("dir/sub"),
        t(1_650_000_000, 123),
        t(1_550_000_000, 456),
    )?;
    set_times(
        &src.join("dir"),
        t(1_650_000_001, 789),
        t(1_550_000_001, 12),
    )?;
    set_times(&src, t(1_650_000_002, 345), t(1_550_000_002, 678))?;
    let before = snapshot(&src)?;
    ensure!(
        before.get(b"file").map(|m| m.mtime) == Some((1_600_000_000, 999_999_999)),
        "the source filesystem does not keep nanoseconds; the test cannot tell"
    );
    let dst = tmp.path().join("dst");
    copy_ok([&src, &dst])?;
    compare(&before, &dst, Check::default())?;
    Ok(())
}

#[test]
fn user_xattrs_are_preserved_on_files_and_directories() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("dir"))?;
    write(&src.join("file"), b"with xattrs")?;
    write(&src.join("empty"), b"")?;
    write(&src.join("readonly"), b"xattrs on a 0444 file")?;
    let big: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
    for p in ["file", "empty", "readonly", "dir", ""] {
        let path = if p.is_empty() {
            src.clone()
        } else {
            src.join(p)
        };
        set_xattr(&path, "user.plain", b"hello")?;
        set_xattr(&path, "user.binary", b"\x00\xff\x01nul inside\x00")?;
        set_xattr(&path, "user.empty", b"")?;
        set_xattr(&path, "user.big", &big)?;
    }
    chmod(&src.join("readonly"), 0o444)?;
    let dst = tmp.path().join("dst");
    let after = {
        let before = snapshot(&src)?;
        copy_ok([&src, &dst])?;
        compare(&before, &dst, Check::default())?
    };
    let x = &after.get(b"readonly").expect("readonly copied").xattrs;
    ensure!(
        x.get(b"user.big".as_slice()) == Some(&big),
        "user.big lost: {x:?}"
    );
    Ok(())
}

#[test]
fn posix_acls_are_preserved_access_acl_on_file_default_acl_on_dir() -> Result<()> {
    if !require_tools(&["setfacl", "getfacl"]) {
        return Ok(());
    }
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("shared"))?;
    write(&src.join("file"), b"acl")?;
    sh(
        "setfacl",
        &[
            "-m".as_ref(),
            "u:1234:rwx,g:5678:r-x,m::rwx".as_ref(),
            src.join("file").as_os_str(),
        ],
    )?;
    sh(
        "setfacl",
        &[
            "-d".as_ref(),
            "-m".as_ref(),
            "u:1234:rwx,g::r-x".as_ref(),
            src.join("shared").as_os_str(),
        ],
    )?;
    // A file created under the default ACL inherits it.
    write(&src.join("shared/inherited"), b"inherits")?;
    let dst = tmp.path().join("dst");
    copy_and_compare(&src, &dst, &[], Check::default())?;
    for (p, flag) in [("file", "-a"), ("shared", "-d"), ("shared/inherited", "-a")] {
        let acl = |root: &Path| {
            sh(
                "getfacl",
                &[
                    "-c".as_ref(),
                    "-p".as_ref(),
                    flag.as_ref(),
                    root.join(p).as_os_str(),
                ],
            )
        };
        let (a, b) = (acl(&src)?, acl(&dst)?);
        ensure!(
            a == b,
            "getfacl {flag} {p} differs:\nsource:\n{a}\ndestination:\n{b}"
        );
        ensure!(
            a.contains("user:1234:rwx"),
            "setup did not set the ACL on {p}: {a}"
        );
    }
    Ok(())
}

#[test]
fn hard_links_across_directories_stay_one_inode_with_three_links() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("a"))?;
    mkdir(&src.join("b"))?;
    mkdir(&src.join("c/d"))?;
    write(&src.join("a/one"), b"three names, one inode")?;
    std::fs::hard_link(src.join("a/one"), src.join("b/two"))?;
    std::fs::hard_link(src.join("a/one"), src.join("c/d/three"))?;
    write(&src.join("b/pair1"), b"two names")?;
    std::fs::hard_link(src.join("b/pair1"), src.join("b/pair2"))?;
    // Spread the group over many directories so parallel workers race on it.
    for i in 0..40 {
        mkdir(&src.join(format!("many/{i}")))?;
        if i == 0 {
            write(&src.join("many/0/x"), b"forty-one names")?;
        } else {
            std::fs::hard_link(src.join("many/0/x"), src.join(format!("many/{i}/x")))?;
        }
    }
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &["--workers", "8"], Check::default())?;
    ensure!(
        lstat(&dst.join("c/d/three"))?.st_nlink == 3,
        "nlink of the copy is not 3"
    );
    ensure!(num(&json, "files") == 3, "files counts inodes: {json}");
    ensure!(
        num(&json, "hardlinks") == 2 + 1 + 39,
        "hardlinks counts the extra names: {json}"
    );
    Ok(())
}

#[test]
fn symlinks_are_copied_verbatim_and_their_targets_never_followed_or_read() -> Result<()> {
    let tmp = tempdir()?;
    let outside = tmp.path().join("outside");
    mkdir(&outside.join("dir"))?;
    let canary = outside.join("canary");
    write(&canary, b"outside the tree: must not be read")?;
    write(&outside.join("dir/secret"), b"must not be copied")?;
    set_times(&canary, (1_000_000_000, 0), (1_000_000_000, 0))?;
    let src = tmp.path().join("src");
    mkdir(&src.join("sub"))?;
    write(&src.join("target.txt"), b"inside")?;
    symlink(&canary, &src.join("absolute"))?;
    symlink("target.txt", &src.join("relative"))?;
    symlink("../../outside/canary", &src.join("sub/escapes"))?;
    symlink(outside.join("dir"), &src.join("to_outside_dir"))?;
    symlink("does/not/exist", &src.join("dangling"))?;
    symlink("loop", &src.join("loop"))?;
    symlink("/", &src.join("root"))?;
    symlink(
        OsStr::from_bytes(b"odd\ntarget with spaces \xff"),
        &src.join("odd"),
    )?;
    symlink("t/".repeat(1500), &src.join("long_target"))?;
    let watch = OpenWatch::new(&[&canary, &outside.join("dir"), &outside.join("dir/secret")])?;
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &[], Check::default())?;
    ensure!(num(&json, "symlinks") == 9, "summary symlinks: {json}");
    let touched = watch.touched();
    ensure!(
        touched.is_empty(),
        "the copy opened or read outside the tree: {touched:?}"
    );
    ensure!(
        lstat(&canary)?.st_atime == 1_000_000_000,
        "the outside canary was read (atime moved)"
    );
    ensure!(
        std::fs::symlink_metadata(dst.join("to_outside_dir"))?
            .file_type()
            .is_symlink(),
        "a symlink to a directory was followed"
    );
    Ok(())
}

#[test]
fn fifo_socket_and_device_nodes_are_recreated_never_opened() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    mkfifo(&src.join("fifo"), 0o640)?;
    unix_socket(&src.join("sock"))?;
    let mut watched = vec![src.join("fifo")];
    if is_root() {
        mknod(&src.join("null"), 'c', 0o666, 1, 3)?;
        mknod(&src.join("block"), 'b', 0o600, 7, 200)?;
        watched.push(src.join("null"));
        watched.push(src.join("block"));
    } else {
        eprintln!("note: character and block devices need root; left out");
    }
    set_times(&src.join("fifo"), (1_234_567_890, 42), (1_234_567_000, 43))?;
    let watch = OpenWatch::new(&watched.iter().map(|p| p.as_path()).collect::<Vec<_>>())?;
    let dst = tmp.path().join("dst");
    // A FIFO opened for reading would block the copy forever: the timeout catches that.
    // (Device nodes are privileged: made only when asked for.)
    let json = copy_and_compare(&src, &dst, &["--keep-privileged-files"], Check::default())?;
    let touched = watch.touched();
    ensure!(touched.is_empty(), "special files were opened: {touched:?}");
    ensure!(
        num(&json, "specials") == watched.len() as u64 + 1,
        "specials count: {json}"
    );
    Ok(())
}

#[test]
fn names_with_newlines_invalid_utf8_255_bytes_dashes_and_spaces_are_copied() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let long_a = vec![b'a'; 255];
    let long_b = vec![b'b'; 255];
    let names: Vec<Vec<u8>> = vec![
        b"new\nline".to_vec(),
        b"\nleading newline".to_vec(),
        b"bad utf8 \xff\xfe\xc3".to_vec(),
        b"\x01\x7f control".to_vec(),
        long_a.clone(),
        b"-rf".to_vec(),
        b"--help".to_vec(),
        b"-".to_vec(),
        b" leading space".to_vec(),
        b"trailing space ".to_vec(),
        b"two  spaces".to_vec(),
        b"back\\slash".to_vec(),
        b"tab\tname".to_vec(),
        b"*?[glob]".to_vec(),
        "ünïcödé ✓ 名前".as_bytes().to_vec(),
        b".hidden".to_vec(),
        b"..dots".to_vec(),
    ];
    for n in &names {
        write(&bytes_path(&src, n), n)?;
    }
    let dir255 = bytes_path(&src, &long_b);
    mkdir(&dir255)?;
    write(&bytes_path(&dir255, &long_a), b"255 under 255")?;
    symlink(
        bytes_path(Path::new(""), &long_a),
        &bytes_path(&dir255, &[b'l'; 255]),
    )?;
    mkdir(&bytes_path(&src, b"dir\nwith newline"))?;
    write(
        &bytes_path(&src, b"dir\nwith newline/-x \xff"),
        b"odd inside odd",
    )?;
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &[], Check::default())?;
    ensure!(
        num(&json, "files") == names.len() as u64 + 2,
        "files count: {json}"
    );
    Ok(())
}

#[test]
fn tree_200_levels_deep_is_copied() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    build_deep_tree(&src, b"d", 200)?;
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &[], Check::default())?;
    ensure!(
        num(&json, "dirs") == 201 && num(&json, "files") == 200,
        "{json}"
    );
    Ok(())
}

#[test]
fn tree_whose_paths_exceed_path_max_is_copied() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let name = [b'n'; 60];
    let deepest = build_deep_tree(&src, &name, 200)?;
    ensure!(
        deepest > 4096 * 2,
        "the tree is not deeper than PATH_MAX: {deepest} bytes"
    );
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &["--verify", "checksum"], Check::default())?;
    ensure!(num(&json, "verified") == 200, "{json}");
    Ok(())
}

#[test]
fn empty_files_and_empty_directories_are_copied() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("empty_dir"))?;
    mkdir(&src.join("nested/empty/dirs"))?;
    write(&src.join("empty_file"), b"")?;
    write(&src.join("nested/also_empty"), b"")?;
    set_xattr(&src.join("nested/also_empty"), "user.k", b"v")?;
    chmod(&src.join("empty_file"), 0o640)?;
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &[], Check::default())?;
    ensure!(
        num(&json, "files") == 2 && num(&json, "bytes") == 0 && num(&json, "dirs") == 5,
        "{json}"
    );

    // An empty source directory makes an empty destination directory.
    let empty = tmp.path().join("nothing");
    mkdir(&empty)?;
    let dst2 = tmp.path().join("dst2");
    let json = copy_and_compare(&empty, &dst2, &[], Check::default())?;
    ensure!(
        num(&json, "files") == 0 && num(&json, "dirs") == 1,
        "{json}"
    );
    Ok(())
}

#[test]
fn tree_1000_levels_deep_is_copied_without_running_out_of_descriptors() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let deepest = build_deep_tree(&src, &[b'q'; 20], 1000)?;
    ensure!(deepest > 4 * 4096, "setup: only {deepest} bytes deep");
    let dst = tmp.path().join("dst");
    let json = copy_and_compare(&src, &dst, &["--workers", "4"], Check::default())?;
    ensure!(
        num(&json, "dirs") == 1001 && num(&json, "files") == 1000,
        "{json}"
    );
    Ok(())
}

#[test]
fn hard_linked_symlinks_and_fifos_stay_hard_linked_as_cp_a_keeps_them() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("other"))?;
    symlink("target", &src.join("link1"))?;
    std::fs::hard_link(src.join("link1"), src.join("other/link2"))?;
    mkfifo(&src.join("fifo1"), 0o600)?;
    std::fs::hard_link(src.join("fifo1"), src.join("other/fifo2"))?;
    ensure!(
        lstat(&src.join("link1"))?.st_nlink == 2,
        "setup: this filesystem cannot hard-link a symlink"
    );
    let dst = tmp.path().join("dst");
    // compare() checks that the destination has the same groups of same-inode names.
    copy_and_compare(&src, &dst, &[], Check::default())?;
    Ok(())
}
