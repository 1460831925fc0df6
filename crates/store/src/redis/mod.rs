//! The Redis store: one authoritative state shared by every limiting
//! server, on stock Redis 7 / Valkey without modules (paper §4.2–4.3).
//!
//! Every operation is one round trip running one Lua script (`EVALSHA`), so
//! it is atomic and changes state only when the reply is a grant. The
//! decision clock is Redis `TIME`, read inside the script, so servers with
//! skewed clocks agree. The rate script is a port of
//! `charon_core::rate::decide` (and the copy scripts of `charon_core::copy`);
//! `crates/limiter/tests/limiter/differential.rs` keeps them equal.
//!
//! Copy counts carry the paper's crash bookkeeping: beside every count,
//! each server's contribution to it, and per server the set of resources it
//! contributed to. Servers are members with a liveness key; a live member
//! fences a member whose liveness stayed lapsed and removes its
//! contributions, and a fenced member resigns. When Redis loses its data,
//! every member rebuilds its contributions from its sessions' hold sets
//! before anyone reserves again. See `docs/redis.md`.
//!
//! This file holds [`RedisStore`] and its [`Store`] implementation; each
//! concern it delegates to has its module: the options (`options.rs`), the
//! decision scripts' arguments (`args.rs`), the copy journal's write path
//! (`copies.rs`) and its operations in doubt (`in_doubt.rs`), this member's
//! own state (`member_state.rs`), the membership's renewal and clean-up
//! (`membership/`), leases (`lease.rs`), batching (`batch.rs`) and the
//! connection (`conn.rs`).

mod args;
mod batch;
mod cluster;
mod conn;
mod copies;
mod crypto;
mod errors;
mod in_doubt;
mod member_state;
mod options;
mod redact;

pub use self::membership::DEAD_SERVERS_REMOVED;
pub use self::redact::redacted;
mod decision_clock;
mod keys;
mod lease;
mod membership;
mod meter;
mod reply;
mod scripts;
mod waits;
mod wakeups;

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use charon_core::Millis;
use charon_core::config::{CopyLimits, Enforcement, RateLimits};
use charon_core::copy::{CopyStatus, Hold, ReserveReply, Staged};
use charon_core::lease::LeaseSet;
use charon_core::meter::{Meter, Op, Policy};
use charon_core::rate::RateReply;
use charon_core::request::Amount;

use self::args::{over, tiers_args, tiers_fields, tiers_keys};
use self::batch::{Batcher, Operation, Step};
use self::conn::Conn;
pub use self::copies::CopyLog;
use self::copies::{record_ttl, same_generation};
use self::decision_clock::DecisionClock;
use self::in_doubt::InDoubt;
use self::keys::Keys;
use self::member_state::MemberState;
pub use self::options::{ClientCertificate, RedisOptions, RedisTls};
use self::reply::{Reply, bad};
use self::scripts::Scripts;
use crate::{Batch, HoldSource, Limit, MeterOp, Store, StoreError};

