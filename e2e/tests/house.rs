//! The house rules of the source tree, checked: every module file is named in
//! ARCHITECTURE.md under its crate, starts with a `//!` comment that says what it owns,
//! and (unless it is a test file) fits in 800 lines; no crate has an import circle between
//! its module files, but for one inside the engine's `copy/` (scripts/module-cycles.py).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use ferry_e2e::repo_root;

/// The workspace's crates: their directory, and the one module whose files may form one
/// import circle among themselves (none elsewhere).
const CRATES: [(&str, Option<&str>); 11] = [
    ("crds", None),
    ("serve", None),
    ("resolve", None),
    ("link", None),
    ("transfer", None),
    ("cbt", None),
    ("cbt/protogen", None),
    ("engine", Some("copy")),
    ("operator", None),
    ("agent", None),
    ("e2e", None),
];

/// A non-test module file's most lines.
const MAX_LINES: usize = 800;

/// Every tracked `.rs` file under `<crate>/src/`, by its path inside `src/`.
fn module_files(krate: &str) -> Result<Vec<(String, String)>> {
    let out = Command::new("git")
        .current_dir(repo_root())
        .args(["ls-files", "--", &format!("{krate}/src/*.rs")])
        .output()
        .context("git ls-files")?;
    ensure!(out.status.success(), "git ls-files failed");
    let prefix = format!("{krate}/src/");
    let mut files = Vec::new();
    for path in String::from_utf8(out.stdout)?.lines() {
        let inside = path.strip_prefix(&prefix).unwrap_or(path).to_string();
        let text = std::fs::read_to_string(repo_root().join(path))
            .with_context(|| format!("reading {path}"))?;
        files.push((inside, text));
    }
    ensure!(!files.is_empty(), "no module files under {prefix}");
    Ok(files)
}

/// ARCHITECTURE.md's sections by the crate directory their heading names (`## \`crds/\``),
/// each with the backticked names it holds.
fn architecture() -> Result<BTreeMap<String, Vec<String>>> {
    let text = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md"))?;
    let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            current = heading
                .split('`')
                .nth(1)
                .unwrap_or_default()
                .trim_end_matches('/')
                .to_string();
            continue;
        }
        let names = sections.entry(current.clone()).or_default();
        names.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
    }
    Ok(sections)
}

#[test]
fn every_module_file_is_named_in_architecture_md_under_its_crate() -> Result<()> {
    let sections = architecture()?;
    let mut missing = Vec::new();
    let mut stale = Vec::new();
    for (krate, _) in CRATES {
        let named = sections
            .get(krate)
            .with_context(|| format!("ARCHITECTURE.md has no section `## \\`{krate}/\\``"))?;
        let files = module_files(krate)?;
        for (path, _) in &files {
            if !named.iter().any(|n| n == path) {
                missing.push(format!("{krate}/src/{path}"));
            }
        }
        // A name that looks like a module file of this crate must be one (moved files).
        for n in named
            .iter()
            .filter(|n| n.ends_with(".rs") && !n.contains(' '))
        {
            if !files.iter().any(|(p, _)| p == n) {
                stale.push(format!("{krate}: `{n}`"));
            }
        }
    }
    ensure!(
        missing.is_empty() && stale.is_empty(),
        "ARCHITECTURE.md does not name (add a line: what it owns):\n{}\nnames files that do not exist (moved?):\n{}",
        missing.join("\n"),
        stale.join("\n")
    );
    Ok(())
}

#[test]
fn every_module_file_says_what_it_owns_and_fits_in_800_lines() -> Result<()> {
    let mut undocumented = Vec::new();
    let mut long = Vec::new();
    for (krate, _) in CRATES {
        for (path, text) in module_files(krate)? {
            if !text.trim_start().starts_with("//!") {
                undocumented.push(format!("{krate}/src/{path}"));
            }
            let is_test = Path::new(&path).file_stem().is_some_and(|s| s == "tests");
            let lines = text.lines().count();
            if !is_test && lines > MAX_LINES {
                long.push(format!("{krate}/src/{path}: {lines} lines"));
            }
        }
    }
    ensure!(
        undocumented.is_empty() && long.is_empty(),
        "module files without a leading //! comment:\n{}\nnon-test module files over {MAX_LINES} lines (split by job):\n{}",
        undocumented.join("\n"),
        long.join("\n")
    );
    Ok(())
}

#[test]
fn no_import_circle_between_module_files_but_one_inside_the_engines_copy() -> Result<()> {
    let mut failed = Vec::new();
    for (krate, allow) in CRATES {
        let mut cmd = Command::new("python3");
        cmd.current_dir(repo_root())
            .arg("scripts/module-cycles.py")
            .arg(format!("{krate}/src"));
        if let Some(m) = allow {
            cmd.args(["--allow", m]);
        }
        let out = cmd.output().context("python3 scripts/module-cycles.py")?;
        if !out.status.success() {
            failed.push(format!(
                "{krate}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    ensure!(failed.is_empty(), "import circles:\n{}", failed.join("\n"));
    Ok(())
}
