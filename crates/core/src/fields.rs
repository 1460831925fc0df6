//! The one checker of JSON/YAML fields: every input path (configuration
//! files and bodies, `charon simulate`'s event lines, the simulator API)
//! reads its documents with these, so an unknown field, a wrong type, a bad
//! number or a missing field gets the same message with the same path
//! everywhere (`events[3].copies: -1 is negative; counts start at 0`).
//!
//! Checks collect [`ConfigIssue`]s in [`Issues`] instead of stopping at the
//! first, and return `None` where a value could not be read.

use std::fmt;

use serde_json::{Map, Value};

use crate::MAX_COUNT;
use crate::meter::FieldError;
use crate::request::check_name;
use crate::time::{Millis, parse_span};

/// One problem found in a configuration, with the exact place. The
/// configuration service answers these as they are; its clients read them
/// back (`Deserialize`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConfigIssue {
    /// Where: `resources[1].tiers[0].window`.
    pub path: String,
    /// What: `"1x" is not a duration`.
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a configuration (never just the first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigIssue>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{issue}")?;
        }
        Ok(())
    }
}

/// A field path such as `resources[1].tiers[0].window`; keys that are not
/// plain names are quoted (`domains["a b"]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    /// The document itself (the empty path).
    pub fn root() -> Path {
        Path::default()
    }

    /// The field `key` under this path.
    pub fn key(&self, key: &str) -> Path {
        let plain = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        let segment = if plain {
            key.to_owned()
        } else {
            format!("[{key:?}]")
        };
        if self.0.is_empty() {
            Path(segment)
        } else if plain {
            Path(format!("{}.{segment}", self.0))
        } else {
            Path(format!("{}{segment}", self.0))
        }
    }

    /// The item `i` of the list at this path.
    pub fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }

    /// The path as written in issues.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The issues found so far, in the order found.
#[derive(Debug, Default)]
pub struct Issues(Vec<ConfigIssue>);

impl Issues {
    /// Notes `message` at `path`.
    pub fn push(&mut self, path: &Path, message: impl Into<String>) {
        self.0.push(ConfigIssue {
            path: path.0.clone(),
            message: message.into(),
        });
    }

    /// How many issues were found (compare before and after a check to see
    /// whether it found any).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none were found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The issues found.
    pub fn into_vec(self) -> Vec<ConfigIssue> {
        self.0
    }

    /// `value` if nothing was found, else every issue.
    pub fn finish<T>(self, value: T) -> Result<T, ConfigErrors> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ConfigErrors(self.0))
        }
    }
}

impl Extend<ConfigIssue> for Issues {
    /// Adds issues found elsewhere (re-pathed, say).
    fn extend<I: IntoIterator<Item = ConfigIssue>>(&mut self, issues: I) {
        self.0.extend(issues);
    }
}

/// A value as messages name it: `the number -1`, `a list`, `nothing`.
pub fn describe(v: &Value) -> String {
    match v {
        Value::Null => "nothing".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "a mapping".to_owned(),
    }
}

/// `v` as a mapping whose fields are all in `allowed` (`what` names it in
/// the message: `expected a tier (a mapping), found a list`). Each unknown
/// field is an issue; the mapping is still returned.
pub fn object<'v>(
    v: &'v Value,
    path: &Path,
    issues: &mut Issues,
    what: &str,
    allowed: &[&str],
) -> Option<&'v Map<String, Value>> {
    let Value::Object(map) = v else {
        issues.push(
            path,
            format!("expected {what} (a mapping), found {}", describe(v)),
        );
        return None;
    };
    unknown_fields(map, path, allowed, issues);
    Some(map)
}

/// Each field of `map` not in `allowed` is an issue at its own path.
pub fn unknown_fields(
    map: &Map<String, Value>,
    path: &Path,
    allowed: &[&str],
    issues: &mut Issues,
) {
    for key in map.keys() {
        if !allowed.contains(&key.as_str()) {
            issues.push(&path.key(key), unknown_field(allowed));
        }
    }
}

