//! Boulder's key-value limits (seed 002): a defaults file `Name: {burst,
//! count, period}` and an overrides file, either keyed `Name:id` (seed
//! 002's layout) or Boulder's list of `- Name: {burst, count, period, ids:
//! [{id, comment}]}`. Each limit becomes a `kind: bucket` resource
//! `boulder/Name` (the same GCRA, in milliseconds), each override an
//! override of its domain, the id written as the domain a client sends
//! ([`super::boulder_ids`]). Checked as Boulder checks them (strict YAML:
//! unknown fields refused; a known limit name; burst, count and period
//! above 0; ids of the limit's format), and an override of a limit the
//! defaults do not have is refused, since it would limit nothing.

use std::collections::BTreeMap;

use charon_core::MAX_COUNT;
use charon_core::fields::{Path, describe};
use serde_json::{Map, Value, json};

use super::Report;
use super::boulder_ids::{self, IdFormat};
use super::yaml::{self, Yaml};

/// The namespace of the resources made.
const NAMESPACE: &str = "boulder";

const LIMIT_FIELDS: &[&str] = &["burst", "count", "period"];
const OVERRIDE_FIELDS: &[&str] = &["burst", "count", "period", "ids"];
const ID_FIELDS: &[&str] = &["id", "comment"];

/// One limit: `(burst, count, period in ms)`.
type Params = (u64, u64, u64);

/// The limits converted so far.
#[derive(Debug, Default)]
pub(super) struct Output {
    defaults: BTreeMap<String, Params>,
    order: Vec<String>,
    overrides: BTreeMap<String, BTreeMap<String, Params>>,
}

impl Output {
    /// The configuration: one bucket per default, in the file's order.
    pub(super) fn into_value(self) -> Value {
        let resources: Vec<Value> = self
            .order
            .iter()
            .map(|name| {
                let (burst, count, period) = self.defaults[name];
                let mut r = json!({
                    "name": format!("{NAMESPACE}/{name}"),
                    "kind": "bucket",
                    "burst": burst,
                    "count": count,
                    "period": format!("{period}ms"),
                });
                if let Some(o) = self.overrides.get(name) {
                    let domains: Map<String, Value> = o
                        .iter()
                        .map(|(d, &(b, c, p))| {
                            (
                                d.clone(),
                                json!({"burst": b, "count": c, "period": format!("{p}ms")}),
                            )
                        })
                        .collect();
                    r["domains"] = Value::Object(domains);
                }
                r
            })
            .collect();
        json!({ "resources": resources })
    }
}

fn parse(text: &str, report: &mut Report) -> Option<Yaml> {
    match yaml::parse(text) {
        Ok(d) => Some(d),
        Err(e) => {
            report.error(&Path::root(), format!("not valid YAML: {e}"));
            None
        }
    }
}

/// The defaults file.
pub(super) fn defaults(text: &str, out: &mut Output, report: &mut Report) {
    let Some(doc) = parse(text, report) else {
        return;
    };
    let entries = match doc {
        Yaml::Map(e) => e,
        Yaml::Null => Vec::new(),
        other => {
            report.error(
                &Path::root(),
                format!(
                    "expected the defaults (a mapping of limit names), found {}",
                    describe(&other.to_json())
                ),
            );
            return;
        }
    };
    for (k, v) in entries {
        let name = k.text();
        let p = Path::root().key(&name);
        if boulder_ids::format_of(&name).is_none() {
            report.error(
                &p,
                format!(
                    "unrecognized name {name:?} in default limit, must be one of [{}]",
                    boulder_ids::names()
                ),
            );
            continue;
        }
        if let Some(params) = limit(&v.to_json(), &p, LIMIT_FIELDS, report) {
            if out.defaults.insert(name.clone(), params).is_some() {
                report.error(&p, format!("the limit {name:?} is given twice"));
            } else {
                out.order.push(name);
            }
        }
    }
}

