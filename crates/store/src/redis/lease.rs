//! Capacity leases on Redis (SPEC §12). A resource's leases are one string
//! key, `<prefix>:{<resource>}:l`: a version, a newline, then one line per
//! client. A decision reads it with the decision clock (`lease_get.lua`),
//! decides in Rust with `charon_core::lease` (the rules are written once,
//! and Doorman's shares need 128-bit arithmetic that Lua has not), and
//! writes it back only if the version is unchanged (`lease_put.lua`);
//! otherwise another server decided in between, and it reads again. So
//! servers on one Redis hand out one consistent set of leases and never
//! over-commit: every decision is on the latest set, and lost updates are
//! impossible.
//!
//! The whole set is read and written per decision: O(clients) bytes. That
//! is the price of deciding in core; a refresh every few seconds per client
//! keeps it small next to the per-request paths (see docs/leases.md).

use charon_core::Millis;
use charon_core::lease::{Lease, LeaseSet, Quantity};

use super::RedisStore;
use super::reply::{Reply, bad};
use crate::StoreError;

/// How often a decision is tried before the store gives up (a server
/// error): each retry means another server stored a decision in between
/// (a server's own decisions on one resource take turns, see [`Stripes`]),
/// so this is only reached under contention far beyond refresh rates.
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

/// Fields of a line are separated by US (0x1F), lines by RS (0x1E): client
/// names never hold control characters (checked at the edge).
const FIELD: char = '\u{1f}';
const LINE: char = '\u{1e}';

/// The stored text of a set: `client US has US wants US subclients US
/// expires_at_ms` per lease, amounts in millionths.
pub(crate) fn encode(set: &LeaseSet) -> String {
    let mut out = String::with_capacity(set.len() * 48);
    for (client, l) in set.iter() {
        if !out.is_empty() {
            out.push(LINE);
        }
        out.push_str(client);
        for n in [
            l.has.micros(),
            l.wants.micros(),
            l.subclients,
            l.expires_at_ms,
        ] {
            out.push(FIELD);
            out.push_str(&n.to_string());
        }
    }
    out
}

/// The set [`encode`] wrote; `None` if `body` is not such a text.
pub(crate) fn decode(body: &str) -> Option<LeaseSet> {
    if body.is_empty() {
        return Some(LeaseSet::new());
    }
    body.split(LINE)
        .map(|line| {
            let mut fields = line.split(FIELD);
            let client = fields.next()?.to_owned();
            let mut n = || fields.next()?.parse::<u64>().ok();
            let lease = Lease {
                has: Quantity::from_micros(n()?)?,
                wants: Quantity::from_micros(n()?)?,
                subclients: n()?,
                expires_at_ms: n()?,
            };
            Some((client, lease))
        })
        .collect()
}

impl RedisStore {
    /// [`crate::Store::leases`] on Redis: read, decide, compare and set.
    pub(crate) async fn lease_decision(
        &self,
        resource: &str,
        decide: &mut (dyn for<'s> FnMut(&'s mut LeaseSet, Millis) + Send),
    ) -> Result<(), StoreError> {
        let key = self.keys.lease_set(resource);
        let _turn = self.lease_locks.of(resource).lock().await;
        for attempt in 0..MAX_TRIES {
            if attempt > 0 {
                // Another server won the race: let it finish, with jitter so
                // that two losers do not collide again.
                let ms = rand::random_range(0..=u64::from(attempt.min(10)));
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            let got = &self.scripts.lease_get;
            let v = self
                .conn
                .eval(got, &[&key], &[self.clock.arg()], &[])
                .await?;
            let mut r = Reply::new(got.name, v)?;
            let (version, body, now) = (r.count()?, r.text()?, r.count()?);
            let mut set = decode(&body).ok_or_else(|| bad(got.name, "malformed lease set"))?;
            decide(&mut set, now);
            let (body, last) = if set.is_empty() {
                (String::new(), 0)
            } else {
                let last = set.iter().map(|(_, l)| l.expires_at_ms).max();
                (encode(&set), last.unwrap_or(0))
            };
            let put = &self.scripts.lease_put;
            let args = [
                version.to_string(),
                body,
                self.clock.arg(),
                last.to_string(),
                self.clock.expiry_slack().to_string(),
            ];
            let v = self.conn.eval(put, &[&key], &args, &[]).await?;
            if Reply::new(put.name, v)?.flag()? {
                if !set.is_empty() {
                    let index = self.keys.lease_index();
                    self.conn
                        .query::<()>(redis::cmd("SADD").arg(index).arg(resource))
                        .await?;
                }
                return Ok(());
            }
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
            let got = &self.scripts.lease_get;
            let key = self.keys.lease_set(&resource);
            let v = self
                .conn
                .eval(got, &[&key], &[self.clock.arg()], &[])
                .await?;
            let mut r = Reply::new(got.name, v)?;
            let (version, body, now) = (r.count()?, r.text()?, r.count()?);
            latest = Some(now);
            if version == 0 {
                self.conn
                    .query::<()>(redis::cmd("SREM").arg(&index).arg(&resource))
                    .await?;
                continue;
            }
            let set = decode(&body).ok_or_else(|| bad(got.name, "malformed lease set"))?;
            out.push((resource, set));
        }
        let now = match latest {
            Some(now) => now,
            None => self.decision_now().await?,
        };
        Ok((now, out))
    }
}

impl RedisStore {
    /// The decision clock's time now (for a snapshot with no set to read).
    async fn decision_now(&self) -> Result<Millis, StoreError> {
        let got = &self.scripts.lease_get;
        let key = self.keys.lease_set("");
        let v = self
            .conn
            .eval(got, &[&key], &[self.clock.arg()], &[])
            .await?;
        let mut r = Reply::new(got.name, v)?;
        r.count()?;
        r.text()?;
        r.count()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use charon_core::lease::{Algorithm, LeaseContext, LeaseParams, Want, get_capacity};

    #[test]
    fn a_set_round_trips_through_its_text() {
        let params = LeaseParams::new(
            Quantity::units(90).unwrap(),
            Algorithm::ProportionalShare,
            10_000,
            1_000,
        )
        .unwrap()
        .with_learning_mode(0)
        .unwrap();
        let mut set = LeaseSet::new();
        assert_eq!(decode(&encode(&set)), Some(set.clone()));
        for (i, (client, wants)) in [("a b", 100.0), ("ç", 50.0), ("c", 10.0)]
            .iter()
            .enumerate()
        {
            let ctx = LeaseContext::root(&params, 0, 1_000 + i as u64);
            let want = Want::parse(*wants, 0.0, 1 + i as u64).unwrap();
            get_capacity(&mut set, &params, ctx, client, want);
        }
        let back = decode(&encode(&set)).unwrap();
        assert_eq!(back, set);
        assert_eq!(back.sum_has_micros(), set.sum_has_micros());
        assert_eq!(back.subclients(), 6);
        for bad in [
            "x",
            "x\u{1f}1\u{1f}2\u{1f}3",
            "x\u{1f}a\u{1f}1\u{1f}1\u{1f}1",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
