//! Capacity leases on Redis (SPEC §12). A resource's leases are one hash,
//! `<prefix>:{<resource>}:l`: `e` (an id drawn when the set was created),
//! `v` (a write counter) and one field `c:<client>` per lease. A decision
//! reads the set and the decision clock (`lease_get.lua`), decides in Rust
//! with `charon_core::lease` (the rules are written once, and Doorman's
//! shares need 128-bit arithmetic that Lua has not), and writes back the
//! one lease it changed and the lapsed ones it dropped, only if the version
//! `e:v` is unchanged (`lease_put.lua`); otherwise another server decided
//! in between, and it reads again. So servers on one Redis hand out one
//! consistent set of leases and never over-commit, and no decision is lost.
//!
//! Servers take turns on a resource: the read takes a decision lock
//! (`<prefix>:{<resource>}:lk`, a token, for the store timeout at most)
//! that the write gives back, and a server finding it held waits a moment
//! and reads again. Without it, a server that must read the whole set was
//! starved by one deciding from its cache (seen with 10,000 clients: every
//! call of the slow one failed after 32 lost races). The lock only orders;
//! the version check is the safety if it lapses.
//!
//! Each server keeps the set it last read or wrote, with its version; the
//! read sends only the version while that is current (a server deciding
//! alone reads and writes O(1) per decision), and after other servers
//! wrote, only the leases they changed, from the resource's change log
//! (`<prefix>:{<resource>}:lc`, the clients each of the last 1024 writes
//! changed). Only a server more than 1024 writes behind, or with no cached
//! set, reads the whole set: O(clients).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use charon_core::Millis;
use charon_core::lease::{Lease, LeaseSet, Quantity};

use super::RedisStore;
use super::reply::{Reply, bad};
use crate::StoreError;

/// How often a decision is tried before the store gives up (a server
/// error): each retry means another server stored a decision in between
/// although the decision lock was held (it lapsed: a server stalled longer
/// than the store timeout), so this is only reached when things are
/// already broken.
const MAX_TRIES: u32 = 32;

/// Locks that make one server's lease decisions on a resource take turns:
/// without them, a burst of refreshes on one server starves itself in
/// compare and set (found by `servers_on_one_redis_never_over_commit`).
/// Striped by the resource's hash; two resources may share a stripe, which
/// only orders their decisions.
#[derive(Debug)]
pub(crate) struct Stripes(Vec<tokio::sync::Mutex<()>>);

impl Default for Stripes {
    fn default() -> Self {
        Self((0..64).map(|_| tokio::sync::Mutex::new(())).collect())
    }
}

impl Stripes {
    fn of(&self, resource: &str) -> &tokio::sync::Mutex<()> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(resource);
        &self.0[(h % self.0.len() as u64) as usize]
    }
}

/// The sets this server last read or wrote, by resource, with their
/// versions.
#[derive(Debug, Default)]
pub(crate) struct Cache(Mutex<HashMap<String, (String, LeaseSet)>>);

impl Cache {
    fn take(&self, resource: &str) -> Option<(String, LeaseSet)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(resource)
    }

    fn version(&self, resource: &str) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .map(|(v, _)| v.clone())
    }

    fn put(&self, resource: &str, version: String, set: LeaseSet) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(resource.to_owned(), (version, set));
    }
}

/// Fields of a stored lease are separated by US (0x1F): `has US wants US
/// subclients US expires_at_ms`, amounts in millionths.
const FIELD: char = '\u{1f}';

/// A lease as its hash field's value.
pub(crate) fn encode(l: &Lease) -> String {
    format!(
        "{}{FIELD}{}{FIELD}{}{FIELD}{}",
        l.has.micros(),
        l.wants.micros(),
        l.subclients,
        l.expires_at_ms
    )
}