/// The overrides file, in either layout.
pub(super) fn overrides(text: &str, out: &mut Output, report: &mut Report) {
    let Some(doc) = parse(text, report) else {
        return;
    };
    match doc {
        Yaml::Null => {}
        Yaml::Map(entries) => {
            for (k, v) in entries {
                let key = k.text();
                let p = Path::root().key(&key);
                let Some((name, id)) = name_id(&key, &p, report) else {
                    continue;
                };
                if let Some(params) = limit(&v.to_json(), &p, LIMIT_FIELDS, report) {
                    add(out, &name, &id, params, &p, report);
                }
            }
        }
        Yaml::Seq(items) => {
            for (i, item) in items.into_iter().enumerate() {
                let p = Path::root().index(i);
                let Yaml::Map(entries) = item else {
                    report.error(&p, "expected an override (a mapping of one limit name)");
                    continue;
                };
                for (k, v) in entries {
                    let name = k.text();
                    let at = p.key(&name);
                    if boulder_ids::format_of(&name).is_none() {
                        report.error(
                            &at,
                            format!(
                                "unrecognized name {name:?} in override limit, must be one of [{}]",
                                boulder_ids::names()
                            ),
                        );
                        continue;
                    }
                    let v = v.to_json();
                    let Some(params) = limit(&v, &at, OVERRIDE_FIELDS, report) else {
                        continue;
                    };
                    let ids = v
                        .get("ids")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    if ids.is_empty() {
                        report.note(&at.key("ids"), "no ids: this override applies to nobody");
                    }
                    for (j, entry) in ids.iter().enumerate() {
                        let ip = at.key("ids").index(j);
                        let Some(m) = entry.as_object() else {
                            report.error(
                                &ip,
                                format!("expected {{id, comment}}, found {}", describe(entry)),
                            );
                            continue;
                        };
                        unknown(m, ID_FIELDS, &ip, report);
                        match m.get("id") {
                            Some(Value::String(id)) if !id.is_empty() => {
                                add(out, &name, id, params, &ip.key("id"), report);
                            }
                            Some(Value::Number(n)) => {
                                add(out, &name, &n.to_string(), params, &ip.key("id"), report);
                            }
                            _ => report.error(
                                &ip.key("id"),
                                "empty id in override, must be an id of the limit's format",
                            ),
                        }
                    }
                }
            }
        }
        other => report.error(
            &Path::root(),
            format!(
                "expected the overrides (a mapping or a list), found {}",
                describe(&other.to_json())
            ),
        ),
    }
}

/// `Name:id` (seed 002's layout), Boulder's checks and reasons.
fn name_id(key: &str, p: &Path, report: &mut Report) -> Option<(String, String)> {
    let Some((name, id)) = key.split_once(':') else {
        report.error(
            p,
            format!("invalid override {key:?}, must be formatted 'name:id'"),
        );
        return None;
    };
    if name.is_empty() {
        report.error(
            p,
            format!("empty name in override {key:?}, must be formatted 'name:id'"),
        );
        return None;
    }
    if boulder_ids::format_of(name).is_none() {
        report.error(
            p,
            format!(
                "unrecognized name {name:?} in override limit {key:?}, must be one of [{}]",
                boulder_ids::names()
            ),
        );
        return None;
    }
    if id.is_empty() {
        report.error(
            p,
            format!("empty id in override {key:?}, must be formatted 'name:id'"),
        );
        return None;
    }
    Some((name.to_owned(), id.to_owned()))
}

/// One override of `name` for `id`.
fn add(out: &mut Output, name: &str, id: &str, params: Params, p: &Path, report: &mut Report) {
    let Some(format) = boulder_ids::format_of(name) else {
        return;
    };
    let n = match boulder_ids::normalize(format, id) {
        Ok(n) => n,
        Err(why) => {
            report.error(
                p,
                format!("validating name {name} and id {id:?} for override limit: {why}"),
            );
            return;
        }
    };
    if !out.defaults.contains_key(name) {
        report.error(
            p,
            format!(
                "an override of {name}, which the defaults file does not limit: it would limit \
                 nothing (add a default for {name}, or remove the override)"
            ),
        );
        return;
    }
    if let Some(note) = n.note {
        report.note(p, note);
    }
    if format == IdFormat::Ipv6Range {
        report.note(
            p,
            "clients send the /48 of their address as the domain, as Boulder builds its bucket key",
        );
    }
    let domains = out.overrides.entry(name.to_owned()).or_default();
    if domains.insert(n.domain.clone(), params).is_some() {
        report.note(
            p,
            format!("a later override of {:?} wins, as in Boulder", n.domain),
        );
    }
}

