// The build script of `ferry-agent` and `ferry-operator` (each `build.rs` includes this file):
// sets `FERRY_GIT_REV`, which `--version` prints. `make image` passes it in the environment
// (the revision, `-dirty` when the tree had changes); otherwise it is asked of git, and
// "unknown" outside a git checkout (a crate tarball).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=FERRY_GIT_REV");
    let rev = std::env::var("FERRY_GIT_REV")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    // Built again when HEAD moves: a checkout (HEAD) or a commit (the branch's ref).
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in std::iter::once("HEAD").chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=FERRY_GIT_REV={rev}");
}