/// The message for a field not in `allowed`.
pub fn unknown_field(allowed: &[&str]) -> String {
    format!("unknown field (expected one of: {})", allowed.join(", "))
}

/// `v` as a list.
pub fn list<'v>(v: &'v Value, path: &Path, issues: &mut Issues) -> Option<&'v [Value]> {
    match v {
        Value::Array(items) => Some(items),
        _ => {
            issues.push(path, format!("expected a list, found {}", describe(v)));
            None
        }
    }
}

/// Whether `n` items of `what` exceed `max`; if so, says so at `path`
/// (`resources[0].tiers: 100000 tiers, at most 64`).
pub fn too_many(n: usize, max: usize, what: &str, path: &Path, issues: &mut Issues) -> bool {
    if n <= max {
        return false;
    }
    issues.push(path, format!("{n} {what}, at most {max}"));
    true
}

/// `v` as a whole number in `0..=MAX_COUNT` (limits, copies, times).
pub fn count(v: &Value, path: &Path, issues: &mut Issues) -> Option<u64> {
    let problem = match v {
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(x), _) if x <= MAX_COUNT => return Some(x),
            (Some(_), _) => format!("{n} is too large (at most {MAX_COUNT})"),
            (None, Some(_)) => format!("{n} is negative; counts start at 0"),
            (None, None) if n.as_f64().is_some_and(|f| f.fract() == 0.0 && f < 0.0) => {
                format!("{n} is negative; counts start at 0")
            }
            (None, None) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                format!("{n} is too large (at most {MAX_COUNT})")
            }
            (None, None) => format!("{n} is not a whole number"),
        },
        other => format!("expected a whole number, found {}", describe(other)),
    };
    issues.push(path, problem);
    None
}

/// The count at `map[key]`, if present and not null.
pub fn optional_count(
    map: &Map<String, Value>,
    key: &str,
    path: &Path,
    issues: &mut Issues,
) -> Option<u64> {
    match map.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => count(v, &path.key(key), issues),
    }
}

/// The count at `map[key]`, or `default` if absent or null.
pub fn count_or(
    map: &Map<String, Value>,
    key: &str,
    default: u64,
    path: &Path,
    issues: &mut Issues,
) -> Option<u64> {
    match map.get(key) {
        None | Some(Value::Null) => Some(default),
        Some(v) => count(v, &path.key(key), issues),
    }
}

/// A JSON number, fractions allowed (a capacity of SPEC §12); its range is
/// the reader's to check.
pub fn number(v: &Value, path: &Path, issues: &mut Issues) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        other => {
            issues.push(
                path,
                format!(
                    "expected a number such as 100 or 2.5, found {}",
                    describe(other)
                ),
            );
            None
        }
    }
}

/// `map[key]`, which must be present and not null.
pub fn required<'v>(
    map: &'v Map<String, Value>,
    key: &str,
    path: &Path,
    issues: &mut Issues,
) -> Option<&'v Value> {
    match map.get(key) {
        None | Some(Value::Null) => {
            issues.push(&path.key(key), "is required");
            None
        }
        Some(v) => Some(v),
    }
}

/// `map[key]` as a boolean; absent or null is `false`.
pub fn boolean(map: &Map<String, Value>, key: &str, path: &Path, issues: &mut Issues) -> bool {
    match map.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            issues.push(
                &path.key(key),
                format!("expected true or false, found {}", describe(other)),
            );
            false
        }
    }
}

/// `v` as a string.
pub fn string(v: &Value, path: &Path, issues: &mut Issues) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        other => {
            issues.push(
                path,
                format!("expected a string, found {}", describe(other)),
            );
            None
        }
    }
}

/// `v` as a list of strings.
pub fn strings(v: &Value, path: &Path, issues: &mut Issues) -> Option<Vec<String>> {
    each(list(v, path, issues)?, path, issues, string)
}

