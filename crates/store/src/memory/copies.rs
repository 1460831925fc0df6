//! Copy counts per resource, with the resource's staging area for
//! transfers. One lock per resource shard makes every reserve exact against
//! the domain, group and global limits at once. The rules are core's
//! (`charon_core::copy`): this table only finds a resource's state, runs
//! the rule on it under the lock and keeps the result.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use charon_core::config::{CopyLimits, Enforcement};
use charon_core::copy::{self, CopyState, CopyStatus, Hold, ReserveReply, Staged};
use charon_core::request::Amount;
use charon_core::{ClientError, Millis};
use hashbrown::HashMap;

use super::shards::{Hashed, Shards};
use crate::StoreError;

/// A resource's counts, with names hashed by foldhash (as the rest of the
/// store's tables).
type Copies = CopyState<foldhash::fast::RandomState>;

struct CopyEntry {
    resource: Box<str>,
    hash: u64,
    copies: Copies,
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
        f: impl FnOnce(&mut Copies) -> R,
    ) -> R {
        self.shards.with(
            hash,
            |e| &*e.resource == resource,
            || CopyEntry {
                resource: resource.into(),
                hash,
                copies: Copies::default(),
            },
            |e| {
                ids.forget(&copy::expire(&mut e.copies, now));
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
            copy::reserve(c, domain, limits, amount, enforcement)
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
            copy::release(c, hold, copies).map_err(|e| StoreError::BadData(e.to_string()))
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
            copy::stage(c, id.clone(), hold, copies, expires);
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
        let staged = self.with(hash, resource, now, ids, |c| copy::seize(c, id));
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
            let gone = copy::expire(&mut e.copies, now);
            expired += gone.len();
            ids.forget(&gone);
            !e.copies.is_empty()
        });
        (dropped, expired)
    }

    pub(super) fn staged_copies(&self) -> u64 {
        let mut total = 0;
        self.shards.for_each(|e| total += e.copies.staged_copies());
        total
    }
}
