//! Every relative link in the repository's markdown leads somewhere. For each tracked `*.md`
//! file, each link or image that is not a URL must name a file or directory that exists (and
//! that git does not ignore), and a `#fragment` into a markdown file (or into the file itself)
//! must name a heading's GitHub anchor or an explicit `<a name>`/`id` in that file. External
//! links (anything with a scheme: https, mailto, ...) are not fetched.
//!
//! The checker takes the files to read as an argument, so the tests at the bottom run it on
//! a small tree of their own and show it reports what it should.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};
use pulldown_cmark::{BrokenLink, CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

/// Markdown files that are not documentation: build output, fuzz inputs, vendored trees.
fn is_skipped(path: &str) -> bool {
    path.starts_with("target/")
        || path.contains("fuzz/corpus/")
        || path.contains("fuzz/artifacts/")
        || path
            .split('/')
            .any(|c| c == "vendor" || c == "vendored" || c == "node_modules")
}

/// GitHub's parser options: tables, footnotes, strikethrough and task lists.
fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
}

/// A heading's anchor as GitHub makes it (github-slugger): lowercase; letters, digits, `-`
/// and `_` kept; each space a `-`; everything else dropped.
fn github_slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// `%20` and friends, as a browser decodes a link before following it. Invalid escapes are
/// kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `scheme:` at the start: a URL, not a path in the repository.
fn has_scheme(link: &str) -> bool {
    let Some(colon) = link.find(':') else {
        return false;
    };
    let scheme = &link[..colon];
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Values of `name="..."` and `id="..."` attributes in a piece of raw HTML.
fn html_anchors(html: &str) -> Vec<String> {
    let mut found = Vec::new();
    let lower = html.to_ascii_lowercase();
    for attr in ["name=", "id="] {
        let mut from = 0;
        while let Some(at) = lower[from..].find(attr) {
            let start = from + at;
            from = start + attr.len();
            let preceded_by_space = lower[..start]
                .chars()
                .next_back()
                .is_some_and(char::is_whitespace);
            if !preceded_by_space {
                continue;
            }
            let rest = &html[from..];
            let value = match rest.chars().next() {
                Some(q @ ('"' | '\'')) => rest[1..].split(q).next(),
                _ => rest.split(|c: char| c.is_whitespace() || c == '>').next(),
            };
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                found.push(v.to_string());
            }
        }
    }
    found
}

/// Values of `href="..."` and `src="..."` in raw HTML: links too.
fn html_links(html: &str) -> Vec<String> {
    let mut found = Vec::new();
    let lower = html.to_ascii_lowercase();
    for attr in ["href=", "src="] {
        let mut from = 0;
        while let Some(at) = lower[from..].find(attr) {
            let start = from + at;
            from = start + attr.len();
            let rest = &html[from..];
            let value = match rest.chars().next() {
                Some(q @ ('"' | '\'')) => rest[1..].split(q).next(),
                _ => rest.split(|c: char| c.is_whitespace() || c == '>').next(),
            };
            if let Some(v) = value {
                found.push(v.to_string());
            }
        }
    }
    found
}

/// What one markdown file offers and asks for.
#[derive(Debug, Default)]
struct Parsed {
    /// Heading anchors (with GitHub's `-1`, `-2` for repeats) and explicit HTML anchors.
    anchors: HashSet<String>,
    /// (line, destination) of every link and image.
    links: Vec<(usize, String)>,
    /// (line, label) of `[text][label]` references that no definition answers.
    undefined_references: Vec<(usize, String)>,
}

