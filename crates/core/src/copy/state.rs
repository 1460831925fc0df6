//! The copy counts of one resource and every rule that changes them
//! (SPEC §3): reserve, release, staging a transfer, seizing it, expiring
//! staged transfers. Pure functions over a [`CopyState`] value, the way
//! [`crate::rate::decide`] is over a `RateState`: a store loads the state
//! of a resource, calls one of them and keeps the result (a mutex in the
//! in-memory store). The Redis scripts `reserve.lua`, `release.lua`,
//! `transfer.lua`, `seize.lua` and `expire_staged` in `copy.lua` are the
//! only other copy of these rules; the differential test keeps them equal.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use super::{CopyCounts, CopyStatus, Hold, ReserveReply, Staged, check_bound, reserve_grant};
use crate::limits::{CopyLimits, Enforcement};
use crate::request::Amount;
use crate::{ClientError, Millis};

/// Copies held of one resource: by domain, by group, in all, and staged.
/// Every count includes the staged copies (they are held until seized or
/// expired); entries at zero are absent. `S` hashes the names (a store
/// picks a fast one; the std default otherwise).
#[derive(Debug, Clone, Default)]
pub struct CopyState<S = RandomState> {
    pub global: u64,
    pub domains: HashMap<Box<str>, u64, S>,
    pub groups: HashMap<Box<str>, u64, S>,
    /// transfer id → (staged copies, expiry).
    pub staged: HashMap<String, (Staged, Millis), S>,
}

impl<S: BuildHasher> PartialEq for CopyState<S> {
    fn eq(&self, other: &Self) -> bool {
        self.global == other.global
            && self.domains == other.domains
            && self.groups == other.groups
            && self.staged == other.staged
    }
}

impl<S: BuildHasher> Eq for CopyState<S> {}

/// A release that would take a count below zero: the counts do not hold
/// what the hold names. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("counts of {resource:?} for domain {domain:?} are below {copies}: refusing to go negative")]
pub struct ShortCounts {
    pub resource: String,
    pub domain: String,
    pub copies: u64,
}

impl<S: BuildHasher> CopyState<S> {
    /// Copies held by `domain`.
    pub fn count(&self, domain: &str) -> u64 {
        self.domains.get(domain).copied().unwrap_or(0)
    }

    /// Copies held under group `name`.
    pub fn group(&self, name: &str) -> u64 {
        self.groups.get(name).copied().unwrap_or(0)
    }

    /// The counts a reserve of `domain` under `limits` is decided on.
    pub fn counts(&self, domain: &str, limits: &CopyLimits) -> CopyCounts {
        CopyCounts {
            domain: self.count(domain),
            global: self.global,
            groups: limits.groups.iter().map(|g| self.group(&g.name)).collect(),
        }
    }

    /// The counts of `hold`'s domain, the resource and `hold`'s groups.
    pub fn status(&self, hold: &Hold) -> CopyStatus {
        CopyStatus {
            domain_holds: self.count(&hold.domain),
            global_holds: self.global,
            groups: hold
                .groups
                .iter()
                .map(|g| (g.clone(), self.group(g)))
                .collect(),
        }
    }

    /// Copies waiting in the staging area.
    pub fn staged_copies(&self) -> u64 {
        self.staged.values().map(|(s, _)| s.copies).sum()
    }

    /// Whether nothing is held or staged: the state is as good as none.
    pub fn is_empty(&self) -> bool {
        self.global == 0 && self.staged.is_empty()
    }

    /// Counts `n` more copies. The caller has checked the bound (see
    /// [`crate::bound`]), so no count passes `MAX_COUNT`; saturating all
    /// the same, so that no input can make a count wrap.
    fn add<'a>(&mut self, domain: &str, groups: impl IntoIterator<Item = &'a str>, n: u64) {
        self.global = self.global.saturating_add(n);
        let d = self.domains.entry(domain.into()).or_default();
        *d = d.saturating_add(n);
        for g in groups {
            let c = self.groups.entry(g.into()).or_default();
            *c = c.saturating_add(n);
        }
    }
}

