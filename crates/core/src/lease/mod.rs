//! Capacity leases, `kind: lease` (SPEC §12, paper §5.1, seed 001): the
//! decision rules of a Doorman-style lease server as pure functions over
//! the leases of one resource.
//!
//! A client asks for a share of a resource's capacity (`wants`), says what
//! it holds (`has`), and gets a lease until `expires_at_ms`, which it
//! refreshes every `refresh_interval_ms`; it limits itself locally. The
//! server keeps one [`Lease`] per client in a [`LeaseSet`]; a store loads
//! the set of a resource, calls [`get_capacity`] or [`release_capacity`]
//! with `now`, and keeps the result, the way the copy rules work over a
//! `CopyState` ([`crate::copy`]). Expired leases are dropped by every call
//! ([`expire`]), so their capacity returns to the pool without a sweeper.
//!
//! What every algorithm but `none` promises, exactly (capacities are
//! integers of millionths, [`Quantity`]):
//! - no client gets more than it wants;
//! - with `proportional_share` and `fair_share` the leases never add up to
//!   more than the capacity: a grant never exceeds the capacity that
//!   others do not hold (`capacity − Σ has + own has`), so a newcomer may
//!   get less than its share until the others shrink at their next
//!   refresh; `static` gives each client at most `capacity` per subclient;
//! - with unchanged wants, once every client has refreshed twice after the
//!   last one joined, every lease is the algorithm's share ([`Shares`]).
//!
//! A server in a tree (SPEC §12) asks its parent with
//! [`LeaseSet::upstream_want`] and shares what it gets by passing that as
//! the capacity of [`LeaseContext`]; the root passes the configured one.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::meter::FieldError;
use crate::{ClientError, MAX_COUNT, Millis};

mod quantity;
mod shares;

pub use quantity::Quantity;
pub use shares::{Algorithm, Shares};

/// The most subclients one client may stand for (2^32 − 1): enough for any
/// tree of servers, and small enough that every product of the exact
/// arithmetic in [`Shares`] fits in 128 bits.
pub const MAX_SUBCLIENTS: u64 = 0xFFFF_FFFF;

/// A validated `kind: lease` configuration (SPEC §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseParams {
    capacity: Quantity,
    algorithm: Algorithm,
    lease_length: Millis,
    refresh_interval: Millis,
    safe_capacity: Option<Quantity>,
    learning_mode: Millis,
}

impl LeaseParams {
    /// A lease resource: `capacity` in all (per client for `static`),
    /// leases of `lease_length` refreshed every `refresh_interval`; no
    /// configured safe capacity (it is then computed, see
    /// [`LeaseParams::safe_capacity`]) and learning mode for one lease
    /// length, Doorman's default: by then every client that held a lease
    /// before the server started has either refreshed it or lost it.
    ///
    /// `lease_length` must be from 1 ms to [`MAX_COUNT`] ms, and
    /// `refresh_interval` at least 1 ms and at most `lease_length`: a
    /// client told to refresh after its lease ended would lose it between
    /// refreshes.
    pub fn new(
        capacity: Quantity,
        algorithm: Algorithm,
        lease_length: Millis,
        refresh_interval: Millis,
    ) -> Result<Self, FieldError> {
        if lease_length == 0 {
            return Err(FieldError::new(
                "lease_length",
                "must be positive (at least 1ms)",
            ));
        }
        if lease_length > MAX_COUNT {
            return Err(FieldError::new(
                "lease_length",
                format!("must be at most {MAX_COUNT}ms"),
            ));
        }
        if refresh_interval == 0 {
            return Err(FieldError::new(
                "refresh_interval",
                "must be positive (at least 1ms)",
            ));
        }
        if refresh_interval > lease_length {
            return Err(FieldError::new(
                "refresh_interval",
                format!(
                    "must not be longer than lease_length ({lease_length}ms): a lease would lapse between refreshes"
                ),
            ));
        }
        Ok(Self {
            capacity,
            algorithm,
            lease_length,
            refresh_interval,
            safe_capacity: None,
            learning_mode: lease_length,
        })
    }

    /// The same with a configured safe capacity.
    pub fn with_safe_capacity(self, safe_capacity: Quantity) -> Self {
        Self {
            safe_capacity: Some(safe_capacity),
            ..self
        }
    }

    /// The same with learning mode lasting `span` after a server starts
    /// (0 turns it off); at most [`MAX_COUNT`] ms.
    pub fn with_learning_mode(self, span: Millis) -> Result<Self, FieldError> {
        if span > MAX_COUNT {
            return Err(FieldError::new(
                "learning_mode",
                format!("must be at most {MAX_COUNT}ms"),
            ));
        }
        Ok(Self {
            learning_mode: span,
            ..self
        })
    }

