//! `charon completions` and `charon man` from the real binary: the bash
//! script registers itself and completes subcommands and flags when bash
//! calls it; every subcommand `charon --help` lists (at every depth) has
//! a man page with its NAME section; `scripts/install-extras` puts them
//! where shells and man look.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::support::charon;

/// The completion script of `shell`, checked to be non-empty.
fn completion(shell: &str) -> String {
    let out = charon().args(["completions", shell]).output().unwrap();
    assert!(
        out.status.success(),
        "{shell}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("charon"), "{shell}: {script}");
    script
}

/// What bash's completion function offers for `words` (the last is the
/// word being completed), after sourcing the script in a fresh `bash`.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let cword = words.len() - 1;
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}' || exit 9
         COMP_WORDS=({})
         COMP_CWORD={cword}
         COMP_LINE='{}'
         COMP_POINT=${{#COMP_LINE}}
         func=$(complete -p charon | sed -n 's/.*-F \\([^ ]*\\) .*/\\1/p')
         \"$func\" charon '{}' '{}'
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.join(" "),
        words[cword],
        words[cword - 1],
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bash: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completion_registers_and_completes_subcommands_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("charon.bash");
    std::fs::write(&script, completion("bash")).unwrap();

    let out = Command::new("bash")
        .args([
            "--norc",
            "--noprofile",
            "-c",
            &format!("source '{}' && complete -p charon", script.display()),
        ])
        .output()
        .unwrap();
    let registered = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && registered.contains("-F _charon") && registered.contains("charon"),
        "{registered} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(bash_complete(&script, &["charon", "se"]), ["serve"]);
    assert_eq!(
        bash_complete(&script, &["charon", "config", "ch"]),
        ["check"]
    );
    assert_eq!(
        bash_complete(&script, &["charon", "serve", "--http-l"]),
        ["--http-listen"]
    );
    let shells = bash_complete(&script, &["charon", "completions", ""]);
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        assert!(shells.iter().any(|s| s == shell), "{shell} in {shells:?}");
    }
}

#[test]
fn every_shell_has_a_script_and_a_bad_shell_is_refused() {
    assert!(completion("zsh").starts_with("#compdef charon"));
    assert!(completion("fish").contains("complete -c charon"));
    assert!(completion("elvish").contains("edit:completion:arg-completer[charon]"));
    assert!(completion("powershell").contains("Register-ArgumentCompleter"));
    let out = charon().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
}

/// The subcommands `charon ARGS --help` lists, without `help`.
fn subcommands(path: &[String]) -> Vec<String> {
    let out = charon().args(path).arg("--help").output().unwrap();
    assert!(out.status.success(), "charon {path:?} --help");
    let help = String::from_utf8(out.stdout).unwrap();
    let Some((_, rest)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    rest.lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| {
            let line = l.trim_start();
            // Continuation lines of a long description are indented more.
            (l.len() - line.len() == 2).then(|| line.split_whitespace().next().unwrap().to_owned())
        })
        .filter(|c| c != "help")
        .collect()
}

/// Every command path below `path`, from the help texts.
fn command_paths(path: Vec<String>, all: &mut BTreeSet<String>) {
    all.insert(
        std::iter::once("charon".to_owned())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join("-"),
    );
    for sub in subcommands(&path) {
        let mut next = path.clone();
        next.push(sub);
        command_paths(next, all);
    }
}

#[test]
fn man_writes_a_page_per_subcommand_with_its_name_section() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("man1");
    let out = charon()
        .args(["man", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut expected = BTreeSet::new();
    command_paths(Vec::new(), &mut expected);
    for name in [
        "charon",
        "charon-serve",
        "charon-config-check",
        "charon-client-hold",
        "charon-man",
    ] {
        assert!(expected.contains(name), "{name} in {expected:?}");
    }
    let written: BTreeSet<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let wanted: BTreeSet<String> = expected.iter().map(|n| format!("{n}.1")).collect();
    assert_eq!(written, wanted);

    let man = Command::new("man").arg("--version").output().is_ok();
    for name in &expected {
        let path = out_dir.join(format!("{name}.1"));
        let roff = std::fs::read_to_string(&path).unwrap();
        assert!(roff.contains(".SH NAME"), "{name}: {roff}");
        assert!(roff.contains(&name.replace('-', "\\-")), "{name}: {roff}");
        if man {
            // Rendered by man itself: the NAME section names the command.
            let out = Command::new("man")
                .arg("-l")
                .arg(&path)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "200")
                .output()
                .unwrap();
            assert!(out.status.success(), "man -l {name}.1");
            let text = String::from_utf8_lossy(&out.stdout);
            let after_name = text.split_once("NAME\n").map(|(_, r)| r.trim_start());
            assert!(
                after_name.is_some_and(|r| r.starts_with(&format!("{name} "))),
                "{name}: {text}"
            );
        }
    }
    // Without --out, charon.1 alone on stdout.
    let out = charon().arg("man").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        std::fs::read_to_string(out_dir.join("charon.1")).unwrap()
    );
}

#[test]
fn install_extras_puts_completions_and_pages_under_the_prefix() {
    let prefix = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-extras");
    let out = Command::new("bash")
        .arg(&script)
        .arg(prefix.path())
        .env("CHARON_BIN", crate::support::bin())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = prefix.path();
    assert_eq!(
        std::fs::read_to_string(p.join("share/bash-completion/completions/charon")).unwrap(),
        completion("bash")
    );
    assert_eq!(
        std::fs::read_to_string(p.join("share/zsh/site-functions/_charon")).unwrap(),
        completion("zsh")
    );
    assert_eq!(
        std::fs::read_to_string(p.join("share/fish/vendor_completions.d/charon.fish")).unwrap(),
        completion("fish")
    );
    for page in ["charon.1", "charon-serve.1", "charon-config-check.1"] {
        assert!(p.join("share/man/man1").join(page).is_file(), "{page}");
    }
}

/// The exit statuses are documented where a user looks: `charon --help`
/// and the man page `charon man` prints.
#[test]
fn help_and_the_man_page_document_the_exit_statuses() {
    let help = charon().arg("--help").output().unwrap();
    assert!(help.status.success());
    let man = charon().arg("man").output().unwrap();
    assert!(man.status.success());
    let (help, man) = (
        String::from_utf8_lossy(&help.stdout).into_owned(),
        String::from_utf8_lossy(&man.stdout).into_owned(),
    );
    for text in [&help, &man] {
        for line in [
            "0  answered",
            "1  client error",
            "2  usage",
            "3  server unavailable",
        ] {
            assert!(text.contains(line), "{line:?} in:\n{text}");
        }
    }
    assert!(help.contains("Exit status:"), "{help}");
    // A usage error exits 2, --help and --version 0.
    let bad = charon().arg("--no-such-flag").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        charon().arg("--version").output().unwrap().status.code(),
        Some(0)
    );
}