/// A reserve of `amount` copies for `domain` (SPEC §3): the grant of
/// [`reserve_grant`], checked against the bound ([`check_bound`]) and
/// counted. On an error nothing changes.
pub fn reserve<S: BuildHasher>(
    state: &mut CopyState<S>,
    domain: &str,
    limits: &CopyLimits,
    amount: Amount,
    enforcement: Enforcement,
) -> Result<ReserveReply, ClientError> {
    let mut counts = state.counts(domain, limits);
    let granted = reserve_grant(limits, &counts, amount, enforcement).unwrap_or(0);
    if granted > 0 {
        check_bound(domain, limits, &counts, granted)?;
        state.add(
            domain,
            limits.groups.iter().map(|g| g.name.as_str()),
            granted,
        );
        counts.domain = counts.domain.saturating_add(granted);
        counts.global = counts.global.saturating_add(granted);
        for g in &mut counts.groups {
            *g = g.saturating_add(granted);
        }
    }
    Ok(ReserveReply::new(granted, limits, &counts, enforcement))
}

/// Gives back `copies` copies of `hold`: the domain's, the resource's and
/// each group's count go down by `copies`. If any of them holds fewer,
/// nothing changes and the caller hears about it. Returns the counts after.
pub fn release<S: BuildHasher>(
    state: &mut CopyState<S>,
    hold: &Hold,
    copies: u64,
) -> Result<CopyStatus, ShortCounts> {
    take(state, hold, copies)?;
    Ok(state.status(hold))
}

/// Stages `copies` copies of `hold` under transfer `id` until `expires`:
/// they stay counted, owned by nobody, until seized or expired.
pub fn stage<S: BuildHasher>(
    state: &mut CopyState<S>,
    id: String,
    hold: &Hold,
    copies: u64,
    expires: Millis,
) {
    let staged = Staged {
        hold: hold.clone(),
        copies,
    };
    state.staged.insert(id, (staged, expires));
}

/// Takes the copies staged under transfer `id` out of the staging area
/// (they stay counted: the seizer holds them now); `None` if there are
/// none (never staged, seized or expired).
pub fn seize<S: BuildHasher>(state: &mut CopyState<S>, id: &str) -> Option<Staged> {
    state.staged.remove(id).map(|(s, _)| s)
}

/// Releases every staged transfer whose ttl has passed (expired at
/// `now >= expiry`); returns their ids.
pub fn expire<S: BuildHasher>(state: &mut CopyState<S>, now: Millis) -> Vec<String> {
    let expired: Vec<String> = state
        .staged
        .iter()
        .filter(|(_, (_, expires))| now >= *expires)
        .map(|(id, _)| id.clone())
        .collect();
    for id in &expired {
        if let Some((staged, _)) = state.staged.remove(id) {
            // Staged copies were counted when staged and stay counted until
            // now, so the counts hold them; if they somehow do not, the
            // transfer is gone all the same and the counts stay as they are.
            let _ = take(state, &staged.hold, staged.copies);
        }
    }
    expired
}

/// Takes `n` copies of `hold` out of the counts, or nothing if any count
/// is short.
fn take<S: BuildHasher>(state: &mut CopyState<S>, hold: &Hold, n: u64) -> Result<(), ShortCounts> {
    let short = state.global < n
        || state.count(&hold.domain) < n
        || hold.groups.iter().any(|g| state.group(g) < n);
    if short {
        return Err(ShortCounts {
            resource: hold.resource.clone(),
            domain: hold.domain.clone(),
            copies: n,
        });
    }
    state.global -= n;
    decrement(&mut state.domains, &hold.domain, n);
    for g in &hold.groups {
        decrement(&mut state.groups, g, n);
    }
    Ok(())
}

/// Removes `n` from a count, dropping the entry at zero.
fn decrement<S: BuildHasher>(map: &mut HashMap<Box<str>, u64, S>, key: &str, n: u64) {
    if let Some(c) = map.get_mut(key) {
        *c -= n;
        if *c == 0 {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
