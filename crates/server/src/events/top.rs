//! The live view: the busiest and the most limited (resource, domain)
//! pairs over a recent window, in bounded memory.
//!
//! One slot per second for the last [`MAX_WINDOW`] seconds (a ring,
//! reused as time goes on). Each slot keeps two *space-saving* summaries
//! (Metwally, Agrawal, El Abbadi 2005) of at most [`PAIRS_PER_SECOND`]
//! pairs: one of every decision, one of limited decisions only. While a
//! second has no more distinct pairs than that, its counts are exact; past
//! it, a new pair takes the place of the least counted one and inherits
//! its count (an overestimate, bounded by that count), so a pair with more
//! than 1/[`PAIRS_PER_SECOND`] of a second's decisions is never lost. A
//! report merges the slots of its window and says whether any slot
//! overflowed (`approximate`). At most 60 × 2 × 256 entries: a few MB with
//! long names, whatever the traffic.
//!
//! The server's writer thread feeds it from the event stream (so it counts
//! the events that were sampled and under the cap); `charon top --events`
//! feeds its own from the file it follows.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Event, EventOutcome};

/// The longest window a report covers.
pub const MAX_WINDOW: Duration = Duration::from_secs(60);

/// Distinct pairs each second's summaries keep exactly (each of the two).
pub const PAIRS_PER_SECOND: usize = 256;

const SLOTS: usize = 60;

/// A (resource, domain) pair as one string, the resource first, and
/// where the domain starts: looked up without allocating (a key buffer
/// reused), allocated only when a pair is new in a second.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Pair {
    key: String,
    split: usize,
}

impl Pair {
    fn resource(&self) -> &str {
        &self.key[..self.split]
    }

    fn domain(&self) -> &str {
        &self.key[self.split..]
    }
}

/// A pair's counts in a summary.
#[derive(Debug, Clone)]
struct Entry {
    pair: Pair,
    count: u64,
    /// Events of this entry that were limited (the "all" summary only).
    limited: u64,
}

/// A space-saving summary of at most [`PAIRS_PER_SECOND`] pairs, indexed
/// by the pair's key (the resource's length as its first bytes keeps two
/// pairs whose concatenations agree apart).
#[derive(Debug, Default)]
struct Summary {
    index: HashMap<String, usize>,
    entries: Vec<Entry>,
    overflowed: bool,
}

impl Summary {
    fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
        self.overflowed = false;
    }

    /// Counts one event of the pair whose index key is `key` (see
    /// [`index_key`]).
    fn add(&mut self, key: &str, resource: &str, domain: &str, limited: bool) {
        if let Some(&i) = self.index.get(key) {
            let e = &mut self.entries[i];
            e.count += 1;
            e.limited += u64::from(limited);
            return;
        }
        let pair = Pair {
            key: format!("{resource}{domain}"),
            split: resource.len(),
        };
        if self.entries.len() < PAIRS_PER_SECOND {
            self.index.insert(key.to_owned(), self.entries.len());
            self.entries.push(Entry {
                pair,
                count: 1,
                limited: u64::from(limited),
            });
            return;
        }
        // Full: the least counted pair gives its place (and its count) to
        // the new one. A linear scan of 256 entries, only for a pair not
        // seen this second once 256 others were.
        self.overflowed = true;
        let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.count) else {
            return;
        };
        let e = &mut self.entries[i];
        let mut old = String::new();
        self.index
            .remove(index_key(&mut old, e.pair.resource(), e.pair.domain()));
        e.pair = pair;
        e.count += 1;
        e.limited = u64::from(limited);
        self.index.insert(key.to_owned(), i);
    }
}

/// The index key of (`resource`, `domain`), written into `buf`: the
/// resource's length, the resource and the domain.
fn index_key<'b>(buf: &'b mut String, resource: &str, domain: &str) -> &'b str {
    use std::fmt::Write as _;
    buf.clear();
    let _ = write!(buf, "{}:{resource}{domain}", resource.len());
    buf
}

/// One second's summaries.
#[derive(Debug, Default)]
struct Slot {
    /// The Unix second it holds; `None`: never used.
    second: Option<u64>,
    decisions: u64,
    limited: u64,
    all: Summary,
    limited_pairs: Summary,
}

