//! The in-memory table of bucket, window and queue states.
//!
//! Most of the memory of a server with many domains is here, one entry per
//! (resource, domain) pair, so an entry is one small allocation and the
//! table holds only its pointer:
//!
//! - each shard keeps its resources once, by name, and each resource its
//!   own table of entries: a pair's entry does not repeat the resource's
//!   name;
//! - an entry is a boxed byte string, the domain then the state, the
//!   state's numbers as LEB128 varints (a time in ms takes 6 bytes, a small
//!   count 1, a zero none): a bucket of a 16-byte domain is about 32 bytes;
//! - no hash is stored: the table recomputes it from the resource's name
//!   and the domain when it grows.
//!
//! The table of pointers costs 17 bytes per slot, 19 to 39 bytes per entry
//! depending on how full it is; `benches/meter_footprint.rs` measures the
//! whole.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

use charon_core::Millis;
use charon_core::drain::Mark;
use charon_core::meter::{self, MeterState};
use charon_core::window::Counts;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;

/// The hasher of the store (random per store).
type Hasher = foldhash::fast::RandomState;

/// Bucket, window and queue states of every (resource, domain) pair.
pub(crate) struct MeterTable {
    hasher: Hasher,
    shards: Box<[Mutex<Shard>]>,
}

/// The resources of one shard, each with the pairs of the shard.
#[derive(Default)]
struct Shard {
    resources: HashTable<Resource>,
}

/// One resource's pairs in one shard.
struct Resource {
    name: Box<str>,
    /// Hash of `name` alone, for the shard's table of resources.
    hash: u64,
    /// Hashed by [`pair_hash`] of (`name`, domain).
    entries: HashTable<Entry>,
}

/// What a stored pair holds, decoded: from when it is as good as none
/// (`Meter::forget_at`), and the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) forget_at: Millis,
    pub(crate) state: MeterState,
}

/// Where a pair is, for [`MeterTable::update`].
pub(crate) struct Pair<'a> {
    resource: &'a str,
    domain: &'a str,
    resource_hash: u64,
    hash: u64,
}

/// What [`MeterTable::update`] does with a pair after a decision.
pub(crate) enum Write {
    /// Leave what is stored as it is (or store nothing).
    Keep,
    /// Store this (the pair is added if it was not stored).
    Put(Stored),
    /// Forget the pair.
    Remove,
}

impl MeterTable {
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

    /// Runs `f` on what is stored for `pair` (`None` if nothing), under the
    /// lock of its shard, and applies the [`Write`] it returns.
    pub(crate) fn update<R>(
        &self,
        pair: &Pair<'_>,
        f: impl FnOnce(Option<Stored>) -> (Write, R),
    ) -> R {
        let mut shard = self.lock(pair.hash);
        update_in(&self.hasher, &mut shard, pair, f)
    }

