//! Capacity leases on Redis (SPEC §12). A resource's leases are one hash,
//! `<prefix>:{<resource>}:l`: `e` (an id drawn when the set was created),
//! `v` (a write counter), `x` (when the key is set to expire), `lk` (the
//! decision lock), one field `c:<client>` per lease and a ring of the
//! clients the last 256 writes changed (`g:<v mod 256>`). The rules are
//! decided in Rust with `charon_core::lease` (written once, and Doorman's
//! shares need 128-bit arithmetic that Lua has not); Redis only keeps the
//! set and checks versions.
//!
//! Each server keeps the set it last read or wrote, with its version
//! `e:v`. A refresh on a current copy is two calls: Redis' clock (`TIME`;
//! none under a virtual clock), then `lease_put.lua`, which writes the one
//! lease the decision changed and the lapsed ones it dropped only if the
//! version is unchanged (compare and set: `HMGET`, `HSET`). If another
//! server wrote in between, the write is refused, the copy is put back as
//! it was before the decision, and the server reads what changed
//! (`lease_get.lua`: only the leases the writes since changed, from the
//! ring, or the whole set when it is more than 256 writes behind or has no
//! copy) and decides again. So servers on one Redis hand out one
//! consistent set of leases and never over-commit, and no decision is
//! lost.
//!
//! Servers take turns when they collide: the read after a refused write
//! (or without a copy) takes the set's decision lock (a token and a
//! deadline in `lk`, for the store timeout at most) that the write gives
//! back, and a server whose write finds it held waits a moment and tries
//! again. Without it, a server that must read the whole set was starved by
//! one deciding from its copy (seen with 10,000 clients: every call of the
//! slow one failed after 32 lost races). The lock only orders; the version
//! check is the safety if it lapses.

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

/// The writes whose changed clients the set's ring keeps (`g:<v mod
/// RING>`, see `lease_get.lua`, which repeats the number).
const RING: u64 = 256;

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

/// A server's copy of a resource's set as of one version: the version
/// `e:v`, when the key is set to expire (`x`, part of the version; `None`:
/// not stored) and the leases.
#[derive(Debug)]
pub(crate) struct SetCopy {
    version: String,
    x: Option<Millis>,
    set: LeaseSet,
}

/// The sets this server last read or wrote, by resource, with their
/// versions.
#[derive(Debug, Default)]
pub(crate) struct Cache(Mutex<HashMap<String, SetCopy>>);

impl Cache {
    fn take(&self, resource: &str) -> Option<SetCopy> {
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
            .map(|c| c.version.clone())
    }

