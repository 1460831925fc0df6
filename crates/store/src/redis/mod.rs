//! The Redis store: one authoritative state shared by every limiting
//! server, on stock Redis 7 / Valkey without modules (paper §4.2–4.3).
//!
//! Every operation is one round trip running one Lua script (`EVALSHA`), so
//! it is atomic and changes state only when the reply is a grant. The
//! decision clock is Redis `TIME`, read inside the script, so servers with
//! skewed clocks agree. The rate script is a port of
//! `charon_core::rate::decide` (and the copy scripts of `charon_core::copy`);
//! `crates/limiter/tests/differential.rs` keeps them equal.
//!
//! Copy counts carry the paper's crash bookkeeping: beside every count,
//! each server's contribution to it, and per server the set of resources it
//! contributed to. Servers are members with a liveness key; a live member
//! fences a member whose liveness stayed lapsed and removes its
//! contributions, and a fenced member resigns. When Redis loses its data,
//! every member rebuilds its contributions from its sessions' hold sets
//! before anyone reserves again. See `docs/redis.md`.

mod batch;
mod cluster;
mod conn;

pub use self::conn::redacted;
pub use self::membership::DEAD_SERVERS_REMOVED;
mod decision_clock;
mod keys;
mod lease;
mod membership;
mod meter;
mod reply;
mod scripts;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use charon_core::Clock;
use charon_core::bound::{self, Kept};
use charon_core::config::{CopyLimits, Enforcement, RateLimits};
use charon_core::copy::{CopyCounts, CopyStatus, Hold, ReserveReply, Staged};
use charon_core::lease::LeaseSet;
use charon_core::meter::{Ban, Meter, Op, Policy, SoftLimit, no_refund};
use charon_core::rate::{DORMANT_GRACE, RateReply, TierContext};
use charon_core::request::{Amount, positive_count};
use charon_core::{MAX_COUNT, Millis, UNBOUNDED};

use self::batch::{Batcher, Operation, Step};
use self::conn::Conn;
use self::decision_clock::DecisionClock;
use self::keys::{Keys, RateKeys};
use self::reply::{Reply, bad};
use self::scripts::Scripts;
use crate::{Batch, HoldSource, Limit, MeterOp, Store, StoreError};

/// How to connect a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// This server's id, shown in logs and key names. Each start of a
    /// server is a new member (the id plus a random suffix), so a fixed id
    /// can be reused by a restarted server. Default: random.
    pub server_id: String,
    /// How long this server counts as live without renewing. It renews
    /// every third of it; after half of it without success its copy
    /// operations wait (server errors) for the next renewal. Others fence
    /// it only once its liveness has stayed lapsed for another third.
    pub liveness_ttl: Duration,
    /// The time limit of each Redis operation.
    pub op_timeout: Duration,
    /// The first part of every key name.
    pub key_prefix: String,
    /// Decide with this virtual clock instead of Redis `TIME` (the scripts
    /// are the same; the time is passed in, and keys expire a day later
    /// than it says). For `charon simulate --store redis://…`, which
    /// replays events at their own times under a key prefix of its own,
    /// and for tests; a server never sets it (servers decide with Redis
    /// `TIME` so that skewed servers agree).
    pub clock: Option<Arc<dyn Clock>>,
    /// Tests only (feature `test-clock`): `(from, to)` replaces the first
    /// `from` in the meters script (`lua/meters.lua`) by `to`, so a test can
    /// show that the batch differential catches a script that breaks a
    /// rule.
    #[cfg(feature = "test-clock")]
    pub meters_mutation: Option<(String, String)>,
    /// How long reserves wait after a new generation of the copy log
    /// starts (Redis lost its data, or is used for the first time), so
    /// that servers that have not noticed yet can rebuild their holds
    /// first. `None`: half the liveness ttl (servers renew every third).
    /// Zero only for tests on a Redis nobody else uses.
    pub rebuild_grace: Option<Duration>,
    /// The most tiers and meter operations of one hash slot sent to Redis
    /// as one script call when they arrive while a call for that slot is
    /// in flight (see docs/redis.md, "Batched decisions"); 1 sends every
    /// operation alone, as before batching.
    pub max_batch: usize,
    /// TLS for a `rediss://` URL: the CA to trust and the client
    /// certificate. Empty: the system's roots and no client certificate.
    pub tls: RedisTls,
}

