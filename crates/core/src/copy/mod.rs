//! Copy-limited resources: a distributed counting semaphore with domain,
//! global and group limits (SPEC §3, paper §2.2).
//!
//! The counts live in a store; this module decides how many copies a
//! reserve gets from the counts it is shown, and describes the reply.

use serde::Serialize;

use crate::bound::{self, Kept};
use crate::limits::{CopyLimits, Enforcement};
use crate::request::Amount;
use crate::{ClientError, UNBOUNDED};

mod state;
mod wait;

pub use state::{CopyState, ShortCounts, expire, release, reserve, seize, stage};
pub use wait::{
    Arrival, DEFAULT_QUEUE_LIMIT, Decided, Joined, MAX_QUEUE_LIMIT, WaitAsk, WaitMode, WaitQueue,
    Waiter, arrive, expire_waiters, leave, result_ready, serve,
};

/// Copies held now, as a store reports them for one reserve: by the domain,
/// by all domains, and by each group of the domain (aligned with
/// [`CopyLimits::groups`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyCounts {
    pub domain: u64,
    pub global: u64,
    pub groups: Vec<u64>,
}

/// How many copies a reserve gets: the largest n in `[min_copies, copies]`
/// such that after the grant the domain, the resource and every group of
/// the domain stay within their limits; `None` if no such n exists. A
/// domain in k groups takes one copy from each group's pool.
pub fn reserve_grant(
    limits: &CopyLimits,
    counts: &CopyCounts,
    amount: Amount,
    enforcement: Enforcement,
) -> Option<u64> {
    if enforcement == Enforcement::Ignore {
        return Some(amount.copies());
    }
    amount.grant_within(available(limits, counts))
}

/// Whether a grant of `n` copies to `domain` keeps every count within
/// [`crate::MAX_COUNT`] (see [`crate::bound`]): the domain's, the
/// resource's, then each group's in the order of `limits.groups`. A store
/// checks a grant (`n > 0`) before it counts it; on an error nothing
/// changes.
pub fn check_bound(
    domain: &str,
    limits: &CopyLimits,
    counts: &CopyCounts,
    n: u64,
) -> Result<(), ClientError> {
    bound::check(Kept::DomainCopies(domain), counts.domain, n)?;
    bound::check(Kept::ResourceCopies, counts.global, n)?;
    for (group, held) in limits.groups.iter().zip(&counts.groups) {
        bound::check(Kept::GroupCopies(&group.name), *held, n)?;
    }
    Ok(())
}

/// The most copies that could be reserved now.
pub fn available(limits: &CopyLimits, counts: &CopyCounts) -> u64 {
    let mut room = limits.domain_limit.saturating_sub(counts.domain);
    room = room.min(
        limits
            .global_limit
            .map_or(UNBOUNDED, |g| g.saturating_sub(counts.global)),
    );
    for (group, held) in limits.groups.iter().zip(&counts.groups) {
        room = room.min(group.limit.saturating_sub(*held));
    }
    room
}

/// A group as the reply to a reserve shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupHolds {
    pub name: String,
    pub limit: u64,
    pub holds: u64,
}

/// The reply to a reserve (SPEC §3), counts as of after the decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReserveReply {
    /// n: copies granted (0 on rejection).
    pub granted: u64,
    #[serde(serialize_with = "crate::wire::bound")]
    pub domain_limit: u64,
    #[serde(serialize_with = "crate::wire::limit")]
    pub global_limit: Option<u64>,
    pub domain_holds: u64,
    pub global_holds: u64,
    /// Every group the domain belongs to now. Their names are the group set
    /// under which the copies are held (needed to release them).
    pub groups: Vec<GroupHolds>,
    /// Whether the grant ignored the limits (SPEC §4 `ignore_configured`);
    /// in JSON only when set.
    #[serde(skip_serializing_if = "crate::wire::is_false")]
    pub ignored: bool,
    /// Rejected at once: the resource's queue of waiters is full (SPEC
    /// §14); in JSON only when set.
    #[serde(skip_serializing_if = "crate::wire::is_false")]
    pub queue_full: bool,
    /// Answered without a copy because a holder released with its result
    /// ready (`wait_mode: shared_result`); in JSON only when set.
    #[serde(skip_serializing_if = "crate::wire::is_false")]
    pub result_ready: bool,
    /// How long a reserve that was allowed to wait waited (0: answered at
    /// once); absent for a reserve that could not wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
}

impl ReserveReply {
    /// Assembles the reply from the limits and the counts after the
    /// decision.
    pub fn new(
        granted: u64,
        limits: &CopyLimits,
        after: &CopyCounts,
        enforcement: Enforcement,
    ) -> Self {
        Self {
            granted,
            domain_limit: limits.domain_limit,
            global_limit: limits.global_limit,
            domain_holds: after.domain,
            global_holds: after.global,
            groups: limits
                .groups
                .iter()
                .zip(&after.groups)
                .map(|(g, &holds)| GroupHolds {
                    name: g.name.clone(),
                    limit: g.limit,
                    holds,
                })
                .collect(),
            ignored: enforcement == Enforcement::Ignore,
            queue_full: false,
            result_ready: false,
            waited_ms: None,
        }
    }

    /// The sorted group set under which the granted copies are held.
    pub fn group_set(&self) -> Vec<String> {
        group_set(self.groups.iter().map(|g| g.name.clone()))
    }
}

/// A group set in canonical form (sorted, without repeats), so that
/// `["b", "a"]` and `["a", "b"]` name the same holds.
pub fn group_set(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = names.into_iter().collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

/// What a session holds, and what it must name to give copies back: the
/// resource, the domain and the group set at the time of the reserve.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Hold {
    pub resource: String,
    pub domain: String,
    /// Canonical (sorted, no repeats): see [`group_set`].
    pub groups: Vec<String>,
}

impl Hold {
    /// A hold key with its group set made canonical.
    pub fn new(
        resource: impl Into<String>,
        domain: impl Into<String>,
        groups: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            resource: resource.into(),
            domain: domain.into(),
            groups: group_set(groups),
        }
    }
}

/// Copies in a transfer's staging area, or the result of seizing them.
/// In JSON the hold's fields come first, then `copies`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Staged {
    #[serde(flatten)]
    pub hold: Hold,
    pub copies: u64,
}

/// Counts after a release (or transfer), for the reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CopyStatus {
    pub domain_holds: u64,
    pub global_holds: u64,
    /// Holds of each group of the released set, in the set's order; in
    /// JSON `[{"name": …, "holds": …}]`.
    #[serde(serialize_with = "crate::wire::named_holds")]
    pub groups: Vec<(String, u64)>,
}