fn parse(text: &str) -> Parsed {
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let line_of = |offset: usize| line_starts.partition_point(|&s| s <= offset);

    let mut parsed = Parsed::default();
    let mut broken = Vec::new();
    let mut heading: Option<String> = None;
    let mut seen: HashMap<String, usize> = HashMap::new();
    // The callback borrows `broken` until the parser is done with it.
    {
        let mut on_broken = |link: BrokenLink<'_>| {
            if matches!(link.link_type, LinkType::Reference | LinkType::Collapsed) {
                broken.push((link.span.start, link.reference.to_string()));
            }
            None::<(CowStr<'_>, CowStr<'_>)>
        };
        let parser = Parser::new_with_broken_link_callback(text, options(), Some(&mut on_broken));

        for (event, range) in parser.into_offset_iter() {
            match event {
                Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
                Event::End(TagEnd::Heading(_)) => {
                    if let Some(h) = heading.take() {
                        let base = github_slug(&h);
                        let mut slug = base.clone();
                        let count = seen.entry(base.clone()).or_insert(0);
                        while parsed.anchors.contains(&slug) {
                            *count += 1;
                            slug = format!("{base}-{count}");
                        }
                        parsed.anchors.insert(slug);
                    }
                }
                Event::Text(t) | Event::Code(t) => {
                    if let Some(h) = heading.as_mut() {
                        h.push_str(&t);
                    }
                }
                Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                    parsed
                        .links
                        .push((line_of(range.start), dest_url.to_string()));
                }
                Event::Html(html) | Event::InlineHtml(html) => {
                    parsed.anchors.extend(html_anchors(&html));
                    for link in html_links(&html) {
                        parsed.links.push((line_of(range.start), link));
                    }
                }
                _ => {}
            }
        }
    }
    parsed.undefined_references = broken
        .into_iter()
        .map(|(offset, label)| (line_of(offset), label))
        .collect();
    parsed
}

/// One link that leads nowhere.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Dangling {
    file: String,
    line: usize,
    link: String,
    why: String,
}

impl fmt::Display for Dangling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} — {}",
            self.file, self.line, self.link, self.why
        )
    }
}

/// `a/b/../c` as `a/c`, lexically (no symlinks are followed); `None` above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Of these repository-relative paths, those git ignores (they exist here, not on GitHub).
fn git_ignored(root: &Path, paths: &[String]) -> Result<HashSet<String>> {
    if paths.is_empty() {
        return Ok(HashSet::new());
    }
    let mut child = Command::new("git")
        .args(["check-ignore", "--stdin", "-z"])
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("git check-ignore")?;
    {
        let mut stdin = child.stdin.take().context("git check-ignore: stdin")?;
        for p in paths {
            stdin.write_all(p.as_bytes())?;
            stdin.write_all(b"\0")?;
        }
    }
    let out = child.wait_with_output()?;
    // 0: some are ignored, 1: none is; anything else is an error.
    ensure!(
        matches!(out.status.code(), Some(0 | 1)),
        "git check-ignore failed: {}",
        out.status
    );
    Ok(out
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect())
}

/// Parses `rel` into the cache, once.
fn read_into(cache: &mut BTreeMap<PathBuf, Parsed>, root: &Path, rel: &Path) -> Result<()> {
    if !cache.contains_key(rel) {
        let text = std::fs::read_to_string(root.join(rel))
            .with_context(|| format!("read {}", rel.display()))?;
        cache.insert(rel.to_path_buf(), parse(&text));
    }
    Ok(())
}

