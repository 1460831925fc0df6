//! Edits of resource documents and their validation, through charon-core
//! only: a change to a part (an override, a group, a member) is applied to
//! the JSON document of the whole resource, which core then parses,
//! validates and normalizes exactly as it would a configuration file. What
//! core reports is re-pathed to be relative to what the request sent.

use std::collections::BTreeMap;

use charon_core::config::{Adjustment, Config, ConfigErrors, ConfigIssue, parse_resource};
use charon_core::fields::Path;
use serde_json::{Map, Value};

/// A resource document as the service stores it: validated and normalized.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Normalized {
    /// `rate` or `copy`.
    pub kind: &'static str,
    /// The SPEC §6 layout of the normalized resource.
    pub document: Value,
    /// What normalization changed, paths relative to the resource.
    pub adjustments: Vec<Adjustment>,
}

/// Validates and normalizes one resource document with charon-core.
pub(crate) fn normalize_resource(doc: &Value) -> Result<Normalized, ConfigErrors> {
    let resource = parse_resource(doc)?;
    let kind = resource.kind.name();
    let (config, adjustments) = Config::new(BTreeMap::new(), vec![resource])?;
    let document = config.to_value()["resources"][0].clone();
    let adjustments = adjustments
        .into_iter()
        .map(|a| Adjustment {
            path: relative(&a.path, "resources[0]").unwrap_or(a.path),
            change: a.change,
        })
        .collect();
    Ok(Normalized {
        kind,
        document,
        adjustments,
    })
}

/// `path` relative to `prefix`, if it lies under it (`""` for the prefix
/// itself).
fn relative(path: &str, prefix: &str) -> Option<String> {
    let rest = path.strip_prefix(prefix)?;
    if rest.is_empty() {
        Some(String::new())
    } else if let Some(field) = rest.strip_prefix('.') {
        Some(field.to_owned())
    } else if rest.starts_with('[') {
        Some(rest.to_owned())
    } else {
        None
    }
}

/// Core's problems with paths under `prefix` made relative to it; a
/// problem at the prefix itself is reported at `whole`.
pub(crate) fn remap(errors: ConfigErrors, prefix: &str, whole: &str) -> Vec<ConfigIssue> {
    errors
        .0
        .into_iter()
        .map(|i| {
            let path = match relative(&i.path, prefix) {
                Some(p) if p.is_empty() => whole.to_owned(),
                Some(p) => p,
                None => i.path,
            };
            ConfigIssue {
                path,
                message: i.message,
            }
        })
        .collect()
}

/// Puts the name from the URL into a body that may carry it too; a body
/// that names something else is refused.
pub(crate) fn with_name(mut body: Value, url_name: &str, what: &str) -> Result<Value, ConfigIssue> {
    if let Value::Object(map) = &mut body {
        match map.get("name") {
            None | Some(Value::Null) => {
                map.insert("name".to_owned(), Value::String(url_name.to_owned()));
            }
            Some(Value::String(n)) if n == url_name => {}
            Some(other) => {
                return Err(ConfigIssue {
                    path: "name".to_owned(),
                    message: format!(
                        "{other} does not match the {what} name in the URL ({url_name:?}); \
                         renaming is a delete and a create"
                    ),
                });
            }
        }
    }
    Ok(body)
}

/// `v` as an object, made one if it is not. (Stored documents always are
/// objects; this keeps the edits total.)
fn ensure_object(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

/// `v` as an array, made one if it is not.
fn ensure_array(v: &mut Value) -> &mut Vec<Value> {
    if !v.is_array() {
        *v = Value::Array(Vec::new());
    }
    match v {
        Value::Array(a) => a,
        _ => unreachable!("made an array above"),
    }
}

/// The object at `v[key]`, created if missing.
fn object_mut<'v>(v: &'v mut Value, key: &str) -> &'v mut Map<String, Value> {
    ensure_object(ensure_object(v).entry(key).or_insert(Value::Null))
}

/// The array at `v[key]`, created if missing.
fn array_mut<'v>(v: &'v mut Value, key: &str) -> &'v mut Vec<Value> {
    ensure_array(ensure_object(v).entry(key).or_insert(Value::Null))
}

/// The override of `domain` in a resource document.
pub(crate) fn get_override<'v>(doc: &'v Value, domain: &str) -> Option<&'v Value> {
    doc.get("domains")?.get(domain)
}

/// The document with `body` as the override of `domain`, and the path
/// prefix under which core will report its problems (written by core's
/// own [`Path`], so that they can be found and re-pathed).
pub(crate) fn set_override(doc: &Value, domain: &str, body: Value) -> (Value, String) {
    let mut doc = doc.clone();
    object_mut(&mut doc, "domains").insert(domain.to_owned(), body);
    (doc, Path::root().key("domains").key(domain).to_string())
}

