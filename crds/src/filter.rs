//! `include` and `exclude`: which entries beneath a copy's source path are copied. One
//! compiled form, shared by the operator (which refuses a bad pattern before anything runs),
//! the agent, the CLI and the engine's walk and plan, so they cannot disagree.
//!
//! Patterns have gitignore's syntax and meaning (matched by the `ignore` crate, ripgrep's),
//! against paths relative to the source path:
//! - a pattern with no `/` but a trailing one matches a name at any depth (`*.tmp`, `cache`);
//! - a `/` at the start or in the middle anchors it to the source path (`/build`,
//!   `logs/*.gz`); `**` spans directories (`**/cache`, `data/**/*.csv`, `tmp/**`);
//! - a trailing `/` matches directories only (`cache/`);
//! - `*`, `?` and `[...]` never match a `/`; `\` makes the next character literal (`\*`,
//!   `\[`, `\!`, `\#`); names starting with `.` are matched like any other;
//! - `!pattern` takes back an earlier pattern of the same list for what it matches.
//!
//! A directory that `exclude` matches is not entered: nothing beneath it is copied (so
//! `!` cannot re-include something below an excluded directory, as in git). When `include`
//! is not empty, a file, symlink or special file is copied only if it or one of its parent
//! directories matches an `include` pattern; directories are walked (unless excluded) and
//! made on the destination whether or not anything inside them is selected, as rsync does
//! with `--include='*/'`. `exclude` wins over `include`. A source that is a single file is
//! copied whatever the patterns say: they select entries beneath a directory.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// At most this many patterns in each list (the CRD's schema says the same).
pub const MAX_PATTERNS: usize = 256;
/// At most this many bytes in a pattern.
pub const MAX_PATTERN_BYTES: usize = 4096;
/// At most this many bytes in all the patterns of a list together. What compiling costs
/// grows with the bytes and the wildcards of a list, not with its number of patterns: 256
/// patterns of 4000 literal bytes each took ~110 MiB and 0.45 s to compile; 16 KiB a list
/// keeps the most expensive list at a few MiB (see `MAX_WILDCARDS`).
pub const MAX_LIST_BYTES: usize = 16 * 1024;
/// At most this many `*`, `?` and `[` characters in a list (counted whether escaped or
/// not, as the CRD's rule counts them). Each wildcard is a regex repetition or class: 256
/// patterns of 2000 `*a` took the operator from 31 to ~620 MiB and 4-7 s of CPU. At the
/// bounds of this list and [`MAX_LIST_BYTES`] the costliest pair of lists measured
/// compiles in ~80 ms and ~11 MiB (release build; `tests/pattern_cost.rs` holds it under
/// 32 MiB).
pub const MAX_WILDCARDS: usize = 1024;

/// The compiled `include` and `exclude` lists; the default selects everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    include: Option<Gitignore>,
    exclude: Option<Gitignore>,
}

/// A pattern that cannot be compiled, or that would not mean what it says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{list}: {problem}")]
pub struct BadPattern {
    /// `include` or `exclude`.
    pub list: &'static str,
    /// The pattern (empty when the list as a whole is refused).
    pub pattern: String,
    /// What is wrong, naming the pattern, and what to write instead.
    pub problem: String,
}

impl Filter {
    /// Compile both lists; the first bad pattern is the error.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, BadPattern> {
        Ok(Self {
            include: compile("include", include)?,
            exclude: compile("exclude", exclude)?,
        })
    }

    /// Whether every entry is selected (no patterns): the walk then builds no paths.
    pub fn is_all(&self) -> bool {
        self.include.is_none() && self.exclude.is_none()
    }

    /// Whether the entry at `rel` (relative to the source path) passes the filter: a
    /// directory is entered ([`Filter::enters`]), anything else copied
    /// ([`Filter::selects`]). The one question the copy's walk, its plan and its prune ask
    /// of every entry, so they cannot disagree on what a copy carries.
    pub fn admits(&self, rel: &[u8], is_dir: bool) -> bool {
        match is_dir {
            true => self.enters(rel),
            false => self.selects(rel),
        }
    }

    /// Whether the walk enters the directory at `rel` (relative to the source path).
    pub fn enters(&self, rel: &[u8]) -> bool {
        !self
            .exclude
            .as_ref()
            .is_some_and(|ex| ex.matched(path(rel), true).is_ignore())
    }

    /// Whether the file, symlink or special file at `rel` is copied.
    pub fn selects(&self, rel: &[u8]) -> bool {
        let p = path(rel);
        if self
            .exclude
            .as_ref()
            .is_some_and(|ex| ex.matched(p, false).is_ignore())
        {
            return false;
        }
        match &self.include {
            None => true,
            Some(inc) => inc.matched_path_or_any_parents(p, false).is_ignore(),
        }
    }
}