/// The Redis [`Store`].
pub struct RedisStore {
    conn: Conn,
    keys: Keys,
    scripts: Arc<Scripts>,
    /// Tiers and meter operations, batched per slot (see batch.rs).
    batcher: Batcher,
    server_id: String,
    /// This start of the server: `server_id` and a random suffix.
    member: String,
    ttl: Duration,
    /// See [`RedisOptions::rebuild_grace`].
    rebuild_grace: Duration,
    clock: DecisionClock,
    /// Where this server's hold sets are (see [`HoldSource`]).
    holds: Mutex<Option<Weak<dyn HoldSource>>>,
    /// Wakes the renewal loop at once (a copy operation saw that Redis
    /// lost its data).
    wake: tokio::sync::Notify,
    /// How long operation records stay (see `copy.lua`): past the time by
    /// which an operation in doubt is undone or this member has resigned.
    record_ttl: Duration,
    /// Numbers this member's copy operations.
    ops: AtomicU64,
    state: Mutex<MemberState>,
    /// Copy operations whose reply was lost, to undo.
    in_doubt: Mutex<Vec<InDoubt>>,
    /// One lease decision per resource at a time from this server (see
    /// `lease.rs`), so that compare and set only ever races other servers.
    lease_locks: lease::Stripes,
    /// The lease sets this server last read or wrote (see `lease.rs`).
    lease_cache: lease::Cache,
    /// How long a lease decision lock holds at most: the store timeout.
    lease_lock_time: Duration,
    /// This server's waiters for copies and what wakes them.
    wakeups: Arc<wakeups::Wakeups>,
    /// The subscriber that hears their wake-ups (stopped with the store).
    listener: Mutex<wakeups::Listener>,
    /// Waiters whose leaving failed, to take out of their queues (see
    /// `waits.rs`).
    abandoned: Mutex<Vec<crate::Ticket>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("member", &self.member)
            .field("keys", &self.keys)
            .field("ttl", &self.ttl)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to Redis at `url` (`redis://[user:password@]host:port[/db]`,
    /// or `rediss://…` for TLS with [`RedisOptions::tls`]), joins the
    /// membership and, if no other server is live, cleans up what earlier
    /// servers left behind before returning. The caller must run
    /// [`Store::maintain`] for as long as it serves.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Arc<RedisStore>, StoreError> {
        let invalid =
            |m: String| StoreError::Unavailable(format!("invalid Redis store options: {m}"));
        keys::check_prefix(&options.key_prefix).map_err(invalid)?;
        keys::check_server_id(&options.server_id).map_err(invalid)?;
        if options.liveness_ttl < Duration::from_millis(30) {
            return Err(invalid("liveness_ttl must be at least 30 ms".into()));
        }
        if options.op_timeout.is_zero() {
            return Err(invalid("op_timeout must be positive".into()));
        }
        let conn = Conn::open(url, &options.tls, options.op_timeout).await?;
        #[cfg(feature = "test-clock")]
        let scripts = Scripts::new(
            options.meters_mutation.as_ref(),
            options.copies_mutation.as_ref(),
            options.leases_mutation.as_ref(),
        );
        #[cfg(not(feature = "test-clock"))]
        let scripts = Scripts::new(None, None, None);
        conn.load(&scripts.all()).await?;
        let scripts = Arc::new(scripts);
        let clock = DecisionClock::new(options.clock);
        let batcher = Batcher::start(
            conn.clone(),
            scripts.clone(),
            clock.clone(),
            options.op_timeout,
            options.max_batch,
        );
        let conn_is_cluster = conn.is_cluster();
        let store = RedisStore {
            conn,
            keys: Keys::new(&options.key_prefix),
            scripts,
            batcher,
            member: format!("{}.{:08x}", options.server_id, rand::random::<u32>()),
            server_id: options.server_id,
            ttl: options.liveness_ttl,
            rebuild_grace: options.rebuild_grace.unwrap_or(options.liveness_ttl / 2),
            clock,
            holds: Mutex::new(None),
            wake: tokio::sync::Notify::new(),
            record_ttl: record_ttl(options.liveness_ttl, options.op_timeout, conn_is_cluster),
            ops: AtomicU64::new(0),
            in_doubt: Mutex::new(Vec::new()),
            lease_locks: lease::Stripes::default(),
            lease_cache: lease::Cache::default(),
            lease_lock_time: options.op_timeout,
            wakeups: Arc::default(),
            listener: Mutex::new(wakeups::Listener(None)),
            abandoned: Mutex::default(),
            state: Mutex::new(MemberState {
                generation: String::new(),
                renewed: Instant::now(),
                resigned: None,
                known: HashSet::new(),
                epoch: 0,
                rebuild_pending: false,
                gate_open: false,
            }),
        };
        store.join().await?;
        if let Some(client) = store.conn.subscriber() {
            // Subscribed before the first waiter, as a rule: a store that
            // cannot subscribe in time still serves (its waiters poll).
            let channel = store.keys.wake_channel(&store.member);
            let (tx, rx) = tokio::sync::oneshot::channel();
            let listen = wakeups::listen(client, channel, Arc::downgrade(&store.wakeups), tx);
            store
                .listener
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .0 = Some(tokio::spawn(listen));
            let _ = tokio::time::timeout(options.op_timeout, rx).await;
        }
        Ok(Arc::new(store))
    }