/// The certificates of a TLS connection to Redis (`rediss://`), PEM
/// encoded. Read by the caller (`charon serve --redis-ca`, …), so that the
/// store does no file I/O and a test can pass certificates it made.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// CA certificates to trust instead of the system's roots (a private
    /// CA, as most Redis deployments with TLS have).
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate, for a Redis that requires one
    /// (`tls-auth-clients yes`: mutual TLS).
    pub client: Option<ClientCertificate>,
}

impl RedisTls {
    /// Whether nothing is set (a `rediss://` URL then trusts the system's
    /// roots and shows no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca_pem.is_none() && self.client.is_none()
    }
}

/// A client certificate chain and its private key, PEM encoded.
#[derive(Clone)]
pub struct ClientCertificate {
    /// The certificate chain, this server's certificate first.
    pub cert_pem: Vec<u8>,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

// Key material never reaches a log line: the Debug forms say only what is
// set.
impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<set>"))
            .field("client", &self.client)
            .finish()
    }
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientCertificate(<redacted>)")
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            server_id: format!("charon-{:012x}", rand::random::<u64>() >> 16),
            liveness_ttl: Duration::from_secs(10),
            op_timeout: Duration::from_secs(1),
            key_prefix: "charon".to_owned(),
            clock: None,
            #[cfg(feature = "test-clock")]
            meters_mutation: None,
            rebuild_grace: None,
            max_batch: batch::MAX_BATCH,
            tls: RedisTls::default(),
        }
    }
}

/// Copy counts of one resource as Redis holds them (for inspection).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyLog {
    /// Copies held in all.
    pub global: u64,
    /// Copies held per domain.
    pub domains: BTreeMap<String, u64>,
    /// Copies held per group.
    pub groups: BTreeMap<String, u64>,
}

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
}

/// A copy operation that may or may not have run.
#[derive(Debug, Clone)]
struct InDoubt {
    resource: String,
    record: String,
    /// The generation it was sent in: after Redis lost its data, the
    /// rebuild replaces whatever it did, so it is not undone.
    generation: String,
}

/// What this member knows about its membership.
#[derive(Debug)]
struct MemberState {
    /// The copy log's generation this member joined (see `renew.lua`).
    generation: String,
    /// When the latest successful renewal (or the join) was sent.
    renewed: Instant,
    /// Why this member resigned, once it has.
    resigned: Option<String>,
    /// Resources (escaped tags) known to be in this member's key set.
    known: HashSet<String>,
    /// Bumped whenever `known` is emptied, so that an operation that
    /// started before does not put back what it learned.
    epoch: u64,
    /// Redis lost its data: this member must rebuild its contributions
    /// from its sessions' holds before it touches copies again.
    rebuild_pending: bool,
    /// Whether reserves may run: false while the copy gate of a new
    /// generation is closed (see `members.lua`).
    gate_open: bool,
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
        let scripts = Scripts::new(options.meters_mutation.as_ref());
        #[cfg(not(feature = "test-clock"))]
        let scripts = Scripts::new(None);
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

    /// This start of the server as the membership knows it (the server id
    /// and a random suffix).
    pub fn member_id(&self) -> &str {
        &self.member
    }

    /// The copy counts of `resource` and this server's contribution to
    /// them, read atomically.
    pub async fn copy_log(&self, resource: &str) -> Result<(CopyLog, CopyLog), StoreError> {
        let k = self.keys.copies(resource, &self.member);
        let v = self
            .conn
            .eval(
                &self.scripts.counts,
                &[&k.counts, &k.contribution],
                &[],
                &[],
            )
            .await
            .inspect_err(|e| self.on_error(e))?;
        let mut r = Reply::new(self.scripts.counts.name, v)?;
        let counts = copy_log(r.nested()?)?;
        let mine = copy_log(r.nested()?)?;
        Ok((counts, mine))
    }

    fn lock(&self) -> MutexGuard<'_, MemberState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The test clock's time, or '' for Redis TIME.
    fn clock_arg(&self) -> String {
        self.clock.arg()
    }

