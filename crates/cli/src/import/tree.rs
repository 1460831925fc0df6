//! The Charon configuration being built: resources and `envoy:` domains,
//! rendered in the SPEC §6 / §11 layout.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};

/// The namespace of the resources the import creates (limits that an inline
/// `rate_limit` cannot express), so they are easy to find and to switch
/// off together (`namespaces: { imported: { ignore_configured: true } }`).
pub(super) const NAMESPACE: &str = "imported";

/// The resource that rejects every request (a `kind: rate` with no tiers:
/// SPEC §2's fake tier 0 has a limit of 0), for limits of 0.
pub(super) const DENY_ALL: &str = "imported/deny-all";

/// One entry of a descriptor path: a key and, for a node with a value,
/// that value.
pub(super) type Entry = (String, Option<String>);

/// What a node does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    RateLimit {
        unit: &'static str,
        requests_per_unit: u64,
    },
    Resource(String),
    Unlimited,
}

/// One descriptor node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Node {
    pub key: String,
    pub value: Option<String>,
    pub action: Option<Action>,
    pub shadow_mode: Option<bool>,
    pub children: Vec<Node>,
}

impl Node {
    pub fn new(key: String, value: Option<String>) -> Self {
        Self {
            key,
            value,
            action: None,
            shadow_mode: None,
            children: Vec::new(),
        }
    }

    fn into_value(self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), Value::String(self.key));
        if let Some(v) = self.value {
            m.insert("value".into(), Value::String(v));
        }
        match self.action {
            Some(Action::RateLimit {
                unit,
                requests_per_unit,
            }) => {
                m.insert(
                    "rate_limit".into(),
                    json!({ "unit": unit, "requests_per_unit": requests_per_unit }),
                );
            }
            Some(Action::Resource(r)) => {
                m.insert("resource".into(), Value::String(r));
            }
            Some(Action::Unlimited) => {
                m.insert("unlimited".into(), Value::Bool(true));
            }
            None => {}
        }
        if let Some(s) = self.shadow_mode {
            m.insert("shadow_mode".into(), Value::Bool(s));
        }
        if !self.children.is_empty() {
            m.insert(
                "descriptors".into(),
                Value::Array(self.children.into_iter().map(Node::into_value).collect()),
            );
        }
        Value::Object(m)
    }
}

/// The configuration built from every source file.
#[derive(Debug, Default)]
pub(super) struct Output {
    resources: Vec<Value>,
    resource_names: HashSet<String>,
    domains: Vec<(String, Vec<Node>)>,
    /// The Limitador limits placed so far, by namespace and path, with
    /// where they came from (`FILE: [i]`), across files.
    pub placed: HashMap<(String, Vec<Entry>), String>,
}

impl Output {
    /// Whether a domain of that name was converted already.
    pub fn has_domain(&self, name: &str) -> bool {
        self.domains.iter().any(|(d, _)| d == name)
    }

    /// The top-level nodes of `name`, created empty if new.
    pub fn domain_mut(&mut self, name: &str) -> &mut Vec<Node> {
        let i = match self.domains.iter().position(|(d, _)| d == name) {
            Some(i) => i,
            None => {
                self.domains.push((name.to_owned(), Vec::new()));
                self.domains.len() - 1
            }
        };
        &mut self.domains[i].1
    }

    /// The action for `count` requests per `seconds`: an inline
    /// `rate_limit` where the span is one of its units, the deny-all
    /// resource for a count of 0, else a fixed window resource named
    /// `name` (created here).
    pub fn limit(&mut self, count: u64, seconds: u64, name: &str) -> Action {
        if count == 0 {
            if self.resource_names.insert(DENY_ALL.to_owned()) {
                self.resources
                    .push(json!({ "name": DENY_ALL, "kind": "rate", "tiers": [] }));
            }
            return Action::Resource(DENY_ALL.to_owned());
        }
        let unit = match seconds {
            1 => Some("second"),
            60 => Some("minute"),
            3600 => Some("hour"),
            86_400 => Some("day"),
            _ => None,
        };
        if let Some(unit) = unit {
            return Action::RateLimit {
                unit,
                requests_per_unit: count,
            };
        }
        // Names come from distinct paths; a repeat would only come from a
        // repeated path, which the converters refuse before.
        let mut name = name.to_owned();
        while !self.resource_names.insert(name.clone()) {
            name.push('\'');
        }
        self.resources.push(json!({
            "name": name,
            "kind": "window",
            "algorithm": "fixed",
            "limit": count,
            "window": format!("{seconds}s"),
        }));
        Action::Resource(name)
    }

    /// The configuration in the SPEC §6 layout.
    pub fn into_value(self) -> Value {
        let domains: Vec<Value> = self
            .domains
            .into_iter()
            .map(|(domain, nodes)| {
                json!({
                    "domain": domain,
                    "descriptors": nodes.into_iter().map(Node::into_value).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "resources": self.resources,
            "envoy": { "domains": domains },
        })
    }
}

/// A resource name part: `/` in it written `\/` (and `\` as `\\`), so
/// different paths give different names.
pub(super) fn name_part(out: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '\\' | '/') {
            out.push('\\');
        }
        out.push(c);
    }
}
