//! Limitador's limits file: a YAML list of limits, each
//! `{namespace, max_value, seconds, conditions, variables, name}`.
//!
//! A limit becomes one path of the `envoy:` tree of the domain named like
//! its namespace (Limitador's namespace is the Envoy domain): one node with
//! a value per condition `KEY == 'VALUE'`, then one value-less node per
//! variable (each distinct value its own counter), and the limit on the
//! last node: an inline `rate_limit` when `seconds` is 1, 60, 3600 or
//! 86400, else a fixed `kind: window` resource of `seconds`. Conditions
//! Charon cannot match (`!=`, CEL expressions) leave the whole limit out:
//! without them it would limit more requests than Limitador does.

use charon_core::MAX_COUNT;
use serde_json::Value;

use super::tree::{Entry, NAMESPACE, Node, Output, name_part};
use super::{Report, count_field, describe, index, join, list_field, object, text_field};

const LIMIT_FIELDS: &[&str] = &[
    "namespace",
    "max_value",
    "seconds",
    "conditions",
    "variables",
    "name",
];

/// The longest window accepted, in seconds (SPEC §10's longest span, 2^50
/// ms).
const MAX_SECONDS: u64 = (1 << 50) / 1000;

/// Converts one limits file (a parsed YAML value) into `out`.
pub(super) fn convert(v: &Value, out: &mut Output, report: &mut Report) {
    let Value::Array(items) = v else {
        report.error(
            "",
            format!(
                "expected Limitador's limits file (a list of limits), found {}",
                describe(v)
            ),
        );
        return;
    };
    let mut ordered = false;
    for (i, item) in items.iter().enumerate() {
        let p = index("", i);
        let Some(map) = object(item, &p, "a limit", LIMIT_FIELDS, report) else {
            continue;
        };
        let namespace = text_field(map, "namespace", &p, report);
        let max_value = count_field(map, "max_value", &p, (0, MAX_COUNT), report);
        let seconds = count_field(map, "seconds", &p, (1, MAX_SECONDS), report);
        if map.get("name").is_some_and(|n| !n.is_null()) {
            report.drop(
                &join(&p, "name"),
                "Charon's limits are named by their node's path (envoy/DOMAIN/KEY=VALUE/…)",
            );
        }
        let Some(entries) = entries(map, &p, report) else {
            continue;
        };
        let (Some(namespace), Some(max_value), Some(seconds)) = (namespace, max_value, seconds)
        else {
            continue;
        };
        if entries.is_empty() {
            report.drop(
                &p,
                "a limit with neither conditions nor variables counts every request of the \
                 namespace, and a Charon descriptor node needs a key: have Envoy send a \
                 descriptor such as (generic_key, all) and limit that node",
            );
            continue;
        }
        if let Some(k) = repeated_key(&entries) {
            report.drop(
                &p,
                format!(
                    "the key {k:?} is used twice; a Charon path matches each entry of a \
                     descriptor once"
                ),
            );
            continue;
        }
        ordered |= entries.len() > 1;
        let at = (namespace.clone(), entries.clone());
        if let Some(first) = out.placed.get(&at) {
            report.drop(
                &p,
                format!(
                    "{first} already limits the same conditions and variables, and a Charon \
                     node has one limit (Limitador applies both): keep the stricter one, or have \
                     Envoy send a second descriptor with an extra generic_key entry for this one"
                ),
            );
            continue;
        }
        out.placed.insert(at, format!("{}: {p}", report.file));
        let mut name = format!("{NAMESPACE}/");
        name_part(&mut name, &namespace);
        for (k, v) in &entries {
            name.push('/');
            name_part(&mut name, k);
            if let Some(v) = v {
                name.push('=');
                name_part(&mut name, v);
            }
        }
        let action = out.limit(max_value, seconds, &name);
        let mut level = out.domain_mut(&namespace);
        let last = entries.len() - 1;
        for (depth, (k, v)) in entries.into_iter().enumerate() {
            let at = match level.iter().position(|n| n.key == k && n.value == v) {
                Some(at) => at,
                None => {
                    level.push(Node::new(k, v));
                    level.len() - 1
                }
            };
            if depth == last {
                level[at].action = Some(action.clone());
            }
            level = &mut level[at].children;
        }
    }
    if ordered {
        report.note(
            "",
            "Limitador finds a limit's keys in any order, in any descriptor of the call; \
             Charon matches the entries of one descriptor in order, one tree level each: have \
             Envoy send each limit's entries in one descriptor, its conditions first, then its \
             variables, in the order of this file",
        );
    }
}

