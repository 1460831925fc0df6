//! The in-memory table of (resource, domain) pairs that the rate-like
//! kinds keep their state in: buckets, windows and queues (`meters.rs`)
//! and burst tiers (`rates.rs`), each kind in a table of its own.
//!
//! Most of the memory of a server with many domains is here, one entry per
//! pair, so an entry is one small allocation and the table holds only its
//! pointer:
//!
//! - each shard keeps its resources once, by name, and each resource its
//!   own table of entries: a pair's entry does not repeat the resource's
//!   name;
//! - an entry is a boxed byte string, the domain then the state, which the
//!   kind encodes compactly (`meters.rs`, `rate_bytes.rs`);
//! - no hash is stored: the table recomputes it from the resource's name
//!   and the domain when it grows.
//!
//! The table of pointers costs 17 bytes per slot, 19 to 39 bytes per entry
//! depending on how full it is; `benches/meter_footprint.rs` and
//! `benches/memory_footprint.rs` measure the whole.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;

/// The hasher of the store (random per store).
pub(crate) type Hasher = foldhash::fast::RandomState;

/// The entries of every (resource, domain) pair of one kind, and in each
/// shard an `S` of the kind's own beside them (burst tiers keep their
/// longest states there, unencoded).
pub(crate) struct PairTable<S = ()> {
    hasher: Hasher,
    shards: Box<[Mutex<Shard<S>>]>,
}

/// The resources of one shard, each with the pairs of the shard.
#[derive(Default)]
struct Shard<S> {
    resources: HashTable<Resource>,
    /// Where a decision writes the state to store, reused from one to
    /// the next.
    out: Vec<u8>,
    side: S,
}

/// One resource's pairs in one shard.
struct Resource {
    name: Box<str>,
    /// Hash of `name` alone, for the shard's table of resources.
    hash: u64,
    /// Hashed by [`pair_hash`] of (`name`, domain).
    entries: HashTable<Entry>,
}

/// Where a pair is, for [`PairTable::update`].
pub(crate) struct Pair<'a> {
    resource: &'a str,
    domain: &'a str,
    resource_hash: u64,
    hash: u64,
}

impl Pair<'_> {
    /// The hash of the resource's name alone (the store's hasher).
    pub(crate) fn resource_hash(&self) -> u64 {
        self.resource_hash
    }
}

/// What [`PairTable::update`] does with a pair after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// Leave what is stored as it is (or store nothing).
    Keep,
    /// Store the state the decision wrote in its buffer (the pair is added
    /// if it was not stored).
    Put,
    /// Forget the pair.
    Remove,
}

impl<S: Default> PairTable<S> {
    /// `count` shards (rounded up to a power of two), hashing with
    /// `hasher`.
    pub(crate) fn new(count: usize, hasher: Hasher) -> Self {
        let count = count.max(1).next_power_of_two();
        Self {
            hasher,
            shards: (0..count).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    /// The pair (`resource`, `domain`), hashed once.
    pub(crate) fn pair<'a>(&self, resource: &'a str, domain: &'a str) -> Pair<'a> {
        Pair {
            resource,
            domain,
            resource_hash: self.hasher.hash_one(resource),
            hash: pair_hash(&self.hasher, resource, domain.as_bytes()),
        }
    }

    /// Runs `f` on the state stored for `pair` (`None` if nothing), an
    /// empty buffer and the shard's `S`, under the lock of its shard, and
    /// applies the [`Write`] it returns ([`Write::Put`] stores what `f`
    /// left in the buffer).
    pub(crate) fn update<R>(
        &self,
        pair: &Pair<'_>,
        f: impl FnOnce(Option<&[u8]>, &mut Vec<u8>, &mut S) -> (Write, R),
    ) -> R {
        let mut shard = self.lock(pair.hash);
        update_in(&self.hasher, &mut shard, pair, f)
    }

    /// Locks the shards of every pair, in ascending order (so that two
    /// batches never wait for each other in a cycle), for an all-or-nothing
    /// batch: it reads every state, then writes them, without another
    /// decision in between.
    pub(crate) fn lock_pairs<'p, 'n: 'p>(
        &self,
        pairs: impl IntoIterator<Item = &'p Pair<'n>>,
    ) -> Locked<'_, S> {
        let mut indices: Vec<usize> = pairs.into_iter().map(|p| self.index(p.hash)).collect();
        indices.sort_unstable();
        indices.dedup();
        Locked {
            table: self,
            guards: indices
                .into_iter()
                .map(|i| {
                    let guard = self.shards[i]
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    (i, guard)
                })
                .collect(),
        }
    }

