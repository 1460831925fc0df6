//! The configuration model of SPEC §6, its validation (SPEC §6, with field
//! paths), normalization (SPEC §2) and namespace resolution (SPEC §4).
//!
//! A [`Config`] can only be built through [`Config::from_yaml`],
//! [`Config::from_value`] or [`Config::new`], all of which validate and
//! normalize, so every `Config` in the program is one the limiter may use.

mod normalize;
mod parse;
mod render;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::LazyLock;

use crate::time::{Millis, SECOND};
use crate::{ClientError, UNBOUNDED};

pub use normalize::{Adjustment, normalize_tiers};
pub use parse::{parse_namespace, parse_resource};

/// Bounds on the size of a configuration, checked by [`Config::from_yaml`],
/// [`Config::from_value`] and [`parse_resource`] alike, so a file, the
/// config API and the embedded API refuse the same documents. Each is far
/// above what a real deployment writes and far below what makes one
/// document cost a server hundreds of megabytes: a write of a resource with
/// 100 000 tiers used to add about 200 MB of RSS to every process that
/// loaded it. A list over its bound is refused before its items are read,
/// with the path and the bound: `resources[0].tiers: 100000 tiers, at most
/// 64`. Names are bounded separately (1024 bytes, SPEC §1).
///
/// The most resources one configuration may hold: a thousand services
/// with a hundred limits each.
pub const MAX_RESOURCES: usize = 100_000;
/// The most tiers one tier list may hold (a resource's, or an override's).
/// The paper's examples use two or three; each tier is a sliding window
/// every decision walks.
pub const MAX_TIERS: usize = 64;
/// The most per-domain overrides one resource may hold. Domains without an
/// override share the resource's limits; a per-domain table larger than
/// this belongs in several resources or namespaces.
pub const MAX_DOMAIN_OVERRIDES: usize = 10_000;
/// The most tiers one rate resource may hold in all, its own and its
/// overrides' together (10 000 overrides of 64 tiers would be 640 000).
pub const MAX_TIERS_PER_RESOURCE: usize = 100_000;
/// The most groups (bulkheads) one copy resource may hold.
pub const MAX_GROUPS: usize = 1_000;
/// The most group memberships one copy resource may hold, over all its
/// groups (a domain in three groups counts three times).
pub const MAX_GROUP_MEMBERS: usize = 10_000;
/// The most namespaces with settings one configuration may hold.
pub const MAX_NAMESPACES: usize = 10_000;

/// What an empty document (no bytes, only whitespace or comments) is told.
pub const EMPTY_CONFIGURATION: &str =
    "the configuration is empty; write `resources: []` to mean no resources";

/// One burst tier `(L, Tw, Ta, Tc, S)` of SPEC §2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    /// L: the most hits its window may hold.
    pub limit: u64,
    /// Tw: the span of its sliding window, at least 1 ms.
    pub window: Millis,
    /// Ta: how long the tier stays active once entered; `None` is infinite.
    pub active: Option<Millis>,
    /// Tc: how long it cannot be entered after its active period.
    pub cooldown: Millis,
    /// S: whether a burst search may skip it while it is in cooldown (or has
    /// a limit of zero).
    pub skippable: bool,
}

/// The limits that decide one (rate-limited resource, domain) pair: the
/// resource's H and G, and the tiers of the domain's override if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits<'a> {
    /// H: most hits per domain in the last second.
    pub hard_limit: Option<u64>,
    /// G: most hits across all domains in the last second.
    pub global_limit: Option<u64>,
    /// The ordered tiers; tier `i` (one-indexed) is `tiers[i - 1]`.
    pub tiers: &'a [Tier],
}

/// A domain-specific override of a rate-limited resource.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RateOverride {
    /// Replaces the resource's H when set.
    pub hard_limit: Option<u64>,
    /// Replaces the whole tier list when set (an empty list makes the
    /// resource inaccessible to the domain).
    pub tiers: Option<Vec<Tier>>,
}

/// A rate-limited resource (SPEC §2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RateResource {
    pub hard_limit: Option<u64>,
    pub global_limit: Option<u64>,
    pub tiers: Vec<Tier>,
    pub domains: BTreeMap<String, RateOverride>,
}

impl RateResource {
    /// The limits that apply to `domain`.
    pub fn limits_for(&self, domain: &str) -> RateLimits<'_> {
        match self.domains.get(domain) {
            None => RateLimits {
                hard_limit: self.hard_limit,
                global_limit: self.global_limit,
                tiers: &self.tiers,
            },
            Some(o) => RateLimits {
                hard_limit: o.hard_limit.or(self.hard_limit),
                global_limit: self.global_limit,
                tiers: o.tiers.as_deref().unwrap_or(&self.tiers),
            },
        }
    }
}

