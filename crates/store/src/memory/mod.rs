//! The in-memory store: the embedded default of a single limiting server.
//!
//! Burst tiers' state is kept per (resource, domain) pair in a sharded
//! table of small entries, the last second of hits per resource beside it
//! (for G), and copy counts per resource. The state of buckets, windows and
//! queues (`charon_core::meter`) has its own table of the same kind. Idle
//! state is dropped from the moment core says it can no longer affect a
//! decision (`RateState::forget_at`): lazily when the pair is next used,
//! and by [`MemoryStore::sweep`], which a server runs periodically so
//! memory does not grow as domains come and go.
//!
//! The table of pairs is in `table.rs`; burst tiers' entries (encoded by
//! `rate_bytes.rs`) and a rate decision on them in `rates.rs`, meters in
//! `meters.rs`, copies in `copies.rs`, waiters in `waits.rs`.

mod copies;
mod meters;
mod rate_bytes;
mod rates;
mod shards;
mod table;
mod waits;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use charon_core::config::{CopyLimits, Enforcement, RateLimits};
use charon_core::copy::{CopyStatus, Hold, ReserveReply, Staged};
use charon_core::lease::LeaseSet;
use charon_core::meter::{Meter, MeterState, Op, Policy, Reply};
use charon_core::rate::{DORMANT_GRACE, HitLog, RateReply, RateState, decide_op};
use charon_core::request::Amount;
use charon_core::time::SECOND;
use charon_core::{ClientError, Clock, Millis};

use self::copies::{CopyTable, TransferIds};
use self::meters::{MeterTable, Stored, Write};
use self::rates::RateTable;
use self::rates::{GlobalEntry, NEVER};
use self::shards::{Hashed, Shards};
use crate::{Batch, Limit, MeterOp, OpReply, Reserved, Store, StoreError, Ticket, WaitOptions};

/// How often [`Store::maintain`] sweeps idle state.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The in-memory [`Store`].
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    hasher: foldhash::fast::RandomState,
    /// Burst tiers' pairs.
    rates: RateTable,
    meters: MeterTable,
    globals: Shards<GlobalEntry>,
    copies: CopyTable,
    transfers: TransferIds,
    /// The leases of each lease resource (SPEC §12), behind one lock: a
    /// lease decision is a refresh every few seconds per client, not a
    /// per-request path.
    leases: Mutex<HashMap<Box<str>, LeaseSet>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("clock", &self.clock)
            .field("pairs", &self.rates.len())
            .finish_non_exhaustive()
    }
}

/// What one [`MemoryStore::sweep`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Idle (resource, domain) rate states, of burst tiers and of the
    /// other rate-like kinds.
    pub pairs: usize,
    /// Per-resource state emptied: global hit logs, copy counts and lease
    /// sets whose every lease lapsed.
    pub resources: usize,
    /// Staged transfers whose ttl had passed.
    pub transfers: usize,
}