/// The busiest and most limited pairs of recent seconds.
#[derive(Debug)]
pub struct Top {
    slots: Vec<Slot>,
    /// Reused for each event's index key.
    key: String,
}

impl Default for Top {
    fn default() -> Self {
        Self::new()
    }
}

/// One pair in a [`TopReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairCount {
    /// The resource.
    pub resource: String,
    /// The domain.
    pub domain: String,
    /// Decisions in the window.
    pub decisions: u64,
    /// Of which a limit stood in the way (rejected, partial, delayed,
    /// shadowed).
    pub limited: u64,
}

/// What `GET /v1/top` answers and `charon top` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopReport {
    /// The window, in seconds.
    pub window_s: u64,
    /// Its end, in milliseconds since the Unix epoch.
    pub until_ms: u64,
    /// Decisions (events) in the window.
    pub decisions: u64,
    /// Of which limited.
    pub limited: u64,
    /// Whether some second had more distinct pairs than the summaries keep
    /// (counts may then be overestimates; see the module docs).
    pub approximate: bool,
    /// The busiest pairs, most decisions first.
    pub busiest: Vec<PairCount>,
    /// The most limited pairs, most limited decisions first (only pairs
    /// that were limited).
    pub most_limited: Vec<PairCount>,
}

impl Top {
    /// An empty view.
    pub fn new() -> Self {
        Self {
            slots: std::iter::repeat_with(Slot::default).take(SLOTS).collect(),
            key: String::new(),
        }
    }

    /// Counts one event (its time decides its second; one older than the
    /// ring is not counted).
    pub fn add(&mut self, event: &Event) {
        self.add_pair(event.time_ms, &event.resource, &event.domain, event.outcome);
    }

    /// Counts one decision of (`resource`, `domain`) at `time_ms`.
    pub fn add_pair(&mut self, time_ms: u64, resource: &str, domain: &str, outcome: EventOutcome) {
        let second = time_ms / 1000;
        let slot = &mut self.slots[(second % SLOTS as u64) as usize];
        match slot.second {
            Some(s) if s == second => {}
            Some(s) if s > second => return,
            _ => {
                slot.second = Some(second);
                slot.decisions = 0;
                slot.limited = 0;
                slot.all.clear();
                slot.limited_pairs.clear();
            }
        }
        let limited = outcome.is_limited();
        let key = index_key(&mut self.key, resource, domain);
        slot.decisions += 1;
        if limited {
            slot.limited += 1;
            slot.limited_pairs.add(key, resource, domain, true);
        }
        slot.all.add(key, resource, domain, limited);
    }

