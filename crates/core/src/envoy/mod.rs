//! Envoy's rate-limit protocol (SPEC §11): the `envoy:` section of the
//! configuration as a model, and descriptor matching as a pure function.
//!
//! Envoy sends, for one HTTP request, a domain and a list of descriptors,
//! each an ordered list of (key, value) entries built by its rate-limit
//! actions (`remote_address`, a header, a generic key…). The section is a
//! tree per domain; [`Envoy::match_descriptor`] walks it with one
//! descriptor and says what applies: a Charon resource (configured, or an
//! inline `rate_limit`) and the Charon domain to count under, `unlimited`,
//! or nothing. A domain may also list `limits:` the way Limitador writes
//! them (conditions and variables over every descriptor of the call);
//! [`Envoy::plan`] gives everything a whole call checks. The server then
//! decides with the resources' meters exactly as for `charon.v1`; nothing
//! here reads a store or a clock, so every rule is a unit test.
//!
//! Matching follows envoyproxy/ratelimit so that its users can move their
//! trees over as they are: entries are matched in order, one level of the
//! tree per entry; a node with a `value` matches only that value (with
//! `*`, the values matching that wildcard) and is preferred over a
//! value-less node of the same key, which matches any value. Which node
//! applies is the section's `match:` — `deepest` (SPEC §11: the deepest
//! matched node that names an action, even when the descriptor has more
//! entries than the path matched) or `whole` (envoyproxy/ratelimit's: the
//! node of the descriptor's last entry, if every entry matched). See
//! `docs/envoy.md`.

mod call;
mod inline;
mod limits;
mod node;
pub(crate) mod parse;
pub(crate) mod render;
mod settings;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use crate::ClientError;

pub use call::{CallPlan, Check, Status};
pub use inline::{Inline, Mask, Per, RateLimit, Unit, Windows};
pub use limits::{Compare, Condition, LimitRule, Variable};
pub use node::{Action, Extras, Node, Wildcard};
pub use settings::{
    DescriptorLimits, HeaderNames, Headers, MatchMode, Record, Settings, UnknownDomain,
};

use node::{By, Children};

/// The most domains one `envoy:` section may hold.
pub const MAX_DOMAINS: usize = 10_000;
/// The most descriptor nodes one `envoy:` section may hold, over all its
/// domains (limits of `limits:` lists count as nodes): each costs a few
/// hundred bytes of memory, never matching time (children are found by
/// hash lookup).
pub const MAX_NODES: usize = 100_000;
/// The most `limits:` one domain may list: every call of the domain
/// evaluates each of them.
pub const MAX_LIMITS: usize = 1_000;
/// The most conditions or variables one limit may have.
pub const MAX_TERMS: usize = 64;
/// The deepest a descriptor tree may be (a top-level node is at depth 1).
/// Envoy's descriptors have a handful of entries; the bound keeps one file
/// from making the parser, the renderer and every node's name deep.
pub const MAX_DEPTH: usize = 16;
/// The longest key, in bytes, of a node or of a request entry. Keys are
/// names from Envoy's configuration (`remote_address`, `tenant`).
pub const MAX_KEY_BYTES: usize = 256;
/// The longest value, in bytes, of a node or of a request entry: the
/// longest Charon domain (SPEC §1), so that one value always fits one.
pub const MAX_VALUE_BYTES: usize = 1024;
/// The most entries one request descriptor may have. Entries beyond the
/// tree's depth never match; a descriptor far longer is a broken client.
pub const MAX_ENTRIES: usize = 64;
/// The longest Charon domain a match may build (SPEC §1's bound on names).
pub const MAX_DOMAIN_BYTES: usize = 1024;
/// The Charon domain of a match whose path has no value-less node (every
/// request that matches it counts together): SPEC §1 domains are never
/// empty.
pub const WHOLE_DOMAIN: &str = "*";
/// The namespace of the resource names [`Node::id`] derives, so an inline
/// `rate_limit` is keyed by the stores like any resource (and
/// `namespaces: { envoy: … }` applies to them).
pub const NAMESPACE: &str = "envoy";

/// The descriptor tree and the limits of one Envoy domain
/// (`RateLimitRequest.domain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyDomain {
    name: String,
    descriptors: Vec<Node>,
    children: Children,
    limits: Vec<LimitRule>,
    same_slot: bool,
}