/// The lease [`encode`] wrote; `None` if `value` is not such a text.
pub(crate) fn decode(value: &str) -> Option<Lease> {
    let mut fields = value.split(FIELD);
    let mut n = || fields.next()?.parse::<u64>().ok();
    let lease = Lease {
        has: Quantity::from_micros(n()?)?,
        wants: Quantity::from_micros(n()?)?,
        subclients: n()?,
        expires_at_ms: n()?,
    };
    fields.next().is_none().then_some(lease)
}

/// Brings a cached set up to date with the changes since its version
/// (client, lease or '' for gone, …).
fn apply_changes(script: &str, set: &mut LeaseSet, mut changes: Reply) -> Result<(), StoreError> {
    while changes.remaining() >= 2 {
        let (client, value) = (changes.text()?, changes.text()?);
        if value.is_empty() {
            set.forget(&client);
        } else {
            let lease = decode(&value).ok_or_else(|| bad(script, "malformed lease"))?;
            set.restore(&client, lease);
        }
    }
    Ok(())
}

/// The set in a `HGETALL` reply (field, value, …).
fn decode_hash(script: &str, mut all: Reply) -> Result<LeaseSet, StoreError> {
    let mut leases = Vec::with_capacity(all.remaining() / 2);
    while all.remaining() >= 2 {
        let (field, value) = (all.text()?, all.text()?);
        if let Some(client) = field.strip_prefix("c:") {
            let lease = decode(&value).ok_or_else(|| bad(script, "malformed lease"))?;
            leases.push((client.to_owned(), lease));
        }
    }
    Ok(leases.into_iter().collect())
}

