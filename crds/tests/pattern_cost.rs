//! What compiling a tenant's `include`/`exclude` may cost the operator (issue 31, hole 1):
//! the patterns an outside review used to take it down are refused before anything is
//! compiled, and the costliest lists the bounds allow compile within a stated memory
//! budget. Memory is counted by this test's own allocator (the peak of live bytes).

// A counting global allocator is `unsafe impl GlobalAlloc`: the test's oracle, not code
// that ships.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use ferry_crds::filter::{MAX_LIST_BYTES, MAX_PATTERNS, MAX_WILDCARDS};
use ferry_crds::Filter;

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only counters move.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(l.size(), Relaxed) + l.size();
        PEAK.fetch_max(now, Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        // SAFETY: p was allocated by System with l.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > l.size() {
            let now = LIVE.fetch_add(new - l.size(), Relaxed) + new - l.size();
            PEAK.fetch_max(now, Relaxed);
        } else {
            LIVE.fetch_sub(l.size() - new, Relaxed);
        }
        // SAFETY: p was allocated by System with l.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// One measurement at a time: the counters are the process's.
static ONE: Mutex<()> = Mutex::new(());

/// Bytes allocated at the peak of `f`, above what was live when it started.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed).saturating_sub(base))
}

const MIB: usize = 1 << 20;

fn lists(n: usize, unit: &str, reps: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{}{i}", unit.repeat(reps)))
        .collect()
}

#[test]
fn the_reviews_patterns_are_refused_before_anything_is_compiled() {
    // 256 patterns of 2000 `*a`: ~620 MiB and seconds of CPU in the operator at 934c0cf.
    let hostile = lists(256, "*a", 2000);
    let (result, peak) = peak_of(|| Filter::new(&hostile, &hostile));
    let e = result.expect_err("refused");
    assert!(e.to_string().contains("at most"), "{e}");
    assert!(peak < MIB, "refusing took {peak} bytes");
    // Within the bytes, over the wildcards: 2048 `*` in 8 KiB.
    let wild = lists(256, "a*", 8);
    let (result, peak) = peak_of(|| Filter::new(&[], &wild));
    let e = result.expect_err("refused");
    assert!(
        e.to_string().contains(&format!("at most {MAX_WILDCARDS}")),
        "{e}"
    );
    assert!(peak < MIB, "refusing took {peak} bytes");
}

#[test]
fn the_costliest_lists_the_bounds_allow_compile_in_under_32_mib() {
    // The shapes that cost most a byte, each filling both lists to the bounds: wildcards
    // between literal runs, `**` segments, classes, and plain literals.
    let per = MAX_WILDCARDS / MAX_PATTERNS; // 4 wildcards a pattern
    let shapes = [
        lists(MAX_PATTERNS, "a*aaaaaaaaaaaaa", per),
        lists(MAX_PATTERNS, "**/a", per / 2),
        lists(MAX_PATTERNS, "[!a]", per),
        lists(MAX_PATTERNS, "?a", per),
        lists(4, "a", MAX_LIST_BYTES / 4 - 8),
    ];
    for list in shapes {
        let bytes: usize = list.iter().map(String::len).sum();
        assert!(bytes <= MAX_LIST_BYTES, "{bytes}");
        let (result, peak) = peak_of(|| Filter::new(&list, &list));
        result.unwrap_or_else(|e| panic!("{:?}... allowed: {e}", &list[0]));
        assert!(
            peak < 32 * MIB,
            "{:?}...: compiling both lists took {} MiB",
            &list[0],
            peak / MIB
        );
    }
}