impl EnvoyDomain {
    /// A domain and its tree; every node's [`Node::id`] is derived here.
    pub fn new(domain: String, mut descriptors: Vec<Node>) -> Self {
        for n in &mut descriptors {
            n.set_ids(&Self::root(&domain));
        }
        let children = Children::of(&descriptors);
        Self {
            name: domain,
            descriptors,
            children,
            limits: Vec::new(),
            same_slot: false,
        }
    }

    fn root(domain: &str) -> String {
        let mut root = format!("{NAMESPACE}/");
        escape_name(&mut root, domain);
        root
    }

    /// The domain with Limitador's kind of limits (see [`LimitRule`]);
    /// every limit's [`LimitRule::id`] is derived here.
    #[must_use]
    pub fn with_limits(mut self, mut limits: Vec<LimitRule>) -> Self {
        let root = Self::root(&self.name);
        for l in &mut limits {
            l.set_id(&root);
        }
        self.limits = limits;
        self
    }

    /// The domain with `same_slot` set: every count a call of this domain
    /// touches is kept under one Redis hash tag (the domain's), so that one
    /// all-or-nothing batch is one script on one Redis Cluster slot even
    /// when its descriptors name different resources. The price is that
    /// those counts are the domain's own: a resource it names is counted
    /// apart from the same resource used by `charon.v1` or another domain
    /// (in both stores, so they decide alike).
    #[must_use]
    pub fn with_same_slot(mut self, same_slot: bool) -> Self {
        self.same_slot = same_slot;
        self
    }

    /// Whether the domain keeps its counts in one slot
    /// ([`EnvoyDomain::with_same_slot`]).
    pub fn same_slot(&self) -> bool {
        self.same_slot
    }

    /// The name Envoy sends.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The top-level nodes, in configuration order.
    pub fn descriptors(&self) -> &[Node] {
        &self.descriptors
    }

    /// The `limits:`, in configuration order.
    pub fn limits(&self) -> &[LimitRule] {
        &self.limits
    }
}

/// The `envoy:` section (SPEC §11).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envoy {
    /// How calls are decided and answered.
    pub settings: Settings,
    domains: Vec<EnvoyDomain>,
    index: HashMap<String, usize>,
}

/// What applies to one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matched<'a> {
    /// No node that applies names an action: the descriptor is not
    /// limited (OK, nothing recorded).
    NotLimited,
    /// The node that applies says `unlimited`.
    Unlimited {
        /// That node (its [`Node::id`] is the metrics label).
        node: &'a Node,
    },
    /// A resource decides.
    Limited(Box<Limit<'a>>),
}

/// A resource that decides a descriptor (or a call, for a limit of a
/// `limits:` list), and under which Charon domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit<'a> {
    /// The applying node's [`Node::id`] or the limit's [`LimitRule::id`]:
    /// its label in metrics.
    pub label: &'a str,
    /// The Charon resource: the configured one `resource:` names, or the
    /// label for an inline `rate_limit` (a name of its own for a
    /// descriptor's `limit` override).
    pub resource: Cow<'a, str>,
    /// The inline `rate_limit` ([`RateLimit::decider`]); `None` for a
    /// configured resource (resolve it with
    /// [`crate::config::Config::rate_like`]).
    pub rate_limit: Option<RateLimit>,
    /// The values of the entries that matched value-less and wildcard
    /// nodes (or of the limit's variables), masked where `mask` says,
    /// joined by `|` ([`WHOLE_DOMAIN`] when there are none). In each value
    /// `\` and `|` are escaped with `\` and control characters written
    /// `\u{…}`, so different values never share a domain; an invalid
    /// address also has its `/` escaped, so it never shares one with a
    /// network. A wildcard node with `share_threshold` gives its pattern
    /// (its `*` escaped), so every value it matches shares one count.
    pub domain: String,
    /// Decide and record, but answer OK: the nearest `shadow_mode` on the
    /// path (the section's own `shadow_mode` is the server's to apply: it
    /// keeps each descriptor's status and answers the call OK).
    pub shadow: bool,
    /// `quota_mode` of the applying node.
    pub quota: bool,
    /// The applying node's (or limit's) `name`.
    pub name: Option<&'a str>,
    /// Its `replaces`.
    pub replaces: &'a [String],
    /// The metrics label with the descriptor's values
    /// (`detailed_metric`, `value_to_metric`); `None` to use `label`.
    pub detail: Option<String>,
    /// How many masked values were not IP addresses (each counted by its
    /// literal text instead; the server counts these in a metric).
    pub invalid_addresses: usize,
}