    fn put(&self, resource: &str, copy: SetCopy) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(resource.to_owned(), copy);
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

/// Waits before looking again when another server has its turn: a
/// decision takes a round trip or two.
async fn lease_pause() {
    let us = rand::random_range(200..=1_000);
    tokio::time::sleep(std::time::Duration::from_micros(us)).await;
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

/// What a decision changed in a copy of the set, to put it back as it was
/// when the write is refused: the client's lease before, and the lapsed
/// leases the decision dropped.
struct Undo {
    client: String,
    before: Option<Lease>,
    lapsed: Vec<(String, Lease)>,
}

impl Undo {
    fn apply(self, set: &mut LeaseSet) {
        for (c, l) in self.lapsed {
            set.restore(&c, l);
        }
        match self.before {
            Some(l) => set.restore(&self.client, l),
            None => {
                set.forget(&self.client);
            }
        }
    }
}

/// What a stored write makes of the copy: its new version and `x`.
struct Next {
    version: String,
    x: Option<Millis>,
}

impl RedisStore {
    /// [`crate::Store::leases`] on Redis: decide on the cached copy (or
    /// read the set), compare and set what changed.
    pub(crate) async fn lease_decision(
        &self,
        resource: &str,
        client: &str,
        decide: &mut (dyn for<'s> FnMut(&'s mut LeaseSet, Millis) + Send),
    ) -> Result<(), StoreError> {
        let key = self.keys.lease_set(resource);
        let _turn = self.lease_locks.of(resource).lock().await;
        // Waiting for other servers' turns is bounded too.
        let deadline = std::time::Instant::now() + self.lease_lock_time * 4;
        let token = format!("{}:{:016x}", self.member, rand::random::<u64>());
        // A refused write means another server decides on this set too:
        // from then on, reads take the lock so that this one has its turn.
        let mut lock = false;
        let mut attempt = 0;
        while attempt < MAX_TRIES {
            if std::time::Instant::now() >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "other servers held the lease lock of {resource:?} for {:?}",
                    self.lease_lock_time * 4
                )));
            }
            let got = match self.lease_cache.version(resource) {
                Some(_) if !lock => {
                    let now = self.lease_now(&key).await?;
                    match self.lease_cache.take(resource) {
                        Some(copy) => Some((copy, now)),
                        None => continue,
                    }
                }
                _ => self.lease_read(resource, &key, &token).await?,
            };
            // None: another server's turn.
            let Some((mut copy, now)) = got else {
                lease_pause().await;
                continue;
            };
            let lapsed: Vec<(String, Lease)> = copy
                .set
                .iter()
                .filter(|(_, l)| now >= l.expires_at_ms)
                .map(|(c, l)| (c.to_owned(), *l))
                .collect();
            let undo = Undo {
                client: client.to_owned(),
                before: copy.set.get(client).copied(),
                lapsed,
            };
            decide(&mut copy.set, now);
            let put = &self.scripts.lease_put;
            let (args, next) = self.put_args(&copy, &token, client, now, &undo)?;
            // Whatever happens, the cache holds only what is known stored
            // (a lost reply leaves none: the next decision reads).
            let stored = self.conn.eval(put, &[key.as_str()], &args, &[]).await?;
            let mut r = Reply::new(put.name, stored)?;
            match r.int()? {
                1 => {
                    let created = r.flag()?;
                    // The index of resources with lease sets changes only
                    // when one is created (an emptied set leaves it at the
                    // next snapshot).
                    if created {
                        let index = self.keys.lease_index();
                        self.conn
                            .query::<()>(redis::cmd("SADD").arg(index).arg(resource))
                            .await?;
                    }
                    copy.version = next.version;
                    copy.x = next.x;
                    self.lease_cache.put(resource, copy);
                    return Ok(());
                }
                // Another server's turn: keep the copy, look again soon.
                2 => {
                    undo.apply(&mut copy.set);
                    self.lease_cache.put(resource, copy);
                    lease_pause().await;
                }
                0 => {
                    // Changed in between: the copy as it was is the base
                    // the read brings up to date.
                    undo.apply(&mut copy.set);
                    self.lease_cache.put(resource, copy);
                    lock = true;
                    attempt += 1;
                }
                v => return Err(bad(put.name, &format!("unexpected outcome {v}"))),
            }
        }
        Err(StoreError::Unavailable(format!(
            "the leases of {resource:?} changed under {MAX_TRIES} decisions in a row"
        )))
    }

    /// The decision clock's time for a decision on a cached copy: the
    /// virtual clock's, or Redis `TIME` (in a cluster, of the set's node).
    async fn lease_now(&self, key: &str) -> Result<Millis, StoreError> {
        if let Some(now) = self.clock.virtual_now() {
            return Ok(now);
        }
        if self.conn.is_cluster() {
            let time = &self.scripts.lease_time;
            let v = self.conn.eval(time, &[key], &[], &[]).await?;
            return redis::from_redis_value::<u64>(v)
                .map_err(|_| bad(time.name, "expected the time in ms"));
        }
        let (s, us): (u64, u64) = self.conn.query(&redis::cmd("TIME")).await?;
        Ok(s * 1000 + us / 1000)
    }

    /// Reads the set (`lease_get.lua`), taking its decision lock: only
    /// what changed since the cached copy when there is one.
    async fn lease_read(
        &self,
        resource: &str,
        key: &str,
        token: &str,
    ) -> Result<Option<(SetCopy, Millis)>, StoreError> {
        let cached = self.lease_cache.version(resource);
        let got = &self.scripts.lease_get;
        let lock_ms = self.lease_lock_time.as_millis().max(100);
        let args = [
            self.clock.arg(),
            cached.unwrap_or_default(),
            token.to_owned(),
            lock_ms.to_string(),
        ];
        let v = self.conn.eval(got, &[key], &args, &[]).await?;
        let mut r = Reply::new(got.name, v)?;
        if r.status_is("busy") {
            return Ok(None);
        }
        let version = r.text()?;
        let (now, x, read) = (r.count()?, r.int()?, r.count()?);
        let set = match (read, self.lease_cache.take(resource)) {
            (0, Some(copy)) => copy.set,
            (2, Some(mut copy)) => {
                apply_changes(got.name, &mut copy.set, r.nested()?)?;
                copy.set
            }
            (1, _) => decode_hash(got.name, r.nested()?)?,
            _ => return Err(bad(got.name, "no set for a cached version")),
        };
        let x = u64::try_from(x).ok();
        Ok(Some((SetCopy { version, x, set }, now)))
    }

    /// `lease_put.lua`'s arguments for the copy as `decide` left it, and
    /// what the copy becomes if they are stored. Every value is made here,
    /// so that the script converts no number.
    fn put_args(
        &self,
        copy: &SetCopy,
        token: &str,
        client: &str,
        now: Millis,
        undo: &Undo,
    ) -> Result<(Vec<String>, Next), StoreError> {
        let set = &copy.set;
        // The next version, and a fresh id if the set is new ("0").
        let (e, v, fresh) = match copy.version.rsplit_once(':') {
            Some((e, v)) => {
                let v: u64 = v
                    .parse()
                    .map_err(|_| bad("lease_get", "a version without its counter"))?;
                (e.to_owned(), v + 1, String::new())
            }
            None => {
                let e = format!("{:016x}", rand::random::<u64>());
                (e.clone(), 1, e)
            }
        };
        // The key expires twice as far from now as its last lease lapses,
        // so its expiry is pushed about once per lease length, not at
        // every refresh (a set whose leases all lapsed stays that much
        // longer, and every decision drops lapsed leases).
        let last = set.iter().map(|(_, l)| l.expires_at_ms).max();
        let (x_arg, ttl, x) = match last {
            None => ("delete".to_owned(), String::new(), None),
            Some(t) if copy.x.is_some_and(|x| t <= x) => (String::new(), String::new(), copy.x),
            Some(t) => {
                let at = t.saturating_add(t.saturating_sub(now));
                let ttl = if at >= 1 << 52 {
                    "persist".to_owned()
                } else {
                    (at.saturating_sub(now) + self.clock.expiry_slack())
                        .max(1)
                        .to_string()
                };
                (at.to_string(), ttl, Some(at))
            }
        };
        let mine = set.get(client);
        let mut gone: Vec<&str> = Vec::new();
        if mine.is_none() {
            gone.push(client);
        }
        gone.extend(
            undo.lapsed
                .iter()
                .filter(|(c, _)| c != client && set.get(c).is_none())
                .map(|(c, _)| c.as_str()),
        );
        let mut entry = format!("{v}{FIELD}{client}");
        for c in gone.iter().filter(|c| **c != client) {
            entry.push(FIELD);
            entry.push_str(c);
        }
        let mut args = vec![
            copy.version.clone(),
            v.to_string(),
            token.to_owned(),
            fresh,
            x_arg,
            ttl,
            format!("g:{}", v % RING),
            entry,
        ];
        match mine {
            Some(l) => args.extend(["1".to_owned(), format!("c:{client}"), encode(l)]),
            None => args.push("0".to_owned()),
        }
        args.extend(gone.iter().map(|c| format!("c:{c}")));
        let next = match last {
            None => Next {
                version: "0".to_owned(),
                x: None,
            },
            Some(_) => Next {
                version: format!("{e}:{v}"),
                x,
            },
        };
        Ok((args, next))
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
            let (version, now) = (r.text()?, r.count()?);
            let (_x, _read) = (r.int()?, r.count()?);
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
        let key = self.keys.lease_set(resource);
        let args = [
            self.clock.arg(),
            String::new(),
            String::new(),
            "0".to_owned(),
        ];
        let v = self.conn.eval(got, &[key.as_str()], &args, &[]).await?;
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
