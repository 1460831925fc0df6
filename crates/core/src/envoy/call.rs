//! A whole `ShouldRateLimit` call: every descriptor matched against the
//! domain's tree, `replaces` applied across them, and the domain's
//! `limits:` evaluated over all of them. What the server then decides in
//! one store batch.

use std::borrow::Cow;
use std::collections::HashSet;

use super::limits::CallEntries;
use super::{
    Action, DomainBuilder, Envoy, Limit, Matched, Node, RateLimit, UnknownDomain, check_entries,
    unknown_domain,
};
use crate::ClientError;

/// What one descriptor's status comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status<'a> {
    /// Nothing applies (or the domain is unknown): OK, no limit.
    NotLimited,
    /// An `unlimited` node applies.
    Unlimited {
        /// That node.
        node: &'a Node,
    },
    /// Its limit was switched off by another's `replaces` in this call:
    /// OK, no limit, nothing recorded (envoyproxy/ratelimit's rule).
    Replaced {
        /// The switched-off limit's label.
        label: &'a str,
    },
    /// Decided by [`CallPlan::checks`]`[i]`.
    Limited(usize),
}

/// One limit a call is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check<'a> {
    /// What limits, under which Charon domain.
    pub limit: Limit<'a>,
    /// The descriptor it came from; `None` for a limit of `limits:`, which
    /// counts the call's `hits_addend`.
    pub descriptor: Option<usize>,
}

/// What a call checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPlan<'a> {
    /// Whether the domain is configured (an unknown one with
    /// `unknown_domain: ok` checks nothing).
    pub known: bool,
    /// One per descriptor, in order; empty for a domain that has `limits:`
    /// and no descriptor tree (Limitador's replies have no statuses).
    pub statuses: Vec<Status<'a>>,
    /// The limits to decide, in order: the descriptors' first, then the
    /// domain's `limits:` that apply.
    pub checks: Vec<Check<'a>>,
}

impl Envoy {
    /// Everything one call of `domain` with `descriptors` (each a list of
    /// entries) checks. A malformed descriptor is a client error naming it
    /// (`descriptors[1]: entries[0].value must not be empty`); an unknown
    /// domain is one too with `unknown_domain: error`, and checks nothing
    /// with `unknown_domain: ok`.
    pub fn plan(
        &self,
        domain: &str,
        descriptors: &[Vec<(&str, &str)>],
    ) -> Result<CallPlan<'_>, ClientError> {
        let at = |i: usize, e: &ClientError| ClientError::invalid(format!("descriptors[{i}]: {e}"));
        for (i, d) in descriptors.iter().enumerate() {
            check_entries(d).map_err(|e| at(i, &e))?;
        }
        let Some(tree) = self.domain(domain) else {
            if self.settings.unknown_domain == UnknownDomain::Error {
                return Err(unknown_domain(domain));
            }
            return Ok(CallPlan {
                known: false,
                statuses: vec![Status::NotLimited; descriptors.len()],
                checks: Vec::new(),
            });
        };
        let mut matched = Vec::with_capacity(descriptors.len());
        let mut replaced: HashSet<&str> = HashSet::new();
        if !tree.descriptors.is_empty() || tree.limits.is_empty() {
            for (i, d) in descriptors.iter().enumerate() {
                let m = self.walk(tree, d).map_err(|e| at(i, &e))?;
                match &m {
                    Matched::Limited(l) => replaced.extend(l.replaces.iter().map(String::as_str)),
                    Matched::Unlimited { node } => {
                        replaced.extend(node.extras.replaces.iter().map(String::as_str));
                    }
                    Matched::NotLimited => {}
                }
                matched.push(m);
            }
        }
        let mut statuses = Vec::with_capacity(matched.len());
        let mut checks = Vec::new();
        for (i, m) in matched.into_iter().enumerate() {
            statuses.push(match m {
                Matched::NotLimited => Status::NotLimited,
                Matched::Unlimited { node } => Status::Unlimited { node },
                Matched::Limited(l) if l.name.is_some_and(|n| replaced.contains(n)) => {
                    Status::Replaced { label: l.label }
                }
                Matched::Limited(l) => {
                    checks.push(Check {
                        limit: *l,
                        descriptor: Some(i),
                    });
                    Status::Limited(checks.len() - 1)
                }
            });
        }
        if !tree.limits.is_empty() {
            let call = CallEntries::of(descriptors);
            for rule in &tree.limits {
                let Some(values) = rule.applies(&call) else {
                    continue;
                };
                let mut d = DomainBuilder::default();
                for v in values {
                    d.value(v, None);
                }
                let domain = d.finish()?;
                let (resource, rate_limit) = match &rule.action {
                    Action::Resource(r) => (r.as_str(), None),
                    Action::RateLimit(l) => (rule.id(), Some(*l)),
                    Action::Unlimited => continue,
                };
                checks.push(Check {
                    limit: Limit {
                        label: rule.id(),
                        resource: Cow::Borrowed(resource),
                        rate_limit,
                        domain,
                        shadow: false,
                        quota: false,
                        name: rule.name(),
                        replaces: &[],
                        detail: None,
                        invalid_addresses: 0,
                    },
                    descriptor: None,
                });
            }
        }
        Ok(CallPlan {
            known: true,
            statuses,
            checks,
        })
    }
}

impl CallPlan<'_> {
    /// Makes descriptor `i` decided by the `limit` override Envoy sent with
    /// it (`requests_per_unit` per `unit`, a fixed window), as
    /// envoyproxy/ratelimit does under `descriptor_limits: apply`: its
    /// counts are those of the call's domain, the override's unit and the
    /// descriptor's entries (keys and values), whatever node matched. A
    /// call to an unknown domain, or a descriptor past the plan's
    /// statuses, is left as it is.
    pub fn apply_override(
        &mut self,
        domain: &str,
        i: usize,
        entries: &[(&str, &str)],
        limit: RateLimit,
    ) -> Result<(), ClientError> {
        if !self.known || i >= self.statuses.len() {
            return Ok(());
        }
        let unit = limit.unit().map_or("window", super::Unit::name);
        let resource = format!("{}/override/{unit}", super::EnvoyDomain::root(domain));
        let mut d = DomainBuilder::default();
        for (k, v) in entries {
            let mut part = String::new();
            super::escape_name(&mut part, k);
            part.push('=');
            part.push_str(v);
            d.value(&part, None);
        }
        let check = Check {
            limit: Limit {
                label: "(descriptor limit)",
                resource: Cow::Owned(resource),
                rate_limit: Some(limit),
                domain: d.finish()?,
                shadow: false,
                quota: false,
                name: None,
                replaces: &[],
                detail: None,
                invalid_addresses: 0,
            },
            descriptor: Some(i),
        };
        // The override replaces whatever the descriptor matched.
        if let Status::Limited(j) = self.statuses[i] {
            self.checks[j] = check;
        } else {
            self.checks.push(check);
            self.statuses[i] = Status::Limited(self.checks.len() - 1);
        }
        Ok(())
    }
}