    /// Checks that this member may change copy counts now (`reserves`:
    /// and add to them). It must not have resigned; its latest renewal must
    /// be less than half a ttl old, so that whatever it sends lands while
    /// its liveness key surely exists (nobody can fence it then); it must
    /// have rebuilt its holds after Redis lost its data; and reserves wait
    /// until every member has (the copy gate). All but resignation pass
    /// by themselves: they are server errors, and clients fail open.
    fn check_member(&self, reserves: bool) -> Result<(), StoreError> {
        let s = self.lock();
        if let Some(why) = &s.resigned {
            return Err(StoreError::Resigned(why.clone()));
        }
        let since = s.renewed.elapsed();
        if since > self.ttl / 2 {
            return Err(StoreError::Unavailable(format!(
                "this server's liveness was last renewed {since:?} ago (ttl {:?}); \
                 copy operations wait for the next renewal",
                self.ttl
            )));
        }
        if s.rebuild_pending {
            return Err(StoreError::Unavailable(
                "Redis lost the copy counts; this server is rebuilding its sessions' holds".into(),
            ));
        }
        if reserves && !s.gate_open {
            return Err(StoreError::Unavailable(
                "copy counts of a new Redis generation are being rebuilt; \
                 reserves wait until every server has rebuilt its holds"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The hold sets of this server, if a [`HoldSource`] is attached and
    /// still there.
    fn hold_source(&self) -> Option<Arc<dyn HoldSource>> {
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Records whether the copy gate is open, logging when reserves open
    /// again after a new generation of the copy log.
    fn note_gate(&self, open: bool) {
        let was = std::mem::replace(&mut self.lock().gate_open, open);
        if open && !was {
            tracing::info!(
                "copy reserves are open: the copy counts of this Redis generation are complete"
            );
        }
    }

    /// A copy operation saw another generation in Redis: its effect there
    /// is overwritten by the rebuild, and copies wait until it is done.
    fn generation_lost(&self) {
        {
            let mut s = self.lock();
            s.rebuild_pending = true;
            s.gate_open = false;
        }
        self.wake.notify_one();
    }

    /// Resigns for good; every later copy operation fails.
    fn resign(&self, why: String) -> StoreError {
        let mut s = self.lock();
        let why = s.resigned.get_or_insert(why).clone();
        StoreError::Resigned(why)
    }

    fn resigned(&self) -> Option<StoreError> {
        self.lock().resigned.clone().map(StoreError::Resigned)
    }

    /// After a failed operation: if Redis may have restarted, this member's
    /// key set may be gone, so every resource is added again on next use.
    fn on_error(&self, e: &StoreError) {
        if matches!(e, StoreError::Unavailable(_)) {
            self.forget_known();
        }
    }

    fn forget_known(&self) {
        let mut s = self.lock();
        s.known.clear();
        s.epoch += 1;
    }

    /// The command that adds `tag` to this member's key set, unless it is
    /// known to be there, and the epoch to remember it under.
    fn key_set_add(&self, tag: &str) -> (Vec<redis::Cmd>, u64) {
        let s = self.lock();
        if s.known.contains(tag) {
            return (Vec::new(), s.epoch);
        }
        let mut cmd = redis::cmd("SADD");
        cmd.arg(self.keys.key_set(&self.member)).arg(tag);
        (vec![cmd], s.epoch)
    }

    fn key_set_added(&self, tag: &str, epoch: u64) {
        let mut s = self.lock();
        if s.epoch == epoch && !s.known.contains(tag) {
            s.known.insert(tag.to_owned());
        }
    }

    /// Runs a copy script: `args` follow the test clock and the record
    /// ttl. Adds the resource to this member's key set first when the
    /// operation `contributes`. `None` when the script found nothing to act
    /// on (an unknown transfer). An operation whose reply is lost is
    /// remembered, to be undone (it was reported as failed).
    ///
    /// The generation marker is read in the same pipeline, just before the
    /// script: if Redis lost its data since this member last looked, the
    /// operation ran on the new, incomplete counts, so it is reported as a
    /// server error and left for the rebuild to overwrite.
    #[allow(clippy::too_many_arguments)]
    async fn copy_op(
        &self,
        script: &scripts::Script,
        resource: &str,
        args: Vec<String>,
        before: Vec<redis::Cmd>,
        contributes: bool,
        reserves: bool,
    ) -> Result<Option<Reply>, StoreError> {
        self.check_member(reserves)?;
        let generation = self.lock().generation.clone();
        let tag = keys::escape(resource);
        let k = self.keys.copies(resource, &self.member);
        let record = self.keys.op_record(
            resource,
            &self.member,
            self.ops.fetch_add(1, Ordering::Relaxed),
        );
        let (mut first, epoch) = if contributes {
            self.key_set_add(&tag)
        } else {
            (Vec::new(), 0)
        };
        let adds_key = !first.is_empty();
        first.extend(before);
        let mut check = redis::cmd("GET");
        check.arg(self.keys.generation());
        first.push(check);
        let mut all_args = Vec::with_capacity(args.len() + 2);
        all_args.push(self.clock_arg());
        all_args.push(self.record_ttl.as_millis().to_string());
        all_args.extend(args);
        let [counts, contribution, staging, expiry] = k.all();
        let keys = [counts, contribution, staging, expiry, record.as_str()];
        // In a cluster, nothing is acknowledged before a replica has it: a
        // failover must not lose a copy grant (docs/redis.md, "Failover").
        // Unconfirmed, it is in doubt and undone like a lost reply.
        let (pre, v) = match self
            .conn
            .eval_replicated(script, &keys, &all_args, &first)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                self.on_error(&e);
                if matches!(e, StoreError::Unavailable(_)) {
                    self.lock_in_doubt().push(InDoubt {
                        resource: resource.to_owned(),
                        record,
                        generation,
                    });
                }
                return Err(e);
            }
        };
        if !same_generation(pre.last(), &generation) {
            self.generation_lost();
            return Err(StoreError::Unavailable(format!(
                "Redis lost its data: {} of {resource:?} was not counted; copy counts are being rebuilt",
                script.name
            )));
        }
        if adds_key {
            self.key_set_added(&tag, epoch);
        }
        let mut r = Reply::new(script.name, v)?;
        let status = r.text()?;
        match status.as_str() {
            "ok" => Ok(Some(r)),
            "none" => Ok(None),
            "fenced" => Err(self.resign(
                "other servers considered this server dead and removed its contributions".into(),
            )),
            "cancelled" => {
                // The record exists: an undo cancelled the operation, or a
                // client library that sent it again after a lost reply (the
                // cluster client retries) finds its own first run. Settling
                // it reverses that run, or does nothing for a cancellation.
                self.lock_in_doubt().push(InDoubt {
                    resource: resource.to_owned(),
                    record,
                    generation,
                });
                Err(StoreError::Unavailable(format!(
                    "{} of {resource:?} was cancelled as in doubt",
                    script.name
                )))
            }
            "short" | "bad" => {
                let field = r.text()?;
                let have = r.count()?;
                let whose = if status == "short" {
                    "this server's contribution"
                } else {
                    "the count"
                };
                Err(StoreError::BadData(format!(
                    "{resource:?}: {whose} is {have} for {}; refusing to let a count go negative",
                    describe_field(&field),
                )))
            }
            "over" => {
                let field = r.text()?;
                let held = r.count()?;
                let n = r.count()?;
                let count = kept_copies(&field)
                    .ok_or_else(|| bad(script.name, &format!("unknown count {field:?}")))?;
                Err(StoreError::Refused(bound::refusal(count, held, n)))
            }
            other => Err(bad(script.name, &format!("unknown status {other:?}"))),
        }
    }

    fn lock_in_doubt(&self) -> MutexGuard<'_, Vec<InDoubt>> {
        self.in_doubt.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Copy operations whose reply was lost and that are not undone yet.
    pub fn operations_in_doubt(&self) -> usize {
        self.lock_in_doubt().len()
    }

    /// Undoes the copy operations whose reply was lost (each had been
    /// reported as failed). Those that cannot be settled now stay for the
    /// next round.
    pub(super) async fn settle_in_doubt(&self) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut *self.lock_in_doubt());
        let mut left = Vec::new();
        let mut failure = None;
        for op in pending {
            if failure.is_some() {
                left.push(op);
                continue;
            }
            if op.generation != self.lock().generation {
                // Redis lost its data since: the rebuild replaced it.
                continue;
            }
            match self.undo(&op).await {
                Ok(Undo::Settled) => {}
                Ok(Undo::Fenced) => {
                    // Every operation left is moot: a resigned member's
                    // contributions are removed as a dead member's.
                    return Err(self.resign(
                        "other servers considered this server dead and removed its contributions"
                            .into(),
                    ));
                }
                Err(e) => {
                    // Kept, with every operation after it: an undo that
                    // failed (or whose reply could not be read) is tried
                    // again, never forgotten (a forgotten one leaks copies).
                    left.push(op);
                    failure = Some(e);
                }
            }
        }
        self.lock_in_doubt().extend(left);
        failure.map_or(Ok(()), Err)
    }

    /// Runs `undo.lua` for one operation in doubt. Running it again is
    /// harmless: an undo whose confirmation was lost (no replica during a
    /// failover) finds its own `undone` mark and answers just `undone`.
    async fn undo(&self, op: &InDoubt) -> Result<Undo, StoreError> {
        let k = self.keys.copies(&op.resource, &self.member);
        let [counts, contribution, staging, expiry] = k.all();
        let keys = [counts, contribution, staging, expiry, op.record.as_str()];
        let args = [self.clock_arg(), self.record_ttl.as_millis().to_string()];
        // Replicated like the operation itself: an undo lost in a
        // failover would leave the copies counted (it is retried).
        let (_, v) = self
            .conn
            .eval_replicated(&self.scripts.undo, &keys, &args, &[])
            .await?;
        let mut r = Reply::new(self.scripts.undo.name, v)?;
        match r.text()?.as_str() {
            "undone" => {
                // The kind is there only on the run that reversed it.
                if let Ok(kind) = r.text() {
                    tracing::warn!(
                        resource = %op.resource,
                        operation = %kind,
                        "undid a copy operation whose reply was lost"
                    );
                }
                Ok(Undo::Settled)
            }
            "cancelled" => Ok(Undo::Settled),
            "fenced" => Ok(Undo::Fenced),
            other => Err(bad(
                self.scripts.undo.name,
                &format!("unknown status {other:?}"),
            )),
        }
    }
}

/// What undoing one operation in doubt came to.
enum Undo {
    /// Reversed now, reversed before, or cancelled before it ran.
    Settled,
    /// Other servers fenced this one: it must resign.
    Fenced,
}

/// On a Redis Cluster, operation records live at least this long: an
/// operation in doubt at a master's death is undone on the promoted
/// replica, which serves only after the failover (the cluster's node
/// timeout, 15 s by default, plus the election). A record that expired
/// first would make the undo a mere cancellation and leak the copies.
const CLUSTER_RECORD_TTL: Duration = Duration::from_secs(60);

/// How long the record of a copy operation lives: long enough for every
/// retry of the operation and for its undo (see "Lost replies" in
/// docs/redis.md).
fn record_ttl(liveness_ttl: Duration, op_timeout: Duration, cluster: bool) -> Duration {
    let ttl = (liveness_ttl * 2).max(op_timeout * 10);
    if cluster {
        ttl.max(CLUSTER_RECORD_TTL)
    } else {
        ttl
    }
}

/// Whether the reply to `GET <generation>` is `generation`.
fn same_generation(reply: Option<&redis::Value>, generation: &str) -> bool {
    match reply {
        Some(redis::Value::BulkString(b)) => b.as_slice() == generation.as_bytes(),
        Some(redis::Value::SimpleString(s)) => s == generation,
        _ => false,
    }
}

fn describe_field(field: &str) -> String {
    if field == "g" {
        "the resource".to_owned()
    } else if let Some(d) = field.strip_prefix("d:") {
        format!("domain {d:?}")
    } else if let Some(g) = field.strip_prefix("G:") {
        format!("group {g:?}")
    } else {
        format!("field {field:?}")
    }
}

/// The count a copy script's field is, as `charon_core::bound` names it.
fn kept_copies(field: &str) -> Option<Kept<'_>> {
    if field == "g" {
        Some(Kept::ResourceCopies)
    } else if let Some(d) = field.strip_prefix("d:") {
        Some(Kept::DomainCopies(d))
    } else {
        field.strip_prefix("G:").map(Kept::GroupCopies)
    }
}

