//! The rate-like kinds' resources as written (bucket, window, queue): the
//! kind's own fields, a resource with its overrides, and how a domain's
//! fields resolve into the kind's parameters.

use std::collections::BTreeMap;
use std::fmt;

use super::over_policy;
use crate::meter::{FieldError, Policy};
use crate::time::Millis;
use crate::window::Algorithm;
use crate::{bucket, queue, window};

/// The kind's own fields of a token bucket (SPEC §7), as written: all
/// present on a resource, only those it replaces on an override.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketFields {
    /// Capacity in tokens.
    pub burst: Option<u64>,
    /// Tokens added every `period`.
    pub count: Option<u64>,
    pub period: Option<Millis>,
}

/// The kind's own fields of a window (SPEC §8), as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowFields {
    pub algorithm: Option<Algorithm>,
    pub limit: Option<u64>,
    pub window: Option<Millis>,
}

/// The kind's own fields of a queue (SPEC §9), as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueFields {
    /// Units that leave the queue every `period`.
    pub rate: Option<u64>,
    pub period: Option<Millis>,
    /// The most units waiting.
    pub size: Option<u64>,
}

/// The fields of one rate-like kind with exact `Params` (bucket, window,
/// queue): what is shared is written once ([`MeterResource`]), so an
/// override means the same for every kind.
pub trait MeterFields: Copy + Default + Eq + fmt::Debug {
    /// The validated parameters the decision takes.
    type Params: Copy + Eq + fmt::Debug;
    /// `kind:` in the configuration file.
    const KIND: &'static str;
    /// The kind's own fields, in the order they are written.
    const NAMES: &'static [&'static str];
    /// These fields where set, else `base`'s.
    fn or(self, base: Self) -> Self;
    /// Whether `field` (one of [`Self::NAMES`]) is set.
    fn names(&self, field: &str) -> bool;
    /// The parameters, checked by the kind's `Params::new` (every
    /// exactness bound, the field named); a missing field is an error
    /// naming it.
    fn params(&self, policy: Policy) -> Result<Self::Params, FieldError>;
}

fn given<T>(field: &'static str, v: Option<T>) -> Result<T, FieldError> {
    v.ok_or_else(|| FieldError {
        field,
        message: "is required".to_owned(),
    })
}

impl MeterFields for BucketFields {
    type Params = bucket::Params;
    const KIND: &'static str = "bucket";
    const NAMES: &'static [&'static str] = &["burst", "count", "period"];

    fn or(self, base: Self) -> Self {
        Self {
            burst: self.burst.or(base.burst),
            count: self.count.or(base.count),
            period: self.period.or(base.period),
        }
    }

    fn names(&self, field: &str) -> bool {
        match field {
            "burst" => self.burst.is_some(),
            "count" => self.count.is_some(),
            "period" => self.period.is_some(),
            _ => false,
        }
    }

    fn params(&self, policy: Policy) -> Result<bucket::Params, FieldError> {
        bucket::Params::new(
            given("burst", self.burst)?,
            given("count", self.count)?,
            given("period", self.period)?,
            policy,
        )
    }
}

impl MeterFields for WindowFields {
    type Params = window::Params;
    const KIND: &'static str = "window";
    const NAMES: &'static [&'static str] = &["algorithm", "limit", "window"];

    fn or(self, base: Self) -> Self {
        Self {
            algorithm: self.algorithm.or(base.algorithm),
            limit: self.limit.or(base.limit),
            window: self.window.or(base.window),
        }
    }

    fn names(&self, field: &str) -> bool {
        match field {
            "algorithm" => self.algorithm.is_some(),
            "limit" => self.limit.is_some(),
            "window" => self.window.is_some(),
            _ => false,
        }
    }

    fn params(&self, policy: Policy) -> Result<window::Params, FieldError> {
        window::Params::new(
            given("algorithm", self.algorithm)?,
            given("limit", self.limit)?,
            given("window", self.window)?,
            policy,
        )
    }
}