    /// What is handed out in all (per client for `static`).
    pub fn capacity(&self) -> Quantity {
        self.capacity
    }

    /// How the capacity is divided.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// How long a lease lasts from the refresh that granted it.
    pub fn lease_length(&self) -> Millis {
        self.lease_length
    }

    /// How often clients should refresh.
    pub fn refresh_interval(&self) -> Millis {
        self.refresh_interval
    }

    /// The configured safe capacity, if any.
    pub fn configured_safe_capacity(&self) -> Option<Quantity> {
        self.safe_capacity
    }

    /// How long learning mode lasts after a server starts.
    pub fn learning_mode(&self) -> Millis {
        self.learning_mode
    }

    /// Whether a server that started at `started_at` is still learning at
    /// `now`: in `[started_at, started_at + learning_mode)`.
    pub fn learning(&self, started_at: Millis, now: Millis) -> bool {
        now < started_at.saturating_add(self.learning_mode)
    }

    /// The safe capacity a client should use when it cannot reach any
    /// server (SPEC §12 safe mode): the configured one; else, for
    /// `static`, the per-client capacity; else `capacity` divided equally
    /// among the `subclients` now holding leases (rounded down to the
    /// millionth; all of it when there are none), as Doorman computes it.
    pub fn safe_capacity(&self, capacity: Quantity, subclients: u128) -> Quantity {
        if let Some(safe) = self.safe_capacity {
            return safe;
        }
        if self.algorithm == Algorithm::Static {
            return capacity;
        }
        Quantity::saturating_from_total(u128::from(capacity.micros()) / subclients.max(1))
    }
}

/// What a client asks for in `get_capacity`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    wants: Quantity,
    has: Quantity,
    subclients: u64,
}

impl Want {
    /// `wants` and `has` as [`Quantity::parse`] reads them, and
    /// `subclients` from 1 to [`MAX_SUBCLIENTS`].
    pub fn new(wants: Quantity, has: Quantity, subclients: u64) -> Result<Self, ClientError> {
        if subclients == 0 {
            return Err(ClientError::invalid("subclients must be at least 1"));
        }
        if subclients > MAX_SUBCLIENTS {
            return Err(ClientError::invalid(format!(
                "subclients must be at most {MAX_SUBCLIENTS}"
            )));
        }
        Ok(Self {
            wants,
            has,
            subclients,
        })
    }

    /// Numbers as they come from the network or `charon simulate` (SPEC
    /// §12: `has` and `subclients` default to 0 and 1).
    pub fn parse(wants: f64, has: f64, subclients: u64) -> Result<Self, ClientError> {
        Self::new(
            Quantity::parse("wants", wants)?,
            Quantity::parse("has", has)?,
            subclients,
        )
    }

    /// What the client wants.
    pub fn wants(&self) -> Quantity {
        self.wants
    }

    /// What the client says it holds.
    pub fn has(&self) -> Quantity {
        self.has
    }

    /// How many clients it stands for.
    pub fn subclients(&self) -> u64 {
        self.subclients
    }
}

/// One client's lease on one resource, as the server keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The capacity granted.
    pub has: Quantity,
    /// What the client asked for at its last refresh.
    pub wants: Quantity,
    /// How many clients it stands for.
    pub subclients: u64,
    /// From this millisecond on the lease is gone.
    pub expires_at_ms: Millis,
}

/// The reply to `get_capacity` for one resource (SPEC §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LeaseReply {
    /// The capacity the client may use until `expires_at_ms`.
    pub capacity: Quantity,
    /// When the lease lapses unless refreshed.
    pub expires_at_ms: Millis,
    /// When to refresh, from now.
    pub refresh_interval_ms: Millis,
    /// What to use when no server can be reached (safe mode).
    pub safe_capacity: Quantity,
}

/// The leases of one resource, by client, with their totals kept exactly
/// (the totals of `none` and `static` leases are not bounded by a
/// capacity, hence `u128`).
///
/// Two things make a refresh cheap when many clients hold leases (the
/// usual case: each refreshes with the wants it had): the shares of the
/// last decision are kept until a want, a subclient count, the capacity or
/// the algorithm changes, or a lease goes; and [`expire`] looks at the
/// leases only once the earliest expiry may have come. Neither is part of
/// the value: two sets with the same leases are equal.
#[derive(Debug, Clone, Default)]
pub struct LeaseSet {
    leases: BTreeMap<String, Lease>,
    sum_has: u128,
    sum_wants: u128,
    subclients: u128,
    /// No lease expires before this (a lower bound; 0 = look).
    next_expiry: Millis,
    /// The shares of the leases as they are, if known.
    shares: Option<CachedShares>,
}

