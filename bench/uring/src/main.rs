//! io_uring vs plain syscalls for copying many small files (Ferry issue experiment).
//!
//! uexp MODE SRC DST [-t THREADS] [-k BATCH] [--statx plain|uring] [--data cfr|rw]
//!      [--times on|off] [--open plain|opath] [--recheck] [--verify]   (the last four: plain
//!      mode's variants for issue 35: no futimens = cpz's work; Ferry's O_PATH open; its
//!      re-stat; a checksum the least it can cost: the source hashed as read+written, the
//!      destination read back and hashed, xxHash3-128 as the engine computes it)
//!   MODE = plain | phased | linked | hybrid | closes | verify | probe
//!
//! Common setup (same for every mode, timed separately): walk SRC, mkdir every
//! directory under DST, open every source and destination directory (O_PATH-free
//! plain O_DIRECTORY fds kept for the whole run). Then the per-file copy phase
//! (the part being compared) runs on THREADS worker threads which take chunks of
//! files from a shared counter.
//!
//! Per file every mode does: open source (O_RDONLY|O_NOFOLLOW|O_NOATIME), stat it,
//! create destination (O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW, mode = source mode),
//! copy the bytes, set atime+mtime (ns) on the destination, close both.
//!
//! plain:  all plain syscalls: openat, statx(fd,""), openat(O_CREAT), copy_file_range
//!         (or read+write with --data rw), futimens, close, close.
//! phased: io_uring, regular fds, batch of K files per ring round:
//!         R1 OpenAt(src) [+ Statx(path) with --statx uring]   (plain statx(fd) otherwise)
//!         R2 OpenAt(dst, O_CREAT) + Read(src)
//!         R3 Write(dst)      then plain futimens(dst) (io_uring has no utimens op)
//!         R4 Close(src) + Close(dst)
//! linked: io_uring with direct (fixed) descriptors and linked SQEs:
//!         R1 statx(dirfd, name, AT_SYMLINK_NOFOLLOW) per file (plain, or uring Statx batch)
//!         R2 one chain per file: OpenAt(src->slot) -> Read(slot) -> OpenAt(dst->slot, O_CREAT)
//!            -> Write(slot) -> Close(slot) -> Close(slot); one submit for K chains
//!         R3 plain utimensat(ddirfd, name, AT_SYMLINK_NOFOLLOW) per file
//! hybrid: plain openat, statx(fd), openat(O_CREAT); then io_uring chains Read->Write
//!         for K files in one submit; plain futimens; io_uring Close x2 batched.
//! closes: like plain (data by copy_file_range or read/write), but the two closes per file
//!         go through io_uring, batched K files per submit (close never punts to io-wq):
//!         isolates the pure syscall-entry saving.
use io_uring::{IoUring, opcode, squeue, types};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const BUF: usize = 64 * 1024; // per-slot data buffer; bigger files use the plain path
const CHUNK: usize = 256; // files per work grab

struct Tree {
    dirs: Vec<CString>,            // relative paths, dirs[0] = "."
    files: Vec<(u32, CString)>,    // (dir index, name)
}

