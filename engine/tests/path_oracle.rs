//! Every path of up to three components over the oracle's tokens (the fuzzer's alphabet),
//! checked against the kernel's `openat2` on a tree of symlink traps: see `oracle/mod.rs`.
//! The same property runs unbounded under `cargo fuzz` (`fuzz/`).

mod oracle;

#[test]
fn every_short_path_resolves_as_the_kernel_says_and_never_outside_the_root() {
    let fx = oracle::fixture();
    let mut failures = Vec::new();
    let mut checked = 0;
    let n = oracle::TOKENS.len() as u8;
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for a in 0..n {
        inputs.push(vec![a]);
        for b in 0..n {
            inputs.push(vec![a, b]);
            for c in 0..n {
                inputs.push(vec![a, b, c]);
            }
        }
    }
    for input in inputs {
        for lead in [0u8, 0x80] {
            let mut data = input.clone();
            data[0] |= lead;
            let path = oracle::path_from(&data);
            checked += 1;
            if let Err(e) = oracle::check(&fx, &path) {
                failures.push(e);
            }
        }
    }
    for raw in [&b"f\0"[..], b"a/\0/b", b"\0"] {
        if let Err(e) = oracle::check(&fx, raw) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} paths disagree, e.g.:\n{}",
        failures.len(),
        failures[..failures.len().min(15)].join("\n")
    );
}
