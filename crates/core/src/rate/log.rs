//! A log of hits over time: the "ordered set of successful hits" of the
//! paper's access log. Hits granted at the same millisecond share one entry,
//! so a log never holds more entries than its span has milliseconds, however
//! large the multi-hit requests.

use std::collections::VecDeque;

use crate::time::Millis;

/// Hits by time, oldest first, with their running total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HitLog {
    entries: VecDeque<(Millis, u64)>,
    total: u64,
}

impl HitLog {
    /// Forgets hits that have fallen out of a window of `span` ending at
    /// `now`. Windows are closed on the left (SPEC §2 rule 1): a hit at `t`
    /// stays while `now <= t + span`.
    #[inline]
    pub fn prune(&mut self, now: Millis, span: Millis) {
        while let Some(&(t, n)) = self.entries.front() {
            if t.saturating_add(span) >= now {
                break;
            }
            self.entries.pop_front();
            self.total -= n;
        }
        if self.entries.is_empty() && self.entries.capacity() > 8 {
            // An idle log gives its memory back.
            self.entries = VecDeque::new();
        }
    }

    /// Records `n` hits at `t` (never earlier than the latest entry).
    #[inline]
    pub fn record(&mut self, t: Millis, n: u64) {
        if n == 0 {
            return;
        }
        match self.entries.back_mut() {
            Some((last, count)) if *last == t => *count = count.saturating_add(n),
            _ => {
                if self.entries.capacity() == 0 {
                    // Most logs of most domains hold one entry: don't pay
                    // for the default four.
                    self.entries.reserve_exact(1);
                }
                self.entries.push_back((t, n));
            }
        }
        self.total = self.total.saturating_add(n);
    }

    /// Hits in the log (after [`HitLog::prune`], hits in the window).
    #[inline]
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The time of the latest hit.
    #[inline]
    pub fn latest(&self) -> Option<Millis> {
        self.entries.back().map(|&(t, _)| t)
    }

    /// Forgets every hit.
    pub fn clear(&mut self) {
        self.entries = VecDeque::new();
        self.total = 0;
    }

    /// True when no hit is logged.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `(time, hits)` entries, oldest first: the form stores serialize.
    #[inline]
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (Millis, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Rebuilds a log from entries in time order (as [`HitLog::entries`]
    /// produced them).
    pub fn from_entries(entries: impl IntoIterator<Item = (Millis, u64)>) -> Self {
        let mut log = Self::default();
        for (t, n) in entries {
            log.record(t, n);
        }
        log
    }

    /// Replaces the log's hits with `entries`, as [`HitLog::entries`]
    /// gave them (oldest first, one per time, none of 0 hits), keeping its
    /// allocation: for a store that reads many pairs' logs into the same
    /// one, one after another. The log is then equal to the one they came
    /// from.
    #[inline]
    pub fn assign(&mut self, entries: impl IntoIterator<Item = (Millis, u64)>) {
        if self.entries.capacity() > 64 {
            // A long log read once does not keep its room for ever.
            self.entries = VecDeque::new();
        }
        self.entries.clear();
        self.entries.extend(entries);
        self.total = self
            .entries
            .iter()
            .fold(0, |total: u64, &(_, n)| total.saturating_add(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_counts_until_exactly_t_plus_span() {
        let mut log = HitLog::default();
        log.record(100, 1);
        log.prune(1_100, 1_000);
        assert_eq!(log.count(), 1, "still inside at t + span");
        log.prune(1_101, 1_000);
        assert_eq!(log.count(), 0, "gone at t + span + 1");
    }

    #[test]
    fn hits_at_one_instant_share_an_entry() {
        let mut log = HitLog::default();
        log.record(5, 3);
        log.record(5, 4);
        log.record(6, 1);
        assert_eq!(log.entries().collect::<Vec<_>>(), vec![(5, 7), (6, 1)]);
        assert_eq!(log.count(), 8);
    }
}
