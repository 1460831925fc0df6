//! The configuration file: the limits of SPEC §6 plus an optional
//! `server:` section, read and validated with every problem reported (the
//! same text `charon config check` checks). Reloading it while running is
//! [`crate::file_reload`].

use std::path::Path;

use charon_core::config::{Adjustment, Config, ResourceKind};
use charon_core::fields::Path as FieldPath;
use charon_core::throttle::ThrottleConfig;
use tracing::info;

use crate::ConfigReport;

/// Server settings a configuration file may carry beside the limits, in a
/// top-level `server:` mapping (`store`, `listen`, `http_listen`). Flags and
/// environment variables take precedence; they are read at start-up only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileServerSettings {
    /// `server.store`: `memory` or a `redis://` URL.
    pub store: Option<String>,
    /// `server.listen`: the gRPC address.
    pub listen: Option<String>,
    /// `server.http_listen`: the HTTP address (metrics, health, pages).
    pub http_listen: Option<String>,
    /// The `throttle:` section (SPEC §13), for `charon sidecar` and
    /// `charon simulate`; `charon serve` checks it and leaves it alone.
    pub throttle: Option<ThrottleConfig>,
}

const SERVER_FIELDS: &[&str] = &["store", "listen", "http_listen"];

/// Validates configuration text: the limits of SPEC §6 plus an optional
/// `server:` section. Every problem is reported, one per line.
pub fn parse_text(
    text: &str,
) -> Result<(Config, Vec<Adjustment>, FileServerSettings), Vec<String>> {
    let mut value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| vec![format!("not valid YAML: {e}")])?;
    let mut problems = Vec::new();
    let mut settings = FileServerSettings::default();
    if let Some(server) = value.as_object_mut().and_then(|m| m.remove("server")) {
        match server {
            serde_json::Value::Object(m) => {
                for (key, v) in m {
                    let slot = match key.as_str() {
                        "store" => &mut settings.store,
                        "listen" => &mut settings.listen,
                        "http_listen" => &mut settings.http_listen,
                        _ => {
                            problems.push(format!(
                                "server.{key}: unknown field (expected one of: {})",
                                SERVER_FIELDS.join(", ")
                            ));
                            continue;
                        }
                    };
                    match v {
                        serde_json::Value::String(s) => *slot = Some(s),
                        other => {
                            problems
                                .push(format!("server.{key}: expected a string, found {other}"));
                        }
                    }
                }
            }
            serde_json::Value::Null => {}
            other => problems.push(format!("server: expected a mapping, found {other}")),
        }
    }
    let throttle = value.as_object_mut().and_then(|m| m.remove("throttle"));
    let throttle_path = FieldPath::root().key("throttle");
    match throttle.filter(|t| !t.is_null()) {
        None => {}
        Some(t) => match ThrottleConfig::from_value(&t, &throttle_path) {
            Ok(t) => settings.throttle = Some(t),
            Err(errors) => problems.extend(errors.0.iter().map(ToString::to_string)),
        },
    }
    match Config::from_value(&value) {
        Ok((config, adjustments)) if problems.is_empty() => {
            problems.extend(throttle_resource_problems(
                &config,
                &settings,
                &throttle_path,
            ));
            if !problems.is_empty() {
                return Err(problems);
            }
            Ok((config, adjustments, settings))
        }
        Ok(_) => Err(problems),
        Err(errors) => {
            problems.extend(errors.0.iter().map(ToString::to_string));
            Err(problems)
        }
    }
}

/// Each in-process resource of `throttle.clients` must be a rate-like
/// resource of the same file (it is decided in the throttler's process).
fn throttle_resource_problems(
    config: &Config,
    settings: &FileServerSettings,
    path: &FieldPath,
) -> Vec<String> {
    let Some(throttle) = &settings.throttle else {
        return Vec::new();
    };
    throttle
        .local_resources(path)
        .into_iter()
        .filter_map(|(p, name)| match config.resource(name).map(|r| &r.kind) {
            None => Some(format!(
                "{p}: no resource {name:?} in this file (a per-client limit is decided in process, by a rate-like resource of the same file)"
            )),
            Some(ResourceKind::Copy(_) | ResourceKind::Lease(_)) => Some(format!(
                "{p}: {name:?} is not rate-like (rate, bucket, window or queue)"
            )),
            Some(_) => None,
        })
        .collect()
}

/// Reads and validates a configuration file; the error lists every
/// problem, one per line, prefixed with the file name.
pub fn load_file(path: &Path) -> Result<(Config, FileServerSettings), String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    load_bytes(path, &text)
}

/// Validates the content of configuration file `path` as read.
pub(crate) fn load_bytes(
    path: &Path,
    bytes: &[u8],
) -> Result<(Config, FileServerSettings), String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))?;
    let (config, adjustments, settings) = parse_text(text).map_err(|problems| {
        problems
            .iter()
            .map(|e| format!("{}: {e}", path.display()))
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    for a in adjustments {
        info!(file = %path.display(), "normalized: {a}");
    }
    Ok((config, settings))
}

/// What `/readyz` says about a configuration file in force.
pub fn file_report(path: &Path, problem: Option<String>) -> ConfigReport {
    ConfigReport {
        source: format!("file {}", path.display()),
        version: 0,
        loaded: true,
        problem,
    }
}
