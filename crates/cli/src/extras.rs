//! `charon completions SHELL` and `charon man [--out DIR]`: shell
//! completions (clap_complete) and man pages (clap_mangen) made from the
//! same clap definition as the parser, so they can never list a flag the
//! binary does not take. `scripts/install-extras` puts them where shells
//! and `man` look (docs/deploy.md).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use clap_complete::Shell;

/// Flags of `charon completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Flags of `charon man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write `charon.1` and one page per subcommand (`charon-serve.1`,
    /// `charon-config-check.1`, …) into this directory (made if missing);
    /// without it, `charon.1` alone is printed on stdout.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Prints the completion script of `shell` for `cmd` on stdout.
pub fn completions(args: &CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let name = cmd.get_name().to_owned();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, name, &mut out);
    std::io::stdout()
        .write_all(&out)
        .context("cannot write the completion script")?;
    Ok(ExitCode::SUCCESS)
}

/// Prints `charon.1` on stdout, or writes every page into `--out`.
pub fn man(args: &ManArgs, cmd: clap::Command) -> anyhow::Result<ExitCode> {
    match &args.out {
        None => {
            let (cmd, source) = prepared(cmd);
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .source(source)
                .render(&mut page)
                .context("cannot render the man page")?;
            std::io::stdout()
                .write_all(&page)
                .context("cannot write the man page")?;
        }
        Some(dir) => {
            for path in write_pages(cmd, dir)? {
                eprintln!("{}", path.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `cmd` and of each of its subcommands, at every
/// depth, into `dir`, named by their path (`charon-config-check.1`, as
/// `clap_mangen::generate_to` names them): the paths written. clap's own
/// `help` subcommand gets no page.
fn write_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let (cmd, source) = prepared(cmd);
    let mut written = Vec::new();
    page(cmd, &source, dir, &mut written)?;
    Ok(written)
}

/// `cmd` ready for its pages, and the footer every page shows. Without
/// clap's `help` subcommand (it has no page, so no page lists it); built
/// once from the top, so every subcommand knows its full name (its display
/// name, `charon-config-check`); the footer names the program and its
/// version (a subcommand's own would be `check` and no version).
fn prepared(cmd: clap::Command) -> (clap::Command, String) {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let source = format!(
        "{} {}",
        cmd.get_name(),
        cmd.get_version().unwrap_or_default()
    );
    (cmd, source)
}

fn page(
    cmd: clap::Command,
    source: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        page(sub.clone(), source, dir, written)?;
    }
    let man = clap_mangen::Man::new(cmd).source(source);
    let path = man
        .generate_to(dir)
        .with_context(|| format!("cannot write {}", dir.join(man.get_filename()).display()))?;
    written.push(path);
    Ok(())
}
