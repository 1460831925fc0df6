//! Capacity leases (SPEC §12) through the limiter: what `charon.v1.Capacity`
//! and `charon simulate` call. The request is checked whole before anything
//! changes (client, every resource, every number); then each resource's
//! lease set is decided by `charon_core::lease` inside the store's atomic
//! step ([`charon_store::Store::leases`]).

use charon_core::config::ResourceKind;
use charon_core::lease::{
    LeaseContext, LeaseParams, LeaseReply, LeaseSet, Quantity, Want, get_capacity, release_capacity,
};
use charon_core::request::check_name;
use charon_core::{ClientError, Millis};

use crate::{LimitError, Limiter};

/// The most resources one `GetCapacity` or `ReleaseCapacity` may name: a
/// bound on what one call costs (each is a store step).
pub const MAX_RESOURCES_PER_CALL: usize = 100;

/// One resource of a `get_capacity` call, as it comes from the network.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityAsk {
    /// A `kind: lease` resource.
    pub resource: String,
    /// How much capacity the client would use if it could.
    pub wants: f64,
    /// What the client holds now (0 for a new client).
    pub has: f64,
    /// How many clients it stands for; 0 means 1 (the proto default).
    pub subclients: u64,
}

/// When this server started answering leases, in the store's time: the
/// start of learning mode (SPEC §12), as Doorman starts it when a server
/// becomes master. Set by the first lease decision, so that it is on the
/// clock the decisions use (Redis `TIME` on a Redis store), and again by
/// the first decision after the store found its state lost
/// ([`charon_store::Store::data_epoch`]): the leases handed out before are
/// gone then, while their clients still hold them.
#[derive(Debug, Default)]
pub(crate) struct LeaseEpoch(std::sync::Mutex<Option<(u64, Millis)>>);

impl LeaseEpoch {
    fn at(&self, store_epoch: u64, now: Millis) -> Millis {
        let mut e = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *e {
            Some((seen, start)) if seen == store_epoch => start,
            _ => {
                *e = Some((store_epoch, now));
                now
            }
        }
    }
}

/// Where a server's lease capacity comes from (SPEC §12 tree): the
/// configuration at a root; what the parent granted (or, once that lapsed,
/// the safe capacity) at a server with a parent, set by its parent task
/// ([`Limiter::set_parent_capacity`]); nothing until the parent answered.
#[derive(Debug, Default)]
pub(crate) struct ParentCapacity {
    from_parent: std::sync::atomic::AtomicBool,
    granted: std::sync::Mutex<std::collections::HashMap<String, Quantity>>,
}

impl ParentCapacity {
    fn of(&self, resource: &str, params: &LeaseParams) -> Quantity {
        if !self.from_parent.load(std::sync::atomic::Ordering::Acquire) {
            return params.capacity();
        }
        self.granted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(resource)
            .copied()
            .unwrap_or(Quantity::ZERO)
    }
}

