//! What the pages show the binary printing is what it prints: the
//! README's migration transcripts, and every `charon simulate` run whose
//! output a page shows.

use std::io::Write;
use std::process::Stdio;

use super::{pages, report, root};
use crate::support::charon;

/// The README's migration section shows each import of `examples/peers/`
/// with its output: that output is what the binary prints.
#[test]
fn the_readme_shows_each_import_with_its_real_output() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut shown = 0;
    for block in readme.split("```console\n").skip(1) {
        let block = block.split("```").next().unwrap_or_default();
        for transcript in block.split("\n\n") {
            let Some((command, output)) = transcript.split_once('\n') else {
                continue;
            };
            let Some(args) = command.strip_prefix("$ charon config import ") else {
                continue;
            };
            let out = charon()
                .current_dir(&root)
                .args(["config", "import"])
                .args(args.split_whitespace())
                .output()
                .expect("run charon");
            assert!(out.status.success(), "{command}");
            let printed = String::from_utf8(out.stdout).expect("utf-8");
            assert_eq!(
                printed.trim_end(),
                output.trim_end(),
                "{command}: the README shows another output"
            );
            shown += 1;
        }
    }
    assert_eq!(shown, 3, "one import of each peer in the README");
}

/// A `sh` block that runs `charon simulate --config FILE <<'EOF'` on the
/// event lines up to `EOF`, followed (after at most one line of prose) by
/// a `text` block: that block is what the run prints.
#[test]
fn every_simulate_run_a_page_shows_prints_what_it_shows() {
    let root = root();
    let mut problems = Vec::new();
    let mut shown = 0;
    for page in pages() {
        let lines: Vec<&str> = page.text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(config) = line
                .strip_prefix("charon simulate --config ")
                .and_then(|rest| rest.strip_suffix(" <<'EOF'"))
            else {
                continue;
            };
            let Some(end) = lines[i..].iter().position(|l| *l == "EOF") else {
                continue;
            };
            let events = lines[i + 1..i + end].join("\n") + "\n";
            // The block's closing fence, at most one line of prose, then
            // the output's block.
            let after = &lines[i + end + 1..];
            let Some(open) = after.iter().take(6).position(|l| *l == "```text") else {
                continue;
            };
            let Some(len) = after[open + 1..].iter().position(|l| *l == "```") else {
                continue;
            };
            let expected = after[open + 1..open + 1 + len].join("\n");
            let mut child = charon()
                .current_dir(&root)
                .args(["simulate", "--config", config])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("run charon simulate");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(events.as_bytes())
                .expect("write events");
            let out = child.wait_with_output().expect("charon simulate");
            let printed = String::from_utf8(out.stdout).expect("utf-8");
            if printed.trim_end() != expected.trim_end() {
                problems.push(format!(
                    "{}: charon simulate prints\n{printed}instead of\n{expected}",
                    page.at(i + 1)
                ));
            }
            shown += 1;
        }
    }
    assert!(shown >= 1, "no simulate run with its output in the pages");
    report("simulate runs the pages show wrongly", &problems);
}
