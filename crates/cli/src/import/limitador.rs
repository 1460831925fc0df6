//! Limitador's limits files: a YAML list of limits, each `{namespace,
//! max_value, seconds, conditions, variables, name}`, read as Limitador
//! reads them (`namespace`, `seconds`, `conditions` and `variables` are
//! required, `max_value` defaults to 0, other fields are ignored).
//!
//! A limit becomes one limit of the `limits:` list of the Envoy domain
//! named like its namespace, with the same conditions (on any descriptor,
//! `==` or `!=`) and variables, and an inline limit of `max_value` per
//! `seconds`. The section's settings make Charon decide as Limitador does:
//! `record: all_or_nothing` (a call over on one limit counts nothing) and
//! `windows: first_hit` (a counter's window starts at its first hit).

use charon_core::MAX_COUNT;
use charon_core::fields::{Path, describe};
use charon_core::meter::MAX_SPAN;
use serde_json::{Map, Value, json};

use super::cel::{self, Entry};
use super::yaml;
use super::{PeerSettings, Report, envoy_settings, with_envoy};

/// The limits converted so far, by namespace, with what identifies each
/// in Limitador (its conditions, variables and window) and where it came
/// from.
#[derive(Debug, Default)]
pub(super) struct Output {
    namespaces: Vec<(String, Vec<Value>)>,
    seen: Vec<(String, String, String)>,
}

impl Output {
    /// The configuration: the limits, and the settings that decide as
    /// Limitador.
    pub(super) fn into_value(self, peer: &PeerSettings) -> Value {
        let domains: Vec<Value> = self
            .namespaces
            .into_iter()
            .map(|(domain, limits)| json!({ "domain": domain, "limits": limits }))
            .collect();
        let envoy = envoy_settings(
            peer,
            json!({
                "match": "deepest",
                "record": "all_or_nothing",
                "windows": "first_hit",
                "domains": domains,
            }),
        );
        with_envoy(Vec::new(), envoy)
    }
}

/// The fields of a limit as Limitador's reader sees them.
const REQUIRED: &[&str] = &["namespace", "seconds", "conditions", "variables"];

/// Converts one limits file into `out`.
pub(super) fn convert(text: &str, out: &mut Output, report: &mut Report) {
    let root = Path::root();
    let doc = match yaml::parse(text) {
        Ok(d) => d.to_json(),
        Err(e) => {
            report.error(&root, format!("Couldn't parse: {e}"));
            return;
        }
    };
    // The text of every string field as written (`namespace: 0123`).
    let texts: Vec<Texts> = yaml::typed(text).unwrap_or_default();
    let items = match &doc {
        Value::Array(items) => items.as_slice(),
        Value::Null => &[],
        other => {
            report.error(
                &root,
                format!(
                    "Couldn't parse: expected a list of limits, found {}",
                    describe(other)
                ),
            );
            return;
        }
    };
    for (i, item) in items.iter().enumerate() {
        let p = root.index(i);
        let t = texts.get(i).cloned().unwrap_or_default();
        if let Some((namespace, limit, identity)) = limit(item, &t, &p, report) {
            let key = (namespace.clone(), identity.0, identity.1);
            if out.seen.contains(&key) {
                report.note(
                    &p,
                    "an earlier limit has the same namespace, seconds, conditions and variables: \
                     Limitador keeps only the first, and so does this import",
                );
                continue;
            }
            out.seen.push(key);
            match out.namespaces.iter_mut().find(|(n, _)| *n == namespace) {
                Some((_, limits)) => limits.push(limit),
                None => out.namespaces.push((namespace, vec![limit])),
            }
        }
    }
}

/// The string fields of one limit, their text as written.
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct Texts {
    namespace: Option<String>,
    name: Option<String>,
}

fn whole(m: &Map<String, Value>, field: &str, p: &Path, report: &mut Report) -> Option<u64> {
    match m.get(field) {
        None | Some(Value::Null) if field == "max_value" => Some(0),
        None | Some(Value::Null) => {
            report.error(&p.key(field), format!("missing field `{field}`"));
            None
        }
        Some(v) => v.as_u64().or_else(|| {
            report.error(
                &p.key(field),
                format!(
                    "invalid type: expected a whole number from 0 to 2^64-1, found {}",
                    describe(v)
                ),
            );
            None
        }),
    }
}