impl MeterFields for QueueFields {
    type Params = queue::Params;
    const KIND: &'static str = "queue";
    const NAMES: &'static [&'static str] = &["rate", "period", "size"];

    fn or(self, base: Self) -> Self {
        Self {
            rate: self.rate.or(base.rate),
            period: self.period.or(base.period),
            size: self.size.or(base.size),
        }
    }

    fn names(&self, field: &str) -> bool {
        match field {
            "rate" => self.rate.is_some(),
            "period" => self.period.is_some(),
            "size" => self.size.is_some(),
            _ => false,
        }
    }

    fn params(&self, policy: Policy) -> Result<queue::Params, FieldError> {
        queue::Params::new(
            given("rate", self.rate)?,
            given("period", self.period)?,
            given("size", self.size)?,
            policy,
        )
    }
}

/// One level of a bucket, window or queue as written: the kind's fields
/// and the shared `soft_limit` and `ban` (SPEC §10).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeterSpec<F> {
    pub fields: F,
    pub policy: Policy,
}

impl<F: MeterFields> MeterSpec<F> {
    /// What applies to a domain with this override: every field it names
    /// replaces the resource's (`base`), the rest is the resource's.
    pub fn over(&self, base: &MeterSpec<F>) -> MeterSpec<F> {
        MeterSpec {
            fields: self.fields.or(base.fields),
            policy: over_policy(self.policy, base.policy),
        }
    }
}

/// A per-domain override of a bucket, window or queue: what it names, and
/// the parameters it resolves to with the resource's other fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterOverride<F: MeterFields> {
    spec: MeterSpec<F>,
    params: F::Params,
}

impl<F: MeterFields> MeterOverride<F> {
    /// The fields the override names.
    pub fn spec(&self) -> &MeterSpec<F> {
        &self.spec
    }

    /// The parameters for its domain.
    pub fn params(&self) -> F::Params {
        self.params
    }
}

/// A resource of `kind: bucket`, `window` or `queue`, validated: its
/// parameters and every override's are built (and checked) once, when the
/// resource is, so resolving a (resource, domain) pair cannot fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterResource<F: MeterFields> {
    spec: MeterSpec<F>,
    params: F::Params,
    domains: BTreeMap<String, MeterOverride<F>>,
}

/// Why a [`MeterResource`] could not be built: the domain of the override
/// (`None` for the resource itself) and the field error.
pub type MeterError = (Option<String>, FieldError);

impl<F: MeterFields> MeterResource<F> {
    /// Checks the resource's fields and every override applied to them
    /// with the kind's `Params::new`; every error is returned. Overrides
    /// are only checked once the resource itself is valid.
    pub fn new(
        spec: MeterSpec<F>,
        domains: BTreeMap<String, MeterSpec<F>>,
    ) -> Result<Self, Vec<MeterError>> {
        let params = spec
            .fields
            .params(spec.policy)
            .map_err(|e| vec![(None, e)])?;
        let mut errors = Vec::new();
        let mut resolved = BTreeMap::new();
        for (domain, o) in domains {
            let merged = o.over(&spec);
            match merged.fields.params(merged.policy) {
                Ok(params) => {
                    resolved.insert(domain, MeterOverride { spec: o, params });
                }
                Err(e) => errors.push((Some(domain), e)),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            spec,
            params,
            domains: resolved,
        })
    }

    /// The resource's own fields.
    pub fn spec(&self) -> &MeterSpec<F> {
        &self.spec
    }

    /// The parameters of a domain without an override.
    pub fn params(&self) -> F::Params {
        self.params
    }

    /// The parameters for `domain`, its override applied.
    pub fn params_for(&self, domain: &str) -> F::Params {
        self.domains.get(domain).map_or(self.params, |o| o.params)
    }

    /// The overrides, by domain.
    pub fn domains(&self) -> &BTreeMap<String, MeterOverride<F>> {
        &self.domains
    }
}

/// A token bucket resource (SPEC §7).
pub type BucketResource = MeterResource<BucketFields>;
/// A window resource (SPEC §8).
pub type WindowResource = MeterResource<WindowFields>;
/// A queue resource (SPEC §9).
pub type QueueResource = MeterResource<QueueFields>;
