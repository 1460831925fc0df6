//! Windows (SPEC §8, seed 001): a count of hits in epoch-aligned windows
//! `[k·W, (k+1)·W)`, either `fixed` (the current window's count) or
//! `sliding_counter` (the current count plus the previous window's,
//! weighted by how much of it the sliding window still covers, rounded
//! down). The state is the window index and one or two counts.
//!
//! A third algorithm, `first_hit`, is Limitador's counter: a window of W
//! that starts at the first hit counted after the previous one ended
//! (`[s, s + W)`), instead of at a multiple of W. Its state is the same
//! triple with the window's start in place of the index.
//!
//! Exactness: the estimate `curr + floor(prev × (W − e) / W)` multiplies a
//! count by a span, so a sliding counter needs `limit × window ≤ 2^53 − 1`
//! and keeps counts (charges included) at most `floor((2^53 − 1) / W)`. A
//! fixed window only adds, and keeps counts up to 2^53 − 1.

use crate::meter::{self, FieldError, Level, Policy, count_param, span_param};
use crate::{ClientError, MAX_COUNT, Millis};

/// `algorithm:` of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `fixed`: hits in the current aligned window.
    Fixed,
    /// `sliding_counter`: the current window's hits plus the previous
    /// window's, weighted.
    SlidingCounter,
    /// `first_hit`: hits in the window that started with the first hit
    /// after the previous window ended (Limitador's counters).
    FirstHit,
}

impl Algorithm {
    /// Every algorithm as the configuration writes it.
    pub const NAMES: &'static [&'static str] = &["fixed", "sliding_counter", "first_hit"];

    /// The algorithm named `name` (one of [`Algorithm::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "fixed" => Some(Algorithm::Fixed),
            "sliding_counter" => Some(Algorithm::SlidingCounter),
            "first_hit" => Some(Algorithm::FirstHit),
            _ => None,
        }
    }

    /// The name as the configuration writes it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Fixed => "fixed",
            Algorithm::SlidingCounter => "sliding_counter",
            Algorithm::FirstHit => "first_hit",
        }
    }
}

/// The counts of one window pair: the aligned window `index` (`now / W`
/// when written), its hits, and the previous window's hits (always 0 for
/// `fixed` and `first_hit`). No state is an empty window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counts {
    /// k of the window `[k·W, (k+1)·W)` the counts were written in; for
    /// `first_hit`, the time the window started (its first hit).
    pub index: u64,
    /// Hits in window k.
    pub curr: u64,
    /// Hits in window k − 1 (`sliding_counter` only).
    pub prev: u64,
}

/// A window's state with its ban.
pub type State = meter::State<Counts>;

/// A validated window configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    algorithm: Algorithm,
    limit: u64,
    window: Millis,
    policy: Policy,
}

/// A window's counts at one time ([`Params::seen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Hits in the current window.
    pub count: u64,
    /// Hits in the previous window (`sliding_counter`; 0 for `fixed`).
    pub previous: u64,
    /// The count the limit is compared with: `count` for `fixed`, `count +
    /// floor(previous × (window − elapsed) / window)` for `sliding_counter`.
    pub estimate: u64,
}

/// What a window state says at a time: the counts that apply and how far
/// into the current window `now` is.
struct View {
    curr: u64,
    prev: u64,
    /// `now − k·W` (for `first_hit`, `now` less the window's start; 0 when
    /// no window is open).
    e: Millis,
}

