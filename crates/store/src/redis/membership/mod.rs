//! Membership and crash bookkeeping (paper §4.3.2), with Redis itself as
//! the coordinator instead of ZooKeeper (the reasoning is in
//! `docs/redis.md`):
//!
//! - each member (one start of a server) has a liveness key with a TTL,
//!   renewed every third of it, and at once again after a failure;
//! - a member whose latest renewal is older than half the TTL refuses copy
//!   operations (server errors) until it renews again; it never resigns
//!   for being unable to reach Redis;
//! - a live member *fences* a member whose liveness stayed lapsed for a
//!   grace period (atomically with that member's renewal: one of the two
//!   wins), then removes its contributions, one atomic script per
//!   resource, leaving a mark that stops the fenced member still running
//!   from touching those counts; a fenced member resigns at its next
//!   renewal; a lapsed member nobody fenced simply renews;
//! - a member that starts alone fences whoever is registered, then cleans
//!   up whatever dead generations left;
//! - when Redis loses its data (the generation marker changed), every
//!   member rebuilds its contributions from its sessions' hold sets, and
//!   reserves wait until all have.
//!
//! Joining, starting alone and leaving are here; renewing the liveness is
//! in `renewal.rs`, fencing and cleaning up after dead members in
//! `fencing.rs`, the rebuild after a data loss in `rebuild.rs`.

mod fencing;
mod rebuild;
mod renewal;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use self::fencing::Fence;
use super::RedisStore;
use super::keys::CopyKind;
use super::reply::Reply;
use crate::StoreError;

/// The counter of other members whose holds this member removed after
/// their liveness lapsed: a crash, a stall or a resignation elsewhere,
/// which operators alert on (described with the server's metrics).
pub const DEAD_SERVERS_REMOVED: &str = "charon_store_dead_servers_removed_total";

/// Resources handled between refreshes of the start lock.
const RESET_BATCH: usize = 64;

/// How long the mark left in a dead member's place stays: far longer than
/// any member can run on after its liveness lapsed (it stops at half the
/// TTL by its own clock; operations time out in seconds).
fn mark_ttl(ttl: Duration) -> Duration {
    (ttl * 10).max(Duration::from_secs(60))
}