fn copy_log(mut r: Reply) -> Result<CopyLog, StoreError> {
    let mut log = CopyLog::default();
    while r.remaining() >= 2 {
        let field = r.text()?;
        if field == "!" {
            r.text()?;
            continue;
        }
        let n = r.count()?;
        if field == "g" {
            log.global = n;
        } else if let Some(d) = field.strip_prefix("d:") {
            log.domains.insert(d.to_owned(), n);
        } else if let Some(g) = field.strip_prefix("G:") {
            log.groups.insert(g.to_owned(), n);
        }
    }
    Ok(log)
}

/// A limit as the scripts take it: -1 for unbounded (anything Lua numbers
/// could not hold exactly is beyond every count anyway).
fn limit_arg(limit: u64) -> String {
    if limit > MAX_COUNT {
        "-1".to_owned()
    } else {
        limit.to_string()
    }
}

fn optional_limit_arg(limit: Option<u64>) -> String {
    limit.map_or_else(String::new, limit_arg)
}

fn enforce_arg(e: Enforcement) -> String {
    match e {
        Enforcement::Enforce => "1",
        Enforcement::Ignore => "0",
    }
    .to_owned()
}

/// The arguments of one tiers operation after the clock and the expiry
/// slack (see `lua/rate.lua`, from `ARGV[3]`); a refund, or a charge of 0,
/// is core's client error, found before the call.
fn tiers_args(
    k: &RateKeys,
    limits: RateLimits<'_>,
    policy: Policy,
    op: Op,
    enforcement: Enforcement,
) -> Result<Vec<String>, StoreError> {
    match op {
        Op::Charge(n) => {
            positive_count("copies", n).map_err(StoreError::Refused)?;
        }
        Op::Refund(_) => return Err(StoreError::Refused(no_refund())),
        Op::Request { .. } => {}
    }
    let (op_arg, copies, min_copies) = meter::op_args(op);
    let tiers = limits.tiers;
    let mut args = Vec::with_capacity(12 + 5 * tiers.len());
    args.push(DORMANT_GRACE.to_string());
    args.push(copies.to_string());
    args.push(min_copies.to_string());
    args.push(enforce_arg(enforcement));
    args.push(optional_limit_arg(limits.hard_limit));
    args.push(optional_limit_arg(limits.global_limit));
    args.push(tiers.len().to_string());
    args.push(k.tier_head.clone());
    args.push(k.tier_tail.clone());
    args.push(op_arg.to_owned());
    args.push(
        policy
            .soft_limit
            .map_or(0, SoftLimit::as_percent)
            .to_string(),
    );
    args.push(policy.ban.map_or(0, Ban::duration).to_string());
    for t in tiers {
        args.push(limit_arg(t.limit));
        args.push(t.window.to_string());
        args.push(t.active.map_or_else(|| "-1".to_owned(), |a| a.to_string()));
        args.push(t.cooldown.to_string());
        args.push(if t.skippable { "1" } else { "0" }.to_owned());
    }
    Ok(args)
}

