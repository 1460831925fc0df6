//! Copy counts per resource, with the resource's staging area for
//! transfers. One lock per resource shard makes every reserve exact against
//! the domain, group and global limits at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use charon_core::config::{CopyLimits, Enforcement};
use charon_core::copy::{
    CopyCounts, CopyStatus, Hold, ReserveReply, Staged, check_bound, reserve_grant,
};
use charon_core::request::Amount;
use charon_core::{ClientError, Millis};
use hashbrown::HashMap;

use super::shards::{Hashed, Shards};
use crate::StoreError;

/// Copies held of one resource: by domain, by group, in all, and staged.
#[derive(Default)]
struct ResourceCopies {
    global: u64,
    domains: HashMap<Box<str>, u64>,
    groups: HashMap<Box<str>, u64>,
    /// transfer id → (staged copies, expiry).
    staged: HashMap<String, (Staged, Millis)>,
}

impl ResourceCopies {
    fn count(&self, domain: &str) -> u64 {
        self.domains.get(domain).copied().unwrap_or(0)
    }

    fn group(&self, name: &str) -> u64 {
        self.groups.get(name).copied().unwrap_or(0)
    }

    /// Counts `n` more copies. The caller has checked the bound (see
    /// `charon_core::bound`), so no count passes `MAX_COUNT`; saturating
    /// all the same, so that no input can make a count wrap.
    fn add(&mut self, domain: &str, groups: &[String], n: u64) {
        self.global = self.global.saturating_add(n);
        let d = self.domains.entry(domain.into()).or_default();
        *d = d.saturating_add(n);
        for g in groups {
            let c = self.groups.entry(g.as_str().into()).or_default();
            *c = c.saturating_add(n);
        }
    }

    /// Takes `n` copies of `hold` out of the counts. The counts must hold
    /// them; if they do not, nothing changes and the caller hears about it.
    fn remove(&mut self, hold: &Hold, n: u64) -> Result<(), StoreError> {
        let short = self.global < n
            || self.count(&hold.domain) < n
            || hold.groups.iter().any(|g| self.group(g) < n);
        if short {
            return Err(StoreError::BadData(format!(
                "counts of {:?} for domain {:?} are below {n}: refusing to go negative",
                hold.resource, hold.domain
            )));
        }
        self.global -= n;
        decrement(&mut self.domains, &hold.domain, n);
        for g in &hold.groups {
            decrement(&mut self.groups, g, n);
        }
        Ok(())
    }

    fn status(&self, hold: &Hold) -> CopyStatus {
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

    /// Releases every staged transfer whose ttl has passed; returns the ids.
    fn expire(&mut self, now: Millis) -> Vec<String> {
        let expired: Vec<String> = self
            .staged
            .iter()
            .filter(|(_, (_, expires))| now >= *expires)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            if let Some((staged, _)) = self.staged.remove(id) {
                // Staged copies were counted when staged; they are there.
                let _ = self.remove(&staged.hold, staged.copies);
            }
        }
        expired
    }

    fn is_empty(&self) -> bool {
        self.global == 0 && self.staged.is_empty()
    }
}

/// Removes `n` from a count, dropping the entry at zero.
fn decrement(map: &mut HashMap<Box<str>, u64>, key: &str, n: u64) {
    if let Some(c) = map.get_mut(key) {
        *c -= n;
        if *c == 0 {
            map.remove(key);
        }
    }
}

struct CopyEntry {
    resource: Box<str>,
    hash: u64,
    copies: ResourceCopies,
}

impl Hashed for CopyEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
}

/// How transfer ids are made, and which resource each live id belongs to
/// (a seize names only the id).
pub(super) struct TransferIds {
    sequence: Option<AtomicU64>,
    live: Mutex<HashMap<String, Box<str>>>,
}

impl TransferIds {
    pub(super) fn random() -> Self {
        Self {
            sequence: None,
            live: Mutex::default(),
        }
    }

    pub(super) fn sequential() -> Self {
        Self {
            sequence: Some(AtomicU64::new(0)),
            live: Mutex::default(),
        }
    }

