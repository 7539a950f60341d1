//! Fuzz Ferry's resolution of tenant paths inside a root against the kernel's `openat2`
//! on a tree of symlink traps (the property lives in engine/tests/oracle, shared with the
//! exhaustive test `path_oracle.rs` that `make test` runs). Run: `make fuzz`.
#![no_main]

#[path = "../../engine/tests/oracle/mod.rs"]
mod oracle;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

static FIXTURE: OnceLock<oracle::Fixture> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let fx = FIXTURE.get_or_init(oracle::fixture);
    // Half the inputs as tokens (dense in traps), half as raw bytes.
    let path = match data.split_first() {
        Some((mode, rest)) if mode & 1 == 0 => oracle::path_from(rest),
        Some((_, rest)) => rest.iter().copied().take(64).collect(),
        None => Vec::new(),
    };
    if let Err(e) = oracle::check(fx, &path) {
        panic!("{e}");
    }
});