/// Checks every link of `files` (paths relative to `root`), and returns those that dangle.
fn check(root: &Path, files: &[String]) -> Result<Vec<Dangling>> {
    let mut cache: BTreeMap<PathBuf, Parsed> = BTreeMap::new();
    for f in files {
        read_into(&mut cache, root, Path::new(f))?;
    }

    let mut dangling = Vec::new();
    // Targets that exist, with the links that reach them, to ask git about at the end.
    let mut existing: BTreeMap<String, Vec<(String, usize, String)>> = BTreeMap::new();
    // Fragments into markdown files, checked once every file they name is parsed.
    let mut fragments: Vec<(String, usize, String, PathBuf, String)> = Vec::new();
    for f in files {
        let here = Path::new(f);
        let parsed = &cache[here];
        let mut found = |line: usize, link: &str, why: String| {
            dangling.push(Dangling {
                file: f.clone(),
                line,
                link: link.to_string(),
                why,
            });
        };
        for (line, label) in &parsed.undefined_references {
            found(
                *line,
                &format!("[{label}]"),
                "no link reference definition has this label".into(),
            );
        }
        for (line, link) in &parsed.links {
            let link_str = link.trim();
            if link_str.is_empty() {
                found(*line, "()", "empty link".into());
                continue;
            }
            if has_scheme(link_str) || link_str.starts_with("//") {
                continue; // a URL: not checked (no network)
            }
            let (path_part, fragment) = match link_str.split_once('#') {
                Some((p, frag)) => (p, Some(frag)),
                None => (link_str, None),
            };
            let path_part = path_part.split('?').next().unwrap_or_default();
            let target = if path_part.is_empty() {
                Some(here.to_path_buf())
            } else {
                let decoded = percent_decode(path_part);
                let joined = match decoded.strip_prefix('/') {
                    Some(from_root) => PathBuf::from(from_root),
                    None => here.parent().unwrap_or(Path::new("")).join(&decoded),
                };
                normalize(&joined)
            };
            let Some(target) = target else {
                found(*line, link_str, "leads outside the repository".into());
                continue;
            };
            let on_disk = root.join(&target);
            if !on_disk.exists() {
                found(
                    *line,
                    link_str,
                    format!("{} does not exist", target.display()),
                );
                continue;
            }
            if !path_part.is_empty() {
                existing
                    .entry(target.display().to_string())
                    .or_default()
                    .push((f.clone(), *line, link_str.to_string()));
            }
            let Some(fragment) = fragment else { continue };
            let is_markdown = on_disk.is_file()
                && target
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("md"));
            if is_markdown {
                fragments.push((
                    f.clone(),
                    *line,
                    link_str.to_string(),
                    target,
                    percent_decode(fragment),
                ));
            }
        }
    }

    for (file, line, link, target, fragment) in fragments {
        read_into(&mut cache, root, &target)?;
        let anchors = &cache[&target].anchors;
        if fragment.is_empty() || !anchors.contains(&fragment) {
            let mut near: Vec<&String> = anchors
                .iter()
                .filter(|a| {
                    let stem = fragment.split('-').next().unwrap_or_default();
                    !stem.is_empty() && a.contains(stem)
                })
                .collect();
            near.sort();
            near.truncate(3);
            let hint = if near.is_empty() {
                String::new()
            } else {
                let near: Vec<String> = near.iter().map(|a| format!("#{a}")).collect();
                format!(" (nearest: {})", near.join(", "))
            };
            dangling.push(Dangling {
                file,
                line,
                link,
                why: format!(
                    "{} has no heading or anchor #{fragment}{hint}",
                    target.display()
                ),
            });
        }
    }

    let targets: Vec<String> = existing.keys().cloned().collect();
    for ignored in git_ignored(root, &targets)? {
        for (file, line, link) in existing.remove(&ignored).unwrap_or_default() {
            dangling.push(Dangling {
                file,
                line,
                link,
                why: format!("{ignored} is ignored by git, so it is not in the repository"),
            });
        }
    }

    dangling.sort();
    Ok(dangling)
}

/// The markdown files git tracks under `root`, less the skipped ones.
fn tracked_markdown(root: &Path) -> Result<Vec<String>> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--", "*.md", "*.MD", "*.markdown"])
        .current_dir(root)
        .output()
        .context("git ls-files (the check reads the files git tracks)")?;
    if !out.status.success() {
        bail!(
            "git ls-files failed in {}: {}",
            root.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .filter(|p| !is_skipped(p))
        // A tracked file deleted in the work tree (being moved right now) has nothing to check.
        .filter(|p| root.join(p).is_file())
        .collect())
}

#[test]
fn every_relative_link_in_tracked_markdown_leads_somewhere() -> Result<()> {
    let root = ferry_e2e::repo_root();
    let files = tracked_markdown(&root)?;
    ensure!(
        files.iter().any(|f| f == "README.md"),
        "git ls-files found no README.md in {}: is this a git checkout?",
        root.display()
    );
    let dangling = check(&root, &files)?;
    let list: Vec<String> = dangling.iter().map(ToString::to_string).collect();
    ensure!(
        dangling.is_empty(),
        "{} dangling link(s) in {} markdown files:\n{}",
        dangling.len(),
        files.len(),
        list.join("\n")
    );
    Ok(())
}

