//! Where Charon's state lives.
//!
//! A [`Store`] swaps state atomically and nothing else: every decision is
//! made by `charon-core`, given the state the store holds and the store's
//! own clock. The in-memory store is the embedded default; the Redis store
//! shares one authoritative state between limiting servers.

#![warn(clippy::print_stdout, clippy::print_stderr)]

mod clock;
mod error;
mod holds;
pub mod memory;
pub mod redis;
mod wait;

/// The `tracing` target of the spans meant for OpenTelemetry (a decision,
/// a Redis call): `TRACE` spans that no log filter enables, so they cost
/// nothing unless `charon serve --otlp-endpoint` adds an exporter that
/// takes this target.
pub const TRACE_TARGET: &str = "charon::otel";

use async_trait::async_trait;
use charon_core::Millis;
use charon_core::config::{CopyLimits, Enforcement, RateLimits};
use charon_core::copy::{CopyStatus, Hold, ReserveReply, Staged};
use charon_core::lease::LeaseSet;
use charon_core::meter::{Meter, Op, Policy, Reply};
use charon_core::rate::RateReply;
use charon_core::request::Amount;

pub use self::redis::{
    ClientCertificate, CopyLog, DEAD_SERVERS_REMOVED, RedisOptions, RedisStore, RedisTls, redacted,
};
pub use clock::SystemClock;
pub use error::StoreError;
pub use holds::{HoldSnapshot, HoldSource};
pub use memory::MemoryStore;
pub use wait::{Reserved, Ticket, WaitOptions};

/// What decides one operation of a [`Store::meters`] batch: any rate-like
/// kind, so that Envoy's descriptors may name any of them and still be
/// decided all or nothing.
#[derive(Debug, Clone, Copy)]
pub enum Limit<'a> {
    /// A bucket, window or queue, decided by `charon_core::meter`.
    Meter(&'a Meter),
    /// Burst tiers, decided by `charon_core::rate::decide_op` as
    /// [`Store::tiers`] decides them (a refund is a client error).
    Tiers {
        /// The pair's H, G and tiers.
        limits: RateLimits<'a>,
        /// Its soft limit and ban.
        policy: Policy,
        /// Whether the limits are enforced (`ignore_configured`).
        enforcement: Enforcement,
    },
}

/// One operation of a [`Store::meters`] batch.
#[derive(Debug, Clone, Copy)]
pub struct MeterOp<'a> {
    /// The resource's name (its state's key, with the domain).
    pub resource: &'a str,
    /// The Charon domain.
    pub domain: &'a str,
    /// The parameters in force for the pair.
    pub limit: Limit<'a>,
    /// What to do.
    pub op: Op,
    /// Envoy's shadow mode: decided and recorded like the others when it
    /// is granted, but its rejection does not stop the batch.
    pub shadow: bool,
    /// Envoy's `same_slot`: the name of the Envoy domain whose counts are
    /// kept apart under one Redis hash tag, so a batch of different
    /// resources is one Redis Cluster slot. `None`: the pair's own counts,
    /// tagged by its resource (what `charon.v1` uses).
    pub slot: Option<&'a str>,
}

/// The name under which the in-memory store keeps a pair's state when it
/// has a [`MeterOp::slot`]: apart from the resource's own counts, as on
/// Redis. Names never hold control characters, so the NULs cannot be forged.
pub(crate) fn slotted_resource<'a>(
    slot: Option<&str>,
    resource: &'a str,
) -> std::borrow::Cow<'a, str> {
    match slot {
        None => std::borrow::Cow::Borrowed(resource),
        Some(s) => std::borrow::Cow::Owned(format!("\0envoy\0{s}\0{resource}")),
    }
}

/// The reply to one operation of a [`Store::meters`] batch, of the kind
/// its [`Limit`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpReply {
    /// A bucket's, window's or queue's.
    Meter(Reply),
    /// The burst tiers'.
    Tiers(RateReply),
}

impl OpReply {
    /// Units granted (request), charged (charge) or refunded (refund).
    pub fn granted(&self) -> u64 {
        match self {
            OpReply::Meter(r) => r.granted,
            OpReply::Tiers(r) => r.granted,
        }
    }

    /// Whether it rejects `op` ([`Op::rejects`]): a request or dry run
    /// granted nothing.
    pub fn rejects(&self, op: Op) -> bool {
        matches!(op, Op::Request { .. }) && self.granted() == 0
    }
}

