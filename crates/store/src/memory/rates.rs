//! Rate state in memory: each (resource, domain) pair's state, encoded
//! (`rate_bytes.rs`) in its entry of a [`PairTable`] of its own, and the
//! last second of hits per resource; a rate operation decided against
//! them under their shards' locks.

use std::cell::RefCell;

use charon_core::ClientError;
use charon_core::Millis;
use charon_core::config::{Enforcement, RateLimits};
use charon_core::meter::{Op, Policy};
use charon_core::rate::{DORMANT_GRACE, HitLog, RateReply, RateState, decide_op};

use super::MemoryStore;
use super::rate_bytes;
use super::shards::Hashed;
use super::table::{Locked, Pair, PairTable, Write};

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

/// A pair whose logs hold more entries than this is spilled: its state is
/// kept as it is, not encoded. Reading and writing an encoded state costs
/// about 80 instructions an entry at each decision (measured with
/// callgrind on `benches/memory_store.rs`), a spilled one nothing more
/// than before; 16 entries are 8 hits at distinct milliseconds in one
/// tier's window and the last second.
pub(super) const SPILL_ABOVE: usize = 16;

/// A spilled state whose logs came down to this many entries is encoded
/// again (lower than [`SPILL_ABOVE`], so that a pair near it does not go
/// back and forth at every decision).
const PACK_AT: usize = 8;

/// The states of one shard's spilled pairs, each in a slot its entry names
/// (`rate_bytes::encode_spilled`); free slots hold the empty state.
#[derive(Default)]
pub(super) struct Spilled {
    slots: Vec<RateState>,
    free: Vec<usize>,
}

impl Spilled {
    fn put(&mut self, state: RateState) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = state;
                i
            }
            None => {
                self.slots.push(state);
                self.slots.len() - 1
            }
        }
    }

    fn free(&mut self, i: usize) {
        self.slots[i] = RateState::default();
        self.free.push(i);
        if self.free.len() == self.slots.len() {
            *self = Self::default();
        }
    }
}

/// The table of burst tiers' pairs.
pub(super) type RateTable = PairTable<Spilled>;

thread_local! {
    /// The state a decision on this thread reads a pair into: its logs
    /// keep their allocations from one decision to the next.
    static SCRATCH: RefCell<RateState> = RefCell::new(RateState::default());
}

/// A pair's stored state (`found`, or `None`) as of `now`: its spilled
/// slot, if any, whether it is stale (may be forgotten by `now`: it
/// decides as nothing would), and its forget time.
struct Found {
    slot: Option<usize>,
    stale: bool,
}

fn found(bytes: Option<&[u8]>, now: Millis) -> Found {
    Found {
        slot: bytes.and_then(rate_bytes::spilled_slot),
        stale: bytes.is_some_and(|b| now >= rate_bytes::forget_at(b)),
    }
}

/// Reads a stored state that is neither spilled nor stale into `state`
/// (the empty state for anything else).
fn read_packed(bytes: Option<&[u8]>, f: &Found, state: &mut RateState) {
    let packed = bytes.filter(|_| f.slot.is_none() && !f.stale);
    // No bytes read as the empty state.
    rate_bytes::decode_into(packed.unwrap_or_default(), state);
}

/// What to store for a pair after an operation at `now` (to be forgotten
/// from `forget_at`), decided on its spilled state where it is (`in_slot`)
/// or on `state`: nothing if it may be forgotten at once (it decides as no
/// state would); else the state, packed into `out` or spilled. `f` is what
/// was stored before.
fn finish(
    spilled: &mut Spilled,
    f: &Found,
    in_slot: bool,
    state: &mut RateState,
    forget_at: Millis,
    now: Millis,
    out: &mut Vec<u8>,
) -> Write {
    match f.slot {
        Some(i) if in_slot => {
            if now >= forget_at {
                spilled.free(i);
                return Write::Remove;
            }
            if rate_bytes::entries(&spilled.slots[i]) > PACK_AT {
                rate_bytes::encode_spilled(forget_at, i, out);
            } else {
                rate_bytes::encode(&spilled.slots[i], forget_at, out);
                spilled.free(i);
            }
        }
        old => {
            // Replaced by `state`.
            if let Some(i) = old {
                spilled.free(i);
            }
            if now >= forget_at {
                return Write::Remove;
            }
            if rate_bytes::entries(state) > SPILL_ABOVE {
                let i = spilled.put(std::mem::take(state));
                rate_bytes::encode_spilled(forget_at, i, out);
            } else {
                rate_bytes::encode(state, forget_at, out);
            }
        }
    }
    Write::Put
}

/// A pair's state (a copy) and forget time under a batch's locks.
pub(super) fn read_locked(
    locked: &mut Locked<'_, Spilled>,
    pair: &Pair<'_>,
) -> (RateState, Millis) {
    locked.update(pair, |bytes, _, spilled| {
        let forget_at = bytes.map_or(NEVER, rate_bytes::forget_at);
        let state = match bytes.and_then(rate_bytes::spilled_slot) {
            Some(i) => spilled.slots[i].clone(),
            None => {
                let mut state = RateState::default();
                rate_bytes::decode_into(bytes.unwrap_or_default(), &mut state);
                state
            }
        };
        (Write::Keep, (state, forget_at))
    })
}

/// Stores a batch's `state` of a pair, to be forgotten from `forget_at`,
/// under the batch's locks.
pub(super) fn write_locked(
    locked: &mut Locked<'_, Spilled>,
    pair: &Pair<'_>,
    mut state: RateState,
    forget_at: Millis,
    now: Millis,
) {
    locked.update(pair, |bytes, out, spilled| {
        // The batch decided on a copy: whatever was stored is replaced.
        let f = Found {
            slot: bytes.and_then(rate_bytes::spilled_slot),
            stale: false,
        };
        let write = finish(spilled, &f, false, &mut state, forget_at, now, out);
        (write, ())
    });
}

/// Drops the pairs that may be forgotten at `now`; returns how many.
pub(super) fn sweep(table: &RateTable, now: Millis) -> usize {
    table.retain(|bytes, spilled| {
        let keep = now < rate_bytes::forget_at(bytes);
        if !keep && let Some(i) = rate_bytes::spilled_slot(bytes) {
            spilled.free(i);
        }
        keep
    })
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
        SCRATCH.with_borrow_mut(|scratch| {
            // Lock order: pair shard, then global shard. Nothing takes them
            // the other way round.
            self.rates.update(&pair, |bytes, out, spilled| {
                let f = found(bytes, now);
                // A spilled state is decided where it is (unless stale).
                let in_slot = f.slot.is_some() && !f.stale;
                if !in_slot {
                    read_packed(bytes, &f, scratch);
                }
                let state = match f.slot {
                    Some(i) if in_slot => &mut spilled.slots[i],
                    _ => &mut *scratch,
                };
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
                // unadvanced one; a stale spilled state stays in its slot).
                let write = match reply {
                    Ok(_) => {
                        let forget_at = state
                            .forget_at(limits.tiers, DORMANT_GRACE)
                            .unwrap_or(NEVER);
                        finish(spilled, &f, in_slot, scratch, forget_at, now, out)
                    }
                    Err(_) => Write::Keep,
                };
                (write, reply)
            })
        })
    }
}
