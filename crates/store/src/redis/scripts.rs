//! The Lua scripts, each one atomic step on Redis (see `lua/`). Shared
//! helpers are prepended at compile time, so every script is one
//! self-contained text that `EVALSHA` runs by its SHA-1. The burst tiers'
//! rule is six files: the hit log, the state, the decision, the reply
//! context and the operation (`rate_step.lua`), which the rate script runs
//! once and the batch script once per tiers operation, so the rule is
//! written once.
//! The meters' hot path (one bucket, window or queue operation; the
//! batcher's batches and the all-or-nothing batches holding meters only)
//! runs lean scripts: a flat decision per kind (`lean_drain.lua`,
//! `lean_window.lua`), no generic prelude, one read and at most one write
//! per key. Batches that hold burst tiers keep the general scripts: the
//! meters' decision in four files (the drain levels, the window level, the
//! decision, the body) beside the tiers' rule. The batch script (`meters.lua`) has the
//! tiers' files too, and the overlay (`rate_overlay.lua`) that holds their
//! writes until the batch commits.

use std::borrow::Cow;

/// One script: its text and SHA-1.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) code: Cow<'static, str>,
    pub(crate) sha: String,
}

impl Script {
    fn new(name: &'static str, code: impl Into<Cow<'static, str>>) -> Self {
        let code = code.into();
        Self {
            name,
            sha: redis::Script::new(&code).get_hash().to_owned(),
            code,
        }
    }
}

/// A lean script of the meters' hot path: only what its kinds need (the
/// flat decision of `lean_drain.lua` and/or `lean_window.lua`, the clock and
/// the one write of `lean_store.lua`), none of the generic prelude.
macro_rules! lean_script {
    ($($part:literal),+) => {
        concat!($(include_str!(concat!("lua/", $part))),+)
    };
}

/// The burst tiers' rule, shared by the rate and meters scripts: every
/// Redis command of it goes through `rcall` (see `lua/rate_log.lua`).
macro_rules! tiers_rule {
    () => {
        concat!(
            include_str!("lua/rate_log.lua"),
            include_str!("lua/rate_state.lua"),
            include_str!("lua/rate_decide.lua"),
            include_str!("lua/rate_context.lua"),
            include_str!("lua/rate_step.lua"),
        )
    };
}

/// The all-or-nothing batch: the meters' decision and the tiers' rule,
/// with the overlay that holds the tiers' writes until the batch commits.
macro_rules! meters_script {
    () => {
        concat!(
            every_rate_rule!(),
            include_str!("lua/rate_overlay.lua"),
            include_str!("lua/meters.lua")
        )
    };
}

/// The meters' decision and the tiers' rule, as the all-or-nothing batch
/// script (`meters.lua`) needs both.
macro_rules! every_rate_rule {
    () => {
        concat!(
            include_str!("lua/common.lua"),
            include_str!("lua/meter_drain.lua"),
            include_str!("lua/meter_window.lua"),
            include_str!("lua/meter_op.lua"),
            tiers_rule!(),
        )
    };
}

/// The batcher's script for burst tiers (batch.rs): independent tiers
/// operations in arrival order, each decided by the function the rate
/// script runs, with direct writes (no overlay).
macro_rules! batch_script {
    () => {
        concat!(
            include_str!("lua/common.lua"),
            tiers_rule!(),
            include_str!("lua/batch.lua")
        )
    };
}

macro_rules! copy_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/common.lua"),
            include_str!("lua/copy.lua"),
            include_str!("lua/wait.lua"),
            include_str!(concat!("lua/", $file))
        )
    };
}

macro_rules! membership_script {
    ($file:literal) => {
        concat!(
            include_str!("lua/common.lua"),
            include_str!("lua/members.lua"),
            include_str!(concat!("lua/", $file))
        )
    };
}

/// Every script the Redis store runs.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) rate: Script,
    /// One bucket or queue operation.
    pub(crate) drain: Script,
    /// One window operation.
    pub(crate) window: Script,
    /// The batcher's call for meter operations only.
    pub(crate) meter_batch: Script,
    /// `meters.lua` for batches of meter operations only.
    pub(crate) meters_lean: Script,
    pub(crate) meters: Script,
    pub(crate) batch: Script,
    pub(crate) reserve: Script,
    pub(crate) release: Script,
    pub(crate) transfer: Script,
    pub(crate) seize: Script,
    /// A waiter's follow-up: its outcome, leaving, or time passing.
    pub(crate) wait_op: Script,
    pub(crate) undo: Script,
    pub(crate) expire: Script,
    pub(crate) cleanup: Script,
    pub(crate) reset: Script,
    pub(crate) counts: Script,
    pub(crate) join: Script,
    pub(crate) renew: Script,
    pub(crate) unlock: Script,
    pub(crate) forget: Script,
    pub(crate) staged: Script,
    pub(crate) fence: Script,
    pub(crate) gate: Script,
    pub(crate) rebuild: Script,
    pub(crate) lease_get: Script,
    pub(crate) lease_put: Script,
    pub(crate) lease_time: Script,
}

