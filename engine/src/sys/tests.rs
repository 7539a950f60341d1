//! Tests of `sys` that need its private calls (a fork, here).

use super::*;
use std::os::fd::AsFd;

/// A child forked after the parent reopened a file reopens through its own descriptor
/// table, not through the parent's `/proc/<pid>/fd` the parent holds open.
#[test]
fn a_forked_child_reopens_its_own_descriptor_not_its_parents() {
    let (a, b) = (
        tempfile::tempfile().expect("tempfile"),
        tempfile::tempfile().expect("tempfile"),
    );
    // The parent's shortcut is in place.
    reopen(a.as_fd(), libc::O_RDONLY).expect("reopen in the parent");
    let ino = |fd: BorrowedFd<'_>| fstat(fd).map(|st| st.st_ino).unwrap_or(0);
    let b_ino = ino(b.as_fd());
    // SAFETY: the child makes only system calls (dup2, openat, fstat) and leaves with
    // _exit, touching no lock another thread of the test harness could hold.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // In the child, `a`'s number now names `b`'s file; the parent's still names `a`.
        // SAFETY: both descriptors are live; _exit ends the child at once.
        unsafe {
            libc::dup2(b.as_raw_fd(), a.as_raw_fd());
            let same = reopen(a.as_fd(), libc::O_RDONLY)
                .map(|f| ino(f.as_fd()) == b_ino)
                .unwrap_or(false);
            libc::_exit(if same { 0 } else { 1 });
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is writable.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child reopened its parent's descriptor (status {status})"
    );
}