    /// Locks the shards of every pair, in ascending order (so that two
    /// batches never wait for each other in a cycle), for an all-or-nothing
    /// batch: it reads every state, then writes them, without another
    /// decision in between.
    pub(crate) fn lock_pairs(&self, pairs: &[Pair<'_>]) -> Locked<'_> {
        let mut indices: Vec<usize> = pairs.iter().map(|p| self.index(p.hash)).collect();
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

    /// Drops every pair for which `keep` is false (given its forget time),
    /// and resources left with none; gives memory back when a table has
    /// shrunk a lot. Returns how many pairs were dropped.
    pub(crate) fn retain(&self, mut keep: impl FnMut(Millis) -> bool) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for Resource { name, entries, .. } in shard.resources.iter_mut() {
                let before = entries.len();
                entries.retain(|e| keep(e.stored().forget_at));
                removed += before - entries.len();
                if entries.capacity() > 64 && entries.len() * 4 < entries.capacity() {
                    entries.shrink_to_fit(|e| pair_hash(&self.hasher, name, e.domain()));
                }
            }
            shard.resources.retain(|r| !r.entries.is_empty());
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
    fn lock(&self, hash: u64) -> MutexGuard<'_, Shard> {
        let i = self.index(hash);
        // A panic while a shard was locked cannot leave it half-updated in
        // a way later requests should fear more than a dead limiter.
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`MeterTable::update`] on the pair's shard, already locked.
fn update_in<R>(
    hasher: &Hasher,
    shard: &mut Shard,
    pair: &Pair<'_>,
    f: impl FnOnce(Option<Stored>) -> (Write, R),
) -> R {
    let found = shard
        .resources
        .find(pair.resource_hash, |r| &*r.name == pair.resource)
        .and_then(|r| r.entries.find(pair.hash, |e| e.is(pair.domain)))
        .map(Entry::stored);
    let (write, reply) = f(found);
    match (found, write) {
        (_, Write::Keep) | (None, Write::Remove) => {}
        (Some(_), Write::Remove) => {
            let resources = &mut shard.resources;
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
        (_, Write::Put(stored)) => {
            let res = match shard.resources.entry(
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
            match entries.entry(
                pair.hash,
                |e| e.is(pair.domain),
                |e| pair_hash(hasher, name, e.domain()),
            ) {
                Slot::Occupied(mut e) => e.get_mut().put(&stored),
                Slot::Vacant(v) => {
                    v.insert(Entry::new(pair.domain, &stored));
                }
            }
        }
    }
    reply
}

/// The locked shards of a batch ([`MeterTable::lock_pairs`]).
pub(crate) struct Locked<'t> {
    table: &'t MeterTable,
    guards: Vec<(usize, MutexGuard<'t, Shard>)>,
}

impl Locked<'_> {
    /// What is stored for `pair` (one of the pairs the shards were locked
    /// for).
    pub(crate) fn find(&mut self, pair: &Pair<'_>) -> Option<Stored> {
        self.update(pair, |found| (Write::Keep, found))
    }

    /// [`MeterTable::update`] under the batch's locks.
    pub(crate) fn update<R>(
        &mut self,
        pair: &Pair<'_>,
        f: impl FnOnce(Option<Stored>) -> (Write, R),
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

/// One pair: `varint(len(domain))`, the domain, then the state (see
/// [`encode`]). Bytes after the state are slack left by a shorter state
/// written in place, and never read.
struct Entry(Box<[u8]>);

/// The kinds, in the low two bits of a state's first byte.
const BUCKET: u8 = 0;
const WINDOW: u8 = 1;
const QUEUE: u8 = 2;

/// The longest encoded state: its first byte and five varints.
const STATE_MAX: usize = 1 + 5 * 10;

impl Entry {
    fn new(domain: &str, stored: &Stored) -> Self {
        let mut state = [0u8; STATE_MAX];
        let n = encode(stored, &mut state);
        let mut len = [0u8; 10];
        let l = put_varint(&mut len, 0, domain.len() as u64);
        let mut bytes = Vec::with_capacity(l + domain.len() + n);
        bytes.extend_from_slice(&len[..l]);
        bytes.extend_from_slice(domain.as_bytes());
        bytes.extend_from_slice(&state[..n]);
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

    fn stored(&self) -> Stored {
        let (end, _) = self.split();
        decode(self.0.get(end..).unwrap_or_default())
    }

    /// Writes `stored` in place if it fits, else in a new allocation.
    fn put(&mut self, stored: &Stored) {
        let mut state = [0u8; STATE_MAX];
        let n = encode(stored, &mut state);
        let (end, _) = self.split();
        match self.0.get_mut(end..end + n) {
            Some(room) => room.copy_from_slice(&state[..n]),
            None => {
                let mut bytes = Vec::with_capacity(end + n);
                bytes.extend_from_slice(self.0.get(..end).unwrap_or_default());
                bytes.extend_from_slice(&state[..n]);
                self.0 = bytes.into_boxed_slice();
            }
        }
    }
}

/// A state as an [`Entry`] keeps it, into `out`; returns its length. The
/// first byte has the kind (bits 0–1) and which of the four words are not
/// zero (bits 2–5); then the forget time and the non-zero words, as
/// varints. The words are a bucket's or queue's mark (ms, frac, 0), a
/// window's counts (index, curr, prev), then the ban's end: 0 stands for
/// none, as a mark or counts of zeros and a ban ending at 0 decide as no
/// state at any time.
fn encode(stored: &Stored, out: &mut [u8; STATE_MAX]) -> usize {
    fn mark(s: &meter::State<Mark>) -> [u64; 4] {
        let m = s.level.unwrap_or_default();
        [m.ms, m.frac, 0, s.banned_until.unwrap_or(0)]
    }
    let (words, kind) = match &stored.state {
        MeterState::Bucket(s) => (mark(s), BUCKET),
        MeterState::Queue(s) => (mark(s), QUEUE),
        MeterState::Window(s) => {
            let c = s.level.unwrap_or_default();
            (
                [c.index, c.curr, c.prev, s.banned_until.unwrap_or(0)],
                WINDOW,
            )
        }
    };
    let mut first = kind;
    let mut at = put_varint(out, 1, stored.forget_at);
    for (i, w) in words.into_iter().enumerate() {
        if w != 0 {
            first |= 4 << i;
            at = put_varint(out, at, w);
        }
    }
    out[0] = first;
    at
}

/// The state [`encode`] wrote; a zero level or ban is none.
fn decode(bytes: &[u8]) -> Stored {
    let first = bytes.first().copied().unwrap_or(0);
    let (forget_at, mut at) = get_varint(bytes, 1);
    let mut words = [0u64; 4];
    for (i, w) in words.iter_mut().enumerate() {
        if first & (4 << i) != 0 {
            (*w, at) = get_varint(bytes, at);
        }
    }
    let [a, b, c, ban] = words;
    let banned_until = (ban != 0).then_some(ban);
    let mark = (a != 0 || b != 0).then_some(Mark { ms: a, frac: b });
    let state = match first & 3 {
        WINDOW => MeterState::Window(meter::State {
            level: (b != 0 || c != 0).then_some(Counts {
                index: a,
                curr: b,
                prev: c,
            }),
            banned_until,
        }),
        QUEUE => MeterState::Queue(meter::State {
            level: mark,
            banned_until,
        }),
        _ => MeterState::Bucket(meter::State {
            level: mark,
            banned_until,
        }),
    };
    Stored { forget_at, state }
}

/// Writes `v` as a LEB128 varint at `at`; returns where it ends.
fn put_varint(out: &mut [u8], mut at: usize, mut v: u64) -> usize {
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

/// Reads the varint at `at` (bytes past the end read as 0); returns it and
/// where it ends.
fn get_varint(bytes: &[u8], mut at: usize) -> (u64, usize) {
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

    #[test]
    fn every_state_round_trips() {
        let m = Mark {
            ms: 1_700_000_000_000,
            frac: 2,
        };
        let c = Counts {
            index: 28_333_333,
            curr: 3,
            prev: 5,
        };
        let states = [
            MeterState::Bucket(meter::State::default()),
            MeterState::Bucket(meter::State {
                level: Some(m),
                banned_until: Some(1_700_000_003_600),
            }),
            MeterState::Bucket(meter::State {
                level: None,
                banned_until: Some(5),
            }),
            MeterState::Bucket(meter::State {
                level: Some(Mark {
                    ms: u64::MAX,
                    frac: u64::MAX,
                }),
                banned_until: Some(u64::MAX),
            }),
            MeterState::Queue(meter::State {
                level: Some(m),
                banned_until: None,
            }),
            MeterState::Window(meter::State {
                level: Some(c),
                banned_until: None,
            }),
            MeterState::Window(meter::State {
                level: Some(Counts { curr: 0, ..c }),
                banned_until: Some(9),
            }),
        ];
        for state in states {
            for forget_at in [0, 1, 1_700_000_060_000, u64::MAX] {
                let stored = Stored { forget_at, state };
                let e = Entry::new("10.0.0.1", &stored);
                assert_eq!(e.stored(), stored);
                assert!(e.is("10.0.0.1") && !e.is("10.0.0.") && !e.is("10.0.0.10"));
            }
        }
    }

    #[test]
    fn a_state_rewritten_in_place_or_grown_reads_back() {
        let small = Stored {
            forget_at: 1,
            state: MeterState::Bucket(meter::State::default()),
        };
        let big = Stored {
            forget_at: u64::MAX,
            state: MeterState::Window(meter::State {
                level: Some(Counts {
                    index: u64::MAX,
                    curr: u64::MAX,
                    prev: u64::MAX,
                }),
                banned_until: Some(u64::MAX),
            }),
        };
        let mut e = Entry::new("tenant-42", &small);
        e.put(&big);
        assert_eq!((e.stored(), e.domain()), (big, &b"tenant-42"[..]));
        let len = e.0.len();
        e.put(&small);
        assert_eq!(e.stored(), small);
        assert_eq!(e.0.len(), len, "a shorter state is written in place");
    }

    #[test]
    fn a_bucket_of_a_typical_domain_is_one_small_allocation() {
        let stored = Stored {
            forget_at: 1_700_000_060_000,
            state: MeterState::Bucket(meter::State {
                level: Some(Mark {
                    ms: 1_700_000_000_600,
                    frac: 0,
                }),
                banned_until: None,
            }),
        };
        let e = Entry::new("tenant-0001234", &stored);
        // 1 (length) + 14 (domain) + 1 (kind) + 6 (forget) + 6 (ms).
        assert_eq!(e.0.len(), 28);
        assert_eq!(size_of::<Entry>(), 16);
    }

    #[test]
    fn pairs_are_stored_updated_and_forgotten_per_resource() {
        let t = MeterTable::new(4, Hasher::default());
        let stored = |forget_at| Stored {
            forget_at,
            state: MeterState::Queue(meter::State::default()),
        };
        for r in ["a", "b"] {
            for d in 0..1_000 {
                let d = format!("d{d}");
                let p = t.pair(r, &d);
                t.update(&p, |found| {
                    assert_eq!(found, None);
                    (Write::Put(stored(d.len() as u64)), ())
                });
            }
        }
        assert_eq!(t.len(), 2_000);
        let p = t.pair("a", "d7");
        t.update(&p, |found| {
            assert_eq!(found, Some(stored(2)));
            (Write::Put(stored(9)), ())
        });
        t.update(&p, |found| {
            assert_eq!(found, Some(stored(9)));
            (Write::Remove, ())
        });
        t.update(&p, |found| (Write::Keep, assert_eq!(found, None)));
        assert_eq!(t.len(), 1_999);
        // d0..d9 forget at 2 (d7 is gone), d10..d99 at 3, the rest at 4.
        assert_eq!(t.retain(|f| f > 2), 19);
        assert_eq!(t.retain(|f| f > 3), 180);
        assert_eq!(t.retain(|_| false), 1_800);
        assert_eq!(t.len(), 0);
        assert!(t.shards.iter().all(|s| {
            s.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .resources
                .is_empty()
        }));
    }
}