/// The path of one limit: its conditions (with values), then its variables.
/// `None` when a condition or a variable cannot be expressed (reported).
fn entries(
    map: &serde_json::Map<String, Value>,
    p: &str,
    report: &mut Report,
) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    let mut ok = true;
    for (field, with_value) in [("conditions", true), ("variables", false)] {
        let at = join(p, field);
        for (j, c) in list_field(map, field, p, report).iter().enumerate() {
            let cp = index(&at, j);
            let Some(text) = c.as_str() else {
                report.error(&cp, format!("expected a string, found {}", describe(c)));
                ok = false;
                continue;
            };
            let parsed = if with_value {
                condition(text).map(|(k, v)| (k, Some(v)))
            } else {
                key_expr(text.trim()).map(|k| (k, None))
            };
            match parsed {
                Ok(e) => entries.push(e),
                Err(why) => {
                    report.drop(
                        &cp,
                        format!(
                            "{why}; the whole limit is left out, since without it the limit \
                             would count more requests than Limitador does"
                        ),
                    );
                    ok = false;
                }
            }
        }
    }
    ok.then_some(entries)
}

fn repeated_key(entries: &[Entry]) -> Option<&str> {
    entries.iter().enumerate().find_map(|(i, (k, _))| {
        entries[..i]
            .iter()
            .any(|(other, _)| other == k)
            .then_some(k.as_str())
    })
}

/// `KEY == 'VALUE'` (or `"VALUE"`, or Limitador's older unquoted `VALUE`),
/// where KEY is a name or `descriptors[0]['name']`.
pub(super) fn condition(text: &str) -> Result<(String, String), String> {
    let t = text.trim();
    if t.contains("!=") {
        return Err(format!(
            "the condition {t:?} cannot be expressed: a Charon node matches one value or any \
             value, never all values but one"
        ));
    }
    let cannot = || {
        format!(
            "the condition {t:?} cannot be expressed: Charon matches a key equal to one value \
             (KEY == 'VALUE')"
        )
    };
    let (lhs, rhs) = t.split_once("==").ok_or_else(cannot)?;
    let key = key_expr(lhs.trim()).map_err(|_| cannot())?;
    let value = literal(rhs.trim()).ok_or_else(cannot)?;
    Ok((key, value))
}

/// A descriptor key: a plain name (`user_id`, `req.method`), or CEL's
/// `descriptors[0]['name']` / `descriptors[0].name`.
fn key_expr(s: &str) -> Result<String, String> {
    if let Some(rest) = s.strip_prefix("descriptors[") {
        let (idx, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("{s:?} is not a key Charon can match"))?;
        if idx.trim() != "0" {
            return Err(format!(
                "{s:?} refers to descriptors[{idx}]; Charon matches the entries of one \
                 descriptor at a time"
            ));
        }
        let key = tail
            .strip_prefix('.')
            .filter(|k| plain(k))
            .map(str::to_owned)
            .or_else(|| {
                tail.strip_prefix('[')
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|q| literal_quoted(q.trim()))
            });
        return key.ok_or_else(|| format!("{s:?} is not a key Charon can match"));
    }
    if plain(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a key Charon can match (a descriptor key, or descriptors[0]['key'])"
        ))
    }
}

/// A name of letters, digits, `_`, `.`, `-` and `:`.
fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | ':'))
}

fn literal_quoted(s: &str) -> Option<String> {
    for q in ['\'', '"'] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q))
            && !inner.contains(q)
            && !inner.is_empty()
        {
            return Some(inner.to_owned());
        }
    }
    None
}

fn literal(s: &str) -> Option<String> {
    literal_quoted(s).or_else(|| {
        (plain(s)
            || s.chars()
                .all(|c| c.is_alphanumeric() || "_.-:/@".contains(c))
                && !s.is_empty())
        .then(|| s.to_owned())
    })
}
