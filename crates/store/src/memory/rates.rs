//! Rate state in memory: an entry per (resource, domain) pair and the
//! last second of hits per resource, and a rate operation decided against
//! them under their shards' locks.

use std::hash::BuildHasher;

use charon_core::ClientError;
use charon_core::Millis;
use charon_core::config::{Enforcement, RateLimits};
use charon_core::meter::{Op, Policy};
use charon_core::rate::{DORMANT_GRACE, HitLog, RateReply, RateState, decide_op};

use super::MemoryStore;
use super::shards::Hashed;

/// State of one (resource, domain) pair.
pub(super) struct PairEntry {
    /// `resource`, a NUL byte, `domain`: one allocation per pair. Names
    /// never contain control characters (checked at the edge).
    pub(super) key: Box<str>,
    pub(super) resource_len: u32,
    pub(super) hash: u64,
    pub(super) state: RateState,
    /// From when `state` is as good as none (see `RateState::forget_at`);
    /// [`NEVER`] if never.
    pub(super) forget_at: Millis,
}

/// `forget_at` of state that must be kept.
pub(super) const NEVER: Millis = Millis::MAX;

impl PairEntry {
    pub(super) fn is(&self, resource: &str, domain: &str) -> bool {
        is_pair(&self.key, self.resource_len, resource, domain)
    }
}

/// Whether `key` (`resource`, NUL, `domain`, with the resource's length)
/// names this pair.
pub(super) fn is_pair(key: &str, resource_len: u32, resource: &str, domain: &str) -> bool {
    resource_len as usize == resource.len()
        && key.len() == resource.len() + 1 + domain.len()
        && key.starts_with(resource)
        && key.ends_with(domain)
}

/// `resource`, a NUL byte, `domain`: one allocation per pair. Names never
/// contain control characters (checked at the edge).
pub(super) fn pair_key(resource: &str, domain: &str) -> (Box<str>, u32) {
    // Names are at most 1024 bytes (checked at the edge).
    let len = u32::try_from(resource.len()).unwrap_or(u32::MAX);
    (format!("{resource}\0{domain}").into_boxed_str(), len)
}

impl Hashed for PairEntry {
    fn hash(&self) -> u64 {
        self.hash
    }
}

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
        let pair_hash = self.hasher.hash_one((resource, domain));
        let global_hash = self.hasher.hash_one(resource);
        // Lock order: pair shard, then global shard. Nothing takes them the
        // other way round.
        self.pairs.with(
            pair_hash,
            |e| e.is(resource, domain),
            || {
                let (key, resource_len) = pair_key(resource, domain);
                PairEntry {
                    key,
                    resource_len,
                    hash: pair_hash,
                    state: RateState::default(),
                    forget_at: NEVER,
                }
            },
            |pair| {
                if now >= pair.forget_at {
                    pair.state = RateState::default();
                }
                let reply = self.globals.with(
                    global_hash,
                    |g| &*g.resource == resource,
                    || GlobalEntry {
                        resource: resource.into(),
                        hash: global_hash,
                        log: HitLog::default(),
                    },
                    |global| {
                        decide_op(
                            limits,
                            policy,
                            &mut pair.state,
                            &mut global.log,
                            now,
                            op,
                            enforcement,
                        )
                    },
                );
                // A client error writes nothing in Redis, so it keeps the
                // forget time there: keep it here too (the state it advanced
                // decides the next operation exactly as the unadvanced one).
                if reply.is_ok() {
                    pair.forget_at = pair
                        .state
                        .forget_at(limits.tiers, DORMANT_GRACE)
                        .unwrap_or(NEVER);
                }
                reply
            },
        )
    }
}
