//! Envoy's rate-limit protocol (SPEC §11): the `envoy:` section of the
//! configuration as a model, and descriptor matching as a pure function.
//!
//! Envoy sends, for one HTTP request, a domain and a list of descriptors,
//! each an ordered list of (key, value) entries built by its rate-limit
//! actions (`remote_address`, a header, a generic key…). The section is a
//! tree per domain; [`Envoy::match_descriptor`] walks it with one
//! descriptor and says what applies: a Charon resource (configured, or the
//! fixed window of an inline `rate_limit`) and the Charon domain to count
//! under, `unlimited`, or nothing. The server then decides with the
//! resource's meter exactly as for `charon.v1`; nothing here reads a store
//! or a clock, so every rule is a unit test.
//!
//! Matching follows envoyproxy/ratelimit so that its users can move their
//! trees over as they are: entries are matched in order, one level of the
//! tree per entry; a node with a `value` matches only that value and is
//! preferred over a value-less node of the same key, which matches any
//! value. Where SPEC §11 differs it wins: the deepest matched node that
//! names an action applies even when the descriptor has more entries than
//! the path matched (envoyproxy/ratelimit applies a limit only when the
//! whole descriptor matched). See `docs/envoy.md`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::ClientError;
use crate::config::Meter;
use crate::meter::{FieldError, Policy};
use crate::time::Millis;
use crate::window::{self, Algorithm};

/// The most domains one `envoy:` section may hold.
pub const MAX_DOMAINS: usize = 10_000;
/// The most descriptor nodes one `envoy:` section may hold, over all its
/// domains: each costs a few hundred bytes of memory, never matching time
/// (children are found by hash lookup).
pub const MAX_NODES: usize = 100_000;
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

/// `unit:` of an inline `rate_limit`: the length of its fixed window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
}

impl Unit {
    /// Every unit as the configuration writes it.
    pub const NAMES: &'static [&'static str] = &["second", "minute", "hour", "day"];

    /// The unit named `name` (one of [`Unit::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "second" => Some(Unit::Second),
            "minute" => Some(Unit::Minute),
            "hour" => Some(Unit::Hour),
            "day" => Some(Unit::Day),
            _ => None,
        }
    }

    /// The name as the configuration writes it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
        }
    }

    /// The window's length. Windows are aligned to the epoch (SPEC §8), so
    /// a day is a UTC day, as in envoyproxy/ratelimit.
    pub fn millis(self) -> Millis {
        match self {
            Unit::Second => 1_000,
            Unit::Minute => 60_000,
            Unit::Hour => 3_600_000,
            Unit::Day => 86_400_000,
        }
    }
}

/// An inline `rate_limit: {unit, requests_per_unit}`: a fixed window of
/// one unit (SPEC §8), built and checked when the configuration is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    unit: Unit,
    requests_per_unit: u64,
    params: window::Params,
}

impl RateLimit {
    /// `requests_per_unit` from 1 to 2^53 − 1 (an error names
    /// `requests_per_unit`).
    pub fn new(unit: Unit, requests_per_unit: u64) -> Result<Self, FieldError> {
        let params = window::Params::new(
            Algorithm::Fixed,
            requests_per_unit,
            unit.millis(),
            Policy::default(),
        )
        .map_err(|e| FieldError {
            field: "requests_per_unit",
            message: e.message,
        })?;
        Ok(Self {
            unit,
            requests_per_unit,
            params,
        })
    }

    /// The window's unit.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// The limit per window.
    pub fn requests_per_unit(&self) -> u64 {
        self.requests_per_unit
    }

    /// The fixed window the stores decide with.
    pub fn meter(&self) -> Meter {
        Meter::Window(self.params)
    }
}

/// `mask: {ipv4, ipv6}` of a value-less node: the request's value is an IP
/// address, and the client is identified by its network of these prefix
/// lengths. The defaults are /32 (one IPv4 address) and /48 (an IPv6 site,
/// what Let's Encrypt limits per subscriber: one customer usually holds a
/// whole /48 or /56, so a /128 would let it rotate addresses for free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask {
    /// The IPv4 prefix length, 0 to 32.
    pub ipv4: u8,
    /// The IPv6 prefix length, 0 to 128.
    pub ipv6: u8,
}

impl Default for Mask {
    fn default() -> Self {
        Self { ipv4: 32, ipv6: 48 }
    }
}

impl Mask {
    /// `addr/prefix` of the network `text` belongs to, or `None` if `text`
    /// is not an IP address. An IPv4-mapped IPv6 address (`::ffff:1.2.3.4`,
    /// what a dual-stack listener reports) is its IPv4 address, so one
    /// client is one key whichever socket it came in on.
    pub fn network(&self, text: &str) -> Option<String> {
        let ip: IpAddr = text.parse().ok()?;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 @ IpAddr::V4(_) => v4,
        };
        Some(match ip {
            IpAddr::V4(a) => {
                let p = u32::from(self.ipv4.min(32));
                let keep = u32::MAX.checked_shl(32 - p).unwrap_or(0);
                format!("{}/{p}", Ipv4Addr::from(u32::from(a) & keep))
            }
            IpAddr::V6(a) => {
                let p = u32::from(self.ipv6.min(128));
                let keep = u128::MAX.checked_shl(128 - p).unwrap_or(0);
                format!("{}/{p}", Ipv6Addr::from(u128::from(a) & keep))
            }
        })
    }
}