/// The document without the override of `domain`; `None` if it had none.
pub(crate) fn remove_override(doc: &Value, domain: &str) -> Option<Value> {
    let mut doc = doc.clone();
    let domains = doc.get_mut("domains")?.as_object_mut()?;
    domains.remove(domain)?;
    if domains.is_empty() {
        doc.as_object_mut()?.remove("domains");
    }
    Some(doc)
}

/// Index of the group named `group`.
pub(crate) fn group_index(doc: &Value, group: &str) -> Option<usize> {
    doc.get("groups")?
        .as_array()?
        .iter()
        .position(|g| g.get("name").and_then(Value::as_str) == Some(group))
}

/// The groups of a resource document (empty if none).
pub(crate) fn groups(doc: &Value) -> Vec<Value> {
    doc.get("groups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The document with `body` (which carries the name) as the group
/// `group`, in place or appended; the path prefix of its problems.
pub(crate) fn set_group(doc: &Value, group: &str, body: Value) -> (Value, String) {
    let mut doc = doc.clone();
    let index = group_index(&doc, group);
    let groups = array_mut(&mut doc, "groups");
    let i = match index {
        Some(i) => {
            groups[i] = body;
            i
        }
        None => {
            groups.push(body);
            groups.len() - 1
        }
    };
    (doc, format!("groups[{i}]"))
}

/// The document without the group; `None` if it had none.
pub(crate) fn remove_group(doc: &Value, group: &str) -> Option<Value> {
    let i = group_index(doc, group)?;
    let mut doc = doc.clone();
    let groups = array_mut(&mut doc, "groups");
    groups.remove(i);
    if groups.is_empty() {
        doc.as_object_mut()?.remove("groups");
    }
    Some(doc)
}

/// The document with `domain` added to group `i`, and the path core will
/// use for the new member; `None` if it is a member already.
pub(crate) fn add_member(doc: &Value, i: usize, domain: &str) -> Option<(Value, String)> {
    let mut doc = doc.clone();
    let group = array_mut(&mut doc, "groups").get_mut(i)?;
    let members = array_mut(group, "domains");
    if members.iter().any(|d| d.as_str() == Some(domain)) {
        return None;
    }
    members.push(Value::String(domain.to_owned()));
    let path = format!("groups[{i}].domains[{}]", members.len() - 1);
    Some((doc, path))
}

/// The document with `domain` removed from group `i`; `None` if it was
/// not a member.
pub(crate) fn remove_member(doc: &Value, i: usize, domain: &str) -> Option<Value> {
    let mut doc = doc.clone();
    let group = array_mut(&mut doc, "groups").get_mut(i)?;
    let members = array_mut(group, "domains");
    let j = members.iter().position(|d| d.as_str() == Some(domain))?;
    members.remove(j);
    Some(doc)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The prefix `set_override` gives must be the path core reports, or
    /// problems would not be re-pathed.
    #[test]
    fn override_prefixes_match_core() {
        let doc = json!({"name": "api/x", "kind": "copy", "domain_limit": 1});
        for domain in ["tenant-42", "a b", "é", "x.y", "_"] {
            let (doc, prefix) = set_override(&doc, domain, json!({ "domain_limit": "many" }));
            let errors = parse_resource(&doc).expect_err("invalid");
            assert_eq!(
                errors.0[0].path,
                format!("{prefix}.domain_limit"),
                "domain {domain:?}"
            );
        }
    }

    #[test]
    fn problems_are_made_relative() {
        let doc = json!({"name": "api/x", "kind": "rate", "tiers": []});
        let (doc, prefix) = set_override(&doc, "a b", json!({"tiers": [{"limit": -1}]}));
        let errors = normalize_resource(&doc).expect_err("invalid");
        let problems = remap(errors, &prefix, "");
        let paths: Vec<_> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["tiers[0].limit", "tiers[0].window"]);
    }

    #[test]
    fn normalization_paths_are_relative_to_the_resource() {
        let doc = json!({"name": "api/x", "kind": "rate",
            "tiers": [{"limit": 1, "window": "10s", "active": "5s"}]});
        let n = normalize_resource(&doc).expect("valid");
        assert_eq!(n.adjustments[0].path, "tiers[0].window");
        assert_eq!(n.document["tiers"][0]["window"], "5s");
    }

    #[test]
    fn members_come_and_go() {
        let doc = json!({"name": "s/vm", "kind": "copy", "domain_limit": 1,
            "groups": [{"name": "g", "limit": 1, "domains": ["a"]}]});
        assert!(add_member(&doc, 0, "a").is_none());
        let (doc, path) = add_member(&doc, 0, "b").expect("new member");
        assert_eq!(path, "groups[0].domains[1]");
        assert_eq!(doc["groups"][0]["domains"], json!(["a", "b"]));
        let doc = remove_member(&doc, 0, "a").expect("member");
        assert_eq!(doc["groups"][0]["domains"], json!(["b"]));
        assert!(remove_member(&doc, 0, "a").is_none());
        let doc = remove_group(&doc, "g").expect("group");
        assert!(doc.get("groups").is_none());
    }
}