    /// Drops every pair whose state `keep` is false for (given its
    /// shard's `S`), and resources left with none; gives memory back when
    /// a table has shrunk a lot. Returns how many pairs were dropped.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&[u8], &mut S) -> bool) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let Shard {
                resources, side, ..
            } = &mut *shard;
            for Resource { name, entries, .. } in resources.iter_mut() {
                let before = entries.len();
                entries.retain(|e| keep(e.state(), side));
                removed += before - entries.len();
                if entries.capacity() > 64 && entries.len() * 4 < entries.capacity() {
                    entries.shrink_to_fit(|e| pair_hash(&self.hasher, name, e.domain()));
                }
            }
            resources.retain(|r| !r.entries.is_empty());
            if shard.out.capacity() > OUT_KEPT {
                shard.out = Vec::new();
            }
        }
        removed
    }

    /// Pairs stored in all shards.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(PoisonError::into_inner);
                s.resources.iter().map(|r| r.entries.len()).sum::<usize>()
            })
            .sum()
    }

    /// The shard of a pair's hash: middle bits of the hash, since the
    /// tables inside use the low bits for their buckets and the top seven
    /// for their tags.
    fn index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.shards.len() - 1)
    }

    /// The locked shard for a pair's hash.
    fn lock(&self, hash: u64) -> MutexGuard<'_, Shard<S>> {
        let i = self.index(hash);
        // A panic while a shard was locked cannot leave it half-updated in
        // a way later requests should fear more than a dead limiter.
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The most bytes a shard's buffer keeps between sweeps: a state larger
/// than this (a tier holding hits at thousands of milliseconds) is rare.
const OUT_KEPT: usize = 4096;

/// [`PairTable::update`] on the pair's shard, already locked.
fn update_in<S, R>(
    hasher: &Hasher,
    shard: &mut Shard<S>,
    pair: &Pair<'_>,
    f: impl FnOnce(Option<&[u8]>, &mut Vec<u8>, &mut S) -> (Write, R),
) -> R {
    let Shard {
        resources,
        out,
        side,
    } = shard;
    out.clear();
    let found = resources
        .find_mut(pair.resource_hash, |r| &*r.name == pair.resource)
        .and_then(|r| r.entries.find_mut(pair.hash, |e| e.is(pair.domain)));
    let Some(entry) = found else {
        let (write, reply) = f(None, out, side);
        if write == Write::Put {
            insert(hasher, resources, pair, out);
        }
        return reply;
    };
    let (write, reply) = f(Some(entry.state()), out, side);
    match write {
        Write::Keep => {}
        Write::Put => entry.put(out),
        Write::Remove => {
            if let Ok(mut r) =
                resources.find_entry(pair.resource_hash, |r| &*r.name == pair.resource)
            {
                let res = r.get_mut();
                if let Ok(e) = res.entries.find_entry(pair.hash, |e| e.is(pair.domain)) {
                    e.remove();
                }
                if res.entries.is_empty() {
                    r.remove();
                }
            }
        }
    }
    reply
}

