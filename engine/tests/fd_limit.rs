//! Open descriptors are bounded by the pool, not by the tree: a copy of a wide and deep
//! tree succeeds under a tiny RLIMIT_NOFILE (fuc reverted per-file parallelism for running
//! out of descriptors). Its own test binary, because the limit is process-wide.

// Raw libc calls here: setrlimit, to give the copy few fds.
#![allow(unsafe_code)]

use std::fs;

use ferry_engine::{copy, NoProgress, Options, Verify};

#[test]
fn wide_deep_tree_copies_under_a_64_descriptor_limit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    for a in 0..30 {
        for b in 0..10 {
            let d = src.join(format!("a{a}/b{b}/c"));
            fs::create_dir_all(&d).expect("mkdir");
            for f in 0..5 {
                fs::write(d.join(format!("f{f}")), format!("{a}/{b}/{f}")).expect("write");
            }
        }
    }
    // Soft and hard, so the engine cannot raise it back.
    let lim = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    // SAFETY: setrlimit reads an initialised struct; only this test binary's process is affected.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let opts = Options {
        workers: 4,
        // Off, as when this test was written: a hash would force read/write past the
        // kernel copy paths it is about (see common::unverified in the other tests).
        verify: Verify::None,
        ..Options::default()
    };
    let s = copy(&src, &tmp.path().join("dst"), &opts, &NoProgress).expect("copy starts");
    assert_eq!(
        s.failed,
        0,
        "failures under the fd limit: {:?}",
        &s.failures[..s.failures.len().min(5)]
    );
    assert_eq!(s.files, 30 * 10 * 5);
    for a in [0, 29] {
        let got =
            fs::read_to_string(tmp.path().join(format!("dst/a{a}/b9/c/f4"))).expect("read copy");
        assert_eq!(got, format!("{a}/9/4"));
    }
}