fn path(rel: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(rel))
}

fn compile(list: &'static str, patterns: &[String]) -> Result<Option<Gitignore>, BadPattern> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let bad = |pattern: &str, problem: String| BadPattern {
        list,
        pattern: pattern.to_string(),
        problem: format!("pattern {pattern:?} {problem}"),
    };
    if patterns.len() > MAX_PATTERNS {
        return Err(BadPattern {
            list,
            pattern: String::new(),
            problem: format!(
                "has {} patterns; at most {MAX_PATTERNS} are allowed",
                patterns.len()
            ),
        });
    }
    // The cost bounds, before anything is compiled: a refusal costs a scan of the text.
    let bytes: usize = patterns.iter().map(String::len).sum();
    if bytes > MAX_LIST_BYTES {
        return Err(BadPattern {
            list,
            pattern: String::new(),
            problem: format!(
                "has {bytes} bytes of patterns; at most {MAX_LIST_BYTES} are allowed in a list: use fewer or shorter patterns (a directory pattern such as `cache/` covers everything beneath it)"
            ),
        });
    }
    let wildcards = patterns.iter().map(|p| wildcards(p)).sum::<usize>();
    if wildcards > MAX_WILDCARDS {
        return Err(BadPattern {
            list,
            pattern: String::new(),
            problem: format!(
                "has {wildcards} wildcards (`*`, `?` and `[`); at most {MAX_WILDCARDS} are allowed in a list: each one costs memory to compile, so use fewer (`**` spans directories, `*.log` matches at any depth)"
            ),
        });
    }
    // Relative to nothing: the walk passes paths relative to the source path.
    let mut builder = GitignoreBuilder::new("");
    for p in patterns {
        if p.len() > MAX_PATTERN_BYTES {
            let start: String = p.chars().take(64).collect();
            return Err(bad(
                &start,
                format!("(cut) has {} bytes; at most {MAX_PATTERN_BYTES}", p.len()),
            ));
        }
        // What gitignore would silently read as something else is refused instead.
        if p.is_empty() || p == "!" || p == "/" {
            return Err(bad(p, "matches nothing: remove it".into()));
        }
        if p.contains(['\n', '\r', '\0']) {
            return Err(bad(p, "contains a line break or NUL".into()));
        }
        if p.trim_start_matches('!')
            .split('/')
            .any(|c| c == "." || c == "..")
        {
            return Err(bad(
                p,
                "has a '.' or '..' component, which no path beneath the source has: write it relative to the source path".into(),
            ));
        }
        if p.starts_with('#') {
            return Err(bad(
                p,
                "would be a comment in gitignore syntax: write \\# for a name starting with #"
                    .into(),
            ));
        }
        if p.ends_with([' ', '\t']) && !p.ends_with("\\ ") {
            return Err(bad(
                p,
                "ends with whitespace, which gitignore syntax drops: write '\\ ' for a trailing space"
                    .into(),
            ));
        }
        builder
            .add_line(None, p)
            .map_err(|e| bad(p, format!("is not a valid glob: {e}")))?;
    }
    let matcher = builder.build().map_err(|e| BadPattern {
        list,
        pattern: String::new(),
        problem: format!("does not compile: {e}"),
    })?;
    Ok(Some(matcher))
}

