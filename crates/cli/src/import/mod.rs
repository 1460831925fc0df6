//! `charon config import --from envoy-ratelimit|limitador|boulder FILE…`:
//! another project's configuration files turned into a Charon
//! configuration that decides and answers as that project did.
//!
//! Everything here is a pure function of the files' text, so every rule of
//! the conversion is a unit test; the command only reads the files, checks
//! the result with the same parser as `charon config check` and prints.
//! Each source file is checked the way its own project checks it, through
//! `charon_core::fields` (one message and one path syntax for every
//! problem), and what it says becomes settings and fields of Charon's
//! `envoy:` section (or `kind: bucket` resources for Boulder) that keep
//! the peer's behaviour.
//!
//! Three kinds of findings, by file and path:
//! - an **error**: the peer itself would refuse the file (with the peer's
//!   reason); nothing is printed on stdout, exit 1;
//! - a **loss**: something the file says that Charon cannot carry over;
//!   the import fails too unless `--lossy`, which prints the configuration
//!   without it and lists each loss;
//! - a **note**: something that changes nothing the peer decided (a field
//!   the peer ignores too, a value normalized).

mod boulder;
mod boulder_ids;
mod cel;
mod envoy_ratelimit;
mod limitador;
mod yaml;

use charon_core::fields::{Issues, Path};
use serde_json::{Value, json};

/// The project whose configuration files are converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// envoyproxy/ratelimit: one YAML file per domain, a tree of
    /// descriptors with `rate_limit: {unit, requests_per_unit}`.
    EnvoyRatelimit,
    /// Limitador: a YAML list of limits (`namespace`, `max_value`,
    /// `seconds`, `conditions`, `variables`).
    Limitador,
    /// Boulder's key-value limits: a defaults file (`Name: {burst, count,
    /// period}`) and, optionally, an overrides file.
    Boulder,
}

/// How the peer ran, where its files do not say it (an environment
/// variable or a flag there).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerSettings {
    /// Response headers: `ratelimit` (envoyproxy/ratelimit's
    /// `LIMIT_RESPONSE_HEADERS_ENABLED=true`) or `x_ratelimit` (Limitador's
    /// `--rate-limit-headers DRAFT_VERSION_03`); `None`: none, both peers'
    /// default.
    pub headers: Option<HeaderStyle>,
    /// Other header names, (`limit`, `remaining` or `reset`, the name):
    /// envoyproxy/ratelimit's `LIMIT_LIMIT_HEADER`, … The configuration
    /// check refuses a bad one by path.
    pub header_names: Vec<(String, String)>,
    /// envoyproxy/ratelimit's `SHADOW_MODE=true`.
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG=true`: files naming the
    /// same domain are merged.
    pub merge_domains: bool,
}

/// `--headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderStyle {
    /// `RateLimit-Limit`, `-Remaining`, `-Reset` (envoyproxy/ratelimit).
    Ratelimit,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Limitador).
    XRatelimit,
}

/// `--header-name FIELD=NAME`.
pub fn header_name(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((field, name)) if HEADER_FIELDS.contains(&field) => {
            Ok((field.to_owned(), name.to_owned()))
        }
        _ => Err(format!(
            "expected FIELD=NAME with FIELD one of {}",
            HEADER_FIELDS.join(", ")
        )),
    }
}

const HEADER_FIELDS: &[&str] = charon_core::envoy::HeaderNames::FIELDS;

/// One source file: its name (for messages) and its text.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// As given on the command line.
    pub name: &'a str,
    /// The file's text.
    pub text: &'a str,
}

/// Something about one place of a source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The file, as given.
    pub file: String,
    /// The place in it, in Charon's path syntax (`descriptors[0].rate_limit`);
    /// empty for the whole file.
    pub path: String,
    /// What and why.
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.path, self.message)
        }
    }
}

/// The result of a conversion.
#[derive(Debug, Clone, Default)]
pub struct Converted {
    /// The Charon configuration (SPEC §6 layout), when no file had an
    /// error. It still has to pass Charon's own checks (bounds on names,
    /// sizes), which the command runs.
    pub config: Option<Value>,
    /// What could not be carried over, and why (`not carried over: …`).
    pub losses: Vec<Finding>,
    /// What changes nothing the peer decided (`note: …`).
    pub notes: Vec<Finding>,
    /// Why a file cannot be converted at all (the peer's reason).
    pub errors: Vec<Finding>,
}

