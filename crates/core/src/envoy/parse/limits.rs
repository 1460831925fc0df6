//! A domain's `limits:` read from its JSON/YAML value: Limitador's kind of
//! limit (conditions and variables over the call's descriptors), every
//! problem with its path. Two limits with the same conditions, variables
//! and window are refused: they would be one count limited twice, and
//! Limitador keeps only one of them.

use serde_json::{Map, Value};

use super::{action_at, entry_text};
use crate::envoy::limits::{Compare, Condition, LimitRule, Variable};
use crate::envoy::node::Action;
use crate::envoy::{MAX_KEY_BYTES, MAX_LIMITS, MAX_TERMS, MAX_VALUE_BYTES};
use crate::fields::{Issues, Path, count_or, list, object, required, too_many};

const LIMIT_FIELDS: &[&str] = &["name", "conditions", "variables", "resource", "rate_limit"];
const CONDITION_FIELDS: &[&str] = &["descriptor", "key", "equals", "not_equals"];
const VARIABLE_FIELDS: &[&str] = &["descriptor", "key"];
/// The highest descriptor index a condition or variable may name (a call
/// has at most 1024 descriptors).
const MAX_DESCRIPTOR_INDEX: u64 = 1023;

/// A domain's `limits:` (Limitador's kind of limit).
pub(super) fn limits_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Vec<LimitRule>> {
    let items = list(v, path, issues)?;
    if too_many(items.len(), MAX_LIMITS, "limits", path, issues) {
        return None;
    }
    let before = issues.len();
    let mut limits: Vec<LimitRule> = Vec::with_capacity(items.len());
    let mut first: Vec<usize> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let p = path.index(i);
        let Some(l) = limit_at(item, &p, issues) else {
            continue;
        };
        // The same conditions, variables and window (or resource) would be
        // one count limited twice: Limitador keeps only one of them.
        let same = |o: &LimitRule| {
            o.conditions() == l.conditions()
                && o.variables() == l.variables()
                && window_of(o.action()) == window_of(l.action())
        };
        if let Some(j) = limits.iter().position(same) {
            issues.push(
                &p,
                format!(
                    "duplicate limit: the same conditions, variables and window as {}",
                    path.index(first[j])
                ),
            );
            continue;
        }
        first.push(i);
        limits.push(l);
    }
    (issues.len() == before).then_some(limits)
}

fn limit_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<LimitRule> {
    let map = object(v, path, issues, "a limit", LIMIT_FIELDS)?;
    let before = issues.len();
    let name = map
        .get("name")
        .filter(|v| !v.is_null())
        .and_then(|v| entry_text(v, &path.key("name"), issues, MAX_VALUE_BYTES));
    let terms = |field: &str, issues: &mut Issues| -> &[Value] {
        match map.get(field).filter(|v| !v.is_null()) {
            None => &[],
            Some(v) => {
                let p = path.key(field);
                match list(v, &p, issues) {
                    Some(items) if !too_many(items.len(), MAX_TERMS, field, &p, issues) => items,
                    _ => &[],
                }
            }
        }
    };
    let conditions: Vec<Condition> = terms("conditions", issues)
        .iter()
        .enumerate()
        .filter_map(|(i, c)| condition_at(c, &path.key("conditions").index(i), issues))
        .collect();
    let variables: Vec<Variable> = terms("variables", issues)
        .iter()
        .enumerate()
        .filter_map(|(i, c)| variable_at(c, &path.key("variables").index(i), issues))
        .collect();
    let action = action_at(map, path, issues, false);
    if action.is_none() && issues.len() == before {
        issues.push(path, "a limit needs resource or rate_limit");
    }
    let action = action?;
    (issues.len() == before).then(|| LimitRule::new(name, conditions, variables, action))
}

fn index_and_key(
    map: &Map<String, Value>,
    path: &Path,
    issues: &mut Issues,
) -> Option<(usize, String)> {
    let descriptor = count_or(map, "descriptor", 0, path, issues);
    let descriptor = match descriptor {
        Some(d) if d > MAX_DESCRIPTOR_INDEX => {
            issues.push(
                &path.key("descriptor"),
                format!("{d} is past the last descriptor a call can have ({MAX_DESCRIPTOR_INDEX})"),
            );
            None
        }
        Some(d) => usize::try_from(d).ok(),
        None => None,
    };
    let key = required(map, "key", path, issues)
        .and_then(|v| entry_text(v, &path.key("key"), issues, MAX_KEY_BYTES));
    Some((descriptor?, key?))
}

fn condition_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Condition> {
    let map = object(v, path, issues, "a condition", CONDITION_FIELDS)?;
    let at = index_and_key(map, path, issues);
    let eq = map.get("equals").filter(|v| !v.is_null());
    let ne = map.get("not_equals").filter(|v| !v.is_null());
    let (compare, value) = match (eq, ne) {
        (Some(v), None) => (
            Compare::Equals,
            entry_text(v, &path.key("equals"), issues, MAX_VALUE_BYTES),
        ),
        (None, Some(v)) => (
            Compare::NotEquals,
            entry_text(v, &path.key("not_equals"), issues, MAX_VALUE_BYTES),
        ),
        _ => {
            issues.push(path, "a condition has one of equals and not_equals");
            (Compare::Equals, None)
        }
    };
    let (descriptor, key) = at?;
    Some(Condition {
        descriptor,
        key,
        compare,
        value: value?,
    })
}

fn variable_at(v: &Value, path: &Path, issues: &mut Issues) -> Option<Variable> {
    let map = object(v, path, issues, "a variable", VARIABLE_FIELDS)?;
    let (descriptor, key) = index_and_key(map, path, issues)?;
    Some(Variable { descriptor, key })
}

/// What tells limits with the same conditions and variables apart.
fn window_of(a: &Action) -> Result<u64, &str> {
    match a {
        Action::RateLimit(l) => Ok(l.window()),
        Action::Resource(r) => Err(r.as_str()),
        Action::Unlimited => Err(""),
    }
}