impl MemoryStore {
    /// A store reading `clock`, with unguessable transfer ids.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::build(clock, TransferIds::random())
    }

    /// A store whose transfer ids are `t1`, `t2`, …: reproducible output
    /// for `charon simulate` and tests.
    pub fn with_sequential_ids(clock: Arc<dyn Clock>) -> Self {
        Self::build(clock, TransferIds::sequential())
    }

    fn build(clock: Arc<dyn Clock>, transfers: TransferIds) -> Self {
        let shards = 64;
        let hasher = foldhash::fast::RandomState::default();
        Self {
            clock,
            meters: MeterTable::new(shards, hasher.clone()),
            rates: RateTable::new(shards, hasher.clone()),
            hasher,
            globals: Shards::new(shards),
            copies: CopyTable::new(shards),
            transfers,
            leases: Mutex::default(),
        }
    }

    /// The store's clock, read once per operation.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Drops every piece of state that can no longer affect a decision and
    /// every staged transfer whose ttl has passed.
    pub fn sweep(&self) -> Swept {
        let now = self.now();
        let pairs = rates::sweep(&self.rates, now) + self.meters.retain(|f| now < f);
        let resources = self.globals.retain(|e| {
            e.log.prune(now, SECOND);
            !e.log.is_empty()
        });
        let (emptied, transfers) = self.copies.sweep(now, &self.transfers);
        let lapsed = {
            let mut sets = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
            let before = sets.len();
            sets.retain(|_, set| {
                charon_core::lease::expire(set, now);
                !set.is_empty()
            });
            before - sets.len()
        };
        Swept {
            pairs,
            resources: resources + emptied + lapsed,
            transfers,
        }
    }

    /// (resource, domain) pairs with rate state in memory.
    pub fn pair_count(&self) -> usize {
        self.rates.len()
    }

    /// (resource, domain) pairs with bucket, window or queue state in
    /// memory.
    pub fn meter_count(&self) -> usize {
        self.meters.len()
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn tiers(
        &self,
        resource: &str,
        domain: &str,
        limits: RateLimits<'_>,
        policy: Policy,
        op: Op,
        enforcement: Enforcement,
    ) -> Result<RateReply, StoreError> {
        self.decide_rate(resource, domain, limits, policy, op, enforcement)
            .map_err(StoreError::Refused)
    }

    async fn meter(
        &self,
        resource: &str,
        domain: &str,
        meter: &Meter,
        op: Op,
    ) -> Result<Reply, StoreError> {
        let now = self.now();
        let pair = self.meters.pair(resource, domain);
        self.meters
            .update(&pair, |found| decide_stored(meter, op, now, found))
            .map_err(StoreError::Refused)
    }

    /// Holds the locks of every shard the batch touches while it decides
    /// every operation on copies of the states (the earlier operations'
    /// results in small overlays), then, if none was rejected, writes them:
    /// a bucket, window or queue applied again as [`Store::meter`] does (at
    /// the same `now` and on the same states, it decides the same), burst
    /// tiers' states and last seconds as the batch left them. The locks are
    /// taken meters' shards first, then the tiers' pair shards, then their
    /// resources' last-second shards, each set in increasing order: a
    /// single tiers operation takes a pair's shard before its resource's,
    /// and nothing takes them the other way round, so nothing deadlocks.
    async fn meters(&self, ops: &[MeterOp<'_>]) -> Result<Batch, StoreError> {
        let now = self.now();
        let resources: Vec<_> = ops
            .iter()
            .map(|o| crate::slotted_resource(o.slot, o.resource))
            .collect();
        let pairs: Vec<_> = ops
            .iter()
            .zip(&resources)
            .map(|(o, r)| self.meters.pair(r, o.domain))
            .collect();
        let is_tiers = |o: &MeterOp<'_>| matches!(o.limit, Limit::Tiers { .. });
        // The pairs of the meters' operations, then of the tiers' (both
        // tables hash as `self.meters.pair` does).
        let pairs_where = |tiers: bool| {
            ops.iter()
                .zip(&pairs)
                .filter(move |(o, _)| is_tiers(o) == tiers)
                .map(|(_, p)| p)
        };
        let mut locked = self.meters.lock_pairs(pairs_where(false));
        let mut pair_locks = self.rates.lock_pairs(pairs_where(true));
        let mut global_locks = self
            .globals
            .lock_many(pairs_where(true).map(table::Pair::resource_hash));
        let mut overlay: HashMap<(&str, &str), MeterState> = HashMap::new();
        // A tiers pair's state, its forget time (as the latest operation
        // left it: from then on the next one starts from nothing, as on
        // its own) and where it is; a resource's last second and hash.
        let mut tier_states: HashMap<(&str, &str), (RateState, Millis, &table::Pair<'_>)> =
            HashMap::new();
        let mut global_logs: HashMap<&str, (HitLog, u64)> = HashMap::new();
        let mut replies = Vec::with_capacity(ops.len());
        let mut committed = true;
        for ((o, pair), resource) in ops.iter().zip(&pairs).zip(&resources) {
            let key = (resource.as_ref(), o.domain);
            let reply = match o.limit {
                Limit::Meter(meter) => {
                    let mut state = match overlay.get(&key) {
                        Some(s) => *s,
                        None => locked
                            .find(pair)
                            .filter(|stored| now < stored.forget_at)
                            .map_or_else(|| meter.empty(), |stored| stored.state),
                    };
                    let reply = meter
                        .decide(&mut state, now, o.op)
                        .map_err(StoreError::Refused)?;
                    overlay.insert(key, state);
                    OpReply::Meter(reply)
                }
                Limit::Tiers {
                    limits,
                    policy,
                    enforcement,
                } => {
                    let resource = key.0;
                    let global_hash = pair.resource_hash();
                    let pair_state = tier_states.entry(key).or_insert_with(|| {
                        let (state, forget_at) = rates::read_locked(&mut pair_locks, pair);
                        (state, forget_at, pair)
                    });
                    if now >= pair_state.1 {
                        pair_state.0 = RateState::default();
                    }
                    let global = global_logs.entry(resource).or_insert_with(|| {
                        let log = global_locks
                            .table(global_hash)
                            .find(global_hash, |g| &*g.resource == resource)
                            .map(|g| g.log.clone())
                            .unwrap_or_default();
                        (log, global_hash)
                    });
                    let reply = decide_op(
                        limits,
                        policy,
                        &mut pair_state.0,
                        &mut global.0,
                        now,
                        o.op,
                        enforcement,
                    )
                    .map_err(StoreError::Refused)?;
                    pair_state.1 = pair_state
                        .0
                        .forget_at(limits.tiers, DORMANT_GRACE)
                        .unwrap_or(NEVER);
                    OpReply::Tiers(reply)
                }
            };
            committed &= o.shadow || !reply.rejects(o.op);
            replies.push(reply);
        }
        if !committed {
            return Ok(Batch { committed, replies });
        }
        for ((o, pair), reply) in ops.iter().zip(&pairs).zip(&mut replies) {
            if let Limit::Meter(meter) = o.limit {
                *reply = OpReply::Meter(
                    locked
                        .update(pair, |found| decide_stored(meter, o.op, now, found))
                        .map_err(StoreError::Refused)?,
                );
            }
        }
        for (state, forget_at, pair) in tier_states.into_values() {
            rates::write_locked(&mut pair_locks, pair, state, forget_at, now);
        }
        for (resource, (log, hash)) in global_logs {
            let table = global_locks.table(hash);
            match table.find_mut(hash, |g| &*g.resource == resource) {
                Some(g) => g.log = log,
                None => {
                    let entry = GlobalEntry {
                        resource: resource.into(),
                        hash,
                        log,
                    };
                    table.insert_unique(hash, entry, Hashed::hash);
                }
            }
        }
        Ok(Batch { committed, replies })
    }

    async fn reserve(
        &self,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
    ) -> Result<ReserveReply, StoreError> {
        let wait = WaitOptions::default();
        match self
            .reserve_or_wait(resource, domain, limits, amount, enforcement, wait)
            .await?
        {
            Reserved::Now(reply) => Ok(reply),
            Reserved::Waiting(_) => Err(StoreError::BadData(
                "a reserve that may not wait waits".into(),
            )),
        }
    }

    async fn reserve_or_wait(
        &self,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
        wait: WaitOptions,
    ) -> Result<Reserved, StoreError> {
        let now = self.now();
        let hash = self.hasher.hash_one(resource);
        self.copies
            .reserve(
                hash,
                resource,
                domain,
                limits,
                amount,
                enforcement,
                wait,
                now,
                &self.transfers,
            )
            .map_err(StoreError::Refused)
    }

    async fn release_ready(
        &self,
        hold: &Hold,
        copies: u64,
        result_ready: bool,
    ) -> Result<CopyStatus, StoreError> {
        let now = self.now();
        let hash = self.hasher.hash_one(hold.resource.as_str());
        self.copies
            .release(hash, hold, copies, result_ready, now, &self.transfers)
    }

    async fn wait_outcome(&self, ticket: &Ticket) -> Result<Option<ReserveReply>, StoreError> {
        let hash = self.hasher.hash_one(ticket.resource.as_str());
        Ok(self
            .copies
            .outcome(hash, ticket, self.now(), &self.transfers))
    }

    async fn woken(&self, ticket: &Ticket, at_most: std::time::Duration) {
        if let Some(wake) = self.copies.wake(ticket) {
            let _ = tokio::time::timeout(at_most, wake.notified()).await;
        }
    }

    async fn leave_queue(&self, ticket: &Ticket) -> Result<Option<ReserveReply>, StoreError> {
        let hash = self.hasher.hash_one(ticket.resource.as_str());
        Ok(self.copies.leave(hash, ticket, self.now(), &self.transfers))
    }

    async fn tick(&self, resource: &str) -> Result<(), StoreError> {
        let hash = self.hasher.hash_one(resource);
        self.copies
            .tick(hash, resource, self.now(), &self.transfers);
        Ok(())
    }

    async fn queue_lengths(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(self.copies.queue_lengths())
    }

    async fn transfer(&self, hold: &Hold, copies: u64, ttl: Millis) -> Result<String, StoreError> {
        let now = self.now();
        let hash = self.hasher.hash_one(hold.resource.as_str());
        Ok(self.copies.transfer(
            hash,
            hold,
            copies,
            now.saturating_add(ttl),
            now,
            &self.transfers,
        ))
    }

    async fn leases(
        &self,
        resource: &str,
        _client: &str,
        decide: &mut (dyn for<'s> FnMut(&'s mut LeaseSet, Millis) + Send),
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut sets = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        match sets.get_mut(resource) {
            Some(set) => {
                decide(set, now);
                if set.is_empty() {
                    sets.remove(resource);
                }
            }
            None => {
                let mut set = LeaseSet::new();
                decide(&mut set, now);
                if !set.is_empty() {
                    sets.insert(resource.into(), set);
                }
            }
        }
        Ok(())
    }

    async fn lease_sets(&self) -> Result<(Millis, Vec<(String, LeaseSet)>), StoreError> {
        let now = self.now();
        let sets = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        Ok((
            now,
            sets.iter()
                .map(|(r, set)| (r.to_string(), set.clone()))
                .collect(),
        ))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn staged_copies(&self) -> Result<u64, StoreError> {
        Ok(self.copies.staged_copies())
    }

    async fn maintain(&self) -> StoreError {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.sweep();
        }
    }

    async fn seize(&self, transfer_id: &str) -> Result<Option<Staged>, StoreError> {
        let now = self.now();
        let Some(resource) = self.transfers.resource_of(transfer_id) else {
            return Ok(None);
        };
        let hash = self.hasher.hash_one(&*resource);
        Ok(self
            .copies
            .seize(hash, &resource, transfer_id, now, &self.transfers))
    }
}

/// [`Store::meter`]'s decision on what is stored for a pair (`None` if
/// nothing), and what to write.
fn decide_stored(
    meter: &Meter,
    op: Op,
    now: Millis,
    found: Option<Stored>,
) -> (Write, Result<Reply, ClientError>) {
    let Some(stored) = found else {
        // Nothing stored: decide on the empty state and keep it only if the
        // decision wrote something that is not idle at once.
        let mut state = meter.empty();
        let reply = meter.decide(&mut state, now, op);
        let forget_at = meter.forget_at(&state);
        let write = if now < forget_at {
            Write::Put(Stored { forget_at, state })
        } else {
            Write::Keep
        };
        return (write, reply);
    };
    let mut state = if now >= stored.forget_at {
        meter.empty()
    } else {
        stored.state
    };
    let before = state;
    let reply = meter.decide(&mut state, now, op);
    // The forget time is the one of the latest write, as a Redis key's
    // expiry is: a decision that wrote nothing keeps it, even if the
    // meter's parameters (or kind) have changed since.
    let forget_at = if state == before {
        stored.forget_at
    } else {
        meter.forget_at(&state)
    };
    let write = if now >= forget_at {
        Write::Remove
    } else if state == before {
        Write::Keep
    } else {
        Write::Put(Stored { forget_at, state })
    };
    (write, reply)
}

#[cfg(test)]
mod tests;