/// Every item of the list at `path` read by `read`; `None` if any item
/// had a problem (every item is still looked at).
pub fn each<T>(
    items: &[Value],
    path: &Path,
    issues: &mut Issues,
    mut read: impl FnMut(&Value, &Path, &mut Issues) -> Option<T>,
) -> Option<Vec<T>> {
    let before = issues.len();
    let out: Vec<T> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| read(item, &path.index(i), issues))
        .collect();
    (issues.len() == before).then_some(out)
}

/// `v` as one of `allowed` (`expected rate or copy, found the string
/// "x"`).
pub fn one_of<'a>(
    v: &Value,
    allowed: &[&'a str],
    path: &Path,
    issues: &mut Issues,
) -> Option<&'a str> {
    if let Value::String(s) = v
        && let Some(&a) = allowed.iter().find(|&&a| a == s)
    {
        return Some(a);
    }
    let expected = match allowed {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    };
    issues.push(path, format!("expected {expected}, found {}", describe(v)));
    None
}

/// A duration field (`"1s"`), its problem recorded in `issues`.
pub(crate) fn span(v: &Value, path: &Path, issues: &mut Issues) -> Option<Millis> {
    match v {
        Value::String(s) => match parse_span(s) {
            Ok(ms) => Some(ms),
            Err(e) => {
                issues.push(path, e);
                None
            }
        },
        other => {
            issues.push(
                path,
                format!(
                    "expected a duration such as \"1s\", found {}",
                    describe(other)
                ),
            );
            None
        }
    }
}

/// A name field, checked as [`check_name`] checks `field`'s names.
pub(crate) fn name(v: &Value, path: &Path, issues: &mut Issues, field: &str) -> Option<String> {
    let Value::String(s) = v else {
        issues.push(
            path,
            format!("expected a name (a string), found {}", describe(v)),
        );
        return None;
    };
    match check_name(field, s) {
        Ok(()) => Some(s.clone()),
        Err(e) => {
            issues.push(path, e.to_string());
            None
        }
    }
}

/// The message for a field error of a value written as `v`: `"0s" must be
/// positive (at least 1ms)`, `0 must be at least 1`; messages that already
/// say the value are kept as they are.
pub(crate) fn field_message(v: Option<&Value>, e: &FieldError) -> String {
    match v {
        Some(v) if e.message.starts_with("must") => {
            let written = match v {
                Value::String(s) => format!("{s:?}"),
                other => other.to_string(),
            };
            format!("{written} {}", e.message)
        }
        Some(_) => e.message.clone(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn issues_of(check: impl FnOnce(&mut Issues)) -> Vec<String> {
        let mut issues = Issues::default();
        check(&mut issues);
        issues.into_vec().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn paths_quote_keys_that_are_not_plain_names() {
        let p = Path::root().key("events").index(3).key("copies");
        assert_eq!(p.as_str(), "events[3].copies");
        assert_eq!(
            Path::root().key("domains").key("a b").as_str(),
            "domains[\"a b\"]"
        );
    }

    #[test]
    fn every_kind_of_problem_has_one_message() {
        let at = Path::root().key("events").index(0);
        let got = issues_of(|i| {
            for v in [json!(-1), json!(1.5), json!(1e300), json!("5"), json!(null)] {
                count(&v, &at.key("t"), i);
            }
            let m = json!({"copys": 1});
            object(&m, &at, i, "an event", &["t", "copies"]);
            required(m.as_object().expect("a map"), "t", &at, i);
            strings(&json!(["a", 1]), &at.key("groups"), i);
            one_of(
                &json!("fly"),
                &["request", "reserve", "release"],
                &at.key("op"),
                i,
            );
        });
        assert_eq!(
            got,
            [
                "events[0].t: -1 is negative; counts start at 0",
                "events[0].t: 1.5 is not a whole number",
                "events[0].t: 1e+300 is too large (at most 9007199254740991)",
                "events[0].t: expected a whole number, found the string \"5\"",
                "events[0].t: expected a whole number, found nothing",
                "events[0].copys: unknown field (expected one of: t, copies)",
                "events[0].t: is required",
                "events[0].groups[1]: expected a string, found the number 1",
                "events[0].op: expected request, reserve or release, found the string \"fly\"",
            ]
        );
    }
}
