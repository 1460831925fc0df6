//! A burst-tiers pair's state (`RateState`) and forget time as the pair's
//! entry keeps it (`table.rs`): a few LEB128 varints, every time but one
//! an offset from the state's latest time, so that a domain that made a
//! few requests costs about 25 bytes after its domain instead of a
//! `RateState` with three heap allocations.
//!
//! Layout, every number a varint:
//!
//! - a header: the number of tier states, then five flags (bit 0: a ban;
//!   bits 1–2: how the last second is kept, see below; bit 3: never
//!   forgotten; bit 4: spilled, see [`encode_spilled`]);
//! - `base`: the latest time of the state (the greatest entry time or hit
//!   time; 0 if none), in full;
//! - unless never forgotten, the forget time minus `base` (wrapping);
//! - if banned, the ban's end minus `base` (wrapping);
//! - each tier: its log, with its entry time (if entered) as `base` minus
//!   it after the log's length;
//! - the last second: nothing if empty ([`LS_EMPTY`]); a log
//!   ([`LS_LOG`]); or, when it is the last `k` entries of tier `i`'s log
//!   (one tier, or hits that all fell in one tier), `i` and `k`
//!   ([`LS_TAIL`]), the common case: a tier's log and the last second hold
//!   the same hits.
//!
//! A log is its entry count `k` shifted left twice (bit 1: a tier entered,
//! its entry time follows), then its entries oldest first: the first one's
//! time back from `base`, each other one's time after the one before,
//! shifted left once with bit 0 set when its count is not 1, then that
//! count. A log whose times do not rise (never written by a decision,
//! which records at the latest time) is kept raw, bit 0 of its length set,
//! each entry as its time and count in full.
//!
//! Every state reads back equal to the one written (the tests below, and
//! the store's differential and model tests, which decide through it).

use charon_core::Millis;
use charon_core::rate::{HitLog, RateState, TierState};

use super::table::{get_varint, push_varint};

const BANNED: u64 = 1;
const LS_SHIFT: u32 = 1;
const LS_MASK: u64 = 3 << LS_SHIFT;
/// The last second is empty.
const LS_EMPTY: u64 = 0;
/// The last second is a log of its own.
const LS_LOG: u64 = 1;
/// The last second is the tail of a tier's log.
const LS_TAIL: u64 = 2;
const NEVER_FORGOTTEN: u64 = 8;
const SPILLED: u64 = 16;
const FLAG_BITS: u32 = 5;

/// Appends the encoding of `state`, to be forgotten from `forget_at`
/// ([`Millis::MAX`] for never), to `out`.
pub(super) fn encode(state: &RateState, forget_at: Millis, out: &mut Vec<u8>) {
    // The greatest entry or hit time (0 if none).
    let base = state.latest();
    let tail = tail_of(state);
    let ls_mode = match tail {
        _ if state.last_second.is_empty() => LS_EMPTY,
        Some(_) => LS_TAIL,
        None => LS_LOG,
    };
    let mut header = (state.tiers.len() as u64) << FLAG_BITS | ls_mode << LS_SHIFT;
    if state.banned_until.is_some() {
        header |= BANNED;
    }
    if forget_at == Millis::MAX {
        header |= NEVER_FORGOTTEN;
    }
    push_varint(out, header);
    push_varint(out, base);
    if forget_at != Millis::MAX {
        push_varint(out, forget_at.wrapping_sub(base));
    }
    if let Some(until) = state.banned_until {
        push_varint(out, until.wrapping_sub(base));
    }
    for t in &state.tiers {
        push_log(out, &t.hits, t.entered, base);
    }
    match (ls_mode, tail) {
        (LS_TAIL, Some((i, k))) => {
            push_varint(out, i as u64);
            push_varint(out, k as u64);
        }
        (LS_LOG, _) => push_log(out, &state.last_second, None, base),
        _ => {}
    }
}

/// The tier whose log ends with exactly the last second's entries, and
/// how many entries that is.
fn tail_of(state: &RateState) -> Option<(usize, usize)> {
    let k = state.last_second.entries().len();
    state.tiers.iter().enumerate().find_map(|(i, t)| {
        let n = t.hits.entries().len();
        (n >= k && t.hits.entries().skip(n - k).eq(state.last_second.entries())).then_some((i, k))
    })
}

/// Steps of a log are shifted left once: they must be less than this.
const STEP_MAX: u64 = 1 << 63;

/// A log (of a tier entered at `entered`, if any), see the module's doc.
fn push_log(out: &mut Vec<u8>, log: &HitLog, entered: Option<Millis>, base: Millis) {
    let start = out.len();
    let mut head = (log.entries().len() as u64) << 2;
    if entered.is_some() {
        head |= 2;
    }
    push_head(out, head, entered, base);
    let mut prev: Option<Millis> = None;
    for (t, n) in log.entries() {
        let step = match prev {
            None => base.checked_sub(t),
            Some(p) => t.checked_sub(p).filter(|&s| s > 0),
        };
        let Some(step) = step.filter(|&s| s < STEP_MAX) else {
            // Times that do not rise: the whole log raw.
            out.truncate(start);
            push_head(out, head | 1, entered, base);
            for (t, n) in log.entries() {
                push_varint(out, t);
                push_varint(out, n);
            }
            return;
        };
        prev = Some(t);
        push_varint(out, step << 1 | u64::from(n != 1));
        if n != 1 {
            push_varint(out, n);
        }
    }
}