    /// The `limit` busiest and most limited pairs of the `window` (whole
    /// seconds, 1 to 60) that ends at `now_ms`.
    pub fn report(&self, now_ms: u64, window: Duration, limit: usize) -> TopReport {
        let window_s = window.as_secs().clamp(1, MAX_WINDOW.as_secs());
        let now_s = now_ms / 1000;
        let first = now_s.saturating_sub(window_s - 1);
        // pair → (decisions, limited as the "all" summary saw it, limited
        // as the limited summary saw it)
        let mut merged: HashMap<&Pair, (u64, u64, u64)> = HashMap::new();
        // (Pairs compare by their key and split: equal pairs merge.)
        let (mut decisions, mut limited, mut approximate) = (0, 0, false);
        for slot in &self.slots {
            let Some(s) = slot.second else { continue };
            if s < first || s > now_s {
                continue;
            }
            decisions += slot.decisions;
            limited += slot.limited;
            approximate |= slot.all.overflowed || slot.limited_pairs.overflowed;
            for e in &slot.all.entries {
                let m = merged.entry(&e.pair).or_default();
                m.0 += e.count;
                m.1 += e.limited;
            }
            for e in &slot.limited_pairs.entries {
                merged.entry(&e.pair).or_default().2 += e.count;
            }
        }
        let pairs: Vec<PairCount> = merged
            .into_iter()
            .map(|(pair, (d, l1, l2))| {
                let limited = l1.max(l2);
                PairCount {
                    resource: pair.resource().to_owned(),
                    domain: pair.domain().to_owned(),
                    decisions: d.max(limited),
                    limited,
                }
            })
            .collect();
        let by_name =
            |a: &PairCount, b: &PairCount| (&a.resource, &a.domain).cmp(&(&b.resource, &b.domain));
        let mut busiest = pairs.clone();
        busiest.sort_by(|a, b| {
            b.decisions
                .cmp(&a.decisions)
                .then(b.limited.cmp(&a.limited))
                .then_with(|| by_name(a, b))
        });
        busiest.truncate(limit);
        let mut most_limited: Vec<PairCount> =
            pairs.into_iter().filter(|p| p.limited > 0).collect();
        most_limited.sort_by(|a, b| {
            b.limited
                .cmp(&a.limited)
                .then(b.decisions.cmp(&a.decisions))
                .then_with(|| by_name(a, b))
        });
        most_limited.truncate(limit);
        TopReport {
            window_s,
            until_ms: now_ms,
            decisions,
            limited,
            approximate,
            busiest,
            most_limited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(pairs: &[PairCount]) -> Vec<(&str, &str, u64, u64)> {
        pairs
            .iter()
            .map(|p| {
                (
                    p.resource.as_str(),
                    p.domain.as_str(),
                    p.decisions,
                    p.limited,
                )
            })
            .collect()
    }

    #[test]
    fn busiest_and_most_limited_over_the_window() {
        let mut top = Top::new();
        let t = 1_000_000_000;
        for i in 0..5 {
            top.add_pair(t + i, "api", "a", EventOutcome::Granted);
        }
        for _ in 0..3 {
            top.add_pair(t + 1500, "api", "b", EventOutcome::Rejected);
        }
        top.add_pair(t + 1500, "api", "b", EventOutcome::Granted);
        // Long before the window: not counted.
        top.add_pair(t - 30_000, "old", "x", EventOutcome::Rejected);
        let r = top.report(t + 1999, Duration::from_secs(10), 10);
        assert_eq!(names(&r.busiest), [("api", "a", 5, 0), ("api", "b", 4, 3)]);
        assert_eq!(names(&r.most_limited), [("api", "b", 4, 3)]);
        assert_eq!((r.decisions, r.limited, r.approximate), (9, 3, false));
        // A window of 1 s sees only the last second.
        let r = top.report(t + 1999, Duration::from_secs(1), 10);
        assert_eq!(names(&r.busiest), [("api", "b", 4, 3)]);
        let r = top.report(t + 1999, Duration::from_secs(60), 1);
        assert_eq!(r.busiest.len(), 1);
        assert_eq!(r.decisions, 10);
    }

    #[test]
    fn memory_stays_bounded_and_heavy_pairs_stay() {
        let mut top = Top::new();
        let t = 5_000_000;
        for i in 0..10_000u64 {
            top.add_pair(t, "r", &format!("d{i}"), EventOutcome::Rejected);
            if i % 4 == 0 {
                top.add_pair(t, "r", "heavy", EventOutcome::Rejected);
            }
        }
        let slot = &top.slots[((t / 1000) % SLOTS as u64) as usize];
        assert!(slot.all.entries.len() <= PAIRS_PER_SECOND);
        assert!(slot.all.index.len() <= PAIRS_PER_SECOND);
        let r = top.report(t, Duration::from_secs(10), 3);
        assert!(r.approximate);
        assert_eq!(r.busiest[0].domain, "heavy");
        assert!(r.busiest[0].decisions >= 2500);
        assert_eq!(r.most_limited[0].domain, "heavy");
        assert_eq!(r.decisions, 12_500);
    }

    #[test]
    fn a_slot_is_reused_a_minute_later() {
        let mut top = Top::new();
        top.add_pair(1_000, "r", "old", EventOutcome::Granted);
        top.add_pair(61_000, "r", "new", EventOutcome::Granted);
        // An event older than its slot's second is dropped.
        top.add_pair(1_000, "r", "late", EventOutcome::Granted);
        let r = top.report(61_000, Duration::from_secs(60), 10);
        assert_eq!(names(&r.busiest), [("r", "new", 1, 0)]);
    }
}