/// Adds the pair, not stored yet, with `state`.
fn insert(hasher: &Hasher, resources: &mut HashTable<Resource>, pair: &Pair<'_>, state: &[u8]) {
    let res = match resources.entry(
        pair.resource_hash,
        |r| &*r.name == pair.resource,
        |r| r.hash,
    ) {
        Slot::Occupied(r) => r.into_mut(),
        Slot::Vacant(v) => v
            .insert(Resource {
                name: pair.resource.into(),
                hash: pair.resource_hash,
                entries: HashTable::new(),
            })
            .into_mut(),
    };
    let Resource { name, entries, .. } = res;
    entries.insert_unique(pair.hash, Entry::new(pair.domain, state), |e| {
        pair_hash(hasher, name, e.domain())
    });
}

/// The locked shards of a batch ([`PairTable::lock_pairs`]).
pub(crate) struct Locked<'t, S = ()> {
    table: &'t PairTable<S>,
    guards: Vec<(usize, MutexGuard<'t, Shard<S>>)>,
}

impl<S: Default> Locked<'_, S> {
    /// [`PairTable::update`] under the batch's locks.
    pub(crate) fn update<R>(
        &mut self,
        pair: &Pair<'_>,
        f: impl FnOnce(Option<&[u8]>, &mut Vec<u8>, &mut S) -> (Write, R),
    ) -> R {
        let i = self.table.index(pair.hash);
        let Some((_, shard)) = self.guards.iter_mut().find(|(j, _)| *j == i) else {
            // Only pairs the batch locked are asked for.
            let mut shard = self.table.lock(pair.hash);
            return update_in(&self.table.hasher, &mut shard, pair, f);
        };
        update_in(&self.table.hasher, shard, pair, f)
    }
}

/// The hash of a pair: the domain as bytes, so that an [`Entry`], which
/// keeps it as bytes, can be rehashed without checking it is UTF-8 again.
fn pair_hash(hasher: &Hasher, resource: &str, domain: &[u8]) -> u64 {
    hasher.hash_one((resource, domain))
}

/// One pair: `varint(len(domain))`, the domain, then the state. Bytes
/// after the state are slack left by a shorter state written in place,
/// and never read: a kind's encoding says where its state ends.
struct Entry(Box<[u8]>);

/// The most slack a state written in place may leave; a state that
/// shrank more gets an allocation of its own size.
const SLACK: usize = 16;

impl Entry {
    fn new(domain: &str, state: &[u8]) -> Self {
        let mut len = [0u8; 10];
        let l = put_varint(&mut len, 0, domain.len() as u64);
        let mut bytes = Vec::with_capacity(l + domain.len() + state.len());
        bytes.extend_from_slice(&len[..l]);
        bytes.extend_from_slice(domain.as_bytes());
        bytes.extend_from_slice(state);
        Self(bytes.into_boxed_slice())
    }

    /// Where the domain ends (and the state starts), and the domain.
    fn split(&self) -> (usize, &[u8]) {
        let (len, at) = get_varint(&self.0, 0);
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .unwrap_or(usize::MAX)
            .min(self.0.len());
        (end, self.0.get(at..end).unwrap_or_default())
    }

    fn domain(&self) -> &[u8] {
        self.split().1
    }

    fn is(&self, domain: &str) -> bool {
        self.domain() == domain.as_bytes()
    }

    /// The state, and any slack after it.
    fn state(&self) -> &[u8] {
        let (end, _) = self.split();
        self.0.get(end..).unwrap_or_default()
    }

    /// Writes `state` in place if it fits with little slack, else in a
    /// new allocation.
    fn put(&mut self, state: &[u8]) {
        let (end, _) = self.split();
        let n = state.len();
        let len = self.0.len();
        match self.0.get_mut(end..end + n) {
            Some(room) if len - (end + n) <= SLACK => room.copy_from_slice(state),
            _ => {
                let mut bytes = Vec::with_capacity(end + n);
                bytes.extend_from_slice(self.0.get(..end).unwrap_or_default());
                bytes.extend_from_slice(state);
                self.0 = bytes.into_boxed_slice();
            }
        }
    }
}

/// Writes `v` as a LEB128 varint at `at`; returns where it ends.
pub(crate) fn put_varint(out: &mut [u8], mut at: usize, mut v: u64) -> usize {
    loop {
        let low = (v & 0x7f) as u8;
        v >>= 7;
        if let Some(b) = out.get_mut(at) {
            *b = if v == 0 { low } else { low | 0x80 };
        }
        at += 1;
        if v == 0 {
            return at;
        }
    }
}