fn unknown(m: &Map<String, Value>, known: &[&str], p: &Path, report: &mut Report) -> bool {
    let mut ok = true;
    for k in m.keys() {
        if !known.contains(&k.as_str()) {
            report.error(
                &p.key(k),
                format!("field {k} not found (known: {})", known.join(", ")),
            );
            ok = false;
        }
    }
    ok
}

/// `{burst, count, period}` (and `ids` for `known` with it): Boulder's
/// `ValidateLimit`.
fn limit(v: &Value, p: &Path, known: &[&str], report: &mut Report) -> Option<Params> {
    let Some(m) = v.as_object() else {
        report.error(
            p,
            format!("expected {{burst, count, period}}, found {}", describe(v)),
        );
        return None;
    };
    let before = report.issues.len();
    unknown(m, known, p, report);
    let whole = |field: &str, report: &mut Report| -> Option<u64> {
        let n = m.get(field).and_then(Value::as_i64).unwrap_or(0);
        if n <= 0 {
            let shown = m.get(field).map_or("0".to_owned(), ToString::to_string);
            report.error(
                &p.key(field),
                format!("invalid {field} '{shown}', must be > 0"),
            );
            return None;
        }
        let n = u64::try_from(n).ok()?;
        if n > MAX_COUNT {
            report.loss(
                &p.key(field),
                format!("{n} is above 2^53-1, the largest count Charon keeps"),
            );
            return None;
        }
        Some(n)
    };
    let burst = whole("burst", report);
    let count = whole("count", report);
    let period = match m.get("period") {
        Some(Value::String(s)) => match go_duration(s) {
            Ok(0) => {
                report.error(
                    &p.key("period"),
                    format!("invalid period '{s}', must be > 0"),
                );
                None
            }
            Ok(ms) => Some(ms),
            Err(why) => {
                report.error(&p.key("period"), why);
                None
            }
        },
        other => {
            report.error(
                &p.key("period"),
                format!(
                    "invalid period '{}', must be > 0",
                    other.map_or("0".into(), ToString::to_string)
                ),
            );
            None
        }
    };
    if report.issues.len() > before {
        return None;
    }
    Some((burst?, count?, period?))
}

/// A Go duration (`1s`, `180m`, `1h30m`, `1.5h`, `500ms`) in whole
/// milliseconds.
fn go_duration(s: &str) -> Result<u64, String> {
    let bad = || format!("time: invalid duration {s:?}");
    let units: [(&str, f64); 7] = [
        ("ns", 1e-6),
        ("us", 1e-3),
        ("µs", 1e-3),
        ("ms", 1.0),
        ("s", 1e3),
        ("m", 6e4),
        ("h", 3.6e6),
    ];
    let mut rest = s.trim();
    if rest == "0" {
        return Ok(0);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let (u, factor) = units
            .iter()
            .filter(|(u, _)| rest.starts_with(u))
            .max_by_key(|(u, _)| u.len())
            .ok_or_else(bad)?;
        total += n * factor;
        rest = &rest[u.len()..];
    }
    if total.fract() != 0.0 {
        return Err(format!(
            "{s:?} is not a whole number of milliseconds; Charon's periods are"
        ));
    }
    if total > (1u64 << 50) as f64 {
        return Err(format!(
            "{s:?} is longer than 2^50 ms, the longest period Charon keeps"
        ));
    }
    Ok(total as u64)
}

#[cfg(test)]
mod tests {
    use super::go_duration;

    #[test]
    fn go_durations_in_milliseconds() {
        assert_eq!(go_duration("1s"), Ok(1_000));
        assert_eq!(go_duration("180m"), Ok(10_800_000));
        assert_eq!(go_duration("1h30m"), Ok(5_400_000));
        assert_eq!(go_duration("1.5h"), Ok(5_400_000));
        assert_eq!(go_duration("2160h"), Ok(7_776_000_000));
        assert_eq!(go_duration("500ms"), Ok(500));
        assert!(go_duration("1500us").is_err());
        assert!(go_duration("fast").is_err());
        assert_eq!(go_duration("0"), Ok(0));
    }
}
