//! `charon config import --from envoy-ratelimit|limitador FILE…`: the
//! configuration files of envoyproxy/ratelimit and of Limitador turned into
//! a Charon configuration with an `envoy:` section (SPEC §11).
//!
//! Everything here is a pure function of the files' text, so every rule of
//! the conversion is a unit test; the command only reads the files, checks
//! the result with the same parser as `charon config check` and prints.
//!
//! What a source file says that Charon cannot express is never dropped
//! silently: each is a [`Finding`] naming the file and the path in it, and
//! the command prints them on stderr. A file that its own project would
//! refuse (not YAML, a missing `domain`, an unknown field, a duplicate
//! descriptor) is an error: nothing is printed on stdout for it, because a
//! half-converted configuration would limit less than the operator thinks.

mod envoy_ratelimit;
mod limitador;
mod tree;

use serde_json::{Map, Value};

/// The project whose configuration files are converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// envoyproxy/ratelimit: one YAML file per domain, a tree of
    /// descriptors with `rate_limit: {unit, requests_per_unit}`.
    EnvoyRatelimit,
    /// Limitador: a YAML list of limits (`namespace`, `max_value`,
    /// `seconds`, `conditions`, `variables`).
    Limitador,
}

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
    /// The Charon configuration (SPEC §6 layout with an `envoy:` section),
    /// when there were no errors. It still has to pass Charon's own
    /// checks (bounds on names, sizes), which the command runs.
    pub config: Option<Value>,
    /// What could not be carried over, and why.
    pub dropped: Vec<Finding>,
    /// Why a file cannot be converted at all.
    pub errors: Vec<Finding>,
}

/// Converts `sources`, all of one `format`, into one Charon configuration.
pub fn convert(format: Format, sources: &[Source<'_>]) -> Converted {
    let mut out = tree::Output::default();
    let mut report = Report::default();
    for source in sources {
        report.file = source.name.to_owned();
        let value: Value = match serde_saphyr::from_str(source.text) {
            Ok(v) => v,
            Err(e) => {
                report.error("", format!("not valid YAML: {e}"));
                continue;
            }
        };
        match format {
            Format::EnvoyRatelimit => envoy_ratelimit::convert(&value, &mut out, &mut report),
            Format::Limitador => limitador::convert(&value, &mut out, &mut report),
        }
    }
    let config = report.errors.is_empty().then(|| out.into_value());
    Converted {
        config,
        dropped: report.dropped,
        errors: report.errors,
    }
}

/// Collects findings for the file being converted.
#[derive(Debug, Default)]
struct Report {
    file: String,
    dropped: Vec<Finding>,
    errors: Vec<Finding>,
}

impl Report {
    fn finding(&self, path: &str, message: String) -> Finding {
        Finding {
            file: self.file.clone(),
            path: path.to_owned(),
            message,
        }
    }

    fn error(&mut self, path: &str, message: impl Into<String>) {
        let f = self.finding(path, message.into());
        self.errors.push(f);
    }

    fn drop(&mut self, path: &str, message: impl Into<String>) {
        let f = self.finding(path, format!("not carried over: {}", message.into()));
        self.dropped.push(f);
    }

    /// A difference in how the converted configuration will behave.
    fn note(&mut self, path: &str, message: impl Into<String>) {
        let f = self.finding(path, format!("note: {}", message.into()));
        self.dropped.push(f);
    }
}

/// `path.field`, or `field` at the root.
fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// `path[i]`.
fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// A short description of a YAML value, for messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

/// A mapping whose fields are all in `known` (both projects refuse unknown
/// fields); `None` (with the error reported) otherwise.
fn object<'v>(
    v: &'v Value,
    path: &str,
    what: &str,
    known: &[&str],
    report: &mut Report,
) -> Option<&'v Map<String, Value>> {
    let Value::Object(map) = v else {
        report.error(
            path,
            format!("expected {what} (a mapping), found {}", describe(v)),
        );
        return None;
    };
    let mut ok = true;
    for k in map.keys() {
        if !known.contains(&k.as_str()) {
            report.error(
                &join(path, k),
                format!("unknown field {k:?} (known: {})", known.join(", ")),
            );
            ok = false;
        }
    }
    ok.then_some(map)
}

/// A key, value or name read as text. Both projects read these as
/// strings, keeping the text as written; here the YAML is read into typed
/// values first, so a bare `yes`, `n`, `1.50` or `0x10` has lost its text
/// (it became `true`, `false`, `1.5`, `16`): those are errors asking to
/// quote them. A whole number is taken as its decimal text, with a note,
/// since `0123` would have become `123`.
fn text_of(v: &Value, path: &str, report: &mut Report) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_u64() || n.is_i64() => {
            report.note(
                path,
                format!(
                    "the number {n} is used as the text \"{n}\"; if the file wrote it otherwise \
                     (leading zeros, 0x…), quote it there"
                ),
            );
            Some(n.to_string())
        }
        Value::Number(_) | Value::Bool(_) => {
            report.error(
                path,
                format!(
                    "{} is not text, and YAML does not keep how it was written (yes, on, n, \
                     1.50, …): quote it",
                    describe(v)
                ),
            );
            None
        }
        _ => {
            report.error(path, format!("expected a string, found {}", describe(v)));
            None
        }
    }
}

/// A required text field.
fn text_field(
    map: &Map<String, Value>,
    field: &str,
    path: &str,
    report: &mut Report,
) -> Option<String> {
    let at = join(path, field);
    match map.get(field) {
        None | Some(Value::Null) => {
            report.error(&at, "is required");
            None
        }
        Some(v) => {
            let s = text_of(v, &at, report)?;
            if s.is_empty() {
                report.error(&at, "must not be empty");
                return None;
            }
            Some(s)
        }
    }
}

/// An optional boolean field.
fn bool_field(
    map: &Map<String, Value>,
    field: &str,
    path: &str,
    report: &mut Report,
) -> Option<bool> {
    match map.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            report.error(
                &join(path, field),
                format!("expected true or false, found {}", describe(v)),
            );
            None
        }
    }
}

/// An optional list field (`[]` when absent or null).
fn list_field<'v>(
    map: &'v Map<String, Value>,
    field: &str,
    path: &str,
    report: &mut Report,
) -> &'v [Value] {
    match map.get(field) {
        None | Some(Value::Null) => &[],
        Some(Value::Array(items)) => items,
        Some(v) => {
            report.error(
                &join(path, field),
                format!("expected a list, found {}", describe(v)),
            );
            &[]
        }
    }
}

/// A required whole number field in `min..=max`.
fn count_field(
    map: &Map<String, Value>,
    field: &str,
    path: &str,
    (min, max): (u64, u64),
    report: &mut Report,
) -> Option<u64> {
    let at = join(path, field);
    match map.get(field) {
        None | Some(Value::Null) => {
            report.error(&at, "is required");
            None
        }
        Some(v) => match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                report.error(
                    &at,
                    format!(
                        "expected a whole number from {min} to {max}, found {}",
                        describe(v)
                    ),
                );
                None
            }
        },
    }
}

#[cfg(test)]
mod tests;
