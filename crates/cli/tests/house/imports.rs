//! The import graph between the modules of one crate, read from its
//! source with a small tokenizer (no parser, no dependency).
//!
//! **What counts as an edge.** A module is a file `foo.rs`, a directory
//! `foo/mod.rs` with its children, or an inline `mod foo { … }`. Code in
//! module `p::a` (or in any module below it) that names `p::b` — with
//! `use crate::…`, `use super::…`, `use self::…` (use trees expanded) or a
//! path `crate::b::…` / `super::b::…` written in code, `super` resolved
//! from the module the code is in — gives the edge `a -> b` between the
//! siblings `a` and `b`, children of the same parent `p`. A name that a
//! `use` brought into a module's scope is followed to where it comes from:
//! `crate::Client` is `crate::client::Client` when the root says
//! `pub use client::Client`, so a re-export hides no edge (a glob import,
//! `use super::*`, is not followed: outside tests, name what you use).
//! Naming an item that lives in the parent itself (`super::Thing`) is no
//! edge, and neither is a parent naming its own children. Comments,
//! strings, test code — items under `#[cfg(test)]` or
//! `#[cfg(any(test, …))]`, modules so declared (`#[cfg(test)] mod
//! fixtures;`), `tests.rs` files and files under a `tests/` directory —
//! are not read: test code may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from its crate's root (`[]` is the root).
pub type ModPath = Vec<String>;

/// One token of Rust source, with the line it starts on.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Colons,
    Punct(char),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

impl Token {
    fn is_ident(&self, name: &str) -> bool {
        matches!(&self.tok, Tok::Ident(i) if i == name)
    }

    fn is_punct(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }
}