fn millis(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

fn new_generation() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl RedisStore {
    /// Joins the membership: waits while a lone starter cleans up, and
    /// cleans up itself if it is alone.
    pub(super) async fn join(&self) -> Result<(), StoreError> {
        // At zero from the start, so an alert on its increase sees the
        // first removal.
        metrics::counter!(DEAD_SERVERS_REMOVED).increment(0);
        let deadline = Instant::now() + (self.ttl * 3).max(Duration::from_secs(5));
        loop {
            let registered: Vec<String> = self
                .conn
                .query(redis::cmd("SMEMBERS").arg(self.keys.registry()))
                .await?;
            let others: Vec<&String> = registered.iter().filter(|m| **m != self.member).collect();
            let live: Vec<String> = others.iter().map(|m| self.keys.live(m)).collect();
            let mut keys = vec![
                self.keys.registry(),
                self.keys.generation(),
                self.keys.start_lock(),
                self.keys.live(&self.member),
                self.keys.rebuild(),
                self.keys.tick(),
            ];
            keys.extend(live);
            let mut args = vec![
                self.member.clone(),
                millis(self.ttl),
                new_generation(),
                self.rebuild_grace.as_millis().to_string(),
                self.keys.live_prefix(),
            ];
            args.extend(others.iter().map(|m| (*m).clone()));
            let sent = Instant::now();
            let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let v = self
                .conn
                .eval(&self.scripts.join, &key_refs, &args, &[])
                .await?;
            let mut r = Reply::new(self.scripts.join.name, v)?;
            let outcome = r.text()?;
            let generation = r.text()?;
            let gate_open = r.text()? == "open";
            match outcome.as_str() {
                "retry" => continue,
                "wait" => {
                    if Instant::now() > deadline {
                        return Err(StoreError::Unavailable(
                            "another server has been cleaning up after starting alone for too long"
                                .into(),
                        ));
                    }
                    tokio::time::sleep((self.ttl / 10).min(Duration::from_millis(100))).await;
                    continue;
                }
                "joined" | "alone" => {
                    {
                        let mut s = self.lock();
                        s.generation = generation;
                        s.renewed = sent;
                    }
                    self.note_gate(gate_open);
                    if outcome == "alone" {
                        let cleaned = self.start_alone().await;
                        let unlocked = self.unlock(Duration::ZERO).await;
                        cleaned?;
                        unlocked?;
                    }
                    return Ok(());
                }
                other => {
                    return Err(super::reply::bad(
                        "join",
                        &format!("unknown outcome {other:?}"),
                    ));
                }
            }
        }
    }

    /// Refreshes the start lock for `hold`, or releases it (zero).
    async fn unlock(&self, hold: Duration) -> Result<(), StoreError> {
        let hold = if hold.is_zero() {
            "0".to_owned()
        } else {
            millis(hold)
        };
        self.conn
            .eval(
                &self.scripts.unlock,
                &[&self.keys.start_lock()],
                &[self.member.clone(), hold],
                &[],
            )
            .await?;
        Ok(())
    }

    /// No other member is live: every copy held by a previous generation
    /// is gone with its sessions. Counts become what is still staged,
    /// contributions and key sets of the dead are dropped.
    ///
    /// Members that are registered but not live may only be late (Redis was
    /// stalled past the ttl): they are fenced first, by the same rule as
    /// always, and if one of them renews instead, this server is not alone
    /// after all and cleans up nothing.
    async fn start_alone(&self) -> Result<(), StoreError> {
        if !self.fence_everyone_else().await? {
            tracing::info!(
                "a server whose liveness had only lapsed renewed it: not alone after all, nothing reset"
            );
            return Ok(());
        }
        let dead: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.dead()))
            .await?;
        for m in dead.iter().filter(|m| **m != self.member) {
            self.conn
                .query::<()>(redis::cmd("DEL").arg(self.keys.key_set(m)))
                .await?;
            self.conn
                .query::<()>(redis::cmd("SREM").arg(self.keys.dead()).arg(m))
                .await?;
            tracing::info!(member = %m, "dropped a dead server's registration (starting alone)");
        }

        // Every resource with copy keys, and the contributions found.
        let mut resources: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for key in self.scan(&self.keys.copy_scan_pattern(), true).await? {
            if let Some((tag, kind)) = self.keys.parse(&key) {
                let entry = resources.entry(tag.to_owned()).or_default();
                if let CopyKind::Contribution(_) = kind {
                    entry.push(key.clone());
                }
            }
        }
        let mut freed = 0u64;
        for (i, (tag, contributions)) in resources.iter().enumerate() {
            if i % RESET_BATCH == RESET_BATCH - 1 {
                self.keep_starting().await?;
            }
            let k = self.keys.copies_of_tag(tag, &self.member);
            let mut keys = vec![
                k.counts.as_str(),
                k.staging.as_str(),
                k.staging_expiry.as_str(),
            ];
            keys.extend(contributions.iter().map(String::as_str));
            let v = self
                .conn
                .eval(
                    &self.scripts.reset,
                    &keys,
                    &[self.clock_arg(), millis(mark_ttl(self.ttl))],
                    &[],
                )
                .await?;
            let mut r = Reply::new(self.scripts.reset.name, v)?;
            let before = r.count()?;
            let after = r.count()?;
            freed += before.saturating_sub(after);
            if after > 0 {
                let mut index = redis::cmd("SADD");
                index.arg(self.keys.staging_index()).arg(tag);
                self.conn.query::<()>(&index).await?;
            }
        }

        // Key sets of members nobody registers any more.
        for key in self.scan(&self.keys.key_set_scan_pattern(), true).await? {
            if let Some(m) = self.keys.key_set_member(&key)
                && m != self.member
            {
                self.conn.query::<()>(redis::cmd("DEL").arg(&key)).await?;
            }
        }
        if freed > 0 || !resources.is_empty() {
            tracing::warn!(
                resources = resources.len(),
                copies = freed,
                "started alone: released copies that earlier servers left held"
            );
        }
        Ok(())
    }

    /// Fences every other registered member, waiting out the suspicion
    /// grace. False as soon as one of them turns out live.
    async fn fence_everyone_else(&self) -> Result<bool, StoreError> {
        let deadline = Instant::now() + (self.ttl * 3).max(Duration::from_secs(5));
        loop {
            let registered: Vec<String> = self
                .conn
                .query(redis::cmd("SMEMBERS").arg(self.keys.registry()))
                .await?;
            let mut suspect = false;
            for m in registered.iter().filter(|m| **m != self.member) {
                match self.fence(m, false).await? {
                    Fence::Live => return Ok(false),
                    Fence::Suspect => suspect = true,
                    Fence::Fenced | Fence::Gone => {}
                }
            }
            if !suspect {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Err(StoreError::Unavailable(
                    "registered servers stayed neither live nor fenced for too long".into(),
                ));
            }
            self.keep_starting().await?;
            tokio::time::sleep(self.retry_every()).await;
        }
    }

    /// Keeps this member live and the start lock held while a long
    /// clean-up runs (`maintain` is not running yet).
    async fn keep_starting(&self) -> Result<(), StoreError> {
        self.unlock(self.ttl).await?;
        self.renew().await.map(|_| ())
    }

    /// How soon a failed renewal is tried again (and how often the copy
    /// gate is polled while closed): a member whose liveness lapsed must
    /// renew well within the suspicion grace once Redis answers again.
    pub(super) fn retry_every(&self) -> Duration {
        (self.ttl / 20).clamp(Duration::from_millis(10), Duration::from_millis(250))
    }

    /// How long after the last renewal was sent the next one is: early
    /// enough that any renewal that succeeds (it is abandoned after a
    /// quarter of the ttl) returns before copy operations are refused (half
    /// a ttl after the last send), with [`RedisStore::retry_every`] to
    /// spare. A third of the ttl, as before, left a gap whenever Redis was
    /// slow but within its time limits: a renewal taking more than a sixth
    /// of the ttl made copy operations fail for a moment every cycle (seen
    /// as server errors with every Redis round trip at 300 ms–0.8 s, ttl 4
    /// s, in `redis_slow_within_the_timeout_during_a_session_flood`).
    pub(super) fn renew_every(&self) -> Duration {
        (self.ttl / 4)
            .saturating_sub(self.retry_every())
            .max(self.retry_every())
    }

    /// How long a member's liveness must stay lapsed, by Redis' clock while
    /// Redis runs, before it is fenced: a renewal interval, far more than
    /// a member retrying every [`RedisStore::retry_every`] needs.
    fn suspicion_grace(&self) -> Duration {
        self.ttl / 3
    }

    /// Every key matching `pattern`; `starting` keeps the member live
    /// between pages.
    async fn scan(&self, pattern: &str, starting: bool) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        // In a cluster each master holds its own keys: every one is walked.
        for node in self.conn.scan_nodes().await? {
            self.scan_node(node, pattern, starting, &mut found).await?;
        }
        found.sort();
        found.dedup();
        Ok(found)
    }

    /// [`Self::scan`] on one node (see `Conn::scan_nodes`).
    async fn scan_node(
        &self,
        node: Option<u16>,
        pattern: &str,
        starting: bool,
        found: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = self
                .conn
                .query_at(
                    node,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            // Keys that are not text are not Charon's.
            found.extend(keys.into_iter().filter_map(|k| String::from_utf8(k).ok()));
            if starting {
                self.keep_starting().await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Deletes every key under this store's key prefix, on every node,
    /// and says how many: what `charon simulate --store redis://` does at
    /// its end with the prefix it made for itself. Never call it on a
    /// prefix servers share: it deletes their state too.
    pub async fn forget_all(&self) -> Result<u64, StoreError> {
        let keys = self.scan(&self.keys.all_scan_pattern(), false).await?;
        let mut deleted = 0u64;
        for key in &keys {
            let n: u64 = self.conn.query(redis::cmd("DEL").arg(key)).await?;
            deleted += n;
        }
        Ok(deleted)
    }

    /// Leaves the membership at a clean shutdown, once every session has
    /// ended: stops copy operations, settles operations in doubt, removes
    /// whatever this server still contributes (as if it had died) and its
    /// registration, so that nobody waits for its liveness to lapse.
    pub async fn leave(&self) -> Result<(), StoreError> {
        let _ = self.resign("this server left the membership".into());
        self.settle_in_doubt().await?;
        self.fence(&self.member, true).await?;
        self.clean_member(&self.member).await
    }

    /// Releases expired staged transfers of every resource that has some.
    pub(super) async fn expire_staging(&self) -> Result<(), StoreError> {
        let tags: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.staging_index()))
            .await?;
        for tag in tags {
            let k = self.keys.copies_of_tag(&tag, &self.member);
            let v = self
                .conn
                .eval(
                    &self.scripts.expire,
                    &[&k.counts, &k.staging, &k.staging_expiry],
                    &[self.clock_arg()],
                    &[],
                )
                .await?;
            let mut r = Reply::new(self.scripts.expire.name, v)?;
            let _expired = r.count()?;
            if r.count()? == 0 {
                // A transfer staged between the script and this SREM is
                // missed here; it still expires on the next use of its
                // resource.
                let mut rem = redis::cmd("SREM");
                rem.arg(self.keys.staging_index()).arg(&tag);
                self.conn.query::<()>(&rem).await?;
            }
        }
        Ok(())
    }
}

/// [`crate::Store::maintain`] of the Redis store.
pub(super) async fn maintain(store: &RedisStore) -> StoreError {
    tokio::select! {
        e = store.renew_loop() => e,
        () = store.housekeeping_loop() => store
            .resigned()
            .unwrap_or_else(|| StoreError::Resigned("membership ended".into())),
    }
}
