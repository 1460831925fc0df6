//! Limits of a call, Limitador's way: a domain may list `limits:`, each
//! with conditions and variables over the call's descriptors (any of
//! them, by index), and every limit whose conditions hold and whose
//! variables are all set applies, with one count per distinct set of
//! variable values. Entries are looked up by key, so their order in a
//! descriptor does not matter; a key sent twice in one descriptor takes
//! its last value (as Limitador reads a descriptor).

use std::collections::HashMap;

use super::node::Action;

/// `==` or `!=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Compare {
    /// The entry's value equals the condition's.
    Equals,
    /// The entry is set and its value differs from the condition's.
    NotEquals,
}

/// One condition: `descriptors[N][KEY] == VALUE` (or `!=`). A condition on
/// a descriptor the call does not have, or on a key that descriptor does
/// not send, does not hold (with `!=` too), as in Limitador.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Condition {
    /// The descriptor's index in the call.
    pub descriptor: usize,
    /// The entry key.
    pub key: String,
    /// How the value is compared.
    pub compare: Compare,
    /// The value compared with.
    pub value: String,
}

/// One variable: `descriptors[N][KEY]`, whose value tells counts apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Variable {
    /// The descriptor's index in the call.
    pub descriptor: usize,
    /// The entry key.
    pub key: String,
}

/// One limit of a domain's `limits:` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitRule {
    pub(super) name: Option<String>,
    pub(super) conditions: Vec<Condition>,
    pub(super) variables: Vec<Variable>,
    pub(super) action: Action,
    pub(super) id: String,
}

/// A call's descriptors as Limitador reads them: one key → value map each.
pub(super) struct CallEntries<'a> {
    maps: Vec<HashMap<&'a str, &'a str>>,
}

impl<'a> CallEntries<'a> {
    pub(super) fn of(descriptors: &[Vec<(&'a str, &'a str)>]) -> Self {
        Self {
            maps: descriptors
                .iter()
                .map(|d| d.iter().copied().collect())
                .collect(),
        }
    }

    fn get(&self, descriptor: usize, key: &str) -> Option<&'a str> {
        self.maps.get(descriptor)?.get(key).copied()
    }
}

impl LimitRule {
    /// A limit; conditions and variables are kept sorted (their order in a
    /// file does not change the limit, nor its counts), and duplicates
    /// dropped. Its [`LimitRule::id`] is set when its domain is built.
    pub fn new(
        name: Option<String>,
        mut conditions: Vec<Condition>,
        mut variables: Vec<Variable>,
        action: Action,
    ) -> Self {
        conditions.sort();
        conditions.dedup();
        variables.sort();
        variables.dedup();
        Self {
            name,
            conditions,
            variables,
            action,
            id: String::new(),
        }
    }

    /// How replies and headers name it.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Its conditions, sorted.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// Its variables, sorted.
    pub fn variables(&self) -> &[Variable] {
        &self.variables
    }

    /// What limits (a resource or an inline limit; never `unlimited`).
    pub fn action(&self) -> &Action {
        &self.action
    }

    /// Its stable name, `envoy/DOMAIN/limit/CONDITIONS/VARIABLES/WINDOW`
    /// (or the resource in place of the window), from what it matches and
    /// counts (never from its place in the list): the resource name of an
    /// inline limit, and its label in metrics.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn set_id(&mut self, domain_root: &str) {
        let mut id = format!("{domain_root}/limit/");
        for (i, c) in self.conditions.iter().enumerate() {
            if i > 0 {
                id.push('&');
            }
            id.push_str(&format!("[{}]", c.descriptor));
            escape(&mut id, &c.key);
            id.push_str(match c.compare {
                Compare::Equals => "==",
                Compare::NotEquals => "!=",
            });
            escape(&mut id, &c.value);
        }
        id.push('/');
        for (i, v) in self.variables.iter().enumerate() {
            if i > 0 {
                id.push(',');
            }
            id.push_str(&format!("[{}]", v.descriptor));
            escape(&mut id, &v.key);
        }
        // Limitador tells limits apart by their window too (10 a minute
        // and 100 an hour on the same keys are two limits).
        id.push('/');
        match &self.action {
            Action::RateLimit(l) => id.push_str(&crate::time::format_span(l.window())),
            Action::Resource(r) => escape(&mut id, r),
            Action::Unlimited => id.push_str("unlimited"),
        }
        self.id = id;
    }

    /// The variables' values if the limit applies to the call: every
    /// condition holds and every variable is set.
    pub(super) fn applies<'a>(&self, call: &CallEntries<'a>) -> Option<Vec<&'a str>> {
        let holds = self.conditions.iter().all(|c| {
            call.get(c.descriptor, &c.key)
                .is_some_and(|v| match c.compare {
                    Compare::Equals => v == c.value,
                    Compare::NotEquals => v != c.value,
                })
        });
        if !holds {
            return None;
        }
        self.variables
            .iter()
            .map(|v| call.get(v.descriptor, &v.key))
            .collect()
    }
}

/// Appends a key or value to a limit's id: the characters that separate
/// its parts escaped with `\`, so different limits never share an id.
fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '\\' | '/' | '=' | '!' | '&' | ',' | '[' | ']') {
            out.push('\\');
        }
        out.push(c);
    }
}