#[test]
fn github_slug_keeps_letters_digits_dashes_and_underscores() {
    assert_eq!(github_slug("Between nodes"), "between-nodes");
    assert_eq!(
        github_slug("make demo, make dev-up, make kube-up"),
        "make-demo-make-dev-up-make-kube-up"
    );
    assert_eq!(
        github_slug("CopyJob reference (ferry.dev/v1alpha1, short name cpj)"),
        "copyjob-reference-ferrydevv1alpha1-short-name-cpj"
    );
    assert_eq!(
        github_slug("A hostile tenant, a hostile pod: one line a class"),
        "a-hostile-tenant-a-hostile-pod-one-line-a-class"
    );
    assert_eq!(
        github_slug("snake_case  and  Ünïcode"),
        "snake_case--and--ünïcode"
    );
}

/// A small tree with one good link of each kind and one bad link of each kind: the checker
/// reports exactly the bad ones, each at its line.
#[test]
fn checker_reports_each_dangling_link_at_its_line() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let git = |args: &[&str]| -> Result<()> {
        let status = Command::new("git")
            .args(args)
            .current_dir(root)
            .stdout(Stdio::null())
            .status()?;
        ensure!(status.success(), "git {args:?}: {status}");
        Ok(())
    };
    git(&["init", "-q"])?;
    std::fs::create_dir_all(root.join("docs/sub"))?;
    std::fs::write(root.join(".gitignore"), "out/\n")?;
    std::fs::create_dir_all(root.join("out"))?;
    std::fs::write(root.join("out/report.md"), "# Report\n")?;
    std::fs::write(root.join("code.rs"), "fn main() {}\n")?;
    std::fs::write(
        root.join("docs/guide.md"),
        "# Guide\n\n## Between nodes\n\n## Between nodes\n\n<a name=\"legacy\"></a>\n\n## `make demo`, `make test`\n",
    )?;
    std::fs::write(
        root.join("docs/sub/deep.md"),
        "# Deep\n\n[up](../guide.md#guide)\n",
    )?;
    std::fs::write(
        root.join("README.md"),
        [
            "# Top",                                         // 1
            "",                                              // 2
            "[guide](docs/guide.md) [dir](docs/sub/)",       // 3
            "[twice](docs/guide.md#between-nodes-1)",        // 4
            "[named](docs/guide.md#legacy) [self](#top)",    // 5
            "[code](docs/guide.md#make-demo-make-test)",     // 6
            "[web](https://example.com/x#y) <mailto:a@b.c>", // 7
            "[rs](code.rs#L1) [root](/docs/guide.md)",       // 8
            "[gone](docs/missing.md)",                       // 9
            "[anchor](docs/guide.md#between-nodes-2)",       // 10
            "[own](#nowhere)",                               // 11
            "| a | [cell](docs/nope/) |",                    // 12
            "[ignored](out/report.md)",                      // 13
            "[escape](../outside.md)",                       // 14
            "![img](docs/pic.svg)",                          // 15
            "[ref][missing-label]",                          // 16
            "",                                              // 17
            "```",                                           // 18
            "[in code](not/checked.md)",                     // 19
            "```",                                           // 20
        ]
        .join("\n"),
    )?;
    let files = vec![
        "README.md".to_string(),
        "docs/guide.md".to_string(),
        "docs/sub/deep.md".to_string(),
    ];
    let got: Vec<String> = check(root, &files)?
        .iter()
        .map(|d| format!("{}:{}: {}", d.file, d.line, d.link))
        .collect();
    assert_eq!(
        got,
        [
            "README.md:9: docs/missing.md",
            "README.md:10: docs/guide.md#between-nodes-2",
            "README.md:11: #nowhere",
            "README.md:12: docs/nope/",
            "README.md:13: out/report.md",
            "README.md:14: ../outside.md",
            "README.md:15: docs/pic.svg",
            "README.md:16: [missing-label]",
        ]
    );
    Ok(())
}