/// The source's tokens, comments, strings, chars and numbers left out.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Skips a string body from `i` (just after the opening quote) to
    // past the closing quote followed by `hashes` `#`s.
    let skip_string = |i: &mut usize, line: &mut usize, hashes: usize, escapes: bool| {
        while *i < chars.len() {
            let c = chars[*i];
            if c == '\n' {
                *line += 1;
            }
            if escapes && c == '\\' {
                if at(*i + 1) == '\n' {
                    *line += 1;
                }
                *i += 2;
                continue;
            }
            *i += 1;
            if c == '"' && (0..hashes).all(|h| at(*i + h) == '#') {
                *i += hashes;
                return;
            }
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            skip_string(&mut i, &mut line, 0, true);
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped char: '\n', '\'', '\u{…}'.
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime: its name follows as an identifier.
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
            match ident.as_str() {
                "r" | "br" | "cr" if at(i + hashes) == '"' => {
                    i += hashes + 1;
                    skip_string(&mut i, &mut line, hashes, false);
                }
                "b" | "c" if at(i) == '"' => {
                    i += 1;
                    skip_string(&mut i, &mut line, 0, true);
                }
                "b" if at(i) == '\'' => {
                    // A byte char: the `'` branch above skips it next.
                }
                _ => out.push(Token {
                    tok: Tok::Ident(ident),
                    line,
                }),
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token {
                tok: Tok::Colons,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// Whether a test-only attribute starts at `i`: `#[cfg(test)]` or
/// `#[cfg(any(test, …))]` (test support behind a feature).
fn cfg_test_at(toks: &[Token], i: usize) -> bool {
    let is = |k: usize, w: &str| {
        toks.get(i + k).is_some_and(|t| match &t.tok {
            Tok::Ident(s) => s == w,
            Tok::Punct(c) => w.len() == 1 && w.starts_with(*c),
            Tok::Colons => false,
        })
    };
    let start = ["#", "[", "cfg", "("]
        .iter()
        .enumerate()
        .all(|(k, w)| is(k, w));
    start && (is(4, "test") && is(5, ")") || is(4, "any") && is(5, "(") && is(6, "test"))
}

/// The index just past the item starting at `i` (its attributes first):
/// past its first `;` or its first `{ … }` at the item's own level.
fn skip_item(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < toks.len() {
        match &toks[i].tok {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
            Tok::Punct(';') if depth == 0 => return i + 1,
            Tok::Punct('{') if depth == 0 => {
                let mut braces = 0usize;
                while i < toks.len() {
                    if toks[i].is_punct('{') {
                        braces += 1;
                    } else if toks[i].is_punct('}') {
                        braces -= 1;
                        if braces == 0 {
                            return i + 1;
                        }
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// One leaf of a use tree: the path it names and the name it brings into
/// scope (`None` for a glob).
#[derive(Debug, Clone, PartialEq)]
struct Leaf {
    path: Vec<String>,
    name: Option<String>,
}

/// The leaves of a use tree starting at `*i`.
fn use_tree(toks: &[Token], i: &mut usize, prefix: &[String], out: &mut Vec<Leaf>) {
    let mut path = prefix.to_vec();
    let mut name = None;
    let mut glob = false;
    while let Some(t) = toks.get(*i) {
        match &t.tok {
            Tok::Colons => *i += 1,
            Tok::Ident(s) if s == "as" => {
                if let Some(Tok::Ident(alias)) = toks.get(*i + 1).map(|t| &t.tok) {
                    name = Some(alias.clone());
                }
                *i += 2;
            }
            Tok::Ident(s) => {
                path.push(s.clone());
                *i += 1;
            }
            Tok::Punct('{') => {
                *i += 1;
                while toks.get(*i).is_some_and(|t| !t.is_punct('}')) {
                    use_tree(toks, i, &path, out);
                    if toks.get(*i).is_some_and(|t| t.is_punct(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Tok::Punct('*') => {
                glob = true;
                *i += 1;
            }
            _ => break,
        }
    }
    let name = match (glob, name, path.last()) {
        (true, _, _) => None,
        (false, Some(alias), _) => Some(alias),
        (false, None, Some(last)) if last == "self" => path.iter().rev().nth(1).cloned(),
        (false, None, last) => last.cloned(),
    };
    out.push(Leaf { path, name });
}

/// `segments` (starting with `crate`, `super` or `self`) as a path from
/// the crate's root, read in module `here`; `None` for other paths.
fn resolve(here: &[String], segments: &[String]) -> Option<ModPath> {
    let (first, rest) = segments.split_first()?;
    let mut base: ModPath = match first.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => here.to_vec(),
        _ => return None,
    };
    let mut rest = rest;
    if first == "super" {
        base.pop()?;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// A sibling edge `parent: from -> to`, as one line of one file shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub parent: ModPath,
    pub from: String,
    pub to: String,
}

/// Where an edge was seen first: `file:line`.
pub type Seen = String;

/// One crate's modules and the sibling edges between them.
#[derive(Debug, Default)]
pub struct Graph {
    pub modules: BTreeSet<ModPath>,
    pub edges: BTreeMap<Edge, Seen>,
}

/// Whether a file holds tests only: `tests.rs` or under a `tests/` dir.
pub fn is_test_file(rel: &Path) -> bool {
    rel.file_name().is_some_and(|n| n == "tests.rs")
        || rel.components().any(|c| c.as_os_str() == "tests")
}

/// The module a file under `src/` is (`rel` is from `src/`).
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    let at_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !at_root {
        parts.push(stem.to_owned());
    }
    parts
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The graph of the crate whose `src/` is `src`; `shown` turns a file's
/// path into the one failures print.
pub fn graph(src: &Path, shown: impl Fn(&Path) -> String) -> Graph {
    let mut graph = Graph::default();
    let mut test_modules = BTreeSet::new();
    let mut named: Vec<(Named, Seen)> = Vec::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).expect("under src");
        if is_test_file(rel) {
            continue;
        }
        let module = module_of(rel);
        graph.modules.insert(module.clone());
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let toks = tokens(&text);
        for n in names(&module, &toks, &mut graph.modules, &mut test_modules) {
            let seen = format!("{}:{}", shown(&file), n.line);
            named.push((n, seen));
        }
    }
    let in_tests = |m: &ModPath| test_modules.iter().any(|t| m.starts_with(t));
    graph.modules.retain(|m| !in_tests(m));
    named.retain(|(n, _)| !in_tests(&n.here));
    // A `use` path may also start at a child module (`pub use client::Client`).
    let modules = &graph.modules;
    let absolute = |n: &Named| -> Option<ModPath> {
        resolve(&n.here, &n.path).or_else(|| {
            let mut child = n.here.clone();
            child.push(n.path.first()?.clone());
            modules
                .contains(&child)
                .then(|| [&n.here[..], &n.path[..]].concat())
        })
    };
    // What each module's `use`s bring into its scope: `crate::Client` is
    // `crate::client::Client` when the root says `pub use client::Client`.
    let mut scope: BTreeMap<(ModPath, String), ModPath> = BTreeMap::new();
    for (n, _) in &named {
        if let (Some(name), Some(target)) = (&n.imports, absolute(n)) {
            scope.insert((n.here.clone(), name.clone()), target);
        }
    }
    let through_uses = |mut target: ModPath| -> ModPath {
        for _ in 0..8 {
            let hop = (0..target.len()).find_map(|k| {
                let key = (target[..k].to_vec(), target[k].clone());
                let is_module = modules.contains(&target[..=k].to_vec());
                (!is_module && modules.contains(&key.0))
                    .then(|| scope.get(&key))
                    .flatten()
                    .map(|to| [&to[..], &target[k + 1..]].concat())
            });
            match hop {
                Some(next) if next != target => target = next,
                _ => break,
            }
        }
        target
    };
    for (n, seen) in &named {
        let Some(target) = absolute(n).map(through_uses) else {
            continue;
        };
        let here = &n.here;
        let common = here.iter().zip(&target).take_while(|(a, b)| a == b).count();
        if common >= here.len() || common >= target.len() {
            continue;
        }
        let parent = here[..common].to_vec();
        let mut sibling = parent.clone();
        sibling.push(target[common].clone());
        if !graph.modules.contains(&sibling) {
            continue;
        }
        let edge = Edge {
            parent,
            from: here[common].clone(),
            to: target[common].clone(),
        };
        graph.edges.entry(edge).or_insert_with(|| seen.clone());
    }
    graph
}

/// A path one file names: the module the naming code is in, the path as
/// written (`crate::a::B`, `super::c`, `d::E` in a `use`), its line, and
/// for a `use` the name it brings into that module's scope.
#[derive(Debug, Clone)]
struct Named {
    here: ModPath,
    path: Vec<String>,
    line: usize,
    imports: Option<String>,
}

/// Each path one file names; inline modules go into `modules`, and
/// modules declared test-only (`#[cfg(test)] mod fixtures;`) into
/// `test_modules`.
fn names(
    file_module: &ModPath,
    toks: &[Token],
    modules: &mut BTreeSet<ModPath>,
    test_modules: &mut BTreeSet<ModPath>,
) -> Vec<Named> {
    let mut out = Vec::new();
    let mut here = file_module.clone();
    // The brace depth each open inline module closes at.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        if cfg_test_at(toks, i) {
            let end = skip_item(toks, i);
            if let [
                ..,
                m,
                Token {
                    tok: Tok::Ident(name),
                    ..
                },
                semi,
            ] = &toks[i..end]
                && m.is_ident("mod")
                && semi.is_punct(';')
            {
                let mut module = here.clone();
                module.push(name.clone());
                test_modules.insert(module);
            }
            i = end;
            continue;
        }
        if t.is_punct('{') {
            depth += 1;
        } else if t.is_punct('}') {
            depth = depth.saturating_sub(1);
            if inline.last() == Some(&depth) {
                inline.pop();
                here.pop();
            }
        } else if t.is_ident("mod")
            && toks.get(i + 2).is_some_and(|t| t.is_punct('{'))
            && let Some(Tok::Ident(name)) = toks.get(i + 1).map(|t| &t.tok)
        {
            here.push(name.clone());
            modules.insert(here.clone());
            inline.push(depth);
            depth += 1;
            i += 3;
            continue;
        } else if t.is_ident("use") && !toks.get(i + 1).is_some_and(|t| t.is_punct('<')) {
            let line = t.line;
            let mut leaves = Vec::new();
            i += 1;
            use_tree(toks, &mut i, &[], &mut leaves);
            for leaf in leaves {
                out.push(Named {
                    here: here.clone(),
                    path: leaf.path,
                    line,
                    imports: leaf.name,
                });
            }
            continue;
        } else if (t.is_ident("crate") || t.is_ident("super") || t.is_ident("self"))
            && toks.get(i + 1).is_some_and(|t| t.tok == Tok::Colons)
            && !(i > 0 && toks[i - 1].tok == Tok::Colons)
            && !(i > 1 && toks[i - 1].is_ident("in") && toks[i - 2].is_punct('('))
        {
            let mut path = Vec::new();
            let mut j = i;
            while let Some(Tok::Ident(s)) = toks.get(j).map(|t| &t.tok) {
                path.push(s.clone());
                if toks.get(j + 1).is_some_and(|t| t.tok == Tok::Colons) {
                    j += 2;
                } else {
                    break;
                }
            }
            out.push(Named {
                here: here.clone(),
                path,
                line: t.line,
                imports: None,
            });
            i = j + 1;
            continue;
        }
        i += 1;
    }
    out
}

/// A circle: modules of one parent that all reach each other.
#[derive(Debug)]
pub struct Circle {
    pub parent: ModPath,
    /// Its modules, sorted.
    pub members: Vec<String>,
    /// The shortest cycle through each member (`a -> b -> a`), repeats
    /// left out: together they show each way the circle closes.
    pub cycles: Vec<Vec<String>>,
}

/// The strongly connected components of more than one module, per
/// parent.
pub fn circles(graph: &Graph) -> Vec<Circle> {
    let mut by_parent: BTreeMap<&ModPath, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for edge in graph.edges.keys() {
        by_parent
            .entry(&edge.parent)
            .or_default()
            .entry(&edge.from)
            .or_default()
            .insert(&edge.to);
    }
    let mut found = Vec::new();
    for (parent, next) in by_parent {
        let reach = |from: &str| -> BTreeSet<&str> {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from];
            while let Some(m) = todo.pop() {
                for &n in next.get(m).into_iter().flatten() {
                    if seen.insert(n) {
                        todo.push(n);
                    }
                }
            }
            seen
        };
        let mut done: BTreeSet<&str> = BTreeSet::new();
        for &start in next.keys() {
            if done.contains(start) {
                continue;
            }
            let from_start = reach(start);
            if !from_start.contains(start) {
                continue;
            }
            let members: BTreeSet<&str> = from_start
                .iter()
                .copied()
                .filter(|m| reach(m).contains(start))
                .collect();
            done.extend(members.iter().copied());
            if members.len() < 2 {
                continue;
            }
            let mut cycles: Vec<Vec<String>> = Vec::new();
            for &m in &members {
                let cycle = shortest_cycle(m, &next);
                let mut key = cycle[1..].to_vec();
                key.sort();
                if !cycles.iter().any(|c| {
                    let mut k = c[1..].to_vec();
                    k.sort();
                    k == key
                }) {
                    cycles.push(cycle);
                }
            }
            found.push(Circle {
                parent: parent.clone(),
                members: members.iter().map(|m| (*m).to_owned()).collect(),
                cycles,
            });
        }
    }
    found
}

/// The shortest way from `start` back to itself, `start` at both ends.
fn shortest_cycle(start: &str, next: &BTreeMap<&str, BTreeSet<&str>>) -> Vec<String> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(m) = queue.pop_front() {
        for &n in next.get(m).into_iter().flatten() {
            if n == start {
                let mut path = vec![start.to_owned()];
                let mut at = m;
                while at != start {
                    path.push(at.to_owned());
                    at = came_from[at];
                }
                path.push(start.to_owned());
                path.reverse();
                return path;
            }
            if !came_from.contains_key(n) {
                came_from.insert(n, m);
                queue.push_back(n);
            }
        }
    }
    vec![start.to_owned()]
}

#[test]
fn the_scanner_reads_use_trees_super_and_inline_paths() {
    let text = r#"
        use crate::{a::{self, X}, b::Y as Z};
        use super::super::c;
        // use crate::commented;
        const S: &str = "crate::in_a_string";
        fn f() { crate::d::g(); let _ = 'x'; }
        #[cfg(test)]
        mod tests { use crate::e; }
        mod inner { use super::f; }
        #[cfg(any(test, feature = "test-support"))]
        pub mod fixtures;
    "#;
    let mut modules = BTreeSet::new();
    let here: ModPath = vec!["p".into(), "q".into()];
    let mut test_modules = BTreeSet::new();
    let got: Vec<ModPath> = names(&here, &tokens(text), &mut modules, &mut test_modules)
        .into_iter()
        .filter_map(|n| resolve(&n.here, &n.path))
        .collect();
    let path = |s: &str| -> ModPath { s.split("::").map(String::from).collect() };
    assert_eq!(
        got,
        [
            path("a"),
            path("a::X"),
            path("b::Y"),
            path("c"),
            path("d::g"),
            path("p::q::f")
        ]
    );
    assert!(modules.contains(&path("p::q::inner")));
    assert_eq!(test_modules, BTreeSet::from([path("p::q::fixtures")]));
}

#[test]
fn a_re_export_hides_no_edge() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write =
        |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    write("lib.rs", "mod a;\nmod b;\npub use a::A;\n");
    write("a.rs", "use crate::b::B;\npub struct A(B);\n");
    write("b.rs", "pub struct B;\nfn f(_: crate::A) {}\n");
    let graph = graph(dir.path(), |p| p.display().to_string());
    let found = circles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].members, ["a", "b"]);
}