    /// This server's id.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// How batching went so far: (script calls that carried more than one
    /// operation, the operations those carried). Tests use it to show that
    /// batches formed; see docs/redis.md, "Batched decisions".
    pub fn batch_counts(&self) -> (u64, u64) {
        self.batcher.counts()
    }

    /// How many wake-up messages for this server's waiters its subscriber
    /// has heard (tests show with it that pub/sub carries them).
    pub fn wake_ups_heard(&self) -> u64 {
        self.wakeups.heard()
    }

    /// This start of the server as the membership knows it (the server id
    /// and a random suffix).
    pub fn member_id(&self) -> &str {
        &self.member
    }
}

#[async_trait]
impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
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
        let k = self.keys.rate(resource, domain);
        let op = Operation {
            step: Step::Tiers,
            args: tiers_args(&k, limits, policy, op, enforcement)?,
            keys: tiers_keys(&k, limits),
        };
        let v = self
            .batcher
            .run(op)
            .await
            .inspect_err(|e| self.on_error(e))?;
        let mut r = Reply::new(self.scripts.rate.name, v)?;
        if r.status_is("over") {
            return Err(over(&mut r)?);
        }
        tiers_fields(&mut r, limits, enforcement)
    }

    /// One `drain.lua` or `window.lua` call. Errors that do not depend on the state (a
    /// charge of 0, a refund on a window) are core's answer on the empty
    /// state, found before the call; a debt the script cannot keep exactly
    /// is worded by core on the state the script saw.
    async fn meter(
        &self,
        resource: &str,
        domain: &str,
        meter: &Meter,
        op: Op,
    ) -> Result<charon_core::meter::Reply, StoreError> {
        meter
            .decide(&mut meter.empty(), 0, op)
            .map_err(StoreError::Refused)?;
        let operation = Operation {
            step: Step::Meter,
            keys: vec![self.keys.meter(resource, domain)],
            args: meter::args(meter, op),
        };
        let v = self
            .batcher
            .run(operation)
            .await
            .inspect_err(|e| self.on_error(e))?;
        meter::reply("meter", meter, op, v)
    }

    /// One `meters.lua` call for the whole batch: every operation decided
    /// in order on the states as the earlier ones left them, and the states
    /// written only if no request was rejected. Errors that do not depend
    /// on the state are found before the call, as for [`Store::meter`].
    async fn meters(&self, ops: &[MeterOp<'_>]) -> Result<Batch, StoreError> {
        if ops.is_empty() {
            return Ok(Batch {
                committed: true,
                replies: Vec::new(),
            });
        }
        let mut keys: Vec<String> = Vec::with_capacity(ops.len());
        let mut args = Vec::with_capacity(2 + 11 * ops.len());
        args.push(self.clock_arg());
        args.push(self.clock.expiry_slack().to_string());
        for o in ops {
            args.push(if o.shadow { "1" } else { "0" }.to_owned());
            match o.limit {
                Limit::Meter(m) => {
                    m.decide(&mut m.empty(), 0, o.op)
                        .map_err(StoreError::Refused)?;
                    keys.push(match o.slot {
                        None => self.keys.meter(o.resource, o.domain),
                        Some(slot) => self.keys.meter_in_slot(slot, o.resource, o.domain),
                    });
                    args.extend(meter::args(m, o.op));
                }
                Limit::Tiers {
                    limits,
                    policy,
                    enforcement,
                } => {
                    let k = match o.slot {
                        None => self.keys.rate(o.resource, o.domain),
                        Some(slot) => self.keys.rate_in_slot(slot, o.resource, o.domain),
                    };
                    args.push("t".to_owned());
                    args.extend(tiers_args(&k, limits, policy, o.op, enforcement)?);
                    keys.extend(tiers_keys(&k, limits));
                }
            }
        }
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        // Without burst tiers the lean script decides the same batch.
        let script = if ops.iter().all(|o| matches!(o.limit, Limit::Meter(_))) {
            &self.scripts.meters_lean
        } else {
            &self.scripts.meters
        };
        let v = self
            .conn
            .eval(script, &key_refs, &args, &[])
            .await
            .inspect_err(|e| self.on_error(e))?;
        meter::batch_reply(script.name, ops, v)
    }

    async fn reserve(
        &self,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
    ) -> Result<ReserveReply, StoreError> {
        let wait = crate::WaitOptions::default();
        match self
            .arrive(resource, domain, limits, amount, enforcement, wait)
            .await?
        {
            crate::Reserved::Now(reply) => Ok(reply),
            crate::Reserved::Waiting(_) => Err(bad("reserve", "a reserve that may not wait waits")),
        }
    }

    async fn reserve_or_wait(
        &self,
        resource: &str,
        domain: &str,
        limits: &CopyLimits,
        amount: Amount,
        enforcement: Enforcement,
        wait: crate::WaitOptions,
    ) -> Result<crate::Reserved, StoreError> {
        self.arrive(resource, domain, limits, amount, enforcement, wait)
            .await
    }

    async fn wait_outcome(&self, t: &crate::Ticket) -> Result<Option<ReserveReply>, StoreError> {
        self.wait_op("outcome", &t.resource, t.id).await
    }

    async fn woken(&self, t: &crate::Ticket, at_most: Duration) {
        let tag = keys::escape(&t.resource);
        self.wakeups.wait(&tag, t.id, at_most).await;
    }

    async fn leave_queue(&self, t: &crate::Ticket) -> Result<Option<ReserveReply>, StoreError> {
        self.leave_or_abandon(t).await
    }

    async fn tick(&self, resource: &str) -> Result<(), StoreError> {
        self.wait_op("tick", resource, 0).await.map(|_| ())
    }

    async fn queue_lengths(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.waiting_by_resource().await
    }

    async fn release_ready(
        &self,
        hold: &Hold,
        copies: u64,
        result_ready: bool,
    ) -> Result<CopyStatus, StoreError> {
        let mut args = Vec::with_capacity(3 + hold.groups.len());
        args.push(hold.domain.clone());
        args.push(copies.to_string());
        args.push(if result_ready { "1" } else { "0" }.to_owned());
        args.extend(hold.groups.iter().cloned());
        let mut r = self
            .copy_op(
                &self.scripts.release,
                &hold.resource,
                args,
                Vec::new(),
                false,
                false,
            )
            .await?
            .ok_or_else(|| bad("release", "none"))?;
        let domain_holds = r.count()?;
        let global_holds = r.count()?;
        let groups = hold
            .groups
            .iter()
            .map(|g| Ok((g.clone(), r.count()?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(CopyStatus {
            domain_holds,
            global_holds,
            groups,
        })
    }

    async fn transfer(&self, hold: &Hold, copies: u64, ttl: Millis) -> Result<String, StoreError> {
        let id = keys::transfer_id(&hold.resource);
        let mut args = Vec::with_capacity(4 + hold.groups.len());
        args.push(hold.domain.clone());
        args.push(copies.to_string());
        args.push(ttl.to_string());
        args.push(id.clone());
        args.extend(hold.groups.iter().cloned());
        // Indexed for maintain(), which releases expired transfers even
        // of resources nobody uses any more.
        let mut index = redis::cmd("SADD");
        index
            .arg(self.keys.staging_index())
            .arg(keys::escape(&hold.resource).as_ref());
        self.copy_op(
            &self.scripts.transfer,
            &hold.resource,
            args,
            vec![index],
            false,
            false,
        )
        .await?
        .ok_or_else(|| bad("transfer", "none"))?;
        Ok(id)
    }

    async fn seize(&self, transfer_id: &str) -> Result<Option<Staged>, StoreError> {
        let Some(resource) = keys::transfer_resource(transfer_id) else {
            return Ok(None);
        };
        let args = vec![transfer_id.to_owned()];
        let Some(mut r) = self
            .copy_op(&self.scripts.seize, resource, args, Vec::new(), true, false)
            .await?
        else {
            return Ok(None);
        };
        let copies = r.count()?;
        let domain = r.text()?;
        let mut groups = Vec::with_capacity(r.remaining());
        while r.remaining() > 0 {
            groups.push(r.text()?);
        }
        Ok(Some(Staged {
            hold: Hold::new(resource, domain, groups),
            copies,
        }))
    }

    /// Redis answers, still holds this member's generation of the copy
    /// log, and copy operations can run, so that `/readyz` says why not (a
    /// renewal overdue, a rebuild after Redis lost its data).
    async fn ping(&self) -> Result<(), StoreError> {
        let generation = self.lock().generation.clone();
        let found: redis::Value = self
            .conn
            .query(redis::cmd("GET").arg(self.keys.generation()))
            .await?;
        if !same_generation(Some(&found), &generation) {
            self.generation_lost();
            return Err(StoreError::Unavailable(
                "Redis lost its data; copy counts are being rebuilt".into(),
            ));
        }
        self.check_member(true)
    }

    async fn staged_copies(&self) -> Result<u64, StoreError> {
        let tags: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.staging_index()))
            .await?;
        let mut total = 0;
        for tag in tags {
            let k = self.keys.copies_of_tag(&tag, &self.member);
            let v = self
                .conn
                .eval(&self.scripts.staged, &[&k.staging], &[], &[])
                .await?;
            total += Reply::new(self.scripts.staged.name, v)?.count()?;
        }
        Ok(total)
    }

    async fn leave(&self) -> Result<(), StoreError> {
        RedisStore::leave(self).await
    }

    fn data_epoch(&self) -> u64 {
        self.lock().epoch
    }

    async fn leases(
        &self,
        resource: &str,
        client: &str,
        decide: &mut (dyn for<'s> FnMut(&'s mut LeaseSet, Millis) + Send),
    ) -> Result<(), StoreError> {
        self.lease_decision(resource, client, decide).await
    }

    async fn lease_sets(&self) -> Result<(Millis, Vec<(String, LeaseSet)>), StoreError> {
        self.all_lease_sets().await
    }

    fn attach_holds(&self, source: Weak<dyn HoldSource>) {
        *self.holds.lock().unwrap_or_else(PoisonError::into_inner) = Some(source);
    }

    async fn maintain(&self) -> StoreError {
        membership::maintain(self).await
    }
}

#[cfg(test)]
mod tests {
    use charon_core::{MAX_COUNT, UNBOUNDED};

    use super::args::{limit_arg, optional_limit_arg};
    use super::copies::describe_field;
    use super::*;

    #[test]
    fn limits_travel_as_the_scripts_expect() {
        assert_eq!(limit_arg(5), "5");
        assert_eq!(limit_arg(MAX_COUNT), MAX_COUNT.to_string());
        assert_eq!(limit_arg(UNBOUNDED), "-1");
        assert_eq!(optional_limit_arg(None), "");
        assert_eq!(describe_field("d:a"), "domain \"a\"");
        let g = redis::Value::BulkString(b"abc".to_vec());
        assert!(same_generation(Some(&g), "abc"));
        assert!(!same_generation(Some(&g), "abd"));
        assert!(!same_generation(Some(&redis::Value::Nil), "abc"));
        assert!(!same_generation(None, "abc"));
    }
}