/// Shares computed for a lease set, and what they were computed with.
#[derive(Debug, Clone)]
struct CachedShares {
    algorithm: Algorithm,
    capacity: Quantity,
    shares: Shares,
}

impl PartialEq for LeaseSet {
    fn eq(&self, other: &Self) -> bool {
        // The totals follow from the leases.
        self.leases == other.leases
    }
}

impl Eq for LeaseSet {}

impl LeaseSet {
    /// No leases.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease of `client`, expired or not (see [`expire`]).
    pub fn get(&self, client: &str) -> Option<&Lease> {
        self.leases.get(client)
    }

    /// Every lease, by client name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Lease)> {
        self.leases.iter().map(|(c, l)| (c.as_str(), l))
    }

    /// How many clients hold leases.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether no client holds a lease.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The capacity granted in all, in millionths.
    pub fn sum_has_micros(&self) -> u128 {
        self.sum_has
    }

    /// The capacity wanted in all, in millionths.
    pub fn sum_wants_micros(&self) -> u128 {
        self.sum_wants
    }

    /// How many clients the leases stand for (their subclients).
    pub fn subclients(&self) -> u128 {
        self.subclients
    }

    /// What a server in a tree asks its parent for (SPEC §12): its clients'
    /// wants in all, as one client with as many subclients as they stand
    /// for (both capped at their bounds), holding `has` (what the parent
    /// granted last). `None` when it has no clients: it has nothing to ask
    /// for and should release its own lease.
    pub fn upstream_want(&self, has: Quantity) -> Option<Want> {
        if self.is_empty() {
            return None;
        }
        Some(Want {
            wants: Quantity::saturating_from_total(self.sum_wants),
            has,
            subclients: u64::try_from(self.subclients)
                .unwrap_or(MAX_SUBCLIENTS)
                .clamp(1, MAX_SUBCLIENTS),
        })
    }

    /// Puts `lease` in for `client`, keeping the totals. Kept shares stay
    /// only if the client's wants and subclients are as they were.
    fn insert(&mut self, client: &str, lease: Lease) {
        let kept = self.shares.take();
        let same = self
            .remove(client)
            .is_some_and(|old| (old.wants, old.subclients) == (lease.wants, lease.subclients));
        if same {
            self.shares = kept;
        }
        self.next_expiry = self.next_expiry.min(lease.expires_at_ms);
        self.sum_has += u128::from(lease.has.micros());
        self.sum_wants += u128::from(lease.wants.micros());
        self.subclients += u128::from(lease.subclients);
        self.leases.insert(client.to_owned(), lease);
    }

    /// Takes `client`'s lease out, keeping the totals.
    fn remove(&mut self, client: &str) -> Option<Lease> {
        let lease = self.leases.remove(client)?;
        self.shares = None;
        // Every lease in the set was added to the totals, so these never
        // go below zero; saturating all the same.
        self.sum_has = self.sum_has.saturating_sub(u128::from(lease.has.micros()));
        self.sum_wants = self
            .sum_wants
            .saturating_sub(u128::from(lease.wants.micros()));
        self.subclients = self.subclients.saturating_sub(u128::from(lease.subclients));
        Some(lease)
    }
}

impl LeaseSet {
    /// Puts a stored lease back for `client` (replacing any), keeping the
    /// totals: how a store that keeps leases elsewhere (Redis) brings its
    /// copy of a set up to date with what other servers decided. Not a
    /// decision: [`get_capacity`] decides.
    pub fn restore(&mut self, client: &str, lease: Lease) {
        self.insert(client, lease);
    }

    /// Takes `client`'s lease out as another server's decision did (a
    /// release, or a lapsed lease dropped), keeping the totals.
    pub fn forget(&mut self, client: &str) -> Option<Lease> {
        self.remove(client)
    }
}

impl FromIterator<(String, Lease)> for LeaseSet {
    /// A set of stored leases, its totals made again: how a store that
    /// keeps leases elsewhere (Redis) gets a set back to decide on.
    fn from_iter<I: IntoIterator<Item = (String, Lease)>>(leases: I) -> Self {
        let mut set = LeaseSet::new();
        for (client, lease) in leases {
            set.insert(&client, lease);
        }
        set
    }
}

/// What a decision needs besides the configuration and the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseContext {
    /// The time of the decision.
    pub now: Millis,
    /// The capacity this server shares: the configured one at the root,
    /// what its parent granted in a tree (or the safe capacity once that
    /// lease has lapsed).
    pub capacity: Quantity,
    /// Whether the server is in learning mode ([`LeaseParams::learning`]).
    pub learning: bool,
}

