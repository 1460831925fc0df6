//! Copy counts per resource, with the resource's staging area for
//! transfers. One lock per resource shard makes every reserve exact against
//! the domain, group and global limits at once. The rules are core's
//! (`charon_core::copy`): this table only finds a resource's state, runs
//! the rule on it under the lock and keeps the result.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use charon_core::config::{CopyLimits, Enforcement};
use charon_core::copy::{
    self, CopyState, CopyStatus, Decided, Hold, Joined, ReserveReply, Staged, WaitAsk, WaitQueue,
};
use charon_core::request::Amount;
use charon_core::{ClientError, Millis};
use hashbrown::HashMap;

use super::shards::{Hashed, Shards};
use super::waits::Waits;
use crate::{Reserved, StoreError, Ticket, WaitOptions};

/// A resource's counts, with names hashed by foldhash (as the rest of the
/// store's tables).
type Copies = CopyState<foldhash::fast::RandomState>;

struct CopyEntry {
    resource: Box<str>,
    hash: u64,
    copies: Copies,
    /// Callers waiting for copies (SPEC §14).
    queue: WaitQueue,
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
    waits: Waits,
}

impl CopyTable {
    pub(super) fn new(shards: usize) -> Self {
        Self {
            shards: Shards::new(shards),
            waits: Waits::default(),
        }
    }

    /// Runs `f` on the counts and queue of `resource` after what time did
    /// to them (expired transfers released, waiters past their deadline
    /// rejected, the queue served), then hands every waiter decided to its
    /// slot. Lock order: resource shard, the transfer-id index, the slots.
    fn with<R>(
        &self,
        hash: u64,
        resource: &str,
        now: Millis,
        ids: &TransferIds,
        f: impl FnOnce(&mut Copies, &mut WaitQueue, &mut Vec<Decided>) -> R,
    ) -> R {
        self.shards.with(
            hash,
            |e| &*e.resource == resource,
            || CopyEntry {
                resource: resource.into(),
                hash,
                copies: Copies::default(),
                queue: WaitQueue::default(),
            },
            |e| {
                let mut decided = self.pass_time(e, now, ids);
                let r = f(&mut e.copies, &mut e.queue, &mut decided);
                self.waits.deliver(decided);
                r
            },
        )
    }

    /// Releases `e`'s expired transfers and rejects its waiters past their
    /// deadline, serving the queue after each.
    fn pass_time(&self, e: &mut CopyEntry, now: Millis, ids: &TransferIds) -> Vec<Decided> {
        // Deadlines first (a waiter whose wait ran out is not served by a
        // copy that came back at the same instant); the queue was served
        // after the last change, so rejecting is all they do until then.
        let mut decided = copy::expire_waiters(&mut e.copies, &mut e.queue, now);
        let expired = copy::expire(&mut e.copies, now);
        ids.forget(&expired);
        if !expired.is_empty() {
            decided.extend(copy::serve(&mut e.copies, &mut e.queue, now));
        }
        decided
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
        wait: WaitOptions,
        now: Millis,
        ids: &TransferIds,
    ) -> Result<Reserved, ClientError> {
        let ticket = if wait.wait_ms > 0 {
            self.waits.issue()
        } else {
            0
        };
        let ask = WaitAsk {
            ticket,
            wait_ms: wait.wait_ms,
            queue_limit: wait.queue_limit,
        };
        let arrival = self.with(hash, resource, now, ids, |c, q, decided| {
            let a = copy::arrive(c, q, domain, limits, amount, enforcement, ask, now)?;
            decided.extend(a.served);
            Ok(a.joined)
        });
        match arrival {
            Ok(Joined::Queued) => Ok(Reserved::Waiting(Ticket {
                resource: resource.to_owned(),
                id: ticket,
            })),
            other => {
                self.waits.forget(ticket);
                other.map(|j| match j {
                    Joined::Now(reply) => Reserved::Now(reply),
                    Joined::Queued => unreachable!("matched above"),
                })
            }
        }
    }

    pub(super) fn release(
        &self,
        hash: u64,
        hold: &Hold,
        copies: u64,
        result_ready: bool,
        now: Millis,
        ids: &TransferIds,
    ) -> Result<CopyStatus, StoreError> {
        self.with(hash, &hold.resource, now, ids, |c, q, decided| {
            let status =
                copy::release(c, hold, copies).map_err(|e| StoreError::BadData(e.to_string()))?;
            if result_ready {
                decided.extend(copy::result_ready(c, q, &hold.domain, now));
            }
            decided.extend(copy::serve(c, q, now));
            Ok(status)
        })
    }

    /// The answer of `ticket` if it has one, after what time did.
    pub(super) fn outcome(
        &self,
        hash: u64,
        ticket: &Ticket,
        now: Millis,
        ids: &TransferIds,
    ) -> Option<ReserveReply> {
        self.with(hash, &ticket.resource, now, ids, |_, _, _| ());
        self.waits.take(ticket.id)
    }

    /// Takes `ticket` out of its queue and serves the queue; its answer if
    /// it had one.
    pub(super) fn leave(
        &self,
        hash: u64,
        ticket: &Ticket,
        now: Millis,
        ids: &TransferIds,
    ) -> Option<ReserveReply> {
        self.with(hash, &ticket.resource, now, ids, |c, q, decided| {
            if copy::leave(q, ticket.id).is_some() {
                decided.extend(copy::serve(c, q, now));
            }
        });
        let answer = self.waits.take(ticket.id);
        self.waits.forget(ticket.id);
        answer
    }

    /// Runs what time did to `resource`.
    pub(super) fn tick(&self, hash: u64, resource: &str, now: Millis, ids: &TransferIds) {
        self.with(hash, resource, now, ids, |_, _, _| ());
    }

    /// What wakes `ticket`'s waiter.
    pub(super) fn wake(&self, ticket: &Ticket) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        self.waits.wake(ticket.id)
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
        self.with(hash, &hold.resource, now, ids, |c, _, _| {
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
        let staged = self.with(hash, resource, now, ids, |c, _, _| copy::seize(c, id));
        if staged.is_some() {
            ids.forget(&[id.to_owned()]);
        }
        staged
    }

    /// Expires staged transfers and waiters everywhere and drops resources
    /// with nothing held and nobody waiting; returns (resources dropped,
    /// transfers expired).
    pub(super) fn sweep(&self, now: Millis, ids: &TransferIds) -> (usize, usize) {
        let mut expired = 0;
        let mut decided = Vec::new();
        let dropped = self.shards.retain(|e| {
            let before = e.copies.staged.len();
            decided.extend(self.pass_time(e, now, ids));
            expired += before - e.copies.staged.len();
            !e.copies.is_empty() || !e.queue.is_empty()
        });
        self.waits.deliver(decided);
        (dropped, expired)
    }

    pub(super) fn staged_copies(&self) -> u64 {
        let mut total = 0;
        self.shards.for_each(|e| total += e.copies.staged_copies());
        total
    }

    /// Callers waiting, by resource (those with none left out).
    pub(super) fn queue_lengths(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        self.shards.for_each(|e| {
            if !e.queue.is_empty() {
                out.push((e.resource.to_string(), e.queue.len() as u64));
            }
        });
        out
    }
}