fn walk(root: &Path) -> Tree {
    let mut dirs = vec![CString::new(".").unwrap()];
    let mut files = Vec::new();
    let mut i = 0;
    while i < dirs.len() {
        let rel = PathBuf::from(std::ffi::OsStr::from_bytes(dirs[i].as_bytes()));
        let mut ents: Vec<_> = std::fs::read_dir(root.join(&rel)).unwrap().map(|e| e.unwrap()).collect();
        ents.sort_by_key(|e| e.file_name());
        for e in ents {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                let p = rel.join(e.file_name());
                dirs.push(CString::new(p.as_os_str().as_bytes()).unwrap());
            } else if ft.is_file() {
                files.push((i as u32, CString::new(e.file_name().as_bytes()).unwrap()));
            }
        }
        i += 1;
    }
    Tree { dirs, files }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn open_dirs(root: &Path, dirs: &[CString]) -> Vec<RawFd> {
    let r = cstr(root);
    let rfd = unsafe { libc::open(r.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    assert!(rfd >= 0, "open {root:?}");
    dirs.iter()
        .map(|d| {
            let fd = unsafe { libc::openat(rfd, d.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
            assert!(fd >= 0, "openat {d:?}: {}", errno());
            fd
        })
        .collect()
}

fn raise_nofile() {
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode { Plain, Phased, Linked, Hybrid, Closes }

#[derive(Clone, Copy)]
struct Opts { mode: Mode, threads: usize, k: usize, statx_uring: bool, data_rw: bool, times: bool, opath: bool, recheck: bool, verify: bool, proc_fd: RawFd }

struct Ctx<'a> { tree: &'a Tree, sdirs: &'a [RawFd], ddirs: &'a [RawFd], next: AtomicUsize, opts: Opts, fails: AtomicUsize }

const SRC_FLAGS: i32 = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOATIME | libc::O_NOCTTY;
const DST_FLAGS: i32 = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;

fn times_of(st: &libc::statx) -> [libc::timespec; 2] {
    [
        libc::timespec { tv_sec: st.stx_atime.tv_sec, tv_nsec: st.stx_atime.tv_nsec as _ },
        libc::timespec { tv_sec: st.stx_mtime.tv_sec, tv_nsec: st.stx_mtime.tv_nsec as _ },
    ]
}

fn is_reg(st: &libc::statx) -> bool {
    (st.stx_mode as u32 & libc::S_IFMT) == libc::S_IFREG
}

/// Plain copy of the data between two open fds, exactly `size` bytes then EOF assumed.
fn copy_data_plain(sfd: RawFd, dfd: RawFd, size: u64, rw: bool, buf: &mut [u8]) -> bool {
    let mut left = size;
    while left > 0 {
        if rw {
            let n = unsafe { libc::read(sfd, buf.as_mut_ptr().cast(), buf.len().min(left as usize)) };
            if n <= 0 { return n == 0; }
            let mut off = 0;
            while off < n as usize {
                let w = unsafe { libc::write(dfd, buf[off..].as_ptr().cast(), n as usize - off) };
                if w <= 0 { return false; }
                off += w as usize;
            }
            left -= n as u64;
        } else {
            let n = unsafe { libc::copy_file_range(sfd, std::ptr::null_mut(), dfd, std::ptr::null_mut(), left as usize, 0) };
            if n <= 0 { return n == 0; }
            left -= n as u64;
        }
    }
    true
}

/// `--verify`: read, hash and write `size` bytes, then read the destination back (exactly
/// `size` bytes, as the engine's `hash_fd` does) and compare the two xxHash3-128s.
fn copy_verified(sfd: RawFd, dfd: RawFd, size: u64, buf: &mut [u8]) -> bool {
    let written = hash_read(sfd, size, buf, |data, off| {
        let mut done = 0;
        while done < data.len() {
            let w = unsafe { libc::pwrite(dfd, data[done..].as_ptr().cast(), data.len() - done, (off + done as u64) as i64) };
            if w <= 0 { return false; }
            done += w as usize;
        }
        true
    });
    written.is_some() && written == hash_read(dfd, size, buf, |_, _| true)
}

/// xxHash3-128 of `size` bytes of `fd` read by `pread`, each block also handed to `each`
/// with its offset; `None` when a read ends short or fails, or `each` says it failed.
fn hash_read(fd: RawFd, size: u64, buf: &mut [u8], mut each: impl FnMut(&[u8], u64) -> bool) -> Option<u128> {
    let (mut h, mut off) = (twox_hash::XxHash3_128::new(), 0u64);
    while off < size {
        let want = buf.len().min((size - off) as usize);
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), want, off as i64) };
        if n <= 0 { return None; }
        let data = &buf[..n as usize];
        h.write(data);
        if !each(data, off) { return None; }
        off += n as u64;
    }
    Some(h.finish_128())
}

/// Ferry's race-free open (engine `sys::open_regular`): `O_PATH | O_NOFOLLOW`, fstat, and only
/// a regular file reopened through this process's `/proc/self/fd` (held open), then the
/// `O_PATH` descriptor closed. Four calls where a plain open is one (with its stat, two).
unsafe fn open_opath(ctx: &Ctx, sdir: RawFd, name: &CStr, st: &mut libc::statx) -> RawFd { unsafe {
    let p = libc::openat(sdir, name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if p < 0 { return -1; }
    if libc::statx(p, c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_BASIC_STATS, st) != 0 || !is_reg(st) {
        libc::close(p);
        return -1;
    }
    let num = CString::new(p.to_string()).unwrap();
    let fd = libc::openat(ctx.opts.proc_fd, num.as_ptr(), (SRC_FLAGS & !libc::O_NOFOLLOW) | libc::O_CLOEXEC);
    libc::close(p);
    fd
} }

fn plain_one(ctx: &Ctx, sdir: RawFd, ddir: RawFd, name: &CStr, buf: &mut [u8]) -> bool {
    unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        let sfd = if ctx.opts.opath {
            let fd = open_opath(ctx, sdir, name, &mut st);
            if fd < 0 { return false; }
            fd
        } else {
            let sfd = libc::openat(sdir, name.as_ptr(), SRC_FLAGS | libc::O_CLOEXEC);
            if sfd < 0 { return false; }
            if libc::statx(sfd, c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_BASIC_STATS, &mut st) != 0 || !is_reg(&st) {
                libc::close(sfd);
                return false;
            }
            sfd
        };
        let flags = match ctx.opts.verify {
            // Read back: the destination opened for reading too.
            true => (DST_FLAGS & !libc::O_WRONLY) | libc::O_RDWR,
            false => DST_FLAGS,
        };
        let dfd = libc::openat(ddir, name.as_ptr(), flags | libc::O_CLOEXEC, (st.stx_mode & 0o7777) as libc::c_uint);
        if dfd < 0 { libc::close(sfd); return false; }
        let mut ok = match ctx.opts.verify {
            true => copy_verified(sfd, dfd, st.stx_size, buf),
            false => copy_data_plain(sfd, dfd, st.stx_size, ctx.opts.data_rw, buf),
        };
        if ctx.opts.recheck {
            // Ferry's torn-copy check: the source's stat again after the copy.
            let mut again: libc::statx = std::mem::zeroed();
            ok &= libc::statx(sfd, c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_BASIC_STATS, &mut again) == 0
                && again.stx_size == st.stx_size
                && again.stx_mtime.tv_nsec == st.stx_mtime.tv_nsec;
        }
        if ctx.opts.times {
            let ts = times_of(&st);
            ok &= libc::futimens(dfd, ts.as_ptr()) == 0;
        }
        libc::close(dfd);
        libc::close(sfd);
        ok
    }
}

fn worker_plain(ctx: &Ctx) {
    let mut buf = vec![0u8; BUF];
    loop {
        let start = ctx.next.fetch_add(CHUNK, Ordering::Relaxed);
        if start >= ctx.tree.files.len() { break; }
        for (di, name) in &ctx.tree.files[start..(start + CHUNK).min(ctx.tree.files.len())] {
            if !plain_one(ctx, ctx.sdirs[*di as usize], ctx.ddirs[*di as usize], name, &mut buf) {
                ctx.fails.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

struct Slot {
    sdir: RawFd,
    ddir: RawFd,
    name: *const libc::c_char,
    sfd: RawFd,
    dfd: RawFd,
    st: libc::statx,
    n: i32,
    ok: bool,
    big: bool,
}

fn new_ring(entries: u32) -> IoUring {
    IoUring::builder()
        .setup_single_issuer()
        .setup_coop_taskrun()
        .build(entries)
        .expect("io_uring_setup")
}

/// Submit everything queued and wait for `want` completions; return (user_data, res).
fn run(ring: &mut IoUring, want: usize, out: &mut Vec<(u64, i32)>) {
    out.clear();
    if want == 0 { return; }
    ring.submit_and_wait(want).expect("submit");
    loop {
        for c in ring.completion() {
            out.push((c.user_data(), c.result()));
        }
        if out.len() >= want { break; }
        ring.submit_and_wait(want - out.len()).expect("submit2");
    }
}

fn push(ring: &mut IoUring, e: squeue::Entry) {
    unsafe { ring.submission().push(&e).expect("sq full") }
}

fn next_batch<'a>(ctx: &'a Ctx, k: usize, pos: &mut usize, end: &mut usize) -> Option<&'a [(u32, CString)]> {
    if *pos >= *end {
        let start = ctx.next.fetch_add(CHUNK.max(k), Ordering::Relaxed);
        if start >= ctx.tree.files.len() { return None; }
        *pos = start;
        *end = (start + CHUNK.max(k)).min(ctx.tree.files.len());
    }
    let b = &ctx.tree.files[*pos..(*pos + k).min(*end)];
    *pos += b.len();
    Some(b)
}

fn mk_slots(ctx: &Ctx, batch: &[(u32, CString)], slots: &mut Vec<Slot>) {
    slots.clear();
    for (di, name) in batch {
        slots.push(Slot {
            sdir: ctx.sdirs[*di as usize], ddir: ctx.ddirs[*di as usize], name: name.as_ptr(),
            sfd: -1, dfd: -1, st: unsafe { std::mem::zeroed() }, n: 0, ok: true, big: false,
        });
    }
}

fn worker_phased(ctx: &Ctx) {
    let k = ctx.opts.k;
    let mut ring = new_ring((4 * k).next_power_of_two() as u32);
    let mut bufs = vec![0u8; BUF * k];
    let mut slots: Vec<Slot> = Vec::with_capacity(k);
    let mut out = Vec::with_capacity(4 * k);
    let (mut pos, mut end) = (0, 0);
    while let Some(batch) = next_batch(ctx, k, &mut pos, &mut end) {
        mk_slots(ctx, batch, &mut slots);
        // R1: open sources (+ statx by path)
        let mut want = 0;
        for (i, s) in slots.iter_mut().enumerate() {
            push(&mut ring, opcode::OpenAt::new(types::Fd(s.sdir), s.name).flags(SRC_FLAGS | libc::O_CLOEXEC).build().user_data((i as u64) << 8));
            want += 1;
            if ctx.opts.statx_uring {
                push(&mut ring, opcode::Statx::new(types::Fd(s.sdir), s.name, (&mut s.st as *mut libc::statx).cast())
                    .flags(libc::AT_SYMLINK_NOFOLLOW).mask(libc::STATX_BASIC_STATS).build().user_data(((i as u64) << 8) | 1));
                want += 1;
            }
        }
        run(&mut ring, want, &mut out);
        for &(ud, res) in &out {
            let s = &mut slots[(ud >> 8) as usize];
            match ud & 0xff {
                0 => if res >= 0 { s.sfd = res } else { s.ok = false },
                _ => if res < 0 { s.ok = false },
            }
        }
        for s in slots.iter_mut() {
            if s.ok && !ctx.opts.statx_uring {
                unsafe {
                    if libc::statx(s.sfd, c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_BASIC_STATS, &mut s.st) != 0 { s.ok = false; }
                }
            }
            if s.ok && !is_reg(&s.st) { s.ok = false; }
            if s.ok && s.st.stx_size as usize > BUF { s.big = true; }
        }
        // R2: create destinations + read sources
        let mut want = 0;
        for (i, s) in slots.iter().enumerate() {
            if !s.ok { continue; }
            push(&mut ring, opcode::OpenAt::new(types::Fd(s.ddir), s.name).flags(DST_FLAGS | libc::O_CLOEXEC)
                .mode((s.st.stx_mode & 0o7777) as _).build().user_data((i as u64) << 8));
            want += 1;
            if !s.big {
                let b = unsafe { bufs.as_mut_ptr().add(i * BUF) };
                push(&mut ring, opcode::Read::new(types::Fd(s.sfd), b, s.st.stx_size as u32).offset(0).build().user_data(((i as u64) << 8) | 1));
                want += 1;
            }
        }
        run(&mut ring, want, &mut out);
        for &(ud, res) in &out {
            let s = &mut slots[(ud >> 8) as usize];
            match ud & 0xff {
                0 => if res >= 0 { s.dfd = res } else { s.ok = false },
                _ => if res == s.st.stx_size as i32 { s.n = res } else { s.ok = false },
            }
        }
        // R3: write destinations
        let mut want = 0;
        for (i, s) in slots.iter_mut().enumerate() {
            if !s.ok { continue; }
            if s.big {
                let mut tmp = vec![0u8; BUF];
                s.ok = copy_data_plain(s.sfd, s.dfd, s.st.stx_size, ctx.opts.data_rw, &mut tmp);
                continue;
            }
            if s.n == 0 { continue; }
            let b = unsafe { bufs.as_ptr().add(i * BUF) };
            push(&mut ring, opcode::Write::new(types::Fd(s.dfd), b, s.n as u32).offset(0).build().user_data((i as u64) << 8));
            want += 1;
        }
        run(&mut ring, want, &mut out);
        for &(ud, res) in &out {
            let s = &mut slots[(ud >> 8) as usize];
            if res != s.n { s.ok = false; }
        }
        // times (plain: no io_uring opcode for utimens), then R4 close all
        let mut want = 0;
        for (i, s) in slots.iter_mut().enumerate() {
            if s.ok {
                let ts = times_of(&s.st);
                if unsafe { libc::futimens(s.dfd, ts.as_ptr()) } != 0 { s.ok = false; }
            }
            if !s.ok { ctx.fails.fetch_add(1, Ordering::Relaxed); }
            for fd in [s.sfd, s.dfd] {
                if fd >= 0 {
                    push(&mut ring, opcode::Close::new(types::Fd(fd)).build().user_data((i as u64) << 8 | 2));
                    want += 1;
                }
            }
        }
        run(&mut ring, want, &mut out);
    }
}

fn worker_linked(ctx: &Ctx) {
    let k = ctx.opts.k;
    let mut ring = new_ring((6 * k + k).next_power_of_two() as u32);
    ring.submitter().register_files_sparse((2 * k) as u32).expect("register_files_sparse");
    let mut bufs = vec![0u8; BUF * k];
    let mut slots: Vec<Slot> = Vec::with_capacity(k);
    let mut out = Vec::with_capacity(7 * k);
    let (mut pos, mut end) = (0, 0);
    let mut tmp = vec![0u8; BUF];
    while let Some(batch) = next_batch(ctx, k, &mut pos, &mut end) {
        mk_slots(ctx, batch, &mut slots);
        // R1: stat by path
        if ctx.opts.statx_uring {
            for (i, s) in slots.iter_mut().enumerate() {
                push(&mut ring, opcode::Statx::new(types::Fd(s.sdir), s.name, (&mut s.st as *mut libc::statx).cast())
                    .flags(libc::AT_SYMLINK_NOFOLLOW).mask(libc::STATX_BASIC_STATS).build().user_data((i as u64) << 8));
            }
            run(&mut ring, slots.len(), &mut out);
            for &(ud, res) in &out { if res < 0 { slots[(ud >> 8) as usize].ok = false; } }
        } else {
            for s in slots.iter_mut() {
                if unsafe { libc::statx(s.sdir, s.name, libc::AT_SYMLINK_NOFOLLOW, libc::STATX_BASIC_STATS, &mut s.st) } != 0 { s.ok = false; }
            }
        }
        // R2: one linked chain per file
        let mut want = 0;
        for (i, s) in slots.iter_mut().enumerate() {
            if s.ok && !is_reg(&s.st) { s.ok = false; }
            if !s.ok { continue; }
            if s.st.stx_size as usize > BUF {
                s.big = true;
                // plain path for big files
                unsafe {
                    let sfd = libc::openat(s.sdir, s.name, SRC_FLAGS | libc::O_CLOEXEC);
                    let dfd = libc::openat(s.ddir, s.name, DST_FLAGS | libc::O_CLOEXEC, (s.st.stx_mode & 0o7777) as libc::c_uint);
                    s.ok = sfd >= 0 && dfd >= 0 && copy_data_plain(sfd, dfd, s.st.stx_size, ctx.opts.data_rw, &mut tmp);
                    if sfd >= 0 { libc::close(sfd); }
                    if dfd >= 0 { libc::close(dfd); }
                }
                continue;
            }
            let (ss, ds) = (2 * i as u32, 2 * i as u32 + 1);
            let b = unsafe { bufs.as_mut_ptr().add(i * BUF) };
            let n = s.st.stx_size as u32;
            let ud = (i as u64) << 8;
            let link = squeue::Flags::IO_LINK;
            push(&mut ring, opcode::OpenAt::new(types::Fd(s.sdir), s.name).flags(SRC_FLAGS)
                .file_index(Some(types::DestinationSlot::try_from_slot_target(ss).unwrap())).build().flags(link).user_data(ud));
            push(&mut ring, opcode::Read::new(types::Fixed(ss), b, n).offset(0).build().flags(link).user_data(ud | 1));
            push(&mut ring, opcode::OpenAt::new(types::Fd(s.ddir), s.name).flags(DST_FLAGS).mode((s.st.stx_mode & 0o7777) as _)
                .file_index(Some(types::DestinationSlot::try_from_slot_target(ds).unwrap())).build().flags(link).user_data(ud | 2));
            push(&mut ring, opcode::Write::new(types::Fixed(ds), b, n).offset(0).build().flags(link).user_data(ud | 3));
            push(&mut ring, opcode::Close::new(types::Fixed(ss)).build().flags(link).user_data(ud | 4));
            push(&mut ring, opcode::Close::new(types::Fixed(ds)).build().user_data(ud | 5));
            want += 6;
        }
        run(&mut ring, want, &mut out);
        for &(ud, res) in &out {
            let s = &mut slots[(ud >> 8) as usize];
            let step = ud & 0xff;
            let good = match step {
                1 | 3 => res == s.st.stx_size as i32,
                _ => res >= 0,
            };
            if !good { s.ok = false; }
        }
        // R3: times by path (the fd is a direct descriptor; no io_uring utimens op)
        for s in slots.iter_mut() {
            if s.ok {
                let ts = times_of(&s.st);
                if unsafe { libc::utimensat(s.ddir, s.name, ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 { s.ok = false; }
            }
            if !s.ok { ctx.fails.fetch_add(1, Ordering::Relaxed); }
        }
    }
}

fn worker_hybrid(ctx: &Ctx) {
    let k = ctx.opts.k;
    let mut ring = new_ring((4 * k).next_power_of_two() as u32);
    let mut bufs = vec![0u8; BUF * k];
    let mut slots: Vec<Slot> = Vec::with_capacity(k);
    let mut out = Vec::with_capacity(4 * k);
    let (mut pos, mut end) = (0, 0);
    let mut tmp = vec![0u8; BUF];
    let mut pending_close = 0usize;
    while let Some(batch) = next_batch(ctx, k, &mut pos, &mut end) {
        mk_slots(ctx, batch, &mut slots);
        let mut want = 0;
        for (i, s) in slots.iter_mut().enumerate() {
            unsafe {
                s.sfd = libc::openat(s.sdir, s.name, SRC_FLAGS | libc::O_CLOEXEC);
                if s.sfd < 0 { s.ok = false; continue; }
                if libc::statx(s.sfd, c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_BASIC_STATS, &mut s.st) != 0 || !is_reg(&s.st) { s.ok = false; continue; }
                s.dfd = libc::openat(s.ddir, s.name, DST_FLAGS | libc::O_CLOEXEC, (s.st.stx_mode & 0o7777) as libc::c_uint);
                if s.dfd < 0 { s.ok = false; continue; }
            }
            if s.st.stx_size as usize > BUF || ctx.opts.mode == Mode::Closes {
                s.ok = copy_data_plain(s.sfd, s.dfd, s.st.stx_size, ctx.opts.data_rw, &mut tmp);
                continue;
            }
            if s.st.stx_size == 0 { continue; }
            let b = unsafe { bufs.as_mut_ptr().add(i * BUF) };
            let n = s.st.stx_size as u32;
            let ud = (i as u64) << 8;
            push(&mut ring, opcode::Read::new(types::Fd(s.sfd), b, n).offset(0).build().flags(squeue::Flags::IO_LINK).user_data(ud | 1));
            push(&mut ring, opcode::Write::new(types::Fd(s.dfd), b, n).offset(0).build().user_data(ud | 3));
            want += 2;
        }
        // the closes queued at the end of the previous batch are submitted with this one
        run(&mut ring, want + pending_close, &mut out);
        for &(ud, res) in &out {
            let step = ud & 0xff;
            if step == 1 || step == 3 {
                let s = &mut slots[(ud >> 8) as usize];
                if res != s.st.stx_size as i32 { s.ok = false; }
            }
        }
        pending_close = 0;
        for (i, s) in slots.iter_mut().enumerate() {
            if s.ok {
                let ts = times_of(&s.st);
                if unsafe { libc::futimens(s.dfd, ts.as_ptr()) } != 0 { s.ok = false; }
            }
            if !s.ok { ctx.fails.fetch_add(1, Ordering::Relaxed); }
            for fd in [s.sfd, s.dfd] {
                if fd >= 0 {
                    push(&mut ring, opcode::Close::new(types::Fd(fd)).build().user_data((i as u64) << 8 | 9));
                    pending_close += 1;
                }
            }
        }
    }
    let mut out2 = Vec::new();
    run(&mut ring, pending_close, &mut out2);
}

fn verify(src: &Path, dst: &Path) -> i32 {
    let t = walk(src);
    let mut bad = 0;
    for (di, name) in &t.files {
        let rel = PathBuf::from(std::ffi::OsStr::from_bytes(t.dirs[*di as usize].as_bytes())).join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let (a, b) = (src.join(&rel), dst.join(&rel));
        let (ma, mb) = match (std::fs::symlink_metadata(&a), std::fs::symlink_metadata(&b)) {
            (Ok(x), Ok(y)) => (x, y),
            _ => { bad += 1; eprintln!("missing {rel:?}"); continue; }
        };
        use std::os::unix::fs::MetadataExt;
        let same_meta = ma.mode() == mb.mode() && ma.size() == mb.size() && ma.mtime() == mb.mtime() && ma.mtime_nsec() == mb.mtime_nsec()
            && ma.atime() == mb.atime() && ma.atime_nsec() == mb.atime_nsec();
        if !same_meta || std::fs::read(&a).unwrap() != std::fs::read(&b).unwrap() {
            bad += 1;
            if bad < 10 { eprintln!("differs {rel:?}: mode {:o}/{:o} size {}/{} mtime {}.{}/{}.{} atime {}.{}/{}.{}", ma.mode(), mb.mode(), ma.size(), mb.size(), ma.mtime(), ma.mtime_nsec(), mb.mtime(), mb.mtime_nsec(), ma.atime(), ma.atime_nsec(), mb.atime(), mb.atime_nsec()); }
        }
    }
    // no extra files in dst
    let td = walk(dst);
    if td.files.len() != t.files.len() || td.dirs.len() != t.dirs.len() { bad += 1; eprintln!("count differs: {} files {} dirs vs {} {}", t.files.len(), t.dirs.len(), td.files.len(), td.dirs.len()); }
    eprintln!("verify: {} files, {} bad", t.files.len(), bad);
    if bad == 0 { 0 } else { 1 }
}

fn probe() {
    let ring = IoUring::new(8);
    match ring {
        Err(e) => println!("io_uring_setup failed: {e} (errno {:?})", e.raw_os_error()),
        Ok(ring) => {
            let mut p = io_uring::Probe::new();
            ring.submitter().register_probe(&mut p).unwrap();
            for (n, c) in [("OPENAT", opcode::OpenAt::CODE), ("OPENAT2", opcode::OpenAt2::CODE), ("STATX", opcode::Statx::CODE),
                ("READ", opcode::Read::CODE), ("WRITE", opcode::Write::CODE), ("CLOSE", opcode::Close::CODE), ("SPLICE", opcode::Splice::CODE),
                ("FSETXATTR", opcode::FSetXattr::CODE), ("FGETXATTR", opcode::FGetXattr::CODE), ("MKDIRAT", opcode::MkDirAt::CODE),
                ("FIXED_FD_INSTALL", opcode::FixedFdInstall::CODE)] {
                println!("{n:18} {}", p.is_supported(c));
            }
            println!("(no io_uring opcode exists for utimensat/futimens, fchmod, fchown, flistxattr, copy_file_range, getdents)");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    if mode == "probe" { probe(); return; }
    let src = PathBuf::from(&args[2]);
    let dst = PathBuf::from(&args[3]);
    if mode == "verify" { std::process::exit(verify(&src, &dst)); }
    let mut opts = Opts { mode: Mode::Plain, threads: 2, k: 32, statx_uring: false, data_rw: false, times: true, opath: false, recheck: false, verify: false, proc_fd: -1 };
    opts.mode = match mode { "plain" => Mode::Plain, "phased" => Mode::Phased, "linked" => Mode::Linked, "hybrid" => Mode::Hybrid, "closes" => Mode::Closes, m => panic!("mode {m}") };
    let mut i = 4;
    while i < args.len() {
        match args[i].as_str() {
            "-t" => { opts.threads = args[i + 1].parse().unwrap(); i += 1; }
            "-k" => { opts.k = args[i + 1].parse().unwrap(); i += 1; }
            "--statx" => { opts.statx_uring = args[i + 1] == "uring"; i += 1; }
            "--data" => { opts.data_rw = args[i + 1] == "rw"; i += 1; }
            "--times" => { opts.times = args[i + 1] != "off"; i += 1; }
            "--open" => { opts.opath = args[i + 1] == "opath"; i += 1; }
            "--recheck" => opts.recheck = true,
            "--verify" => opts.verify = true,
            a => panic!("arg {a}"),
        }
        i += 1;
    }
    raise_nofile();
    unsafe { libc::umask(0) };
    if opts.opath {
        assert!(opts.mode == Mode::Plain, "--open opath is a plain-mode variant");
        opts.proc_fd = unsafe { libc::open(c"/proc/self/fd".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        assert!(opts.proc_fd >= 0, "open /proc/self/fd");
    }
    let t0 = Instant::now();
    let tree = walk(&src);
    let t1 = Instant::now();
    std::fs::create_dir(&dst).unwrap();
    for d in &tree.dirs[1..] {
        let p = dst.join(std::ffi::OsStr::from_bytes(d.as_bytes()));
        std::fs::create_dir(&p).unwrap();
    }
    let sdirs = open_dirs(&src, &tree.dirs);
    let ddirs = open_dirs(&dst, &tree.dirs);
    let t2 = Instant::now();
    let ctx = Ctx { tree: &tree, sdirs: &sdirs, ddirs: &ddirs, next: AtomicUsize::new(0), opts, fails: AtomicUsize::new(0) };
    std::thread::scope(|s| {
        for _ in 0..opts.threads {
            s.spawn(|| match opts.mode {
                Mode::Plain => worker_plain(&ctx),
                Mode::Phased => worker_phased(&ctx),
                Mode::Linked => worker_linked(&ctx),
                Mode::Hybrid | Mode::Closes => worker_hybrid(&ctx),
            });
        }
    });
    let t3 = Instant::now();
    let fails = ctx.fails.load(Ordering::Relaxed);
    eprintln!("{mode} t={} k={} statx={} data={}: files={} fails={} walk={:.1}ms mkdir+opendirs={:.1}ms copy={:.1}ms",
        opts.threads, opts.k, if opts.statx_uring { "uring" } else { "plain" }, if opts.verify { "rw+verify" } else if opts.data_rw { "rw" } else { "cfr" },
        tree.files.len(), fails, (t1 - t0).as_secs_f64() * 1e3, (t2 - t1).as_secs_f64() * 1e3, (t3 - t2).as_secs_f64() * 1e3);
    if fails > 0 { std::process::exit(1); }
}
