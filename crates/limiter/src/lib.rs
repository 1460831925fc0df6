//! The limiting service without a protocol.
//!
//! A [`Limiter`] holds the configuration in force (swapped atomically on
//! reload) and a store, and decides every rate-like kind
//! ([`Limiter::decide`], [`Limiter::charge`], [`Limiter::refund`]); a
//! [`Session`] is one client's session, owning the holds it made or seized
//! and releasing them all when it ends.
//! The gRPC server, `charon simulate` and the throttler's per-client limits
//! decide through these two types, so every protocol decides the same way.

#![warn(clippy::print_stdout, clippy::print_stderr)]

mod decision;
mod error;
mod holds;
mod leases;
mod session;

use std::sync::Arc;

use arc_swap::ArcSwap;
use charon_core::ClientError;
use charon_core::config::{Config, Enforcement, RateLike, RateResource};
use charon_core::copy::{CopyStatus, Hold};
use charon_core::meter::{Meter, Op};
use charon_core::rate::RateReply;
use charon_core::request::{Amount, check_name, positive_count};
use charon_store::{HoldSource, Store};

use self::holds::Registry;

pub use charon_store::{Reserved, Ticket};
pub use decision::{Decision, RequestOptions};
pub use error::LimitError;
pub use leases::{CapacityAsk, LeaseEntry, LeaseSummary, MAX_RESOURCES_PER_CALL};
pub use session::{MAX_WAIT_MS, Session};

/// Configuration in force plus the store that holds the state, and the
/// hold sets of every session (which the store may need to rebuild its
/// copy counts).
#[derive(Debug)]
pub struct Limiter {
    config: ArcSwap<Config>,
    store: Arc<dyn Store>,
    holds: Arc<Registry>,
    /// The start of learning mode for leases (see `leases.rs`).
    lease_epoch: leases::LeaseEpoch,
    /// The capacity leases share: configured, or a parent's.
    parent_capacity: leases::ParentCapacity,
}

impl Limiter {
    /// A limiter enforcing `config` over `store`; the store is told where
    /// this limiter's hold sets are (the last limiter built over a store
    /// is the one it asks).
    pub fn new(config: Config, store: Arc<dyn Store>) -> Arc<Self> {
        let holds = Arc::new(Registry::default());
        let source: Arc<dyn HoldSource> = holds.clone();
        store.attach_holds(Arc::downgrade(&source));
        Arc::new(Self {
            config: ArcSwap::from_pointee(config),
            store,
            holds,
            lease_epoch: leases::LeaseEpoch::default(),
            parent_capacity: leases::ParentCapacity::default(),
        })
    }

    /// The configuration in force now.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The configuration in force now, without taking a reference count:
    /// what a hot path reads on every call (`config` bumps a count shared
    /// by every core; this reads a per-thread slot). Hold it only briefly:
    /// a reload waits for no reader, but a guard kept for long makes
    /// `ArcSwap` fall back to counting.
    pub fn current_config(&self) -> arc_swap::Guard<Arc<Config>> {
        self.config.load()
    }

    /// Puts `config` in force for every request that starts after this
    /// returns. State is kept: a lowered limit applies to hits already in
    /// the window.
    pub fn replace_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// `request(resource, domain, copies, min_copies)` for a resource of
    /// `kind: rate` (burst tiers, SPEC §2), kept for callers that only know
    /// the tiers' reply; a bucket, window or queue is a wrong-kind client
    /// error here. [`Limiter::decide`] serves every rate-like kind. Needs
    /// no session: hits are never given back.
    pub async fn request(
        &self,
        resource: &str,
        domain: &str,
        amount: Amount,
    ) -> Result<RateReply, LimitError> {
        check_name("resource", resource)?;
        check_name("domain", domain)?;
        let config = self.config.load();
        let (rate, enforcement) = config.rate(resource)?;
        self.tiers(resource, domain, rate, Op::request(amount), enforcement)
            .await
    }

    /// `op` on the burst tiers of `rate` for `domain` (its override, soft
    /// limit and ban applied).
    async fn tiers(
        &self,
        resource: &str,
        domain: &str,
        rate: &RateResource,
        op: Op,
        enforcement: Enforcement,
    ) -> Result<RateReply, LimitError> {
        Ok(self
            .store
            .tiers(
                resource,
                domain,
                rate.limits_for(domain),
                rate.policy_for(domain),
                op,
                enforcement,
            )
            .await?)
    }