/// What a node does when it is the deepest matched node naming one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `resource: NAME`: a rate-like resource of the same configuration.
    Resource(String),
    /// `rate_limit: {unit, requests_per_unit}`: an inline fixed window.
    RateLimit(RateLimit),
    /// `unlimited: true`: never limited (and nothing recorded).
    Unlimited,
}

/// The children of a node (or a domain's top-level nodes), found by key and
/// value in two hash lookups, so matching costs the same however wide the
/// tree is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Children {
    by_key: HashMap<String, Slot>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Slot {
    /// The value-less node of the key.
    any: Option<usize>,
    /// The nodes with a value, by value.
    values: HashMap<String, usize>,
}

impl Children {
    fn of(nodes: &[Node]) -> Self {
        let mut c = Children::default();
        for (i, n) in nodes.iter().enumerate() {
            let slot = c.by_key.entry(n.key.clone()).or_default();
            match &n.value {
                None => {
                    slot.any.get_or_insert(i);
                }
                Some(v) => {
                    slot.values.entry(v.clone()).or_insert(i);
                }
            }
        }
        c
    }

    /// The node matching `(key, value)`: the one with that value, else the
    /// value-less one.
    fn find(&self, key: &str, value: &str) -> Option<usize> {
        let slot = self.by_key.get(key)?;
        slot.values.get(value).copied().or(slot.any)
    }
}

/// One node of a descriptor tree.
#[derive(Debug, Clone, PartialEq, Eq)]
///
/// Its fields are read through methods: a node is built once, with the
/// index of its children, and never changed (an index that no longer
/// matched its children would make matching wrong).
pub struct Node {
    key: String,
    value: Option<String>,
    mask: Option<Mask>,
    action: Option<Action>,
    shadow_mode: Option<bool>,
    descriptors: Vec<Node>,
    id: String,
    children: Children,
}

impl Node {
    /// A node; its [`Node::id`] is set when its domain is built
    /// ([`EnvoyDomain::new`]). The parser checks what a node may hold (a
    /// mask only without a value, distinct siblings); where siblings repeat
    /// a (key, value), the first one is matched.
    pub fn new(
        key: String,
        value: Option<String>,
        mask: Option<Mask>,
        action: Option<Action>,
        shadow_mode: Option<bool>,
        descriptors: Vec<Node>,
    ) -> Self {
        let children = Children::of(&descriptors);
        Self {
            key,
            value,
            mask,
            action,
            shadow_mode,
            descriptors,
            id: String::new(),
            children,
        }
    }

    /// The entry key it matches.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The only value it matches; `None` matches every value, each its own
    /// Charon domain.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// How a value-less node reads its value as an IP address.
    pub fn mask(&self) -> Option<Mask> {
        self.mask
    }

    /// What applies when this is the deepest matched node with an action.
    pub fn action(&self) -> Option<&Action> {
        self.action.as_ref()
    }

    /// Overrides the shadow mode of the nodes above (and of the section)
    /// for this subtree.
    pub fn shadow_mode(&self) -> Option<bool> {
        self.shadow_mode
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

    fn set_ids(&mut self, parent: &str) {
        let mut id = format!("{parent}/");
        escape_name(&mut id, &self.key);
        if let Some(v) = &self.value {
            id.push('=');
            escape_name(&mut id, v);
        }
        for c in &mut self.descriptors {
            c.set_ids(&id);
        }
        self.id = id;
    }
}

/// The descriptor tree of one Envoy domain (`RateLimitRequest.domain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyDomain {
    name: String,
    descriptors: Vec<Node>,
    children: Children,
    same_slot: bool,
}

impl EnvoyDomain {
    /// A domain and its tree; every node's [`Node::id`] is derived here.
    pub fn new(domain: String, mut descriptors: Vec<Node>) -> Self {
        let mut root = format!("{NAMESPACE}/");
        escape_name(&mut root, &domain);
        for n in &mut descriptors {
            n.set_ids(&root);
        }
        let children = Children::of(&descriptors);
        Self {
            name: domain,
            descriptors,
            children,
            same_slot: false,
        }
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
}

/// The `envoy:` section (SPEC §11).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envoy {
    /// Decide and record every descriptor, and always answer OK.
    pub shadow_mode: bool,
    /// Add `RateLimit-*` and `Retry-After` headers to replies.
    pub headers: bool,
    domains: Vec<EnvoyDomain>,
    index: HashMap<String, usize>,
}

/// What applies to one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matched<'a> {
    /// No matched node names an action: the descriptor is not limited
    /// (OK, nothing recorded).
    NotLimited,
    /// The deepest node with an action says `unlimited`.
    Unlimited {
        /// That node (its [`Node::id`] is the metrics label).
        node: &'a Node,
    },
    /// A resource decides.
    Limited(Limit<'a>),
}

