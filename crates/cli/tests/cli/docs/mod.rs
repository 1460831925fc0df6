//! The user-facing pages hold to the repository and to the binary: every
//! relative link names a file that exists (and, into a Markdown page, a
//! heading it has), every repository path written in code names one that
//! exists, every `charon SUBCOMMAND --flag` shown is a flag that
//! subcommand's `--help` lists, no page (and no `--help`) cites a
//! contract, an issue or a file outside the repository, and the README's
//! migration transcripts are what the binary prints.
//!
//! The pages: `README.md`, `ARCHITECTURE.md`, `docs/**/*.md`, and the
//! READMEs of the Python client, the benchmarks and `deploy/`. The maps
//! (`ARCHITECTURE.md`'s crate graph, `docs/README.md`'s index) are held to
//! the code and the pages in [`map`].

mod map;
mod markdown;
mod transcripts;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::charon;
use markdown::{Line, anchors, code_spans, commands, links};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// A user-facing page: its path from the root and its text.
struct Page {
    path: PathBuf,
    text: String,
}

impl Page {
    /// `path:line` as failures name it.
    fn at(&self, line: usize) -> String {
        format!("{}:{line}", self.path.display())
    }
}

/// Every user-facing page, in a stable order.
fn pages() -> Vec<Page> {
    let root = root();
    let mut paths: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "clients/python/README.md",
        "benches/README.md",
        "deploy/envoy/README.md",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(root.join(&dir)).expect("read docs/") {
            let name = entry.expect("entry").file_name();
            let path = dir.join(&name);
            if root.join(&path).is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                paths.push(path);
            }
        }
    }
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root.join(&path))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Page { path, text }
        })
        .collect()
}