impl Params {
    /// `limit` from 1 to 2^53 − 1, `window` from 1 ms to
    /// [`meter::MAX_SPAN`]; for `sliding_counter` also `limit × window ≤
    /// 2^53 − 1` (the error names `limit` and says the largest that fits).
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        window: Millis,
        policy: Policy,
    ) -> Result<Self, FieldError> {
        let limit = count_param("limit", limit)?;
        let window = span_param("window", window)?;
        let params = Self {
            algorithm,
            limit,
            window,
            policy,
        };
        if limit > params.max_count() {
            return Err(FieldError::new(
                "limit",
                format!(
                    "{limit} is too large for a sliding_counter window of {window}ms: limit × \
                     window must be at most {MAX_COUNT} (2^53-1) to be kept exactly; the most is {}",
                    params.max_count()
                ),
            ));
        }
        Ok(params)
    }

    /// `fixed`, `sliding_counter` or `first_hit`.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The window's length in ms.
    pub fn window(&self) -> Millis {
        self.window
    }

    /// The most hits one window keeps (a charge beyond is refused).
    pub fn max_count(&self) -> u64 {
        match self.algorithm {
            Algorithm::Fixed | Algorithm::FirstHit => MAX_COUNT,
            Algorithm::SlidingCounter => MAX_COUNT / self.window,
        }
    }

    /// What the window holds at `now`, as the decision sees it: hits in
    /// the current window, hits of the previous one (0 for `fixed`) and
    /// the estimate the limit is compared with (the count for `fixed`).
    /// For displays (the simulator page draws them), so that nothing
    /// outside this module repeats which window a time falls in.
    pub fn seen(&self, s: Option<&Counts>, now: Millis) -> Seen {
        let v = self.view(s, now);
        Seen {
            count: v.curr,
            previous: v.prev,
            estimate: self.estimate(&v),
        }
    }

    fn view(&self, s: Option<&Counts>, now: Millis) -> View {
        if self.algorithm == Algorithm::FirstHit {
            // Open while `now < start + W` (a start after `now`, from a
            // clock that stepped back, still counts).
            return match s.filter(|s| now < s.index.saturating_add(self.window)) {
                Some(s) => View {
                    curr: s.curr,
                    prev: 0,
                    e: now.saturating_sub(s.index),
                },
                None => View {
                    curr: 0,
                    prev: 0,
                    e: 0,
                },
            };
        }
        let (k, e) = (now / self.window, now % self.window);
        let (curr, prev) = match s {
            // A state from a later window (the clock stepped back) still
            // counts, so a step back never grants more.
            Some(s) if s.index >= k => (s.curr, s.prev),
            Some(s) if s.index.checked_add(1) == Some(k) => (0, s.curr),
            _ => (0, 0),
        };
        let prev = match self.algorithm {
            Algorithm::Fixed | Algorithm::FirstHit => 0,
            Algorithm::SlidingCounter => prev,
        };
        View { curr, prev, e }
    }

    /// `curr + floor(prev × (W − e) / W)`; `prev × (W − e)` is at most
    /// `max_count × W ≤ 2^53 − 1` (computed wider here only so that counts
    /// kept under another configuration cannot overflow).
    fn estimate(&self, v: &View) -> u64 {
        let weighted = u128::from(v.prev) * u128::from(self.window - v.e) / u128::from(self.window);
        v.curr
            .saturating_add(u64::try_from(weighted).unwrap_or(u64::MAX))
    }

    /// The state to write at `now`, in the window the counts were read
    /// from (a later one than `now`'s if the clock stepped back).
    fn counts(&self, s: Option<&Counts>, now: Millis, curr: u64, prev: u64) -> Counts {
        if self.algorithm == Algorithm::FirstHit {
            // The open window's start, or a window starting now.
            let start = s
                .filter(|s| now < s.index.saturating_add(self.window))
                .map_or(now, |s| s.index);
            return Counts {
                index: start,
                curr,
                prev: 0,
            };
        }
        let k = now / self.window;
        Counts {
            index: s.map_or(k, |s| s.index.max(k)),
            curr,
            prev,
        }
    }
}

impl Level for Params {
    type State = Counts;

    fn limit(&self) -> u64 {
        self.limit
    }

    fn policy(&self) -> Policy {
        self.policy
    }

    fn room(&self, s: Option<&Counts>, now: Millis) -> u64 {
        self.limit.saturating_sub(self.estimate(&self.view(s, now)))
    }

    fn take(&self, s: Option<&Counts>, now: Millis, n: u64) -> Counts {
        let v = self.view(s, now);
        self.counts(s, now, v.curr + n, v.prev)
    }