impl Envoy {
    /// The section; domain names must be distinct (the parser says where a
    /// name repeats; here the first one is kept).
    pub fn new(settings: Settings, domains: Vec<EnvoyDomain>) -> Self {
        let mut index = HashMap::new();
        for (i, d) in domains.iter().enumerate() {
            index.entry(d.name.clone()).or_insert(i);
        }
        Self {
            settings,
            domains,
            index,
        }
    }

    /// The domains, in configuration order.
    pub fn domains(&self) -> &[EnvoyDomain] {
        &self.domains
    }

    /// The tree of `domain`, if configured.
    pub fn domain(&self, domain: &str) -> Option<&EnvoyDomain> {
        self.index.get(domain).map(|&i| &self.domains[i])
    }

    /// What applies to one request descriptor of `domain` (SPEC §11),
    /// matched by the section's `match:`. A malformed descriptor (no
    /// entries, more than [`MAX_ENTRIES`], an empty or too long key or
    /// value) or one whose Charon domain would be longer than
    /// [`MAX_DOMAIN_BYTES`] is a client error naming the bound, as is an
    /// unknown domain here (what a call to one answers is the section's
    /// `unknown_domain:`, see [`Envoy::plan`]). A value that is not an IP
    /// address where a mask expects one is never an error (see
    /// [`Limit::invalid_addresses`]).
    pub fn match_descriptor(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
    ) -> Result<Matched<'_>, ClientError> {
        check_entries(entries)?;
        let Some(tree) = self.domain(domain) else {
            return Err(unknown_domain(domain));
        };
        self.walk(tree, entries)
    }

    fn walk<'a>(
        &'a self,
        tree: &'a EnvoyDomain,
        entries: &[(&str, &str)],
    ) -> Result<Matched<'a>, ClientError> {
        let mut path: Vec<(&Node, By)> = Vec::with_capacity(entries.len());
        let mut children = &tree.children;
        let mut level = tree.descriptors.as_slice();
        let mut deepest = None;
        for &(key, value) in entries {
            let Some((i, by)) = children.find(level, key, value) else {
                break;
            };
            let node = &level[i];
            path.push((node, by));
            if node.action.is_some() {
                deepest = Some(path.len());
            }
            children = &node.children;
            level = &node.descriptors;
        }
        let depth = match self.settings.matching {
            MatchMode::Deepest => deepest,
            // envoyproxy/ratelimit: the node of the last entry, if every
            // entry matched one.
            MatchMode::Whole => {
                Some(path.len()).filter(|&n| n == entries.len() && path[n - 1].0.action.is_some())
            }
        };
        let Some(depth) = depth else {
            return Ok(Matched::NotLimited);
        };
        let path = &path[..depth];
        let node = path[depth - 1].0;
        let (resource, rate_limit) = match &node.action {
            Some(Action::Resource(r)) => (r.as_str(), None),
            Some(Action::RateLimit(l)) => (node.id(), Some(*l)),
            Some(Action::Unlimited) | None => return Ok(Matched::Unlimited { node }),
        };
        let mut domain = DomainBuilder::default();
        for (&(n, by), &(_, value)) in path.iter().zip(entries) {
            match by {
                By::Value => {}
                By::Wildcard if n.extras.share_threshold => domain.pattern(n.value().unwrap_or("")),
                By::Wildcard => domain.value(value, None),
                By::Any => domain.value(value, n.mask),
            }
        }
        let invalid_addresses = domain.invalid;
        let domain = domain.finish()?;
        let shadow = path
            .iter()
            .rev()
            .find_map(|(n, _)| n.shadow_mode)
            .unwrap_or(false);
        Ok(Matched::Limited(Box::new(Limit {
            label: node.id(),
            resource: Cow::Borrowed(resource),
            rate_limit,
            domain,
            shadow,
            quota: node.extras.quota_mode,
            name: node.extras.name.as_deref(),
            replaces: &node.extras.replaces,
            detail: detail(tree, path, entries, node),
            invalid_addresses,
        })))
    }
}

/// The metrics label of a match with `detailed_metric` (every entry's
/// value) or `value_to_metric` (the values of the nodes that ask): the
/// node's path with the values written in, as envoyproxy/ratelimit's
/// stats keys have them. `None` when neither applies.
fn detail(
    tree: &EnvoyDomain,
    path: &[(&Node, By)],
    entries: &[(&str, &str)],
    node: &Node,
) -> Option<String> {
    let detailed = node.extras.detailed_metric;
    if !detailed && !path.iter().any(|(n, _)| n.extras.value_to_metric) {
        return None;
    }
    let mut label = EnvoyDomain::root(&tree.name);
    for (&(n, by), &(key, value)) in path.iter().zip(entries) {
        label.push('/');
        escape_name(&mut label, key);
        let shown = match by {
            By::Wildcard if n.extras.share_threshold => n.value(),
            By::Value => Some(value),
            _ if detailed || n.extras.value_to_metric => Some(value),
            By::Wildcard => n.value(),
            By::Any => None,
        };
        if let Some(v) = shown {
            label.push('=');
            escape_name(&mut label, v);
        }
    }
    Some(label)
}