/// Appends `v` as a LEB128 varint.
#[inline]
pub(crate) fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    if v < 0x80 {
        out.push(v as u8);
        return;
    }
    loop {
        let low = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

/// Reads the varint at `at` (bytes past the end read as 0); returns it and
/// where it ends.
#[inline]
pub(crate) fn get_varint(bytes: &[u8], mut at: usize) -> (u64, usize) {
    if let Some(&b) = bytes.get(at)
        && b < 0x80
    {
        return (u64::from(b), at + 1);
    }
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = bytes.get(at).copied().unwrap_or(0);
        at += 1;
        if shift < 64 {
            v |= u64::from(b & 0x7f) << shift;
        }
        shift += 7;
        if b & 0x80 == 0 {
            return (v, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(t: &PairTable, resource: &str, domain: &str, state: &[u8]) {
        t.update(&t.pair(resource, domain), |_, out, ()| {
            out.extend_from_slice(state);
            (Write::Put, ())
        });
    }

    fn get(t: &PairTable, resource: &str, domain: &str) -> Option<Vec<u8>> {
        t.update(&t.pair(resource, domain), |found, _, ()| {
            (Write::Keep, found.map(<[u8]>::to_vec))
        })
    }

    #[test]
    fn pairs_are_stored_updated_and_forgotten_per_resource() {
        let t: PairTable = PairTable::new(4, Hasher::default());
        for r in ["a", "b"] {
            for d in 0..1_000 {
                let d = format!("d{d}");
                assert_eq!(get(&t, r, &d), None);
                put(&t, r, &d, &[d.len() as u8]);
            }
        }
        assert_eq!(t.len(), 2_000);
        assert_eq!(get(&t, "a", "d7"), Some(vec![2]));
        put(&t, "a", "d7", &[9]);
        assert_eq!(get(&t, "a", "d7"), Some(vec![9]));
        t.update(&t.pair("a", "d7"), |found, _, ()| {
            assert_eq!(found, Some(&[9][..]));
            (Write::Remove, ())
        });
        assert_eq!(get(&t, "a", "d7"), None);
        assert_eq!(t.len(), 1_999);
        // d0..d9 keep 2 (d7 is gone), d10..d99 3, the rest 4.
        assert_eq!(t.retain(|s, ()| s[0] > 2), 19);
        assert_eq!(t.retain(|s, ()| s[0] > 3), 180);
        assert_eq!(t.retain(|_, ()| false), 1_800);
        assert_eq!(t.len(), 0);
        assert!(t.shards.iter().all(|s| {
            s.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .resources
                .is_empty()
        }));
    }

    #[test]
    fn a_state_rewritten_in_place_or_grown_or_shrunk_reads_back() {
        let mut e = Entry::new("tenant-42", &[1]);
        e.put(&[7; 40]);
        assert_eq!((e.state(), e.domain()), (&[7; 40][..], &b"tenant-42"[..]));
        let len = e.0.len();
        e.put(&[8; 30]);
        assert_eq!(&e.state()[..30], &[8; 30][..]);
        assert_eq!(e.0.len(), len, "a little shorter: written in place");
        e.put(&[9; 2]);
        assert_eq!(e.state(), &[9; 2][..]);
        assert_eq!(e.0.len(), 1 + 9 + 2, "much shorter: its own size again");
        assert_eq!(size_of::<Entry>(), 16);
    }

    #[test]
    fn varints_round_trip() {
        for v in [0, 1, 127, 128, 1_700_000_000_000, u64::MAX] {
            let mut a = [0u8; 10];
            let n = put_varint(&mut a, 0, v);
            let mut b = Vec::new();
            push_varint(&mut b, v);
            assert_eq!(&a[..n], &b[..]);
            assert_eq!(get_varint(&b, 0), (v, n));
        }
    }
}
