//! Membership and crash bookkeeping (paper §4.3.2), with Redis itself as
//! the coordinator instead of ZooKeeper:
//!
//! - each member (one start of a server) has a liveness key with a TTL,
//!   renewed every third of it;
//! - a member that cannot renew for half the TTL (by its own clock, so it
//!   stops before others may consider it dead), or that finds its liveness
//!   key gone, resigns;
//! - every live member periodically removes the contributions of members
//!   whose liveness lapsed, one atomic script per resource, and leaves a
//!   mark that stops a dead member still running from touching the counts;
//! - a member that starts alone cleans up whatever dead generations left.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::RedisStore;
use super::keys::CopyKind;
use super::reply::Reply;
use crate::StoreError;

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
            ];
            keys.extend(live);
            let mut args = vec![self.member.clone(), millis(self.ttl), new_generation()];
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
    async fn start_alone(&self) -> Result<(), StoreError> {
        let registered: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.registry()))
            .await?;
        for m in registered.iter().filter(|m| **m != self.member) {
            self.conn
                .query::<()>(redis::cmd("DEL").arg(self.keys.key_set(m)))
                .await?;
            self.conn
                .query::<()>(redis::cmd("SREM").arg(self.keys.registry()).arg(m))
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

    /// Keeps this member live and the start lock held while a long
    /// clean-up runs (`maintain` is not running yet).
    async fn keep_starting(&self) -> Result<(), StoreError> {
        self.unlock(self.ttl).await?;
        self.renew().await
    }

    /// Every key matching `pattern`; `starting` keeps the member live
    /// between pages.
    async fn scan(&self, pattern: &str, starting: bool) -> Result<Vec<String>, StoreError> {
        let mut cursor = 0u64;
        let mut found = Vec::new();
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = self
                .conn
                .query(
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
                found.sort();
                found.dedup();
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// Renews this member's liveness once.
    async fn renew(&self) -> Result<(), StoreError> {
        let generation = self.lock().generation.clone();
        let sent = Instant::now();
        let keys = [
            self.keys.live(&self.member),
            self.keys.generation(),
            self.keys.registry(),
        ];
        let args = [
            generation,
            millis(self.ttl),
            self.member.clone(),
            new_generation(),
        ];
        let key_refs = [keys[0].as_str(), keys[1].as_str(), keys[2].as_str()];
        let work = self.conn.eval(&self.scripts.renew, &key_refs, &args, &[]);
        // A renewal that takes longer than a quarter of the ttl is as good
        // as none.
        let v = tokio::time::timeout(self.ttl / 4, work)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "renewing liveness took too long".into(),
                ))
            })?;
        let mut r = Reply::new(self.scripts.renew.name, v)?;
        let outcome = r.text()?;
        let generation = r.text()?;
        match outcome.as_str() {
            "ok" => {
                self.lock().renewed = sent;
                Ok(())
            }
            "lapsed" => Err(self.resign(
                "this server's liveness key is gone: other servers may have removed its contributions"
                    .into(),
            )),
            "new" => {
                {
                    let mut s = self.lock();
                    s.generation = generation;
                    s.renewed = sent;
                    s.known.clear();
                    s.epoch += 1;
                    s.rescan = true;
                }
                tracing::warn!(
                    member = %self.member,
                    "Redis lost the copy log (restart without persistence?); joined its new generation"
                );
                Ok(())
            }
            other => Err(super::reply::bad(
                "renew",
                &format!("unknown outcome {other:?}"),
            )),
        }
    }

    /// Renews every third of the ttl until this member resigns.
    async fn renew_loop(&self) -> StoreError {
        let mut every = tokio::time::interval(self.ttl / 3);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if let Some(e) = self.resigned() {
                return e;
            }
            match self.renew().await {
                Ok(()) => {}
                Err(e @ StoreError::Resigned(_)) => return e,
                Err(e) => {
                    self.on_error(&e);
                    let since = self.lock().renewed.elapsed();
                    if since > self.ttl / 2 {
                        return self.resign(format!(
                            "could not renew liveness for {since:?}, more than half its ttl of {:?}: {e}",
                            self.ttl
                        ));
                    }
                    tracing::warn!(error = %e, "could not renew liveness; will retry");
                }
            }
        }
    }

    /// Cleans up after dead members and expires staged transfers, every
    /// third of the ttl. Errors wait for the next round.
    async fn housekeeping_loop(&self) {
        let mut every = tokio::time::interval(self.ttl / 3);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if self.check_member().is_err() {
                return;
            }
            if let Err(e) = self.rebuild_key_set().await {
                tracing::warn!(error = %e, "rebuilding this server's key set failed; will retry");
            }
            if let Err(e) = self.settle_in_doubt().await {
                tracing::warn!(error = %e, "undoing copy operations in doubt failed; will retry");
            }
            if let Err(e) = self.clean_dead_members().await {
                tracing::warn!(error = %e, "cleaning up after dead servers failed; will retry");
            }
            if let Err(e) = self.expire_staging().await {
                tracing::warn!(error = %e, "expiring staged transfers failed; will retry");
            }
        }
    }

    /// Removes the contributions of every registered member whose liveness
    /// lapsed. Returns how many members were cleaned up.
    pub(super) async fn clean_dead_members(&self) -> Result<usize, StoreError> {
        let registered: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.registry()))
            .await?;
        let others: Vec<&String> = registered.iter().filter(|m| **m != self.member).collect();
        if others.is_empty() {
            return Ok(0);
        }
        let mut cleaned = 0;
        for m in others {
            let live: u64 = self
                .conn
                .query(redis::cmd("EXISTS").arg(self.keys.live(m)))
                .await?;
            if live == 0 {
                self.check_member()?;
                self.clean_member(m).await?;
                cleaned += 1;
            }
        }
        Ok(cleaned)
    }

    /// Removes a dead member's contributions, resource by resource, then
    /// its registration.
    async fn clean_member(&self, member: &str) -> Result<(), StoreError> {
        let tags: Vec<String> = self
            .conn
            .query(redis::cmd("SMEMBERS").arg(self.keys.key_set(member)))
            .await?;
        let mark = millis(mark_ttl(self.ttl));
        let mut copies = 0u64;
        for tag in &tags {
            let k = self.keys.copies_of_tag(tag, member);
            let v = self
                .conn
                .eval(
                    &self.scripts.cleanup,
                    &[&k.counts, &k.contribution],
                    std::slice::from_ref(&mark),
                    &[],
                )
                .await?;
            let mut r = Reply::new(self.scripts.cleanup.name, v)?;
            copies += r.count()?;
            let negative = r.count()?;
            if negative > 0 {
                tracing::error!(
                    member,
                    resource_tag = %tag,
                    fields = negative,
                    "counts were below a dead server's contribution; set to zero"
                );
            }
        }
        let v = self
            .conn
            .eval(
                &self.scripts.forget,
                &[
                    &self.keys.registry(),
                    &self.keys.live(member),
                    &self.keys.key_set(member),
                ],
                &[member.to_owned(), tags.len().to_string()],
                &[],
            )
            .await?;
        let forgotten = matches!(v, redis::Value::Int(1));
        tracing::warn!(
            member,
            resources = tags.len(),
            copies,
            forgotten,
            "removed the contributions of a dead server"
        );
        Ok(())
    }

    /// After Redis lost its data, operations that ran between the loss and
    /// its discovery may have contributed without adding their resource to
    /// the key set (it was known to be there): add every resource this
    /// member contributes to.
    async fn rebuild_key_set(&self) -> Result<(), StoreError> {
        if !self.lock().rescan {
            return Ok(());
        }
        let pattern = self.keys.contribution_scan_pattern(&self.member);
        let mut tags = Vec::new();
        for key in self.scan(&pattern, false).await? {
            if let Some((tag, CopyKind::Contribution(m))) = self.keys.parse(&key)
                && m == self.member
            {
                tags.push(tag.to_owned());
            }
        }
        if !tags.is_empty() {
            let mut add = redis::cmd("SADD");
            add.arg(self.keys.key_set(&self.member)).arg(&tags);
            self.conn.query::<()>(&add).await?;
        }
        self.lock().rescan = false;
        Ok(())
    }

    /// Leaves the membership at a clean shutdown, once every session has
    /// ended: stops copy operations, settles operations in doubt, removes
    /// whatever this server still contributes (as if it had died) and its
    /// registration, so that nobody waits for its liveness to lapse.
    pub async fn leave(&self) -> Result<(), StoreError> {
        let _ = self.resign("this server left the membership".into());
        self.settle_in_doubt().await?;
        self.conn
            .query::<()>(redis::cmd("DEL").arg(self.keys.live(&self.member)))
            .await?;
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