/// Collects what the converters find in the file being converted.
#[derive(Debug, Default)]
pub(super) struct Report {
    file: String,
    /// Errors, through `charon_core::fields` (paths in its syntax).
    pub issues: Issues,
    losses: Vec<Finding>,
    notes: Vec<Finding>,
    errors: Vec<Finding>,
}

impl Report {
    fn finding(&self, path: &Path, message: String) -> Finding {
        Finding {
            file: self.file.clone(),
            path: path.as_str().to_owned(),
            message,
        }
    }

    /// The peer refuses the file.
    pub(super) fn error(&mut self, path: &Path, message: impl Into<String>) {
        self.issues.push(path, message);
    }

    /// Something that cannot be carried over.
    pub(super) fn loss(&mut self, path: &Path, message: impl Into<String>) {
        let f = self.finding(path, format!("not carried over: {}", message.into()));
        self.losses.push(f);
    }

    /// Something that changes nothing the peer decided.
    pub(super) fn note(&mut self, path: &Path, message: impl Into<String>) {
        let f = self.finding(path, format!("note: {}", message.into()));
        self.notes.push(f);
    }

    /// Moves the errors found so far into findings of this file.
    fn close_file(&mut self) {
        for issue in std::mem::take(&mut self.issues).into_vec() {
            self.errors.push(Finding {
                file: self.file.clone(),
                path: issue.path,
                message: issue.message,
            });
        }
    }
}

/// The `envoy:` section's settings for a peer's behaviour.
pub(super) fn envoy_settings(peer: &PeerSettings, base: Value) -> Value {
    let mut s = base;
    s["shadow_mode"] = peer.shadow_mode.into();
    s["headers"] = match peer.headers {
        None => false.into(),
        Some(HeaderStyle::Ratelimit) => "ratelimit".into(),
        Some(HeaderStyle::XRatelimit) => "x_ratelimit".into(),
    };
    if !peer.header_names.is_empty() {
        let names: serde_json::Map<String, Value> = peer
            .header_names
            .iter()
            .map(|(field, name)| (field.clone(), name.as_str().into()))
            .collect();
        s["header_names"] = names.into();
    }
    s["unknown_domain"] = "ok".into();
    s
}

/// Converts `sources`, all of one `format`, into one Charon configuration.
pub fn convert(format: Format, sources: &[Source<'_>], peer: &PeerSettings) -> Converted {
    let mut report = Report::default();
    let config = match format {
        Format::EnvoyRatelimit => {
            let mut out = envoy_ratelimit::Output::default();
            out.merge_domains = peer.merge_domains;
            for source in sources {
                report.file = source.name.to_owned();
                envoy_ratelimit::convert(source.text, &mut out, &mut report);
                report.close_file();
            }
            out.into_value(peer)
        }
        Format::Limitador => {
            let mut out = limitador::Output::default();
            for source in sources {
                report.file = source.name.to_owned();
                limitador::convert(source.text, &mut out, &mut report);
                report.close_file();
            }
            out.into_value(peer)
        }
        Format::Boulder => {
            let mut out = boulder::Output::default();
            for (i, source) in sources.iter().enumerate() {
                report.file = source.name.to_owned();
                if i == 0 {
                    boulder::defaults(source.text, &mut out, &mut report);
                } else {
                    boulder::overrides(source.text, &mut out, &mut report);
                }
                report.close_file();
            }
            if sources.len() > 2 {
                report.file = sources[2].name.to_owned();
                report.error(
                    &Path::root(),
                    "Boulder has one defaults file and one overrides file: give at most two",
                );
                report.close_file();
            }
            out.into_value()
        }
    };
    Converted {
        config: report.errors.is_empty().then_some(config),
        losses: report.losses,
        notes: report.notes,
        errors: report.errors,
    }
}

/// An empty Charon configuration with an `envoy:` section.
pub(super) fn with_envoy(resources: Vec<Value>, envoy: Value) -> Value {
    json!({ "resources": resources, "envoy": envoy })
}

#[cfg(test)]
mod tests;