/// The keys of one tiers operation, in the order `lua/rate.lua` takes
/// them: the state, the last seconds, then one list per configured tier.
fn tiers_keys(k: &RateKeys, limits: RateLimits<'_>) -> Vec<String> {
    let mut keys = Vec::with_capacity(4 + limits.tiers.len());
    keys.extend([
        k.state.clone(),
        k.last_second.clone(),
        k.global.clone(),
        k.global_total.clone(),
    ]);
    keys.extend((1..=limits.tiers.len()).map(|i| k.tier(i)));
    keys
}

/// The client error of an `over` reply (after its status): the count a
/// grant would have taken past `MAX_COUNT`.
fn over(r: &mut Reply) -> Result<StoreError, StoreError> {
    let which = r.text()?;
    let held = r.count()?;
    let n = r.count()?;
    let count = match which.as_str() {
        "d" => Kept::DomainHits,
        "g" => Kept::ResourceHits,
        "t" => Kept::TierHits,
        other => return Err(bad("rate", &format!("unknown count {other:?}"))),
    };
    Ok(StoreError::Refused(bound::refusal(count, held, n)))
}

/// The 13 values of one tiers operation's reply, as core's reply.
fn tiers_fields(
    r: &mut Reply,
    limits: RateLimits<'_>,
    enforcement: Enforcement,
) -> Result<RateReply, StoreError> {
    let tiers = limits.tiers;
    let granted = r.count()?;
    let domain_hits_last_second = r.count()?;
    let global_hits_last_second = r.count()?;
    let tier_hits = r.count()?;
    let tier = usize::try_from(r.count()?).unwrap_or(usize::MAX);
    if tier > tiers.len() {
        return Err(bad("rate", &format!("tier {tier} of {}", tiers.len())));
    }
    let burst = r.flag()?;
    let hard_limited = r.flag()?;
    let global_limited = r.flag()?;
    // -1 stands for unbounded (remaining) or never (the waits).
    let remaining = u64::try_from(r.int()?).unwrap_or(UNBOUNDED);
    let reset_after_ms = u64::try_from(r.int()?).ok();
    let retry_after_ms = u64::try_from(r.int()?).ok();
    let warning = r.flag()?;
    let banned = r.flag()?;
    // The context's limit is the current tier's after the operation;
    // for a dry run that is where the hits would have gone.
    let tier_limit = tier
        .checked_sub(1)
        .and_then(|i| tiers.get(i))
        .map_or(0, |t| t.limit);
    Ok(RateReply {
        granted,
        hard_limit: limits.hard_limit,
        global_limit: limits.global_limit,
        tier_limit,
        domain_hits_last_second,
        global_hits_last_second,
        tier_hits,
        tier,
        burst,
        hard_limited,
        global_limited,
        ignored: enforcement == Enforcement::Ignore,
        context: TierContext {
            limit: tier_limit,
            remaining,
            reset_after_ms,
            retry_after_ms,
            warning,
            banned,
        },
    })
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
        let mut args = Vec::with_capacity(6 + 2 * limits.groups.len());
        args.push(domain.to_owned());
        args.push(amount.copies().to_string());
        args.push(amount.min_copies().to_string());
        args.push(enforce_arg(enforcement));
        args.push(limit_arg(limits.domain_limit));
        args.push(optional_limit_arg(limits.global_limit));
        for g in &limits.groups {
            args.push(g.name.clone());
            args.push(limit_arg(g.limit));
        }
        let mut r = self
            .copy_op(
                &self.scripts.reserve,
                resource,
                args,
                Vec::new(),
                true,
                true,
            )
            .await?
            .ok_or_else(|| bad("reserve", "none"))?;
        let granted = r.count()?;
        let domain_holds = r.count()?;
        let global_holds = r.count()?;
        let groups = (0..limits.groups.len())
            .map(|_| r.count())
            .collect::<Result<Vec<_>, _>>()?;
        let after = CopyCounts {
            domain: domain_holds,
            global: global_holds,
            groups,
        };
        Ok(ReserveReply::new(granted, limits, &after, enforcement))
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
        if wait.wait_ms > 0 {
            return Err(StoreError::Refused(charon_core::ClientError::invalid(
                "wait_ms needs the in-memory store: the Redis store does not queue waiters yet",
            )));
        }
        let reply = self
            .reserve(resource, domain, limits, amount, enforcement)
            .await?;
        Ok(crate::Reserved::Now(reply))
    }

    async fn wait_outcome(
        &self,
        _ticket: &crate::Ticket,
    ) -> Result<Option<ReserveReply>, StoreError> {
        Ok(None)
    }

    async fn woken(&self, _ticket: &crate::Ticket, at_most: Duration) {
        tokio::time::sleep(at_most).await;
    }

    async fn leave_queue(
        &self,
        _ticket: &crate::Ticket,
    ) -> Result<Option<ReserveReply>, StoreError> {
        Ok(None)
    }

    async fn tick(&self, _resource: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn queue_lengths(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(Vec::new())
    }

    async fn release_ready(
        &self,
        hold: &Hold,
        copies: u64,
        _result_ready: bool,
    ) -> Result<CopyStatus, StoreError> {
        let mut args = Vec::with_capacity(2 + hold.groups.len());
        args.push(hold.domain.clone());
        args.push(copies.to_string());
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
