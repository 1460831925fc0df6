//! The configuration model of SPEC §6, its validation (SPEC §6, with field
//! paths), normalization (SPEC §2) and namespace resolution (SPEC §4).
//!
//! A [`Config`] can only be built through [`Config::from_yaml`],
//! [`Config::from_value`] or [`Config::new`], all of which validate and
//! normalize, so every `Config` in the program is one the limiter may use.

mod envoy_refs;
mod lease;
mod meter;
mod normalize;
pub(crate) mod parse;
mod render;

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use crate::envoy::Envoy;
use crate::fields::Path;
pub use crate::fields::{ConfigErrors, ConfigIssue};
pub use crate::limits::{CopyLimits, Enforcement, GroupLimit, RateLimits, Tier};
pub use crate::meter::Meter;
use crate::meter::Policy;
use crate::time::SECOND;
use crate::{ClientError, UNBOUNDED};

use envoy_refs::{check_action, check_node};
pub use lease::LeaseResource;
pub use meter::{
    BucketFields, BucketResource, MeterError, MeterFields, MeterOverride, MeterResource, MeterSpec,
    QueueFields, QueueResource, WindowFields, WindowResource,
};
pub use normalize::{Adjustment, normalize_tiers};
pub use parse::{parse_envoy, parse_namespace, parse_resource, parse_soft_limit, resource_fields};

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

/// A domain-specific override of a rate-limited resource.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RateOverride {
    /// Replaces the resource's H when set.
    pub hard_limit: Option<u64>,
    /// Replaces the whole tier list when set (an empty list makes the
    /// resource inaccessible to the domain).
    pub tiers: Option<Vec<Tier>>,
    /// Replaces the resource's `soft_limit` and `ban`, each where set.
    pub policy: Policy,
}

/// A rate-limited resource (SPEC §2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RateResource {
    pub hard_limit: Option<u64>,
    pub global_limit: Option<u64>,
    pub tiers: Vec<Tier>,
    /// `soft_limit` and `ban` (SPEC §10), applied by
    /// [`crate::rate::decide_op`] with the domain's override
    /// ([`RateResource::policy_for`]).
    pub policy: Policy,
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

    /// The soft limit and ban in force for `domain` (SPEC §10): its
    /// override's where it names them, else the resource's. (Not part of
    /// [`RateLimits`], which stores and benchmarks build by hand.)
    pub fn policy_for(&self, domain: &str) -> Policy {
        match self.domains.get(domain) {
            None => self.policy,
            Some(o) => over_policy(o.policy, self.policy),
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
    /// The most callers that may wait for copies at once (SPEC §14).
    pub queue_limit: u64,
    /// What a waiter gets when a holder releases with its result ready.
    pub wait_mode: crate::copy::WaitMode,
    /// domain → indexes into `groups`, built on load.
    membership: HashMap<String, Vec<usize>>,
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
            queue_limit: crate::copy::DEFAULT_QUEUE_LIMIT,
            wait_mode: crate::copy::WaitMode::default(),
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

/// An override's `soft_limit` and `ban` where it names them, else the
/// resource's (SPEC §7: an override replaces what it names).
fn over_policy(over: Policy, base: Policy) -> Policy {
    Policy {
        soft_limit: over.soft_limit.or(base.soft_limit),
        ban: over.ban.or(base.ban),
    }
}

/// What a resource limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceKind {
    Rate(RateResource),
    Copy(CopyResource),
    Bucket(BucketResource),
    Window(WindowResource),
    Queue(QueueResource),
    /// `kind: lease`: a capacity shared as leases (SPEC §12).
    Lease(LeaseResource),
}

/// Every `kind:` a resource may have, as the configuration file writes it.
pub const KINDS: &[&str] = &["rate", "copy", "bucket", "window", "queue", "lease"];

impl ResourceKind {
    /// `"rate"`, `"copy"`, `"bucket"`, `"window"`, `"queue"` or `"lease"`,
    /// as in the configuration file.
    pub fn name(&self) -> &'static str {
        match self {
            ResourceKind::Rate(_) => "rate",
            ResourceKind::Copy(_) => "copy",
            ResourceKind::Bucket(_) => BucketFields::KIND,
            ResourceKind::Window(_) => WindowFields::KIND,
            ResourceKind::Queue(_) => QueueFields::KIND,
            ResourceKind::Lease(_) => "lease",
        }
    }

    /// The parameters for `domain` of a bucket, window or queue; `None`
    /// for `rate`, `copy` and `lease`.
    pub fn meter(&self, domain: &str) -> Option<Meter> {
        match self {
            ResourceKind::Bucket(r) => Some(Meter::Bucket(r.params_for(domain))),
            ResourceKind::Window(r) => Some(Meter::Window(r.params_for(domain))),
            ResourceKind::Queue(r) => Some(Meter::Queue(r.params_for(domain))),
            ResourceKind::Rate(_) | ResourceKind::Copy(_) | ResourceKind::Lease(_) => None,
        }
    }
}

/// A rate-like resource resolved for one domain ([`Config::rate_like`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLike<'a> {
    /// `kind: rate`: the burst tiers (SPEC §2).
    Tiers(&'a RateResource),
    /// `kind: bucket`, `window` or `queue`, the domain's override applied.
    Meter(Meter),
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
    policy: Policy::default(),
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
    envoy: Option<Envoy>,
}