    fn charge(&self, s: Option<&Counts>, now: Millis, n: u64) -> Result<Counts, ClientError> {
        let v = self.view(s, now);
        if n > self.max_count() - v.curr.min(self.max_count()) {
            return Err(ClientError::invalid(format!(
                "copies {n} is too large to charge: the window would count more than {}, the \
                 most Charon keeps exactly for this limit",
                self.max_count()
            )));
        }
        Ok(self.counts(s, now, v.curr + n, v.prev))
    }

    fn remaining(&self, s: Option<&Counts>, now: Millis) -> u64 {
        self.room(s, now)
    }

    /// Until the window counts nothing again if no other hit arrives: 0
    /// when it counts nothing; the end of the current window for `fixed`
    /// and `first_hit`; for `sliding_counter`, the first instant from which
    /// the weighted estimate stays 0 (the current window's hits weigh on
    /// the next window until `prev × (W − e) < W`).
    fn reset_after(&self, s: Option<&Counts>, now: Millis) -> Millis {
        let Some(s) = s else { return 0 };
        if self.algorithm != Algorithm::SlidingCounter {
            return self.forget_at(s).saturating_sub(now);
        }
        let w = self.window;
        let v = self.view(Some(s), now);
        let start = now - v.e;
        // The count that weighs on an estimate last, and the window it
        // weighs on: the current one's hits weigh on the next window.
        let (weighing, from) = match (v.curr, v.prev) {
            (0, 0) => return 0,
            (0, prev) => (prev, start),
            (curr, _) => (curr, start.saturating_add(w)),
        };
        // floor(weighing × (W − e) / W) = 0 iff e ≥ W − floor((W − 1) / weighing).
        from.saturating_add(w - (w - 1) / weighing)
            .saturating_sub(now)
    }

    fn retry_after(&self, s: Option<&Counts>, now: Millis, min: u64) -> Option<Millis> {
        if min > self.limit {
            return None;
        }
        let w = self.window;
        let v = self.view(s, now);
        if self.algorithm == Algorithm::FirstHit {
            // Room now, else when the open window ends.
            return Some(if v.curr + min <= self.limit {
                0
            } else {
                s.map_or(0, |s| s.index.saturating_add(w).saturating_sub(now))
            });
        }
        let to_next = w - v.e;
        if self.algorithm == Algorithm::Fixed {
            return Some(if v.curr + min <= self.limit {
                0
            } else {
                to_next
            });
        }
        // In the current window, at `t` from now the previous window still
        // weighs `s = W − e − t` of W: the estimate is `curr + floor(prev ×
        // s / W)`, at most `r` iff `prev × s ≤ (r + 1) × W − 1`.
        if v.curr + min <= self.limit {
            let r = self.limit - min - v.curr;
            if v.prev == 0 {
                return Some(0);
            }
            let s_most = ((r + 1) * w - 1) / v.prev;
            if s_most >= to_next {
                return Some(0);
            }
            if s_most >= 1 {
                return Some(to_next - s_most);
            }
        }
        // In the next window `curr` is the previous count and nothing is in
        // the current one; the window after has an estimate of 0.
        let r = self.limit - min;
        if v.curr == 0 {
            return Some(to_next);
        }
        let s_most = ((r + 1) * w - 1) / v.curr;
        Some(to_next + (w - s_most.min(w)))
    }

    fn forget_at(&self, s: &Counts) -> Millis {
        if self.algorithm == Algorithm::FirstHit {
            return if s.curr == 0 {
                0
            } else {
                s.index.saturating_add(self.window)
            };
        }
        let windows = match self.algorithm {
            Algorithm::Fixed | Algorithm::FirstHit => 1,
            Algorithm::SlidingCounter if s.curr == 0 => 1,
            Algorithm::SlidingCounter => 2,
        };
        if s.curr == 0 && s.prev == 0 {
            return 0;
        }
        s.index.saturating_add(windows).saturating_mul(self.window)
    }
}

#[cfg(test)]
mod tests;
