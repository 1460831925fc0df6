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

use super::tokens::{Tok, Token, cfg_test_at, skip_item, tokens};

/// A module's path from its crate's root (`[]` is the root).
pub type ModPath = Vec<String>;

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
    let found = super::circles::circles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].members, ["a", "b"]);
}
