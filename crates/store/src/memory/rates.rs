//! Rate state in memory: each (resource, domain) pair's state, encoded
//! (`rate_bytes.rs`) in its entry of a [`PairTable`] of its own, and the
//! last second of hits per resource; a rate operation decided against
//! them under their shards' locks.

use std::cell::RefCell;

use charon_core::ClientError;
use charon_core::Millis;
use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::meter::{Op, Policy};
use charon_core::rate::{DORMANT_GRACE, HitLog, RateReply, RateState, decide_op};

use super::MemoryStore;
use super::rate_bytes;
use super::shards::Hashed;
use super::table::{Locked, Pair, Write};

/// The forget time of state that must be kept.
pub(super) const NEVER: Millis = Millis::MAX;

/// The last second of hits of one resource, across all domains.
pub(super) struct GlobalEntry {
    pub(super) resource: Box<str>,
    pub(super) hash: u64,
    pub(super) log: HitLog,
}

impl Hashed for GlobalEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
}

thread_local! {
    /// The state a decision on this thread reads a pair into: its logs
    /// keep their allocations from one decision to the next.
    static SCRATCH: RefCell<RateState> = RefCell::new(RateState::default());
}

/// Reads a pair's stored state (`None` if none) into `state`, as of
/// `now`: nothing if it may be forgotten by then. Returns its forget time
/// ([`NEVER`] if nothing was stored).
pub(super) fn read(found: Option<&[u8]>, now: Millis, state: &mut RateState) -> Millis {
    let forget_at = found.map_or(NEVER, rate_bytes::forget_at);
    let bytes = found.filter(|_| now < forget_at).unwrap_or_default();
    // Nothing (no bytes) reads as the empty state.
    rate_bytes::decode_into(bytes, state);
    forget_at
}

/// What to store for a pair after an operation at `now` left `state`,
/// decided with `tiers`, and from when it may be forgotten: nothing if at
/// once (it decides as no state would), else its encoding, into `out`.
pub(super) fn write(state: &RateState, tiers: &[Tier], now: Millis, out: &mut Vec<u8>) -> Write {
    let forget_at = state.forget_at(tiers, DORMANT_GRACE).unwrap_or(NEVER);
    write_until(state, forget_at, now, out)
}

/// [`write`] with the forget time known.
pub(super) fn write_until(
    state: &RateState,
    forget_at: Millis,
    now: Millis,
    out: &mut Vec<u8>,
) -> Write {
    if now >= forget_at {
        return Write::Remove;
    }
    rate_bytes::encode(state, forget_at, out);
    Write::Put
}

/// A pair's state and forget time under a batch's locks.
pub(super) fn read_locked(locked: &mut Locked<'_>, pair: &Pair<'_>) -> (RateState, Millis) {
    let mut state = RateState::default();
    let forget_at = locked.update(pair, |found, _| {
        let forget_at = found.map_or(NEVER, rate_bytes::forget_at);
        if let Some(bytes) = found {
            rate_bytes::decode_into(bytes, &mut state);
        }
        (Write::Keep, forget_at)
    });
    (state, forget_at)
}

impl MemoryStore {
    /// Decides rate operation `op` on `resource` for `domain` (see
    /// [`crate::Store::tiers`]).
    pub(super) fn decide_rate(
        &self,
        resource: &str,
        domain: &str,
        limits: RateLimits<'_>,
        policy: Policy,
        op: Op,
        enforcement: Enforcement,
    ) -> Result<RateReply, ClientError> {
        let now = self.now();
        let pair = self.rates.pair(resource, domain);
        let global_hash = pair.resource_hash();
        SCRATCH.with_borrow_mut(|state| {
            // Lock order: pair shard, then global shard. Nothing takes them
            // the other way round.
            self.rates.update(&pair, |found, out| {
                read(found, now, state);
                let reply = self.globals.with(
                    global_hash,
                    |g| &*g.resource == resource,
                    || GlobalEntry {
                        resource: resource.into(),
                        hash: global_hash,
                        log: HitLog::default(),
                    },
                    |global| {
                        decide_op(limits, policy, state, &mut global.log, now, op, enforcement)
                    },
                );
                // A client error writes nothing in Redis, so it keeps the
                // forget time there: keep it here too (the state it
                // advanced decides the next operation exactly as the
                // unadvanced one).
                let write = match reply {
                    Ok(_) => write(state, limits.tiers, now, out),
                    Err(_) => Write::Keep,
                };
                (write, reply)
            })
        })
    }
}