impl LeaseContext {
    /// A root server's context: the configured capacity, learning while
    /// within `learning_mode` of `started_at`.
    pub fn root(params: &LeaseParams, started_at: Millis, now: Millis) -> Self {
        Self {
            now,
            capacity: params.capacity(),
            learning: params.learning(started_at, now),
        }
    }
}

/// Drops every lease that has lapsed at `now` (`now ≥ expires_at_ms`):
/// their capacity returns to the pool. Returns the clients that lost them.
pub fn expire(set: &mut LeaseSet, now: Millis) -> Vec<String> {
    if now < set.next_expiry {
        return Vec::new();
    }
    let lapsed: Vec<String> = set
        .leases
        .iter()
        .filter(|(_, lease)| now >= lease.expires_at_ms)
        .map(|(client, _)| client.clone())
        .collect();
    for client in &lapsed {
        set.remove(client);
    }
    set.next_expiry = set
        .leases
        .values()
        .map(|l| l.expires_at_ms)
        .min()
        .unwrap_or(Millis::MAX);
    lapsed
}

/// `release_capacity` (SPEC §12): `client` gives its lease back; true if
/// it held one that had not lapsed at `now`.
pub fn release_capacity(set: &mut LeaseSet, client: &str, now: Millis) -> bool {
    expire(set, now);
    set.remove(client).is_some()
}

/// `get_capacity` (SPEC §12) for one resource: lapsed leases are dropped,
/// then `client` gets a lease of `lease_length` from `ctx.now` on
/// - in learning mode (any algorithm but `none`), what it says it has,
///   within what it wants and the bound below: a server that just started
///   does not know the leases handed out before, and trusting the clients
///   keeps them as they were;
/// - else its share ([`Shares`]) among the live leases, with this
///   request's wants and subclients in place of the client's old ones;
/// - bounded, for `proportional_share` and `fair_share`, by the capacity
///   others do not hold, and for `static` by `capacity × subclients`.
///
/// The lease replaces the client's previous one whatever it was (a refresh
/// may shrink it). The request is valid by construction ([`Want`]), so
/// this cannot fail.
pub fn get_capacity(
    set: &mut LeaseSet,
    params: &LeaseParams,
    ctx: LeaseContext,
    client: &str,
    want: Want,
) -> LeaseReply {
    expire(set, ctx.now);
    let algorithm = params.algorithm();
    let own = set.get(client).map_or(0, |l| u128::from(l.has.micros()));
    let capacity = u128::from(ctx.capacity.micros());
    let bound = match algorithm {
        Algorithm::None => u128::MAX,
        Algorithm::Static => capacity.saturating_mul(u128::from(want.subclients)),
        Algorithm::ProportionalShare | Algorithm::FairShare => {
            capacity.saturating_sub(set.sum_has.saturating_sub(own))
        }
    };
    let learning = ctx.learning && algorithm != Algorithm::None;
    let shares = (!learning).then(|| shares_with(set, algorithm, ctx.capacity, client, want));
    let target = shares.as_ref().map_or(want.has.min(want.wants), |s| {
        s.of(want.wants, want.subclients)
    });
    let has = Quantity::saturating_from_total(u128::from(target.micros()).min(bound));
    let expires_at_ms = ctx.now.saturating_add(params.lease_length());
    set.insert(
        client,
        Lease {
            has,
            wants: want.wants,
            subclients: want.subclients,
            expires_at_ms,
        },
    );
    // The set now holds exactly the wants these shares were computed for.
    if let Some(shares) = shares {
        set.shares = Some(CachedShares {
            algorithm,
            capacity: ctx.capacity,
            shares,
        });
    }
    LeaseReply {
        capacity: has,
        expires_at_ms,
        refresh_interval_ms: params.refresh_interval(),
        safe_capacity: params.safe_capacity(ctx.capacity, set.subclients()),
    }
}

/// The shares of the set with `client`'s wants and subclients replaced by
/// `want`'s: the kept ones when that changes nothing, else computed anew.
fn shares_with(
    set: &LeaseSet,
    algorithm: Algorithm,
    capacity: Quantity,
    client: &str,
    want: Want,
) -> Shares {
    let unchanged = set
        .get(client)
        .is_some_and(|l| (l.wants, l.subclients) == (want.wants, want.subclients));
    if let Some(kept) = &set.shares
        && unchanged
        && kept.algorithm == algorithm
        && kept.capacity == capacity
    {
        return kept.shares.clone();
    }
    let others = set
        .iter()
        .filter(|(c, _)| *c != client)
        .map(|(_, l)| (l.wants, l.subclients));
    Shares::new(
        algorithm,
        capacity,
        others.chain([(want.wants, want.subclients)]),
    )
}

#[cfg(test)]
mod tests;
