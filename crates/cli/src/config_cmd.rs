//! `charon config …`: configuration files from the command line.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use charon_core::config::Config;

/// Loads a configuration file, printing every problem to stderr. `None`
/// when the file is invalid (the problems have been printed).
pub fn load(path: &Path) -> anyhow::Result<Option<Config>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    // The same rules as `charon serve`: the limits, and an optional
    // `server:` section.
    match charon_server::config_file::parse_text(&text) {
        Ok((config, adjustments, _)) => {
            for a in adjustments {
                eprintln!("{}: normalized: {a}", path.display());
            }
            Ok(Some(config))
        }
        Err(problems) => {
            for e in problems {
                eprintln!("{}: {e}", path.display());
            }
            Ok(None)
        }
    }
}

/// `charon config check FILE`.
pub fn check(path: &Path) -> anyhow::Result<ExitCode> {
    Ok(match load(path)? {
        Some(config) => {
            print!("{}", config.to_yaml());
            ExitCode::SUCCESS
        }
        None => ExitCode::FAILURE,
    })
}