/// A resource that decides a descriptor, and under which Charon domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit<'a> {
    /// The deepest matched node with an action.
    pub node: &'a Node,
    /// The Charon resource: the configured one `resource:` names, or the
    /// node's [`Node::id`] for an inline `rate_limit`.
    pub resource: &'a str,
    /// The inline `rate_limit`, whose fixed window decides
    /// ([`RateLimit::meter`]); `None` for a configured resource (resolve it
    /// with [`crate::config::Config::rate_like`]).
    pub rate_limit: Option<RateLimit>,
    /// The values of the entries that matched value-less nodes, masked
    /// where `mask` says, joined by `|` ([`WHOLE_DOMAIN`] when there are
    /// none). In each value `\` and `|` are escaped with `\` and control
    /// characters written `\u{…}`, so different values never share a
    /// domain; an invalid address also has its `/` escaped, so it never
    /// shares one with a network.
    pub domain: String,
    /// Decide and record, but answer OK: the section's `shadow_mode`, else
    /// the nearest `shadow_mode` on the path.
    pub shadow: bool,
    /// How many masked values were not IP addresses (each counted by its
    /// literal text instead; the server counts these in a metric).
    pub invalid_addresses: usize,
}

impl Envoy {
    /// The section; domain names must be distinct (the parser says where a
    /// name repeats; here the first one is kept).
    pub fn new(shadow_mode: bool, headers: bool, domains: Vec<EnvoyDomain>) -> Self {
        let mut index = HashMap::new();
        for (i, d) in domains.iter().enumerate() {
            index.entry(d.name.clone()).or_insert(i);
        }
        Self {
            shadow_mode,
            headers,
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

    /// What applies to one request descriptor of `domain` (SPEC §11). A
    /// malformed descriptor (no entries, more than [`MAX_ENTRIES`], an
    /// empty or too long key or value) or one whose Charon domain would be
    /// longer than [`MAX_DOMAIN_BYTES`] is a client error naming the
    /// bound, as is an unknown domain: Envoy sent a name the configuration
    /// does not have, and answering OK would hide that every limit of it is
    /// off. A value that is not an IP address where a mask expects one is
    /// never an error (see [`Limit::invalid_addresses`]).
    pub fn match_descriptor(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
    ) -> Result<Matched<'_>, ClientError> {
        check_entries(entries)?;
        let Some(tree) = self.domain(domain) else {
            return Err(ClientError::invalid(format!(
                "unknown Envoy domain {:?}: the configuration's envoy.domains does not name it",
                shorten(domain)
            )));
        };
        self.walk(tree, entries)
    }

    fn walk<'a>(
        &'a self,
        tree: &'a EnvoyDomain,
        entries: &[(&str, &str)],
    ) -> Result<Matched<'a>, ClientError> {
        let mut path: Vec<&Node> = Vec::with_capacity(entries.len());
        let mut children = &tree.children;
        let mut level = tree.descriptors.as_slice();
        let mut deepest = None;
        for &(key, value) in entries {
            let Some(i) = children.find(key, value) else {
                break;
            };
            let node = &level[i];
            path.push(node);
            if node.action.is_some() {
                deepest = Some(path.len());
            }
            children = &node.children;
            level = &node.descriptors;
        }
        let Some(depth) = deepest else {
            return Ok(Matched::NotLimited);
        };
        let path = &path[..depth];
        let node = path[depth - 1];
        let (resource, rate_limit) = match &node.action {
            Some(Action::Resource(r)) => (r.as_str(), None),
            Some(Action::RateLimit(l)) => (node.id(), Some(*l)),
            Some(Action::Unlimited) | None => return Ok(Matched::Unlimited { node }),
        };
        let mut domain = String::new();
        let mut invalid_addresses = 0;
        let mut parts = 0;
        for (n, &(_, value)) in path.iter().zip(entries) {
            if n.value.is_some() {
                continue;
            }
            if parts > 0 {
                domain.push('|');
            }
            parts += 1;
            match n.mask.map(|m| m.network(value)) {
                Some(Some(net)) => escape_part(&mut domain, &net, false),
                Some(None) => {
                    invalid_addresses += 1;
                    escape_part(&mut domain, value, true);
                }
                None => escape_part(&mut domain, value, false),
            }
            if domain.len() > MAX_DOMAIN_BYTES {
                break;
            }
        }
        if parts == 0 {
            domain.push_str(WHOLE_DOMAIN);
        }
        if domain.len() > MAX_DOMAIN_BYTES {
            return Err(ClientError::invalid(format!(
                "the Charon domain built from this descriptor's values is longer than \
                 {MAX_DOMAIN_BYTES} bytes, the most a domain may be"
            )));
        }
        let shadow = self.shadow_mode
            || path
                .iter()
                .rev()
                .find_map(|n| n.shadow_mode)
                .unwrap_or(false);
        Ok(Matched::Limited(Limit {
            node,
            resource,
            rate_limit,
            domain,
            shadow,
            invalid_addresses,
        }))
    }
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
fn escape_part(out: &mut String, value: &str, slash: bool) {
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