/// Builds a Charon domain from the values of a match.
#[derive(Default)]
struct DomainBuilder {
    text: String,
    parts: usize,
    invalid: usize,
}

impl DomainBuilder {
    fn sep(&mut self) {
        if self.parts > 0 {
            self.text.push('|');
        }
        self.parts += 1;
    }

    /// A value, as its network where `mask` says.
    fn value(&mut self, value: &str, mask: Option<Mask>) {
        if self.text.len() > MAX_DOMAIN_BYTES {
            return;
        }
        self.sep();
        match mask.map(|m| m.network(value)) {
            Some(Some(net)) => escape_part(&mut self.text, &net, false),
            Some(None) => {
                self.invalid += 1;
                escape_part(&mut self.text, value, true);
            }
            None => escape_part(&mut self.text, value, false),
        }
    }

    /// A `share_threshold` wildcard: its pattern, `*` escaped (a value
    /// never writes an unescaped `\*`, so no value shares its count).
    fn pattern(&mut self, pattern: &str) {
        if self.text.len() > MAX_DOMAIN_BYTES {
            return;
        }
        self.sep();
        for part in pattern.split('*').enumerate() {
            if part.0 > 0 {
                self.text.push_str("\\*");
            }
            escape_part(&mut self.text, part.1, false);
        }
    }

    fn finish(mut self) -> Result<String, ClientError> {
        if self.parts == 0 {
            self.text.push_str(WHOLE_DOMAIN);
        }
        if self.text.len() > MAX_DOMAIN_BYTES {
            return Err(ClientError::invalid(format!(
                "the Charon domain built from this descriptor's values is longer than \
                 {MAX_DOMAIN_BYTES} bytes, the most a domain may be"
            )));
        }
        Ok(self.text)
    }
}

/// The client error of a call to a domain the section does not name.
pub fn unknown_domain(domain: &str) -> ClientError {
    ClientError::invalid(format!(
        "unknown Envoy domain {:?}: the configuration's envoy.domains does not name it",
        shorten(domain)
    ))
}

/// Checks one request descriptor against the bounds: at least one entry,
/// at most [`MAX_ENTRIES`], keys of 1 to [`MAX_KEY_BYTES`] bytes, values of
/// 1 to [`MAX_VALUE_BYTES`] bytes. Messages name the entry
/// (`entries[2].value must not be empty`), for the server to prefix with
/// the descriptor.
pub fn check_entries(entries: &[(&str, &str)]) -> Result<(), ClientError> {
    if entries.is_empty() {
        return Err(ClientError::invalid(
            "a descriptor needs at least one entry",
        ));
    }
    if entries.len() > MAX_ENTRIES {
        return Err(ClientError::invalid(format!(
            "{} entries in one descriptor, at most {MAX_ENTRIES}",
            entries.len()
        )));
    }
    for (i, &(key, value)) in entries.iter().enumerate() {
        for (field, text, max) in [
            ("key", key, MAX_KEY_BYTES),
            ("value", value, MAX_VALUE_BYTES),
        ] {
            if text.is_empty() {
                return Err(ClientError::invalid(format!(
                    "entries[{i}].{field} must not be empty"
                )));
            }
            if text.len() > max {
                return Err(ClientError::invalid(format!(
                    "entries[{i}].{field} is {} bytes long; at most {max} are allowed",
                    text.len()
                )));
            }
        }
    }
    Ok(())
}

/// The first 64 characters of a name from a request, for a message.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// Appends one value of a Charon domain: `\` and `|` escaped with `\`
/// (and `/` too for an invalid address), control characters as `\u{…}`.
pub(crate) fn escape_part(out: &mut String, value: &str, slash: bool) {
    for c in value.chars() {
        match c {
            '\\' | '|' => {
                out.push('\\');
                out.push(c);
            }
            '/' if slash => out.push_str("\\/"),
            c if c.is_control() => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
}

/// Appends a domain, key or value to a node name: `\`, `/` and `=`
/// escaped with `\` (they have no control characters: the parser refuses
/// them).
fn escape_name(out: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '\\' | '/' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
}

#[cfg(test)]
mod tests;