impl Config {
    /// Builds a configuration from parts, validating names and applying the
    /// normalization of SPEC §2. Returns what normalization changed.
    pub fn new(
        namespaces: BTreeMap<String, NamespaceSettings>,
        resources: Vec<Resource>,
    ) -> Result<(Self, Vec<Adjustment>), ConfigErrors> {
        Self::with_envoy(namespaces, resources, None)
    }

    /// [`Config::new`] with an `envoy:` section (SPEC §11), whose
    /// references are checked against the resources: a `resource:` must
    /// name a rate-like resource of this configuration, and the name of an
    /// inline `rate_limit` ([`Node::id`](crate::envoy::Node::id)) must fit a resource name and be
    /// no configured resource's (the two would share counts).
    pub fn with_envoy(
        namespaces: BTreeMap<String, NamespaceSettings>,
        resources: Vec<Resource>,
        envoy: Option<Envoy>,
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
        if let Some(e) = &envoy {
            let path = Path::root().key("envoy").key("domains");
            for (i, d) in e.domains().iter().enumerate() {
                let p = path.index(i).key("descriptors");
                for (j, n) in d.descriptors().iter().enumerate() {
                    check_node(n, &p.index(j), &resources, &index, &mut issues);
                }
                let p = path.index(i).key("limits");
                for (j, l) in d.limits().iter().enumerate() {
                    check_action(
                        l.action(),
                        l.id(),
                        &p.index(j),
                        &resources,
                        &index,
                        &mut issues,
                    );
                }
            }
        }
        if !issues.is_empty() {
            return Err(ConfigErrors(issues));
        }
        let mut config = Self {
            namespaces,
            resources,
            index,
            envoy,
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
        let (namespaces, resources, envoy) = parse::parse_config(value)?;
        Self::with_envoy(namespaces, resources, envoy)
    }

    /// The configuration as the YAML of SPEC §6, normalized.
    pub fn to_yaml(&self) -> String {
        render::to_yaml(&render::config_value(self))
    }

    /// The configuration as a JSON value in the SPEC §6 layout.
    pub fn to_value(&self) -> serde_json::Value {
        render::config_value(self)
    }

    /// The `envoy:` section (SPEC §11); `None` when the configuration has
    /// none (the server then answers every Envoy call OK).
    pub fn envoy(&self) -> Option<&Envoy> {
        self.envoy.as_ref()
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

    /// Where a configured resource is in [`Config::resources`]: a caller
    /// that keeps something per resource of one configuration (the
    /// server's metric handles) keeps it in a vector indexed by this rather
    /// than copying every name into a map of its own.
    pub fn resource_position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
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

    /// Resolves a rate-like resource for `operation` on `domain` in one
    /// lookup (SPEC §4, §7–§10): the burst tiers (configured, or the
    /// permissive ones of a namespace that allows unconfigured resources),
    /// or a bucket's, window's or queue's parameters with the domain's
    /// override applied; a copy-limited or unknown resource is a client
    /// error, as in [`Config::rate`]. What every request of the limiter
    /// resolves first, so it is one map lookup and one namespace lookup.
    pub fn rate_like(
        &self,
        resource: &str,
        domain: &str,
        operation: &'static str,
    ) -> Result<(RateLike<'_>, Enforcement), ClientError> {
        let ns = self.namespace(namespace_of(resource));
        let enforcement = enforcement(ns);
        match self.resource(resource) {
            Some(Resource {
                kind: ResourceKind::Rate(r),
                ..
            }) => Ok((RateLike::Tiers(r), enforcement)),
            Some(Resource { kind, .. }) => match kind.meter(domain) {
                Some(meter) => Ok((RateLike::Meter(meter), enforcement)),
                None => Err(wrong_kind(resource, operation, "rate", kind.name())),
            },
            None if ns.allow_unconfigured => Ok((RateLike::Tiers(&PERMISSIVE_RATE), enforcement)),
            None => Err(ClientError::UnknownResource(resource.to_owned())),
        }
    }

    /// The parameters of a configured bucket, window or queue resource for
    /// `domain`, its override applied: what the store decides with (the
    /// namespace's `ignore_configured` still applies, see
    /// [`Config::enforcement`]). `None` for any other resource, and for an
    /// unconfigured one: an unconfigured resource of a namespace with
    /// `allow_unconfigured` stays the permissive `rate` resource
    /// ([`Config::rate`]), whatever kinds the namespace configures.
    pub fn meter(&self, resource: &str, domain: &str) -> Option<Meter> {
        self.resource(resource)?.kind.meter(domain)
    }

    /// Whether the namespace of `resource` enforces its limits (SPEC §4
    /// `ignore_configured`).
    pub fn enforcement(&self, resource: &str) -> Enforcement {
        enforcement(self.namespace(namespace_of(resource)))
    }

    /// Resolves a lease resource for `operation` (`get_capacity`,
    /// `release_capacity`, SPEC §12): its configuration, or a client
    /// error. There is no permissive lease resource: a lease needs a
    /// capacity, so an unconfigured one is unknown in every namespace.
    pub fn lease(
        &self,
        resource: &str,
        operation: &'static str,
    ) -> Result<&LeaseResource, ClientError> {
        match self.resource(resource) {
            Some(Resource {
                kind: ResourceKind::Lease(l),
                ..
            }) => Ok(l),
            Some(r) => Err(wrong_kind(resource, operation, "lease", r.kind.name())),
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