/// The `*`, `?` and `[` characters of `pattern`, escaped or not: what [`MAX_WILDCARDS`]
/// bounds (the CRD's CEL rule counts the same characters).
pub fn wildcards(pattern: &str) -> usize {
    pattern
        .bytes()
        .filter(|b| matches!(b, b'*' | b'?' | b'['))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(include: &[&str], exclude: &[&str]) -> Filter {
        let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        Filter::new(&s(include), &s(exclude)).expect("valid patterns")
    }

    #[test]
    fn unanchored_anchored_recursive_and_directory_only_patterns() {
        let f = filter(
            &[],
            &["*.tmp", "/build", "logs/*.gz", "**/cache/", "a/**/z"],
        );
        assert!(!f.selects(b"x.tmp") && !f.selects(b"deep/er/x.tmp"));
        assert!(f.selects(b"x.tmpl"));
        assert!(!f.enters(b"build") && f.enters(b"src/build"));
        assert!(!f.selects(b"build") && f.selects(b"src/build"));
        assert!(!f.selects(b"logs/a.gz") && f.selects(b"logs/old/a.gz"));
        assert!(!f.enters(b"cache") && !f.enters(b"x/y/cache") && f.selects(b"cache"));
        assert!(!f.selects(b"a/z") && !f.selects(b"a/b/c/z") && f.selects(b"b/a/z"));
    }

    #[test]
    fn include_selects_files_beneath_a_matching_directory_and_exclude_wins() {
        let f = filter(&["*.csv", "keep/"], &["old/"]);
        assert!(f.selects(b"a.csv") && f.selects(b"x/y/a.csv"));
        assert!(!f.selects(b"a.txt"));
        assert!(f.selects(b"keep/a.txt") && f.selects(b"x/keep/b/c.bin"));
        // Directories are entered whatever `include` says; excluded ones are not.
        assert!(f.enters(b"x") && !f.enters(b"old") && !f.enters(b"x/old"));
        let both = filter(&["*.csv"], &["secret.csv"]);
        assert!(!both.selects(b"secret.csv") && both.selects(b"public.csv"));
    }

    #[test]
    fn negation_escapes_and_dotfiles() {
        let f = filter(
            &[],
            &["*.log", "!important.log", ".*", "\\*literal", "\\#hash"],
        );
        assert!(!f.selects(b"a.log") && f.selects(b"important.log"));
        assert!(!f.selects(b".env") && !f.enters(b".git"));
        // A glob metacharacter in a name is matched literally when escaped...
        assert!(!f.selects(b"*literal") && f.selects(b"xliteral"));
        assert!(!f.selects(b"#hash"));
        // ...and a name with `[` is matched by a pattern that escapes it.
        let g = filter(&[], &["\\[draft\\]*"]);
        assert!(!g.selects(b"[draft] notes") && g.selects(b"d notes"));
        // Bytes that are not UTF-8 are matched like any other.
        assert!(!filter(&[], &["*.tmp"]).selects(b"\xff\xfe.tmp"));
    }

    #[test]
    fn no_patterns_select_everything_and_exclude_everything_selects_nothing() {
        let all = Filter::default();
        assert!(all.is_all() && all.selects(b"any/thing") && all.enters(b"dir"));
        let none = filter(&[], &["*"]);
        assert!(!none.is_all() && !none.selects(b"a") && !none.enters(b"d"));
    }

    #[test]
    fn admits_enters_directories_and_selects_everything_else() {
        let f = filter(&["*.csv"], &["old/", "*.tmp"]);
        // An include-only file pattern never stops a directory being entered...
        assert!(f.admits(b"data", true) && f.admits(b"x/y", true));
        // ...an excluded directory is not entered, and exclude wins over include.
        assert!(!f.admits(b"old", true) && !f.admits(b"x/old", true));
        assert!(f.admits(b"a.csv", false) && !f.admits(b"a.txt", false));
        assert!(!f.admits(b"a.tmp", false) && !f.admits(b"x/b.tmp", false));
        for (rel, is_dir) in [
            (&b"a"[..], true),
            (b"a", false),
            (b"old", true),
            (b"z.csv", false),
        ] {
            let asked = if is_dir {
                f.enters(rel)
            } else {
                f.selects(rel)
            };
            assert_eq!(f.admits(rel, is_dir), asked);
        }
        let all = Filter::default();
        assert!(all.admits(b"any", true) && all.admits(b"any/thing", false));
    }

    #[test]
    fn patterns_that_would_not_mean_what_they_say_are_refused() {
        let refused = |p: &str| Filter::new(&[], &[p.to_string()]).expect_err(p).to_string();
        assert!(
            refused("a[z-a]").contains("is not a valid glob"),
            "{}",
            refused("a[z-a]")
        );
        assert!(refused("#notes").contains("comment"));
        assert!(refused("name ").contains("whitespace"));
        assert!(refused("").contains("matches nothing"));
        assert!(refused("a\nb").contains("line break"));
        assert!(refused("../x").contains("'..' component"));
        assert!(refused("a/./b").contains("'.' or '..' component"));
        assert!(Filter::new(&[], &["name\\ ".to_string()]).is_ok());
        let long = "a".repeat(MAX_PATTERN_BYTES + 1);
        assert!(refused(&long).contains("at most 4096"));
        let many = vec!["a".to_string(); MAX_PATTERNS + 1];
        let e = Filter::new(&many, &[]).expect_err("too many");
        assert_eq!(e.list, "include");
        assert!(e.to_string().contains("at most 256"), "{e}");
    }
}