/// A log's length and flags, and a tier's entry time (`base` is at least
/// every entry time).
fn push_head(out: &mut Vec<u8>, head: u64, entered: Option<Millis>, base: Millis) {
    push_varint(out, head);
    if let Some(e) = entered {
        push_varint(out, base - e);
    }
}

/// The entries a state's logs hold: what reading and writing it costs.
pub(super) fn entries(state: &RateState) -> usize {
    state
        .tiers
        .iter()
        .map(|t| t.hits.entries().len())
        .sum::<usize>()
        + state.last_second.entries().len()
}

/// Instead of a state, where it is kept unencoded (slot `slot` of its
/// shard's spilled states), and its forget time: the header (flag bit 4),
/// a `base` of 0, the forget time, the slot.
pub(super) fn encode_spilled(forget_at: Millis, slot: usize, out: &mut Vec<u8>) {
    if forget_at == Millis::MAX {
        push_varint(out, SPILLED | NEVER_FORGOTTEN);
        push_varint(out, 0);
    } else {
        push_varint(out, SPILLED);
        push_varint(out, 0);
        push_varint(out, forget_at);
    }
    push_varint(out, slot as u64);
}

/// The slot [`encode_spilled`] wrote, if these bytes are one.
pub(super) fn spilled_slot(bytes: &[u8]) -> Option<usize> {
    let (header, at) = get_varint(bytes, 0);
    if header & SPILLED == 0 {
        return None;
    }
    let (_, mut at) = get_varint(bytes, at);
    if header & NEVER_FORGOTTEN == 0 {
        at = get_varint(bytes, at).1;
    }
    usize::try_from(get_varint(bytes, at).0).ok()
}

/// From when the state [`encode`] wrote may be forgotten ([`Millis::MAX`]
/// if never).
pub(super) fn forget_at(bytes: &[u8]) -> Millis {
    let (header, at) = get_varint(bytes, 0);
    if header & NEVER_FORGOTTEN != 0 {
        return Millis::MAX;
    }
    let (base, at) = get_varint(bytes, at);
    get_varint(bytes, at).0.wrapping_add(base)
}

/// Reads what [`encode`] wrote into `state`, reusing its allocations;
/// returns the forget time.
pub(super) fn decode_into(bytes: &[u8], state: &mut RateState) -> Millis {
    let (header, at) = get_varint(bytes, 0);
    let (base, mut at) = get_varint(bytes, at);
    let mut forget_at = Millis::MAX;
    if header & NEVER_FORGOTTEN == 0 {
        let (f, next) = get_varint(bytes, at);
        (forget_at, at) = (f.wrapping_add(base), next);
    }
    state.banned_until = None;
    if header & BANNED != 0 {
        let (u, next) = get_varint(bytes, at);
        (state.banned_until, at) = (Some(u.wrapping_add(base)), next);
    }
    let tiers = usize::try_from(header >> FLAG_BITS).unwrap_or(0);
    state.tiers.truncate(tiers);
    state.tiers.resize_with(tiers, TierState::default);
    for t in &mut state.tiers {
        at = read_log(bytes, at, base, &mut t.hits, Some(&mut t.entered));
    }
    match (header & LS_MASK) >> LS_SHIFT {
        LS_TAIL => {
            let (i, next) = get_varint(bytes, at);
            let (k, _) = get_varint(bytes, next);
            match usize::try_from(i).ok().and_then(|i| state.tiers.get(i)) {
                Some(t) => {
                    let n = t.hits.entries().len();
                    let k = usize::try_from(k).unwrap_or(usize::MAX).min(n);
                    state.last_second.assign(t.hits.entries().skip(n - k));
                }
                None => state.last_second.assign([]),
            }
        }
        LS_LOG => {
            read_log(bytes, at, base, &mut state.last_second, None);
        }
        _ => state.last_second.assign([]),
    }
    forget_at
}