    fn issue(&self, resource: &str) -> String {
        let id = match &self.sequence {
            Some(n) => format!("t{}", n.fetch_add(1, Ordering::Relaxed) + 1),
            None => format!("{:032x}", rand::random::<u128>()),
        };
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone(), resource.into());
        id
    }

    pub(super) fn resource_of(&self, id: &str) -> Option<Box<str>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    fn forget(&self, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        for id in ids {
            live.remove(id);
        }
    }
}

pub(super) struct CopyTable {
    shards: Shards<CopyEntry>,
}

impl CopyTable {
    pub(super) fn new(shards: usize) -> Self {
        Self {
            shards: Shards::new(shards),
        }
    }

    /// Runs `f` on the counts of `resource` after releasing its expired
    /// transfers. Lock order: resource shard, then the transfer-id index.
    fn with<R>(
        &self,
        hash: u64,
        resource: &str,
        now: Millis,
        ids: &TransferIds,
        f: impl FnOnce(&mut ResourceCopies) -> R,
    ) -> R {
        self.shards.with(
            hash,
            |e| &*e.resource == resource,
            || CopyEntry {
                resource: resource.into(),
                hash,
                copies: ResourceCopies::default(),
            },
            |e| {
                ids.forget(&e.copies.expire(now));
                f(&mut e.copies)
            },
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reserve(
        &self,
        hash: u64,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
        now: Millis,
        ids: &TransferIds,
    ) -> Result<ReserveReply, ClientError> {
        self.with(hash, resource, now, ids, |c| {
            let names: Vec<String> = limits.groups.iter().map(|g| g.name.clone()).collect();
            let mut counts = CopyCounts {
                domain: c.count(domain),
                global: c.global,
                groups: names.iter().map(|g| c.group(g)).collect(),
            };
            let granted = reserve_grant(limits, &counts, amount, enforcement).unwrap_or(0);
            if granted > 0 {
                check_bound(domain, limits, &counts, granted)?;
                c.add(domain, &names, granted);
                counts.domain = counts.domain.saturating_add(granted);
                counts.global = counts.global.saturating_add(granted);
                for g in &mut counts.groups {
                    *g = g.saturating_add(granted);
                }
            }
            Ok(ReserveReply::new(granted, limits, &counts, enforcement))
        })
    }

    pub(super) fn release(
        &self,
        hash: u64,
        hold: &Hold,
        copies: u64,
        now: Millis,
        ids: &TransferIds,
    ) -> Result<CopyStatus, StoreError> {
        self.with(hash, &hold.resource, now, ids, |c| {
            c.remove(hold, copies)?;
            Ok(c.status(hold))
        })
    }

    pub(super) fn transfer(
        &self,
        hash: u64,
        hold: &Hold,
        copies: u64,
        expires: Millis,
        now: Millis,
        ids: &TransferIds,
    ) -> String {
        self.with(hash, &hold.resource, now, ids, |c| {
            let id = ids.issue(&hold.resource);
            let staged = Staged {
                hold: hold.clone(),
                copies,
            };
            c.staged.insert(id.clone(), (staged, expires));
            id
        })
    }

    pub(super) fn seize(
        &self,
        hash: u64,
        resource: &str,
        id: &str,
        now: Millis,
        ids: &TransferIds,
    ) -> Option<Staged> {
        let staged = self.with(hash, resource, now, ids, |c| {
            c.staged.remove(id).map(|(s, _)| s)
        });
        if staged.is_some() {
            ids.forget(&[id.to_owned()]);
        }
        staged
    }

    /// Expires staged transfers everywhere and drops resources with nothing
    /// held; returns (resources dropped, transfers expired).
    pub(super) fn sweep(&self, now: Millis, ids: &TransferIds) -> (usize, usize) {
        let mut expired = 0;
        let dropped = self.shards.retain(|e| {
            let gone = e.copies.expire(now);
            expired += gone.len();
            ids.forget(&gone);
            !e.copies.is_empty()
        });
        (dropped, expired)
    }

    pub(super) fn staged_copies(&self) -> u64 {
        let mut total = 0;
        self.shards
            .for_each(|e| total += e.copies.staged.values().map(|(s, _)| s.copies).sum::<u64>());
        total
    }
}