impl RedisStore {
    /// [`crate::Store::leases`] on Redis: read (or use the cached set),
    /// decide, compare and set what changed.
    pub(crate) async fn lease_decision(
        &self,
        resource: &str,
        client: &str,
        decide: &mut (dyn for<'s> FnMut(&'s mut LeaseSet, Millis) + Send),
    ) -> Result<(), StoreError> {
        let key = self.keys.lease_set(resource);
        let lock = self.keys.lease_lock(resource);
        let log = self.keys.lease_log(resource);
        let keys = [key.as_str(), lock.as_str(), log.as_str()];
        let _turn = self.lease_locks.of(resource).lock().await;
        let lock_ms = self.lease_lock_time.as_millis().max(100);
        // Waiting for other servers' turns is bounded too.
        let deadline = std::time::Instant::now() + self.lease_lock_time * 4;
        let mut attempt = 0;
        loop {
            if attempt >= MAX_TRIES {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "other servers held the lease lock of {resource:?} for {:?}",
                    self.lease_lock_time * 4
                )));
            }
            let token = format!("{}:{:016x}", self.member, rand::random::<u64>());
            let cached = self.lease_cache.version(resource);
            let got = &self.scripts.lease_get;
            let args = [
                self.clock.arg(),
                cached.clone().unwrap_or_default(),
                token.clone(),
                lock_ms.to_string(),
            ];
            let v = self.conn.eval(got, &keys, &args, &[]).await?;
            let mut r = Reply::new(got.name, v)?;
            let version = r.text()?;
            if version == "busy" {
                // Another server's turn: a decision takes a round trip or
                // two, so look again soon.
                let us = rand::random_range(200..=1_000);
                tokio::time::sleep(std::time::Duration::from_micros(us)).await;
                continue;
            }
            let (now, read) = (r.count()?, r.count()?);
            let mut set = match (read, self.lease_cache.take(resource)) {
                (0, Some((_, set))) => set,
                (2, Some((_, mut set))) => {
                    apply_changes(got.name, &mut set, r.nested()?)?;
                    set
                }
                (1, _) => decode_hash(got.name, r.nested()?)?,
                _ => return Err(bad(got.name, "no set for a cached version")),
            };
            let lapsed: Vec<String> = set
                .iter()
                .filter(|(_, l)| now >= l.expires_at_ms)
                .map(|(c, _)| c.to_owned())
                .collect();
            decide(&mut set, now);
            let last = set.iter().map(|(_, l)| l.expires_at_ms).max();
            let put = &self.scripts.lease_put;
            let mut args = vec![
                version,
                format!("{:016x}", rand::random::<u64>()),
                self.clock.arg(),
                last.map_or_else(|| "-1".to_owned(), |t| t.to_string()),
                self.clock.expiry_slack().to_string(),
                token,
            ];
            let mine = set.get(client);
            args.push(u8::from(mine.is_some()).to_string());
            if let Some(l) = mine {
                args.extend([client.to_owned(), encode(l)]);
            } else {
                args.push(client.to_owned());
            }
            args.extend(lapsed.into_iter().filter(|c| set.get(c).is_none()));
            let stored = self.conn.eval(put, &keys, &args, &[]).await;
            // Whatever happened, the cache holds only what is known stored.
            let mut r = Reply::new(put.name, stored?)?;
            if r.flag()? {
                let (version, created) = (r.text()?, r.flag()?);
                // The index of resources with lease sets changes only when
                // one is created (an emptied set leaves it at the next
                // snapshot).
                if created {
                    let index = self.keys.lease_index();
                    self.conn
                        .query::<()>(redis::cmd("SADD").arg(index).arg(resource))
                        .await?;
                }
                self.lease_cache.put(resource, version, set);
                return Ok(());
            }
            attempt += 1;
        }
        Err(StoreError::Unavailable(format!(
            "the leases of {resource:?} changed under {MAX_TRIES} decisions in a row"
        )))
    }

    /// [`crate::Store::lease_sets`] on Redis: every indexed resource's set
    /// as stored (sets that lapsed are dropped from the index).
    pub(crate) async fn all_lease_sets(
        &self,
    ) -> Result<(Millis, Vec<(String, LeaseSet)>), StoreError> {
        let index = self.keys.lease_index();
        let resources: Vec<String> = self.conn.query(redis::cmd("SMEMBERS").arg(&index)).await?;
        let mut out = Vec::with_capacity(resources.len());
        let mut latest = None;
        for resource in resources {
            let mut r = self.snapshot(&resource).await?;
            let (version, now, _) = (r.text()?, r.count()?, r.count()?);
            latest = Some(now);
            if version == "0" {
                self.conn
                    .query::<()>(redis::cmd("SREM").arg(&index).arg(&resource))
                    .await?;
                continue;
            }
            let set = decode_hash(self.scripts.lease_get.name, r.nested()?)?;
            out.push((resource, set));
        }
        let now = match latest {
            Some(now) => now,
            // No set to read: the clock of a read of none.
            None => {
                let mut r = self.snapshot("").await?;
                r.text()?;
                r.count()?
            }
        };
        Ok((now, out))
    }

    /// `lease_get` without the lock and without a cached version: the
    /// whole set of `resource` as stored, and the decision clock.
    async fn snapshot(&self, resource: &str) -> Result<Reply, StoreError> {
        let got = &self.scripts.lease_get;
        let keys = [
            self.keys.lease_set(resource),
            self.keys.lease_lock(resource),
            self.keys.lease_log(resource),
        ];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args = [
            self.clock.arg(),
            String::new(),
            String::new(),
            "0".to_owned(),
        ];
        let v = self.conn.eval(got, &keys, &args, &[]).await?;
        Reply::new(got.name, v)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips_through_its_text() {
        let l = Lease {
            has: Quantity::from_micros(45_555_555).unwrap(),
            wants: Quantity::units(100).unwrap(),
            subclients: 3,
            expires_at_ms: 1_700_000_000_123,
        };
        assert_eq!(decode(&encode(&l)), Some(l));
        for bad in [
            "",
            "1",
            "1\u{1f}2\u{1f}3",
            "a\u{1f}1\u{1f}1\u{1f}1",
            "1\u{1f}1\u{1f}1\u{1f}1\u{1f}1",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