/// Reads the log at `at` into `log` (and a tier's entry time into
/// `entered`); returns where it ends.
fn read_log(
    bytes: &[u8],
    at: usize,
    base: Millis,
    log: &mut HitLog,
    entered: Option<&mut Option<Millis>>,
) -> usize {
    let (head, mut at) = get_varint(bytes, at);
    let k = head >> 2;
    let raw = head & 1 != 0;
    let mut e = None;
    if head & 2 != 0 {
        let (back, next) = get_varint(bytes, at);
        (e, at) = (Some(base.wrapping_sub(back)), next);
    }
    if let Some(entered) = entered {
        *entered = e;
    }
    let mut prev: Option<Millis> = None;
    let entries = (0..k).map(|_| {
        if raw {
            let (t, next) = get_varint(bytes, at);
            let (n, next) = get_varint(bytes, next);
            at = next;
            return (t, n);
        }
        let (v, next) = get_varint(bytes, at);
        at = next;
        let step = v >> 1;
        let t = match prev {
            None => base.wrapping_sub(step),
            Some(p) => p.wrapping_add(step),
        };
        prev = Some(t);
        let n = if v & 1 == 0 {
            1
        } else {
            let (n, next) = get_varint(bytes, at);
            at = next;
            n
        };
        (t, n)
    });
    log.assign(entries);
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(entries: &[(Millis, u64)]) -> HitLog {
        HitLog::from_entries(entries.iter().copied())
    }

    fn tier(entered: Option<Millis>, hits: &[(Millis, u64)]) -> TierState {
        TierState {
            entered,
            hits: log(hits),
        }
    }

    fn round_trip(state: &RateState, forget_at: Millis) -> usize {
        let mut out = Vec::new();
        encode(state, forget_at, &mut out);
        // Decoded into a state holding something else, as a reused one
        // does.
        let mut back = RateState {
            tiers: vec![tier(Some(3), &[(1, 2), (3, 4)]); 4],
            last_second: log(&[(9, 9)]),
            banned_until: Some(7),
        };
        assert_eq!(decode_into(&out, &mut back), forget_at, "{state:?}");
        assert_eq!(&back, state);
        assert_eq!(super::forget_at(&out), forget_at);
        // Slack after the state is never read.
        out.extend_from_slice(&[0xff; 8]);
        let mut again = RateState::default();
        decode_into(&out, &mut again);
        assert_eq!(&again, state);
        out.len() - 8
    }

    #[test]
    fn every_state_reads_back_as_written() {
        let t = 1_700_000_000_000;
        let states = [
            RateState::default(),
            RateState {
                tiers: vec![tier(Some(t), &[(t, 1), (t + 150, 1), (t + 400, 1)])],
                last_second: log(&[(t, 1), (t + 150, 1), (t + 400, 1)]),
                banned_until: None,
            },
            // Hits of the last second in two tiers, a tier not entered
            // between entered ones, a ban, big counts.
            RateState {
                tiers: vec![
                    tier(Some(t - 60_000), &[(t - 59_000, 3), (t - 10, 5)]),
                    tier(None, &[]),
                    tier(Some(t - 10), &[(t - 10, 20), (t, 1 << 40)]),
                ],
                last_second: log(&[(t - 10, 25), (t, 1 << 40)]),
                banned_until: Some(t + 3_600_000),
            },
            // The last second a strict tail of a tier's log, and a tier
            // entered after its last hit.
            RateState {
                tiers: vec![
                    tier(Some(t - 5_000), &[(t - 4_000, 1), (t - 900, 2), (t, 1)]),
                    tier(Some(t + 5), &[]),
                ],
                last_second: log(&[(t - 900, 2), (t, 1)]),
                banned_until: Some(0),
            },
            // Only a ban; times at the ends of the range; logs that do not
            // rise (kept raw).
            RateState {
                tiers: vec![],
                last_second: HitLog::default(),
                banned_until: Some(u64::MAX),
            },
            RateState {
                tiers: vec![tier(Some(0), &[(0, 1), (u64::MAX, u64::MAX)])],
                last_second: log(&[(u64::MAX, 1)]),
                banned_until: None,
            },
            RateState {
                tiers: vec![tier(Some(5), &[(9, 1), (3, 2), (3, 1)])],
                last_second: log(&[(2, 1), (1, 1)]),
                banned_until: None,
            },
        ];
        for state in &states {
            for forget_at in [0, 1, t, t + 3_661_001, u64::MAX - 1, u64::MAX] {
                round_trip(state, forget_at);
            }
        }
    }

    #[test]
    fn a_domain_that_made_a_few_requests_is_a_few_bytes() {
        let t = 1_700_000_000_000;
        let hits = [(t, 1), (t + 150, 1), (t + 400, 1)];
        let state = RateState {
            tiers: vec![tier(Some(t), &hits)],
            last_second: log(&hits),
            banned_until: None,
        };
        // 1 header + 6 base + 4 forget (a dormant tier 1: an hour and a
        // minute on) + 2 entry + 7 log (2 bytes a hit, the length) + 2 the
        // last second as the log's tail.
        assert_eq!(round_trip(&state, t + 400 + 60_001 + 3_600_000), 22);
        assert_eq!(entries(&state), 6);
    }

    #[test]
    fn a_spilled_state_says_where_it_is_and_when_it_is_forgotten() {
        for forget_at in [0, 1_700_000_000_000, u64::MAX] {
            for slot in [0, 1, 300, 1 << 40] {
                let mut out = Vec::new();
                encode_spilled(forget_at, slot, &mut out);
                assert_eq!(spilled_slot(&out), Some(slot));
                assert_eq!(super::forget_at(&out), forget_at);
            }
        }
        let mut out = Vec::new();
        encode(&RateState::default(), 5, &mut out);
        assert_eq!(spilled_slot(&out), None);
    }
}