/// A domain group of a copy-limited resource: a bulkhead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub limit: u64,
    pub domains: Vec<String>,
}

/// A copy-limited resource (SPEC §3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CopyResource {
    pub domain_limit: u64,
    pub global_limit: Option<u64>,
    /// Per-domain overrides of `domain_limit`.
    pub domains: BTreeMap<String, u64>,
    pub groups: Vec<Group>,
    /// domain → indexes into `groups`, built on load.
    membership: HashMap<String, Vec<usize>>,
}

/// A group as a reserve sees it: its name and limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLimit {
    pub name: String,
    pub limit: u64,
}

/// The limits that decide a reserve for one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyLimits {
    pub domain_limit: u64,
    pub global_limit: Option<u64>,
    /// Every group that contains the domain, in configuration order.
    pub groups: Vec<GroupLimit>,
}

impl CopyResource {
    /// Builds a copy resource and its membership index.
    pub fn new(
        domain_limit: u64,
        global_limit: Option<u64>,
        domains: BTreeMap<String, u64>,
        groups: Vec<Group>,
    ) -> Self {
        let mut r = Self {
            domain_limit,
            global_limit,
            domains,
            groups,
            membership: HashMap::new(),
        };
        r.reindex();
        r
    }

    fn reindex(&mut self) {
        self.membership.clear();
        for (i, g) in self.groups.iter().enumerate() {
            for d in &g.domains {
                let v = self.membership.entry(d.clone()).or_default();
                if !v.contains(&i) {
                    v.push(i);
                }
            }
        }
    }

    /// The limits that apply to `domain`, with the groups it belongs to now.
    pub fn limits_for(&self, domain: &str) -> CopyLimits {
        let groups = self
            .membership
            .get(domain)
            .map(|ix| {
                ix.iter()
                    .map(|&i| GroupLimit {
                        name: self.groups[i].name.clone(),
                        limit: self.groups[i].limit,
                    })
                    .collect()
            })
            .unwrap_or_default();
        CopyLimits {
            domain_limit: self
                .domains
                .get(domain)
                .copied()
                .unwrap_or(self.domain_limit),
            global_limit: self.global_limit,
            groups,
        }
    }
}

/// What a resource limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceKind {
    Rate(RateResource),
    Copy(CopyResource),
}

impl ResourceKind {
    /// `"rate"` or `"copy"`, as in the configuration file.
    pub fn name(&self) -> &'static str {
        match self {
            ResourceKind::Rate(_) => "rate",
            ResourceKind::Copy(_) => "copy",
        }
    }
}

/// A configured resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    pub kind: ResourceKind,
}

/// Per-namespace switches of SPEC §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NamespaceSettings {
    /// Grant every request in the namespace (accesses are still recorded).
    pub ignore_configured: bool,
    /// Unknown resources behave as the most permissive configuration.
    pub allow_unconfigured: bool,
}

/// Whether limits are enforced for a request (SPEC §4 `ignore_configured`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Enforce,
    /// Grant everything asked for, but record the accesses.
    Ignore,
}

/// The namespace of a resource name: the text before the first `/`, or
/// `default` for a name without one (SPEC §1).
pub fn namespace_of(resource: &str) -> &str {
    resource.split_once('/').map_or("default", |(ns, _)| ns)
}

/// The most permissive rate configuration (SPEC §4): no H, no G, one tier of
/// unbounded limit that never ends.
pub static PERMISSIVE_RATE: LazyLock<RateResource> = LazyLock::new(|| RateResource {
    hard_limit: None,
    global_limit: None,
    tiers: vec![Tier {
        limit: UNBOUNDED,
        window: SECOND,
        active: None,
        cooldown: 0,
        skippable: false,
    }],
    domains: BTreeMap::new(),
});

/// The most permissive copy configuration: no limit at all.
pub static PERMISSIVE_COPY: LazyLock<CopyResource> =
    LazyLock::new(|| CopyResource::new(UNBOUNDED, None, BTreeMap::new(), Vec::new()));

/// A validated, normalized configuration: what one limiting server enforces.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    namespaces: BTreeMap<String, NamespaceSettings>,
    resources: Vec<Resource>,
    index: HashMap<String, usize>,
}

/// One problem found in a configuration, with the exact place.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConfigIssue {
    /// Where: `resources[1].tiers[0].window`.
    pub path: String,
    /// What: `"1x" is not a duration`.
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a configuration (never just the first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigIssue>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{issue}")?;
        }
        Ok(())
    }
}

