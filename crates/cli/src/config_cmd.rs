//! `charon config …`: configuration files from the command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use charon_core::config::Config;

use crate::import::{self, Format, PeerSettings, Source};

/// Loads a configuration file, printing every problem to stderr. `None`
/// when the file is invalid (the problems have been printed).
pub fn load(path: &Path) -> anyhow::Result<Option<Config>> {
    Ok(load_with_settings(path)?.map(|(config, _)| config))
}

/// [`load`], with the file's other sections (`server:`, `throttle:`).
pub fn load_with_settings(
    path: &Path,
) -> anyhow::Result<Option<(Config, charon_server::config_file::FileServerSettings)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    // The same rules as `charon serve`: the limits, and an optional
    // `server:` section.
    match charon_server::config_file::parse_text(&text) {
        Ok((config, adjustments, settings)) => {
            for a in adjustments {
                eprintln!("{}: normalized: {a}", path.display());
            }
            Ok(Some((config, settings)))
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

/// `charon config import --from FORMAT FILE…`: the converted configuration
/// on stdout; what was not carried over, and notes, on stderr. Fails,
/// printing nothing on stdout, when a file cannot be converted (the peer
/// would refuse it), when something cannot be carried over and `lossy` is
/// not set, or when the result does not pass the checks of `charon config
/// check` (a name too long for Charon, say): a partial configuration would
/// limit less than the operator thinks.
pub fn import(
    format: Format,
    files: &[PathBuf],
    peer: &PeerSettings,
    lossy: bool,
) -> anyhow::Result<ExitCode> {
    let mut texts = Vec::with_capacity(files.len());
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        texts.push((f.display().to_string(), text));
    }
    let sources: Vec<Source<'_>> = texts
        .iter()
        .map(|(name, text)| Source { name, text })
        .collect();
    let converted = import::convert(format, &sources, peer);
    for f in &converted.errors {
        eprintln!("{f}");
    }
    let Some(value) = converted.config else {
        eprintln!(
            "charon: the files cannot be converted (their own project refuses them); nothing was printed"
        );
        return Ok(ExitCode::FAILURE);
    };
    let config = match Config::from_value(&value) {
        Ok((config, _)) => config,
        Err(problems) => {
            for p in problems.0 {
                eprintln!("converted configuration: {}: {}", p.path, p.message);
            }
            eprintln!(
                "charon: the converted configuration does not pass Charon's checks; nothing \
                 was printed"
            );
            return Ok(ExitCode::FAILURE);
        }
    };
    for f in converted.losses.iter().chain(&converted.notes) {
        eprintln!("{f}");
    }
    if !converted.losses.is_empty() && !lossy {
        eprintln!(
            "charon: {} thing(s) cannot be carried over (listed above); nothing was printed. \
             Rerun with --lossy to print the configuration without them",
            converted.losses.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    print!("{}", config.to_yaml());
    Ok(ExitCode::SUCCESS)
}