/// One limit: its namespace, its Charon limit, and what identifies it in
/// Limitador (conditions and variables, as sorted text, and window).
fn limit(
    item: &Value,
    t: &Texts,
    p: &Path,
    report: &mut Report,
) -> Option<(String, Value, (String, String))> {
    let Value::Object(m) = item else {
        report.error(
            p,
            format!(
                "Couldn't parse: expected a limit (a mapping), found {}",
                describe(item)
            ),
        );
        return None;
    };
    let before = report.issues.len();
    for field in REQUIRED {
        if !m.contains_key(*field) {
            report.error(&p.key(field), format!("missing field `{field}`"));
        }
    }
    for k in m.keys() {
        if ![
            "namespace",
            "max_value",
            "seconds",
            "conditions",
            "variables",
            "name",
            "id",
        ]
        .contains(&k.as_str())
        {
            report.note(
                &p.key(k),
                "Limitador ignores this field, and so does this import",
            );
        }
    }
    let namespace = t.namespace.clone().filter(|s| !s.is_empty());
    if m.contains_key("namespace") && namespace.is_none() {
        report.error(
            &p.key("namespace"),
            "expected a namespace (a non-empty string)",
        );
    }
    let max_value = whole(m, "max_value", p, report);
    let seconds = whole(m, "seconds", p, report);
    let conditions = strings(m, "conditions", p, report);
    let variables = strings(m, "variables", p, report);
    if report.issues.len() > before {
        return None;
    }
    let (namespace, max_value, seconds) = (namespace?, max_value?, seconds?);
    let mut lost = false;
    let mut conds = Vec::new();
    for (j, text) in conditions.iter().enumerate() {
        let at = p.key("conditions").index(j);
        match cel::parse_condition(text) {
            Ok(c) => {
                if c.entry.bare {
                    bare_note(report, &at, &c.entry);
                }
                if c.bare_value {
                    report.note(
                        &at,
                        format!(
                            "the unquoted {:?} is read as text, as Limitador read it before its \
                             CEL conditions",
                            c.value
                        ),
                    );
                }
                let op = if c.equals { "equals" } else { "not_equals" };
                conds.push(json!({
                    "descriptor": c.entry.descriptor, "key": c.entry.key, op: c.value
                }));
            }
            Err(why) => {
                report.loss(
                    &at,
                    format!("{why}; the whole limit is left out, since without it it would count more requests than Limitador does"),
                );
                lost = true;
            }
        }
    }
    let mut vars = Vec::new();
    for (j, text) in variables.iter().enumerate() {
        let at = p.key("variables").index(j);
        match cel::parse_variable(text) {
            Ok(e) => {
                if e.bare {
                    bare_note(report, &at, &e);
                }
                vars.push(json!({ "descriptor": e.descriptor, "key": e.key }));
            }
            Err(why) => {
                report.loss(&at, format!("{why}; the whole limit is left out"));
                lost = true;
            }
        }
    }
    if seconds == 0 || seconds > MAX_SPAN / 1000 {
        report.loss(
            &p.key("seconds"),
            format!(
                "{seconds} seconds: Charon's windows last from 1 ms to 2^50 ms; the whole limit \
                 is left out"
            ),
        );
        lost = true;
    }
    if max_value > MAX_COUNT {
        report.loss(
            &p.key("max_value"),
            format!("{max_value} is above 2^53-1, the largest count Charon keeps exactly"),
        );
        lost = true;
    }
    if lost {
        return None;
    }
    let mut limit = Map::new();
    if let Some(name) = t.name.clone().filter(|s| !s.is_empty()) {
        limit.insert("name".into(), name.into());
    }
    let mut identity = (conditions.clone(), variables.clone());
    identity.0.sort();
    identity.0.dedup();
    identity.1.sort();
    identity.1.dedup();
    if !conds.is_empty() {
        limit.insert("conditions".into(), conds.into());
    }
    if !vars.is_empty() {
        limit.insert("variables".into(), vars.into());
    }
    limit.insert(
        "rate_limit".into(),
        json!({ "window": format!("{seconds}s"), "requests_per_unit": max_value }),
    );
    Some((
        namespace,
        Value::Object(limit),
        (
            format!("{:?}", identity.0),
            format!("{:?} {seconds}", identity.1),
        ),
    ))
}

fn bare_note(report: &mut Report, at: &Path, e: &Entry) {
    report.note(
        at,
        format!(
            "{:?} is read as descriptors[0].{} (Limitador's conditions and variables name \
             descriptors[N] since they are CEL)",
            e.key, e.key
        ),
    );
}

/// A list of expressions (null is none).
fn strings(m: &Map<String, Value>, field: &str, p: &Path, report: &mut Report) -> Vec<String> {
    match m.get(field) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(j, v)| match v {
                Value::String(s) => Some(s.clone()),
                other => {
                    report.error(
                        &p.key(field).index(j),
                        format!(
                            "invalid type: expected a CEL expression (a string), found {}",
                            describe(other)
                        ),
                    );
                    None
                }
            })
            .collect(),
        Some(other) => {
            report.error(
                &p.key(field),
                format!("invalid type: expected a list, found {}", describe(other)),
            );
            Vec::new()
        }
    }
}