impl Scripts {
    /// The scripts; `mutation` (tests only) replaces the first occurrence
    /// of its first text in the meters scripts, the batcher's scripts and
    /// the lean scripts of single meter operations by its second, to show
    /// that the differential tests catch a script that breaks a rule (of a
    /// meter, or of the tiers: the rate script keeps its own copy of the
    /// tiers' rule, untouched). `copies_mutation` does the same to every
    /// copy script (the queue of waiters is in each of them), and
    /// `leases_mutation` to both lease scripts.
    pub(crate) fn new(
        mutation: Option<&(String, String)>,
        copies_mutation: Option<&(String, String)>,
        leases_mutation: Option<&(String, String)>,
    ) -> Self {
        let replaced = |code: &'static str, m: Option<&(String, String)>| -> Cow<'static, str> {
            match m {
                None => Cow::Borrowed(code),
                Some((from, to)) => Cow::Owned(code.replacen(from.as_str(), to, 1)),
            }
        };
        let mutated = |code: &'static str| replaced(code, mutation);
        let copied = |code: &'static str| replaced(code, copies_mutation);
        let leased = |code: &'static str| replaced(code, leases_mutation);
        Self {
            rate: Script::new(
                "rate",
                concat!(
                    include_str!("lua/common.lua"),
                    tiers_rule!(),
                    include_str!("lua/rate.lua"),
                ),
            ),
            drain: Script::new(
                "drain",
                mutated(lean_script!(
                    "lean_store.lua",
                    "lean_drain.lua",
                    "drain.lua"
                )),
            ),
            window: Script::new(
                "window",
                mutated(lean_script!(
                    "lean_store.lua",
                    "lean_window.lua",
                    "window.lua"
                )),
            ),
            meter_batch: Script::new(
                "meter_batch",
                mutated(lean_script!(
                    "lean_store.lua",
                    "lean_drain.lua",
                    "lean_window.lua",
                    "meter_batch.lua"
                )),
            ),
            meters_lean: Script::new(
                "meters_lean",
                mutated(lean_script!(
                    "lean_store.lua",
                    "lean_drain.lua",
                    "lean_window.lua",
                    "meters_lean.lua"
                )),
            ),
            meters: Script::new("meters", mutated(meters_script!())),
            batch: Script::new("batch", mutated(batch_script!())),
            reserve: Script::new("reserve", copied(copy_script!("reserve.lua"))),
            release: Script::new("release", copied(copy_script!("release.lua"))),
            transfer: Script::new("transfer", copied(copy_script!("transfer.lua"))),
            seize: Script::new("seize", copied(copy_script!("seize.lua"))),
            wait_op: Script::new("wait_op", copied(copy_script!("wait_op.lua"))),
            undo: Script::new("undo", copied(copy_script!("undo.lua"))),
            expire: Script::new("expire", copied(copy_script!("expire.lua"))),
            cleanup: Script::new("cleanup", copied(copy_script!("cleanup.lua"))),
            reset: Script::new("reset", copied(copy_script!("reset.lua"))),
            counts: Script::new("counts", include_str!("lua/counts.lua")),
            join: Script::new("join", membership_script!("join.lua")),
            renew: Script::new("renew", membership_script!("renew.lua")),
            unlock: Script::new("unlock", include_str!("lua/unlock.lua")),
            forget: Script::new("forget", include_str!("lua/forget.lua")),
            staged: Script::new("staged", include_str!("lua/staged.lua")),
            fence: Script::new("fence", membership_script!("fence.lua")),
            gate: Script::new("gate", membership_script!("gate.lua")),
            rebuild: Script::new("rebuild", copy_script!("rebuild.lua")),
            lease_get: Script::new(
                "lease_get",
                leased(concat!(
                    include_str!("lua/common.lua"),
                    include_str!("lua/lease_get.lua")
                )),
            ),
            // The refresh's hot path: flat, no shared prelude.
            lease_put: Script::new("lease_put", leased(include_str!("lua/lease_put.lua"))),
            lease_time: Script::new("lease_time", include_str!("lua/lease_time.lua")),
        }
    }

    /// All of them, to load at start.
    pub(crate) fn all(&self) -> [&Script; 28] {
        [
            &self.rate,
            &self.drain,
            &self.window,
            &self.meter_batch,
            &self.meters_lean,
            &self.meters,
            &self.batch,
            &self.reserve,
            &self.release,
            &self.transfer,
            &self.seize,
            &self.wait_op,
            &self.undo,
            &self.expire,
            &self.cleanup,
            &self.reset,
            &self.counts,
            &self.join,
            &self.renew,
            &self.unlock,
            &self.forget,
            &self.staged,
            &self.fence,
            &self.gate,
            &self.rebuild,
            &self.lease_get,
            &self.lease_put,
            &self.lease_time,
        ]
    }
}