/// What a [`Store::meters`] batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Whether the states were written (no request was rejected).
    pub committed: bool,
    /// One reply per operation, in order, each as decided on the states
    /// the earlier ones left (whether or not the batch committed).
    pub replies: Vec<OpReply>,
}

/// Atomic access to rate and copy state. Each method is one atomic step:
/// state changes only when the reply is a grant (or, for release, transfer
/// and seize, when it succeeds).
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// A short name for logs and metrics (`memory`, `redis`).
    fn kind(&self) -> &'static str;

    /// Decides and records `request(resource, domain, amount)` with the
    /// limits that apply to the domain, without soft limit or ban: what
    /// [`Store::tiers`] does for a plain request.
    async fn request(
        &self,
        resource: &str,
        domain: &str,
        limits: RateLimits<'_>,
        amount: Amount,
        enforcement: Enforcement,
    ) -> Result<RateReply, StoreError> {
        self.tiers(
            resource,
            domain,
            limits,
            Policy::default(),
            Op::request(amount),
            enforcement,
        )
        .await
    }

    /// Decides and records one operation (request, dry run, charge) on a
    /// (resource, domain) pair of burst tiers (SPEC §2, §10):
    /// `charon_core::rate::decide_op` decides, the store swaps the pair's
    /// state (hits, tier entries, a ban) and the resource's last second.
    /// A dry run records nothing; a refund or a grant past a kept count's
    /// bound is [`StoreError::Refused`] and changes nothing.
    async fn tiers(
        &self,
        resource: &str,
        domain: &str,
        limits: RateLimits<'_>,
        policy: Policy,
        op: Op,
        enforcement: Enforcement,
    ) -> Result<RateReply, StoreError>;

    /// Decides and records one operation (request, dry run, charge,
    /// refund) on a (resource, domain) pair of a rate-like kind (SPEC
    /// §7–10): the store swaps the pair's state, `charon_core::meter`
    /// decides. The state is written only on a grant, a charge, a refund or
    /// a new ban, and is forgotten once it is idle. Bad input (a refund on a
    /// window, a charge of 0, debt beyond the exact bound) is
    /// [`StoreError::Refused`] with core's error, and changes nothing.
    async fn meter(
        &self,
        resource: &str,
        domain: &str,
        meter: &Meter,
        op: Op,
    ) -> Result<Reply, StoreError>;

    /// Decides a batch of operations all or nothing (Envoy's descriptors,
    /// SPEC §11), each on a bucket, window or queue or on burst tiers
    /// ([`Limit`]): each is decided in order on the states as the earlier
    /// ones of the batch left them (the same pair may come twice; tiers of
    /// one resource share its last second across domains), and the states
    /// are written only if no request or dry run among them was rejected
    /// ([`Op::rejects`](charon_core::meter::Op::rejects)), not counting
    /// [`MeterOp::shadow`] ones; otherwise nothing
    /// is written, not even a ban (nor what time alone made irrelevant).
    /// Atomic: no other operation sees a part
    /// of the batch (the in-memory store holds the shards' locks, the Redis
    /// store runs one script). A client error in any operation is the
    /// batch's error, and nothing is written.
    async fn meters(&self, ops: &[MeterOp<'_>]) -> Result<Batch, StoreError>;

    /// Decides and records `reserve(resource, domain, amount)`; the group set
    /// of the hold is the names of `limits.groups`.
    async fn reserve(
        &self,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
    ) -> Result<ReserveReply, StoreError>;

    /// Gives back `copies` held under `hold`. The caller has checked that
    /// its session holds them.
    async fn release(&self, hold: &Hold, copies: u64) -> Result<CopyStatus, StoreError> {
        self.release_ready(hold, copies, false).await
    }

    /// [`Store::release`], then serves the resource's waiters (SPEC §14);
    /// with `result_ready` (the resource's `wait_mode: shared_result`),
    /// every waiter of `hold`'s (resource, domain) is first answered with
    /// no copy and `result_ready`.
    async fn release_ready(
        &self,
        hold: &Hold,
        copies: u64,
        result_ready: bool,
    ) -> Result<CopyStatus, StoreError>;

    /// A reserve that may wait (SPEC §14): it joins the resource's queue of
    /// waiters, which is served; answered at once if it got copies, if
    /// `wait.wait_ms` is 0 or if the queue is full (`queue_full`), else it
    /// waits under the returned ticket until it is served or rejected at
    /// its deadline (`wait_ms` after now). Every waiter must be followed up
    /// by [`Store::wait_outcome`] until it has its answer, or by
    /// [`Store::leave_queue`].
    #[allow(clippy::too_many_arguments)]
    async fn reserve_or_wait(
        &self,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
        wait: WaitOptions,
    ) -> Result<Reserved, StoreError>;

    /// The answer to waiter `ticket` if it has one (rejected if its
    /// deadline has passed by the store's clock), taken: it is given once.
    async fn wait_outcome(&self, ticket: &Ticket) -> Result<Option<ReserveReply>, StoreError>;

    /// Waits until the store may have decided for `ticket`, or `at_most`
    /// has passed: a wake-up hint only, the answer is
    /// [`Store::wait_outcome`]'s.
    async fn woken(&self, ticket: &Ticket, at_most: std::time::Duration);

    /// Takes waiter `ticket` out of the queue (its session ended) and
    /// serves the queue. Returns its answer if it had one already (copies
    /// granted to it are the caller's to give back).
    async fn leave_queue(&self, ticket: &Ticket) -> Result<Option<ReserveReply>, StoreError>;

    /// Runs what time alone does to `resource`'s copies (staged transfers
    /// expire, waiters reach their deadline) and serves its queue: the
    /// simulator's clock calls it at those instants.
    async fn tick(&self, resource: &str) -> Result<(), StoreError>;

    /// Callers waiting for copies, by resource (for metrics).
    async fn queue_lengths(&self) -> Result<Vec<(String, u64)>, StoreError>;

    /// Moves `copies` held under `hold` into the staging area for `ttl`
    /// milliseconds and returns the transfer id. Staged copies stay counted
    /// and are released by themselves when the ttl passes.
    async fn transfer(&self, hold: &Hold, copies: u64, ttl: Millis) -> Result<String, StoreError>;

    /// Takes staged copies out of the staging area: `None` if the id is
    /// unknown, already seized or expired.
    async fn seize(&self, transfer_id: &str) -> Result<Option<Staged>, StoreError>;

    /// Runs one decision on the leases of `resource` (SPEC §12), atomically
    /// with respect to every other server on the same store: `decide` gets
    /// the set as stored and the store's time, and changes the set, which
    /// the store keeps (dropping it when empty). `charon_core::lease`
    /// decides; the store only swaps the set. `decide` may change only
    /// `client`'s lease and drop leases lapsed at that time (what
    /// `get_capacity` and `release_capacity` do), so that the Redis store
    /// writes only those. It may run more than once (the Redis store
    /// retries when another server changed the set in between), so it must
    /// depend only on its arguments.
    async fn leases(
        &self,
        resource: &str,
        client: &str,
        decide: &mut (dyn for<'s> FnMut(&'s mut LeaseSet, Millis) + Send),
    ) -> Result<(), StoreError>;

    /// How many times this store has found its shared state lost (Redis
    /// came back empty): a lease server re-enters learning mode then, as
    /// after its own start, since the leases handed out before are gone
    /// while their clients still hold them. Always 0 for a store of one
    /// process (its state goes only with the process).
    fn data_epoch(&self) -> u64 {
        0
    }

    /// Every resource's leases, for metrics and the leases page, with the
    /// store's time: a snapshot, not a decision (leases that lapsed by then
    /// may still be in it).
    async fn lease_sets(&self) -> Result<(Millis, Vec<(String, LeaseSet)>), StoreError>;

    /// Checks that the store can answer now (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Copies sitting in staging areas, waiting to be seized (for metrics).
    async fn staged_copies(&self) -> Result<u64, StoreError>;

    /// Leaves at a clean shutdown, after every session has ended (the Redis
    /// store deregisters this server so nobody waits for its liveness to
    /// lapse). Nothing to do for a store of one process.
    async fn leave(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Tells the store where this server's hold sets are, for a store that
    /// must rebuild copy counts from them (the Redis store, after Redis lost
    /// its data). A store of one process has nothing to rebuild.
    fn attach_holds(&self, _source: std::sync::Weak<dyn HoldSource>) {}

    /// Runs the store's background duties for as long as the server runs
    /// (the in-memory store drops idle state; the Redis store renews this
    /// server's liveness and cleans up after dead servers). Returns only
    /// when the server must stop serving, with the reason.
    async fn maintain(&self) -> StoreError;
}