impl Config {
    /// Builds a configuration from parts, validating names and applying the
    /// normalization of SPEC §2. Returns what normalization changed.
    pub fn new(
        namespaces: BTreeMap<String, NamespaceSettings>,
        resources: Vec<Resource>,
    ) -> Result<(Self, Vec<Adjustment>), ConfigErrors> {
        let mut issues = Vec::new();
        let mut index = HashMap::new();
        for (i, r) in resources.iter().enumerate() {
            if let Some(first) = index.insert(r.name.clone(), i) {
                issues.push(ConfigIssue {
                    path: format!("resources[{i}].name"),
                    message: format!(
                        "duplicate resource {:?} (first at resources[{first}])",
                        r.name
                    ),
                });
            }
        }
        if !issues.is_empty() {
            return Err(ConfigErrors(issues));
        }
        let mut config = Self {
            namespaces,
            resources,
            index,
        };
        let adjustments = normalize::normalize(&mut config.resources);
        for r in &mut config.resources {
            if let ResourceKind::Copy(c) = &mut r.kind {
                c.reindex();
            }
        }
        Ok((config, adjustments))
    }

    /// Parses, validates and normalizes the YAML of SPEC §6.
    pub fn from_yaml(text: &str) -> Result<(Self, Vec<Adjustment>), ConfigErrors> {
        let value: serde_json::Value = match serde_saphyr::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return Err(ConfigErrors(vec![ConfigIssue {
                    path: String::new(),
                    message: format!("not valid YAML: {e}"),
                }]));
            }
        };
        Self::from_value(&value)
    }

    /// Validates and normalizes a configuration already parsed into a JSON
    /// value (the config API's import format is the same as the file's).
    pub fn from_value(value: &serde_json::Value) -> Result<(Self, Vec<Adjustment>), ConfigErrors> {
        let (namespaces, resources) = parse::parse_config(value)?;
        Self::new(namespaces, resources)
    }

    /// The configuration as the YAML of SPEC §6, normalized.
    pub fn to_yaml(&self) -> String {
        render::to_yaml(&render::config_value(self))
    }

    /// The configuration as a JSON value in the SPEC §6 layout.
    pub fn to_value(&self) -> serde_json::Value {
        render::config_value(self)
    }

    /// Namespace switches in force, by namespace name.
    pub fn namespaces(&self) -> &BTreeMap<String, NamespaceSettings> {
        &self.namespaces
    }

    /// Resources in configuration order.
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// A configured resource by exact name.
    pub fn resource(&self, name: &str) -> Option<&Resource> {
        self.index.get(name).map(|&i| &self.resources[i])
    }

    /// The switches of `namespace` (all off if it is not configured).
    pub fn namespace(&self, namespace: &str) -> NamespaceSettings {
        self.namespaces.get(namespace).copied().unwrap_or_default()
    }

    /// Resolves a rate-limited resource for `request` (SPEC §4): its
    /// configuration, the permissive one for an unknown resource in a
    /// namespace that allows it, or a client error.
    pub fn rate(&self, resource: &str) -> Result<(&RateResource, Enforcement), ClientError> {
        let ns = self.namespace(namespace_of(resource));
        let enforcement = enforcement(ns);
        match self.resource(resource) {
            Some(Resource {
                kind: ResourceKind::Rate(r),
                ..
            }) => Ok((r, enforcement)),
            Some(r) => Err(wrong_kind(resource, "request", "rate", r.kind.name())),
            None if ns.allow_unconfigured => Ok((&PERMISSIVE_RATE, enforcement)),
            None => Err(ClientError::UnknownResource(resource.to_owned())),
        }
    }

    /// Resolves a copy-limited resource for `operation` (reserve, release,
    /// transfer), like [`Config::rate`].
    pub fn copy(
        &self,
        resource: &str,
        operation: &'static str,
    ) -> Result<(&CopyResource, Enforcement), ClientError> {
        let ns = self.namespace(namespace_of(resource));
        let enforcement = enforcement(ns);
        match self.resource(resource) {
            Some(Resource {
                kind: ResourceKind::Copy(r),
                ..
            }) => Ok((r, enforcement)),
            Some(r) => Err(wrong_kind(resource, operation, "copy", r.kind.name())),
            None if ns.allow_unconfigured => Ok((&PERMISSIVE_COPY, enforcement)),
            None => Err(ClientError::UnknownResource(resource.to_owned())),
        }
    }
}

fn enforcement(ns: NamespaceSettings) -> Enforcement {
    if ns.ignore_configured {
        Enforcement::Ignore
    } else {
        Enforcement::Enforce
    }
}

fn wrong_kind(
    resource: &str,
    operation: &'static str,
    expected: &'static str,
    actual: &'static str,
) -> ClientError {
    ClientError::WrongKind {
        resource: resource.to_owned(),
        operation,
        expected,
        actual,
    }
}

#[cfg(test)]
mod tests;