    /// `request(resource, domain, copies, min_copies)` on any rate-like
    /// resource (SPEC §2, §7–§10): a bucket, window or queue (its domain's
    /// override applied) is decided by [`Store::meter`], `kind: rate` by
    /// [`Store::tiers`] with the domain's soft limit and ban.
    /// `options.dry_run` records nothing.
    ///
    /// Under `ignore_configured` a bucket, window or queue grants the whole
    /// request and records it as a charge (never rejected, no ban), which is
    /// what SPEC §4 asks: granted, accesses still recorded.
    pub async fn decide(
        &self,
        resource: &str,
        domain: &str,
        amount: Amount,
        options: RequestOptions,
    ) -> Result<Decision, LimitError> {
        check_name("resource", resource)?;
        check_name("domain", domain)?;
        let config = self.config.load();
        let operation = if options.dry_run {
            "dry_run"
        } else {
            "request"
        };
        let (meter, enforcement) = match config.rate_like(resource, domain, operation)? {
            (RateLike::Meter(meter), enforcement) => (meter, enforcement),
            (RateLike::Tiers(rate), enforcement) => {
                let op = Op::Request {
                    amount,
                    dry_run: options.dry_run,
                };
                let reply = self.tiers(resource, domain, rate, op, enforcement).await?;
                return Ok(Decision::Tiers(reply));
            }
        };
        let ignored = enforcement == Enforcement::Ignore;
        let op = match (ignored, options.dry_run) {
            (false, dry_run) => Op::Request { amount, dry_run },
            (true, false) => Op::Charge(amount.copies()),
            (true, true) => Op::dry_run(amount),
        };
        let mut reply = self.store.meter(resource, domain, &meter, op).await?;
        if ignored {
            reply.granted = amount.copies();
        }
        Ok(Decision::Meter { reply, ignored })
    }

    /// `charge(resource, domain, copies)` (SPEC §10): a cost recorded after
    /// the fact (LLM tokens once the answer is known), never rejected; a
    /// bucket goes into debt that later requests pay, burst tiers record
    /// the hits in the current tier (none in tier 0) and in H's and G's
    /// last second.
    pub async fn charge(
        &self,
        resource: &str,
        domain: &str,
        copies: u64,
    ) -> Result<Decision, LimitError> {
        self.meter_op(resource, domain, "charge", Op::Charge(copies))
            .await
    }

    /// `refund(resource, domain, copies)` (SPEC §10): tokens given back to
    /// a bucket. A client error on every other kind: hits already counted
    /// cannot be un-requested.
    pub async fn refund(
        &self,
        resource: &str,
        domain: &str,
        copies: u64,
    ) -> Result<Decision, LimitError> {
        self.meter_op(resource, domain, "refund", Op::Refund(copies))
            .await
    }

    async fn meter_op(
        &self,
        resource: &str,
        domain: &str,
        operation: &'static str,
        op: Op,
    ) -> Result<Decision, LimitError> {
        check_name("resource", resource)?;
        check_name("domain", domain)?;
        if let Op::Charge(n) | Op::Refund(n) = op {
            positive_count("copies", n)?;
        }
        let config = self.config.load();
        let (meter, enforcement) = match config.rate_like(resource, domain, operation)? {
            (RateLike::Meter(meter), enforcement) => (meter, enforcement),
            (RateLike::Tiers(_), _) if operation == "refund" => {
                return Err(no_tier_refund().into());
            }
            (RateLike::Tiers(rate), enforcement) => {
                let reply = self.tiers(resource, domain, rate, op, enforcement).await?;
                return Ok(Decision::Tiers(reply));
            }
        };
        let ignored = enforcement == Enforcement::Ignore;
        let reply = self.store.meter(resource, domain, &meter, op).await?;
        Ok(Decision::Meter { reply, ignored })
    }

    /// The parameters a bucket, window or queue decides with for `domain`
    /// (its override applied); `None` for any other resource.
    pub fn meter(&self, resource: &str, domain: &str) -> Option<Meter> {
        self.config.load().meter(resource, domain)
    }

    /// Opens a session (SPEC §3): the owner of holds.
    pub fn session(self: &Arc<Self>) -> Session {
        Session::new(self.clone())
    }

    /// Releases copies of a session that ended while the store could not
    /// be reached ([`Session::end`] returned them): until then they are
    /// still counted as this server's holds.
    pub async fn release_ended(&self, hold: &Hold, copies: u64) -> Result<CopyStatus, LimitError> {
        let _op = self.holds.operation().await;
        let status = self.store.release(hold, copies).await?;
        self.holds.remove_ended(hold, copies);
        Ok(status)
    }

    /// Gives up releasing copies of an ended session: they are no longer
    /// counted as this server's holds (a later rebuild of the store's
    /// counts leaves them out).
    pub fn abandon_ended(&self, holds: &[(Hold, u64)]) {
        for (hold, n) in holds {
            self.holds.remove_ended(hold, *n);
        }
    }
}

/// The error of a refund on the burst tiers: SPEC §10 keeps refunds to
/// buckets, hits in a log cannot be un-requested (paper §3.1).
fn no_tier_refund() -> ClientError {
    ClientError::invalid(
        "refund is only for kind bucket: hits already counted cannot be un-requested",
    )
}
