//! One node of a descriptor tree, and how a node finds its children: by
//! key and exact value (a hash lookup), then by wildcard value (`foo*`,
//! in configuration order), then the key's value-less node, as
//! envoyproxy/ratelimit looks them up.

use std::collections::HashMap;

use super::inline::{Mask, RateLimit};

/// What a node does when it is the node that applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `resource: NAME`: a rate-like resource of the same configuration.
    Resource(String),
    /// `rate_limit: {unit | window, requests_per_unit}`: an inline limit.
    RateLimit(RateLimit),
    /// `unlimited: true`: never limited (and nothing recorded).
    Unlimited,
}

/// A value with `*` in it: each `*` matches any text, none included
/// (`foo*`, `*bar`, `foo*bar*baz`), as in envoyproxy/ratelimit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    parts: Vec<String>,
}

impl Wildcard {
    /// The pattern of `value`, if it has a `*`.
    pub fn of(value: &str) -> Option<Self> {
        value.contains('*').then(|| Self {
            parts: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// Whether `text` matches: it starts with the first literal part, ends
    /// with the last, and holds the middle ones in order between them,
    /// without overlap.
    pub fn matches(&self, text: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if text.len() < fixed || !text.starts_with(first.as_str()) || !text.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &text[first.len()..text.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// The children of a node (or a domain's top-level nodes), found by key
/// and value in two hash lookups (wildcard values are tried in order
/// after an exact value), so matching costs the same however wide the
/// tree is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Children {
    by_key: HashMap<String, Slot>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Slot {
    /// The value-less node of the key.
    any: Option<usize>,
    /// The nodes with a value, by value.
    values: HashMap<String, usize>,
    /// The nodes with a wildcard value, in configuration order.
    wildcards: Vec<usize>,
}

/// How an entry matched a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum By {
    /// The node's value.
    Value,
    /// The node's wildcard value.
    Wildcard,
    /// The key's value-less node.
    Any,
}

impl Children {
    pub(super) fn of(nodes: &[Node]) -> Self {
        let mut c = Children::default();
        for (i, n) in nodes.iter().enumerate() {
            let slot = c.by_key.entry(n.key.clone()).or_default();
            match (&n.value, &n.wildcard) {
                (None, _) => {
                    slot.any.get_or_insert(i);
                }
                (Some(_), Some(_)) => slot.wildcards.push(i),
                (Some(v), None) => {
                    slot.values.entry(v.clone()).or_insert(i);
                }
            }
        }
        c
    }

    /// The node matching `(key, value)`: the one with that value, else the
    /// first wildcard value that matches, else the value-less one.
    pub(super) fn find(&self, nodes: &[Node], key: &str, value: &str) -> Option<(usize, By)> {
        let slot = self.by_key.get(key)?;
        if let Some(&i) = slot.values.get(value) {
            return Some((i, By::Value));
        }
        let wild = slot
            .wildcards
            .iter()
            .copied()
            .find(|&i| nodes[i].wildcard.as_ref().is_some_and(|w| w.matches(value)));
        if let Some(i) = wild {
            return Some((i, By::Wildcard));
        }
        slot.any.map(|i| (i, By::Any))
    }
}

/// What a node says besides its key, value and action: names, metrics and
/// the peers' switches, all optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    /// `name`: how replies name the limit (`current_limit.name`), and what
    /// `replaces` of other nodes refer to.
    pub name: Option<String>,
    /// `replaces`: names of limits this node's limit switches off when both
    /// apply in one call.
    pub replaces: Vec<String>,
    /// `share_threshold` (a wildcard node only): every value matching the
    /// wildcard shares one count instead of one count each.
    pub share_threshold: bool,
    /// `detailed_metric`: metrics of the applying node carry the
    /// descriptor's values (bounded in number, see `docs/envoy.md`).
    pub detailed_metric: bool,
    /// `value_to_metric`: metrics carry the value this node matched.
    pub value_to_metric: bool,
    /// `quota_mode`: over its limit, this descriptor makes the call over
    /// only when every quota descriptor of the call is over.
    pub quota_mode: bool,
}

/// One node of a descriptor tree.
///
/// Its fields are read through methods: a node is built once, with the
/// index of its children, and never changed (an index that no longer
/// matched its children would make matching wrong).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub(super) key: String,
    pub(super) value: Option<String>,
    pub(super) wildcard: Option<Wildcard>,
    pub(super) mask: Option<Mask>,
    pub(super) action: Option<Action>,
    pub(super) shadow_mode: Option<bool>,
    pub(super) extras: Extras,
    pub(super) descriptors: Vec<Node>,
    pub(super) id: String,
    pub(super) children: Children,
}

impl Node {
    /// A node; its [`Node::id`] is set when its domain is built
    /// ([`super::EnvoyDomain::new`]). A value with `*` in it is a wildcard.
    /// The parser checks what a node may hold (a mask only without a value,
    /// distinct siblings); where siblings repeat a (key, value), the first
    /// one is matched.
    pub fn new(
        key: String,
        value: Option<String>,
        mask: Option<Mask>,
        action: Option<Action>,
        shadow_mode: Option<bool>,
        descriptors: Vec<Node>,
    ) -> Self {
        let children = Children::of(&descriptors);
        let wildcard = value.as_deref().and_then(Wildcard::of);
        Self {
            key,
            value,
            wildcard,
            mask,
            action,
            shadow_mode,
            extras: Extras::default(),
            descriptors,
            id: String::new(),
            children,
        }
    }

    /// The node with its names, metric and peer switches.
    #[must_use]
    pub fn with_extras(mut self, extras: Extras) -> Self {
        self.extras = extras;
        self
    }

    /// The entry key it matches.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The only value it matches (with `*`, the values matching that
    /// wildcard); `None` matches every value, each its own Charon domain.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// Whether the value is a wildcard.
    pub fn is_wildcard(&self) -> bool {
        self.wildcard.is_some()
    }

    /// How a value-less node reads its value as an IP address.
    pub fn mask(&self) -> Option<Mask> {
        self.mask
    }

    /// What applies when this is the node that applies.
    pub fn action(&self) -> Option<&Action> {
        self.action.as_ref()
    }

    /// Overrides the shadow mode of the nodes above for this subtree.
    pub fn shadow_mode(&self) -> Option<bool> {
        self.shadow_mode
    }

    /// Its name, `replaces`, metric and peer switches.
    pub fn extras(&self) -> &Extras {
        &self.extras
    }

    /// Its children, in configuration order.
    pub fn descriptors(&self) -> &[Node] {
        &self.descriptors
    }

    /// The node's stable name: `envoy/DOMAIN/KEY[=VALUE]/…`, from the
    /// domain and the keys and values on its path (`\`, `/` and `=` in them
    /// escaped with `\`, so different paths never share a name). It is the
    /// resource name of an inline `rate_limit` (what the stores key its
    /// counts by, so reordering the file keeps them) and the node's label
    /// in metrics (bounded by the configuration, never by requests).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn set_ids(&mut self, parent: &str) {
        let mut id = format!("{parent}/");
        super::escape_name(&mut id, &self.key);
        if let Some(v) = &self.value {
            id.push('=');
            super::escape_name(&mut id, v);
        }
        for c in &mut self.descriptors {
            c.set_ids(&id);
        }
        self.id = id;
    }
}

#[cfg(test)]
mod tests {
    use super::Wildcard;

    #[test]
    fn wildcards_match_as_envoyproxy_ratelimit_matches_them() {
        let w = |p: &str| Wildcard::of(p).expect("a wildcard");
        assert!(w("foo*").matches("foo"));
        assert!(w("foo*").matches("foobar"));
        assert!(!w("foo*").matches("fo"));
        assert!(w("*bar").matches("xbar") && !w("*bar").matches("barx"));
        assert!(w("bar*b").matches("barb") && w("bar*b").matches("bar-xyz-b"));
        // The parts may not overlap: "bab" holds "ba" and "ab" only shared.
        assert!(!w("ba*ab").matches("bab"));
        assert!(w("foo*bar*baz").matches("foo-bar-baz"));
        assert!(w("foo*bar*baz").matches("foobarbaz"));
        assert!(!w("foo*bar*baz").matches("foo-baz-bar"));
        assert!(w("*").matches("") && w("*").matches("anything"));
        assert!(w("a**b").matches("ab"));
        assert!(Wildcard::of("plain").is_none());
    }
}
