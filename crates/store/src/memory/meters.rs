//! The in-memory states of buckets, windows and queues: each pair's state
//! is a few LEB128 varints (a time in ms takes 6 bytes, a small count 1, a
//! zero none) after its domain in the pair's entry of a [`PairTable`]
//! (`table.rs`): a bucket of a 16-byte domain is about 32 bytes.

use charon_core::Millis;
use charon_core::drain::Mark;
use charon_core::meter::{self, MeterState};
use charon_core::window::Counts;

use super::table::{self, Hasher, Pair, PairTable, get_varint, put_varint};

/// Bucket, window and queue states of every (resource, domain) pair.
pub(crate) struct MeterTable {
    table: PairTable,
}

/// What a stored pair holds, decoded: from when it is as good as none
/// (`Meter::forget_at`), and the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) forget_at: Millis,
    pub(crate) state: MeterState,
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

impl Write {
    /// The table's write, the state (if any) encoded into `out`.
    fn encode(self, out: &mut Vec<u8>) -> table::Write {
        match self {
            Write::Keep => table::Write::Keep,
            Write::Remove => table::Write::Remove,
            Write::Put(stored) => {
                let mut state = [0u8; STATE_MAX];
                let n = encode(&stored, &mut state);
                out.extend_from_slice(&state[..n]);
                table::Write::Put
            }
        }
    }
}

impl MeterTable {
    /// `count` shards (rounded up to a power of two), hashing with
    /// `hasher`.
    pub(crate) fn new(count: usize, hasher: Hasher) -> Self {
        Self {
            table: PairTable::new(count, hasher),
        }
    }

    /// The pair (`resource`, `domain`), hashed once.
    pub(crate) fn pair<'a>(&self, resource: &'a str, domain: &'a str) -> Pair<'a> {
        self.table.pair(resource, domain)
    }

    /// Runs `f` on what is stored for `pair` (`None` if nothing), under the
    /// lock of its shard, and applies the [`Write`] it returns.
    pub(crate) fn update<R>(
        &self,
        pair: &Pair<'_>,
        f: impl FnOnce(Option<Stored>) -> (Write, R),
    ) -> R {
        self.table.update(pair, |found, out, ()| {
            let (write, reply) = f(found.map(decode));
            (write.encode(out), reply)
        })
    }

    /// Locks the shards of every pair (see [`PairTable::lock_pairs`]).
    pub(crate) fn lock_pairs<'p, 'n: 'p>(
        &self,
        pairs: impl IntoIterator<Item = &'p Pair<'n>>,
    ) -> Locked<'_> {
        Locked(self.table.lock_pairs(pairs))
    }

    /// Drops every pair for which `keep` is false (given its forget time),
    /// and resources left with none. Returns how many pairs were dropped.
    pub(crate) fn retain(&self, mut keep: impl FnMut(Millis) -> bool) -> usize {
        self.table.retain(|state, ()| keep(get_varint(state, 1).0))
    }

    /// Pairs stored in all shards.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// The locked shards of a batch ([`MeterTable::lock_pairs`]).
pub(crate) struct Locked<'t>(table::Locked<'t>);

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
        self.0.update(pair, |found, out, ()| {
            let (write, reply) = f(found.map(decode));
            (write.encode(out), reply)
        })
    }
}

/// The kinds, in the low two bits of a state's first byte.
const BUCKET: u8 = 0;
const WINDOW: u8 = 1;
const QUEUE: u8 = 2;

/// The longest encoded state: its first byte and five varints.
const STATE_MAX: usize = 1 + 5 * 10;

/// A state as a pair's entry keeps it, into `out`; returns its length. The
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
                let mut bytes = [0u8; STATE_MAX];
                let n = encode(&stored, &mut bytes);
                assert_eq!(decode(&bytes[..n]), stored);
                assert_eq!(get_varint(&bytes, 1).0, forget_at, "read by retain");
            }
        }
    }

    #[test]
    fn a_bucket_is_thirteen_bytes_after_its_domain() {
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
        let mut bytes = [0u8; STATE_MAX];
        // 1 (kind) + 6 (forget) + 6 (ms), after the domain and its length.
        assert_eq!(encode(&stored, &mut bytes), 13);
    }
}