fn checked_resources<'a>(
    names: impl ExactSizeIterator<Item = &'a str>,
) -> Result<Vec<&'a str>, ClientError> {
    if names.len() == 0 {
        return Err(ClientError::invalid("name at least one resource"));
    }
    if names.len() > MAX_RESOURCES_PER_CALL {
        return Err(ClientError::invalid(format!(
            "{} resources in one call; at most {MAX_RESOURCES_PER_CALL}",
            names.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for name in names {
        if !seen.insert(name) {
            return Err(ClientError::invalid(format!(
                "resource {name:?} is named twice in one call"
            )));
        }
        out.push(name);
    }
    Ok(out)
}

impl Limiter {
    /// `get_capacity(client, [(resource, wants, has, subclients)])` (SPEC
    /// §12): a lease per resource, in the order asked. Bad input (an
    /// unknown or non-lease resource, NaN or negative numbers, too many
    /// resources) is a client error and changes nothing.
    pub async fn get_capacity(
        &self,
        client: &str,
        asks: &[CapacityAsk],
    ) -> Result<Vec<LeaseReply>, LimitError> {
        check_name("client_id", client)?;
        checked_resources(asks.iter().map(|a| a.resource.as_str()))?;
        let config = self.config();
        let mut decided: Vec<(&str, LeaseParams, Want)> = Vec::with_capacity(asks.len());
        for a in asks {
            let params = *config.lease(&a.resource, "get_capacity")?.params();
            let want = Want::parse(a.wants, a.has, a.subclients.max(1))?;
            decided.push((&a.resource, params, want));
        }
        let mut replies = Vec::with_capacity(decided.len());
        for (resource, params, want) in decided {
            let capacity = self.parent_capacity.of(resource, &params);
            let mut reply = None;
            let epoch = &self.lease_epoch;
            let store_epoch = self.store().data_epoch();
            self.store()
                .leases(resource, client, &mut |set: &mut LeaseSet, now| {
                    let ctx = LeaseContext {
                        capacity,
                        ..LeaseContext::root(&params, epoch.at(store_epoch, now), now)
                    };
                    reply = Some(get_capacity(set, &params, ctx, client, want));
                })
                .await?;
            replies.push(reply.ok_or_else(|| {
                LimitError::Server(charon_store::StoreError::BadData(
                    "the store made no lease decision".into(),
                ))
            })?);
        }
        Ok(replies)
    }

    /// `release_capacity(client, [resource])` (SPEC §12): whether the
    /// client held a lease (not lapsed) on each resource, in the order
    /// named; its capacity returns to the pool at once.
    pub async fn release_capacity(
        &self,
        client: &str,
        resources: &[String],
    ) -> Result<Vec<bool>, LimitError> {
        check_name("client_id", client)?;
        let names = checked_resources(resources.iter().map(String::as_str))?;
        let config = self.config();
        for r in &names {
            config.lease(r, "release_capacity")?;
        }
        let mut released = Vec::with_capacity(names.len());
        for resource in names {
            let mut was = false;
            self.store()
                .leases(resource, client, &mut |set: &mut LeaseSet, now| {
                    was = release_capacity(set, client, now);
                })
                .await?;
            released.push(was);
        }
        Ok(released)
    }
}

/// One lease as the leases page and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LeaseEntry {
    /// Who holds it.
    pub client: String,
    /// What it may use.
    pub capacity: Quantity,
    /// What it asked for at its last refresh.
    pub wants: Quantity,
    /// How many clients it stands for.
    pub subclients: u64,
    /// When it lapses unless refreshed.
    pub expires_at_ms: Millis,
}

/// The live leases of one configured lease resource.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LeaseSummary {
    /// The resource.
    pub resource: String,
    /// The capacity it shares: the configured one (per client for
    /// `static`), or what the parent granted in a tree.
    pub capacity: Quantity,
    /// How it is divided.
    pub algorithm: &'static str,
    /// The capacity leased in all.
    pub leased: Quantity,
    /// The capacity wanted in all.
    pub wanted: Quantity,
    /// How many clients hold leases.
    pub clients: usize,
    /// The leases, by client.
    pub leases: Vec<LeaseEntry>,
}

impl Limiter {
    /// Makes this server share what a parent grants (SPEC §12 tree)
    /// instead of the configured capacities: nothing until
    /// [`Limiter::set_parent_capacity`] says what.
    pub fn take_capacity_from_parent(&self) {
        self.parent_capacity
            .from_parent
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// What this server shares of `resource` now: its parent's grant, or
    /// the safe capacity once that lapsed.
    pub fn set_parent_capacity(&self, resource: &str, capacity: Quantity) {
        self.parent_capacity
            .granted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(resource.to_owned(), capacity);
    }

    /// What to ask a parent for (SPEC §12 tree): per configured lease
    /// resource, this server's clients' wants in all as one client with
    /// that many subclients, holding what the parent granted last
    /// (`holding`); and the resources nobody here wants any more, whose
    /// parent lease should be given back.
    pub async fn upstream_wants(
        &self,
        holding: impl Fn(&str) -> Quantity,
    ) -> Result<(Vec<(String, Want)>, Vec<String>), LimitError> {
        let (_, sets) = self.live_lease_sets().await?;
        let (mut wants, mut idle) = (Vec::new(), Vec::new());
        for (name, _, set) in sets {
            match set.upstream_want(holding(&name)) {
                Some(w) => wants.push((name, w)),
                None => idle.push(name),
            }
        }
        Ok((wants, idle))
    }

    /// Every configured lease resource, its parameters and its set as the
    /// store holds it without the leases lapsed at the store's time (which
    /// comes first): what the page, the metrics and a tree's parent asks
    /// are made of. A snapshot, not a decision.
    async fn live_lease_sets(
        &self,
    ) -> Result<(Millis, Vec<(String, LeaseParams, LeaseSet)>), LimitError> {
        let config = self.config();
        let (now, sets) = self.store().lease_sets().await?;
        let mut sets: std::collections::HashMap<String, LeaseSet> = sets.into_iter().collect();
        let mut out = Vec::new();
        for r in config.resources() {
            let ResourceKind::Lease(l) = &r.kind else {
                continue;
            };
            let mut set = sets.remove(&r.name).unwrap_or_default();
            charon_core::lease::expire(&mut set, now);
            out.push((r.name.clone(), *l.params(), set));
        }
        Ok((now, out))
    }

    /// Every configured lease resource with its live leases (those not
    /// lapsed at the store's time), for the leases page and `/metrics`.
    /// The store's time comes first.
    pub async fn lease_summaries(&self) -> Result<(Millis, Vec<LeaseSummary>), LimitError> {
        let (now, sets) = self.live_lease_sets().await?;
        let mut out = Vec::new();
        for (resource, params, set) in sets {
            let capacity = self.parent_capacity.of(&resource, &params);
            let leases: Vec<LeaseEntry> = set
                .iter()
                .map(|(client, l)| LeaseEntry {
                    client: client.to_owned(),
                    capacity: l.has,
                    wants: l.wants,
                    subclients: l.subclients,
                    expires_at_ms: l.expires_at_ms,
                })
                .collect();
            out.push(LeaseSummary {
                resource,
                capacity,
                algorithm: params.algorithm().name(),
                leased: Quantity::saturating_from_total(set.sum_has_micros()),
                wanted: Quantity::saturating_from_total(set.sum_wants_micros()),
                clients: leases.len(),
                leases,
            });
        }
        Ok((now, out))
    }
}