/// Fails with every problem found, one a line.
fn report(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what} ({}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn docs_link_only_to_files_and_headings_that_exist() {
    let root = root();
    let mut headings: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for page in pages() {
        let dir = page.path.parent().unwrap_or(Path::new("")).to_path_buf();
        for (line, target) in links(&page.text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if file.is_empty() {
                page.path.clone()
            } else {
                normalize(&dir.join(file))
            };
            let on_disk = root.join(&linked);
            if !on_disk.exists() {
                problems.push(format!("{}: {target}: no such file", page.at(line)));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if on_disk.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let known = headings.entry(linked.clone()).or_insert_with(|| {
                anchors(&std::fs::read_to_string(&on_disk).expect("read linked page"))
            });
            if !known.contains(anchor) {
                problems.push(format!(
                    "{}: {target}: {} has no heading #{anchor}",
                    page.at(line),
                    linked.display()
                ));
            }
        }
    }
    report("links to nothing", &problems);
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The repository's top-level directories a page may name in code.
const TOP: &[&str] = &[
    "benches/",
    "clients/",
    "crates/",
    "deploy/",
    "docs/",
    "examples/",
    "proto/",
    "scripts/",
];

#[test]
fn docs_name_repository_paths_that_exist() {
    let root = root();
    let mut problems = Vec::new();
    for page in pages() {
        for (line, span) in code_spans(&page.text) {
            // `crates/x/tests/y.rs::a_test` names the file.
            let path = span.split("::").next().unwrap_or_default();
            let path = path.trim_end_matches([',', '.', ':']);
            let plain = !path.contains(|c: char| c.is_whitespace() || "*{}<>…$=|[]()".contains(c));
            if plain && TOP.iter().any(|t| path.starts_with(t)) && !root.join(path).exists() {
                problems.push(format!("{}: `{span}`: no such path", page.at(line)));
            }
        }
    }
    report("paths that do not exist", &problems);
}

/// What `charon … --help` says about one subcommand.
#[derive(Debug, Default)]
struct Help {
    subcommands: BTreeSet<String>,
    flags: BTreeSet<String>,
    /// The whole text, as a user reads it.
    text: String,
}

/// Every subcommand path of the binary with its help, read from the
/// binary's own `--help` (the root is the empty path).
fn cli() -> BTreeMap<Vec<String>, Help> {
    let mut all = BTreeMap::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let out = charon()
            .args(&path)
            .arg("--help")
            .output()
            .expect("run charon --help");
        assert!(out.status.success(), "charon {} --help", path.join(" "));
        let text = String::from_utf8(out.stdout).expect("utf-8 help");
        let mut help = parse_help(&text);
        help.text = text;
        for sub in &help.subcommands {
            let mut next = path.clone();
            next.push(sub.clone());
            todo.push(next);
        }
        all.insert(path, help);
    }
    all
}

/// The subcommands (the `Commands:` section, `help` left out) and flags
/// (every option line's `--long`) of a clap help text.
fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut in_commands = false;
    for line in text.lines() {
        if !line.starts_with(' ') {
            in_commands = line.trim_end() == "Commands:";
            continue;
        }
        let trimmed = line.trim_start();
        if in_commands {
            if let Some(name) = trimmed.split_whitespace().next()
                && name != "help"
                && line.starts_with("  ")
                && !line.starts_with("   ")
            {
                help.subcommands.insert(name.to_owned());
            }
        } else if trimmed.starts_with('-') {
            for word in trimmed.split([' ', ',', '=']) {
                if let Some(flag) = word.strip_prefix("--")
                    && !flag.is_empty()
                {
                    help.flags.insert(format!("--{flag}"));
                }
            }
        }
    }
    help
}

/// The flags a command at `path` (and, where it has subcommands and
/// none was given, any of them) accepts.
fn accepted(cli: &BTreeMap<Vec<String>, Help>, path: &[String]) -> BTreeSet<String> {
    cli.iter()
        .filter(|(p, _)| p.starts_with(path))
        .flat_map(|(_, h)| h.flags.iter().cloned())
        .chain(["--help".to_owned(), "--version".to_owned()])
        .collect()
}

#[test]
fn docs_name_only_flags_the_binary_knows() {
    let cli = cli();
    assert!(
        cli.len() > 10,
        "the binary's subcommands were found: {:?}",
        cli.keys()
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for (line, words) in commands(&page.text) {
            // The subcommand path: words while they name subcommands
            // (`request|hold` or `apply/export` name several).
            let mut paths = vec![Vec::<String>::new()];
            let mut rest = &words[..];
            while let Some((word, tail)) = rest.split_first() {
                let next: Vec<Vec<String>> = paths
                    .iter()
                    .flat_map(|p| {
                        word.split(['|', '/']).map(move |w| {
                            let mut q = p.clone();
                            q.push(w.to_owned());
                            q
                        })
                    })
                    .filter(|q| cli.contains_key(q))
                    .collect();
                if next.is_empty() {
                    break;
                }
                paths = next;
                rest = tail;
            }
            let known: BTreeSet<String> = paths.iter().flat_map(|p| accepted(&cli, p)).collect();
            for word in rest {
                if word == "--" {
                    break;
                }
                for flag in flags_in(word) {
                    checked += 1;
                    if !known.contains(&flag) {
                        problems.push(format!(
                            "{}: `charon {}` has no flag {flag} (charon {} --help)",
                            page.at(line),
                            paths[0].join(" "),
                            paths[0].join(" ")
                        ));
                    }
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} flags found in the docs");
    report("flags the binary does not know", &problems);
}

/// The `--long` flags a word of a command names (`[--config`,
/// `--redis-cert/--redis-key`, `--config=FILE`).
fn flags_in(word: &str) -> Vec<String> {
    word.split('/')
        .filter_map(|part| {
            let part = part.trim_start_matches(['[', '(', '`', '"', '\'']);
            let name: String = part
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .collect()
}

/// What user-facing pages may not cite: the contract and the issues of
/// the project's own workflow, and files outside the repository.
const FORBIDDEN: &[&str] = &[
    "SPEC §",
    "SPEC 1",
    "SPEC 2",
    "SPEC 3",
    "SPEC 4",
    "SPEC 5",
    "SPEC 6",
    "SPEC 7",
    "SPEC 8",
    "SPEC 9",
    "SPEC.md",
    "../shared",
    "/work/",
    "seeds/",
    "seed 00",
];

#[test]
fn user_docs_cite_no_spec_no_issue_and_no_file_outside_the_repository() {
    let mut problems = Vec::new();
    for page in pages() {
        for Line { number, text, .. } in markdown::lines(&page.text) {
            for bad in FORBIDDEN {
                if text.contains(bad) {
                    problems.push(format!("{}: {bad:?} in {text:?}", page.at(number)));
                }
            }
            if let Some(issue) = issue_number(text) {
                problems.push(format!("{}: {issue:?} in {text:?}", page.at(number)));
            }
        }
    }
    report("citations outside the repository", &problems);
}

/// An issue number in `text`: "issue 26", "Issue 13's", "issues 5",
/// "issue #7", "(#26)".
fn issue_number(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    for word in ["issue ", "issues ", "issue #"] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(word) {
            let start = from + i;
            let after = &lower[start + word.len()..];
            let starts_word = start == 0 || !lower[..start].ends_with(char::is_alphanumeric);
            if starts_word && after.starts_with(|c: char| c.is_ascii_digit()) {
                let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                return Some(format!("{word}{digits}"));
            }
            from = start + word.len();
        }
    }
    let mut from = 0;
    while let Some(i) = text[from..].find("(#") {
        let after = &text[from + i + 2..];
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            return Some(format!("(#{digits}"));
        }
        from += i + 2;
    }
    None
}

#[test]
fn the_binary_help_cites_no_spec_no_issue_and_no_file_outside_the_repository() {
    let mut problems = Vec::new();
    for (path, help) in cli() {
        for line in help.text.lines() {
            let bad = FORBIDDEN
                .iter()
                .map(|b| (*b).to_owned())
                .find(|b| line.contains(b.as_str()))
                .or_else(|| issue_number(line));
            if let Some(bad) = bad {
                problems.push(format!(
                    "charon {} --help: {bad:?} in {line:?}",
                    path.join(" ")
                ));
            }
        }
    }
    report("citations outside the repository in --help", &problems);
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // The parsers the tests above rely on, on the mistakes they must see.
    let text = "# Top\n\nSee [a](missing.md) and [b](#top).\n\n```sh\ncharon serve --no-such \\\n  --listen x\n```\n\n`charon config apply/export --url U`, `crates/nowhere.rs`\n";
    let found: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(found, ["missing.md", "#top"]);
    assert!(anchors(text).contains("top"));
    let cmds: Vec<Vec<String>> = commands(text).into_iter().map(|(_, c)| c).collect();
    assert!(
        cmds.iter()
            .any(|c| c == &["serve", "--no-such", "--listen", "x"]),
        "{cmds:?}"
    );
    assert!(
        cmds.iter()
            .any(|c| c == &["config", "apply/export", "--url", "U"]),
        "{cmds:?}"
    );
    assert!(
        code_spans(text)
            .iter()
            .any(|(_, s)| s == "crates/nowhere.rs")
    );
    assert_eq!(
        issue_number("as issue 26 says").as_deref(),
        Some("issue 26")
    );
    assert_eq!(issue_number("fixed (#26)").as_deref(), Some("(#26"));
    assert_eq!(issue_number("PKCS#8 keys, process #1, tissue 3"), None);
    assert_eq!(
        flags_in("[--redis-cert/--redis-key"),
        ["--redis-cert", "--redis-key"]
    );
    assert_eq!(
        markdown::slug("Burst tiers (`kind: rate`)"),
        "burst-tiers-kind-rate"
    );
}
