//! The maps stay true: `ARCHITECTURE.md`'s table of dependencies is what
//! the crates' `Cargo.toml` files declare, every crate has its paragraph,
//! and `docs/README.md` lists every page of `docs/`.

use std::collections::{BTreeMap, BTreeSet};

use super::{pages, report, root};

/// Each workspace crate's name and the workspace crates it depends on
/// (`[dependencies]` only: dev- and build-dependencies are left out), read
/// from `crates/*/Cargo.toml`.
fn declared() -> BTreeMap<String, BTreeSet<String>> {
    let mut all = BTreeMap::new();
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let manifest = entry.expect("entry").path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let mut section = "";
        let mut name = None;
        let mut deps = BTreeSet::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
                continue;
            }
            let key = line
                .split(['=', '.', ' '])
                .next()
                .unwrap_or_default()
                .trim();
            if section == "[package]" && key == "name" {
                name = line.split('"').nth(1).map(str::to_owned);
            } else if section == "[dependencies]" && key.starts_with("charon") {
                deps.insert(key.to_owned());
            }
        }
        let name = name.unwrap_or_else(|| panic!("{}: no package name", manifest.display()));
        all.insert(name, deps);
    }
    all
}

/// The table of `ARCHITECTURE.md`: crate → the crates it lists.
fn mapped(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut all = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, first, second, _] = cells[..] else {
            continue;
        };
        let Some(name) = first.split('`').nth(1).filter(|n| n.starts_with("charon")) else {
            continue;
        };
        // `core, store (each optional, …)`: the names before any remark.
        let deps = second
            .split('(')
            .next()
            .unwrap_or_default()
            .split(',')
            .filter_map(|d| d.split_whitespace().next())
            .filter(|d| *d != "—")
            .map(|d| format!("charon-{d}"))
            .collect();
        all.insert(name.to_owned(), deps);
    }
    all
}

#[test]
fn the_architecture_map_is_the_crate_graph() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let declared = declared();
    assert!(declared.len() >= 10, "crates found: {declared:?}");
    let mapped = mapped(&text);
    let mut problems = Vec::new();
    for (name, deps) in &declared {
        match mapped.get(name) {
            None => problems.push(format!("{name} is not in the table")),
            Some(listed) if listed != deps => problems.push(format!(
                "{name}: Cargo.toml says {deps:?}, the table {listed:?}"
            )),
            Some(_) => {}
        }
        // Each crate has its paragraph: `### `name`` (the binary's heading
        // is `charon` too).
        if !text.contains(&format!("### `{name}`")) {
            problems.push(format!("{name} has no paragraph (### `{name}`)"));
        }
    }
    for name in mapped.keys().filter(|n| !declared.contains_key(*n)) {
        problems.push(format!("{name} is in the table but is no crate"));
    }
    report(
        "ARCHITECTURE.md and the Cargo.toml files disagree",
        &problems,
    );
}

#[test]
fn the_docs_index_lists_every_page() {
    let index = std::fs::read_to_string(root().join("docs/README.md")).expect("docs/README.md");
    let linked: BTreeSet<String> = super::markdown::links(&index)
        .into_iter()
        .map(|(_, t)| t.split('#').next().unwrap_or_default().to_owned())
        .collect();
    let missing: Vec<String> = pages()
        .into_iter()
        .filter_map(|p| {
            let rel = p.path.strip_prefix("docs").ok()?.to_str()?.to_owned();
            (rel != "README.md" && !linked.contains(&rel)).then_some(rel)
        })
        .collect();
    report("pages of docs/ that docs/README.md does not list", &missing);
}
