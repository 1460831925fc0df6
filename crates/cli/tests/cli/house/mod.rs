//! The house check: the workspace's source stays walkable. No crate has
//! an import circle between its modules (see [`imports`] for what counts
//! as an edge), and no Rust source file outside tests grows over
//! [`MAX_LINES`] lines.

mod circles;
mod imports;
mod tokens;

use std::path::{Path, PathBuf};

/// The workspace's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Each crate under `crates/`: its package name and its directory.
fn crates() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).expect("read crates/") {
        let dir = entry.expect("dir entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = manifest
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_owned())
            .expect("a package name");
        if dir.join("src").is_dir() {
            out.push((name, dir));
        }
    }
    out.sort();
    out
}

/// A path as failures print it: from the workspace's root.
fn shown(path: &Path) -> String {
    let root = root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The circles not broken yet, as the check names them. The list only
/// shrinks: a circle broken must leave it, and no other may appear.
const STILL_CIRCLES: &[&str] = &[];

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let mut problems = Vec::new();
    let mut found = Vec::new();
    for (name, dir) in crates() {
        let graph = imports::graph(&dir.join("src"), shown);
        for circle in circles::circles(&graph) {
            let prefix: String = circle.parent.iter().map(|p| format!("{p}::")).collect();
            let circle_name = format!("{name}: {prefix}{{{}}}", circle.members.join(", "));
            if STILL_CIRCLES.contains(&circle_name.as_str()) {
                found.push(circle_name);
                continue;
            }
            problems.push(format!("{circle_name} reach each other:"));
            for cycle in &circle.cycles {
                problems.push(format!("  {name}: {prefix}{}", cycle.join(" -> ")));
                for pair in cycle.windows(2) {
                    let edge = imports::Edge {
                        parent: circle.parent.clone(),
                        from: pair[0].clone(),
                        to: pair[1].clone(),
                    };
                    let seen = &graph.edges[&edge];
                    problems.push(format!("    {} -> {}: {seen}", pair[0], pair[1]));
                }
            }
        }
    }
    for listed in STILL_CIRCLES {
        if !found.iter().any(|f| f == listed) {
            problems.push(format!(
                "{listed}: no longer a circle (or now another): take it off STILL_CIRCLES"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "import circles between sibling modules (each edge with where it is first seen):\n{}",
        problems.join("\n")
    );
}

/// The most lines a Rust source file outside tests may have.
const MAX_LINES: usize = 600;

/// The files over [`MAX_LINES`] not split yet. The list only shrinks: a
/// file split below the limit must leave it, and no other file may grow
/// over the limit.
const STILL_OVER: &[&str] = &[];

#[test]
fn no_source_file_is_over_600_lines() {
    let mut over = Vec::new();
    for (_, dir) in crates() {
        let src = dir.join("src");
        for file in imports::rust_files(&src) {
            let rel = file.strip_prefix(&src).expect("under src");
            if imports::is_test_file(rel) {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("read a source file");
            let lines = text.lines().count();
            if lines > MAX_LINES {
                over.push((shown(&file), lines));
            }
        }
    }
    let mut problems: Vec<String> = over
        .iter()
        .filter(|(path, _)| !STILL_OVER.contains(&path.as_str()))
        .map(|(path, lines)| format!("{path}: {lines} lines, over {MAX_LINES}: split it"))
        .collect();
    for listed in STILL_OVER {
        if !over.iter().any(|(path, _)| path == listed) {
            problems.push(format!(
                "{listed}: no longer over {MAX_LINES} lines (or gone): take it off STILL_OVER"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
