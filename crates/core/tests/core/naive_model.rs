//! The burst-tier engine against a deliberately naive model of SPEC §2:
//! lists of timestamps, one hit at a time, every candidate n tried from the
//! largest down. Random tier configurations and random timelines (several
//! domains, multi-hit requests) must give identical replies, the reply
//! context of SPEC §10 included: `remaining` by trying every n, and
//! `retry_after_ms` and `reset_after_ms` by trying every millisecond from
//! now on.

use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::rate::{HitLog, RateReply, RateState, TierContext, decide};
use charon_core::request::Amount;
use charon_core::testing;
use proptest::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Inactive,
    Active,
    Cooldown,
}

#[derive(Debug, Clone, Default)]
struct NaiveTier {
    entered: Option<u64>,
    hits: Vec<u64>,
}

#[derive(Debug, Clone, Default)]
struct NaiveDomain {
    tiers: Vec<NaiveTier>,
    hits: Vec<u64>,
}

struct Naive {
    tiers: Vec<Tier>,
    hard: Option<u64>,
    global: Option<u64>,
    domains: Vec<NaiveDomain>,
    global_hits: Vec<u64>,
    /// Whether to compute `remaining` and `retry_after_ms` (by brute force,
    /// the slow part).
    with_context: bool,
}

fn inside(t: u64, now: u64, span: u64) -> bool {
    i128::from(now) - i128::from(span) <= i128::from(t) && t <= now
}

impl Naive {
    fn phase(&self, d: &NaiveDomain, i: usize, now: u64) -> Phase {
        let cfg = &self.tiers[i - 1];
        let Some(e) = d.tiers[i - 1].entered else {
            return Phase::Inactive;
        };
        let Some(a) = cfg.active else {
            return Phase::Active;
        };
        if e <= now && now < e + a {
            Phase::Active
        } else if e + a <= now && now < e + a + cfg.cooldown {
            Phase::Cooldown
        } else {
            Phase::Inactive
        }
    }

    fn current(&self, d: &NaiveDomain, now: u64) -> usize {
        let mut cur = 0;
        for i in 1..=self.tiers.len() {
            if self.phase(d, i, now) == Phase::Active {
                cur = i;
            }
        }
        cur
    }

    fn window_count(&self, d: &NaiveDomain, i: usize, now: u64) -> u64 {
        if i == 0 {
            return 0;
        }
        let w = self.tiers[i - 1].window;
        d.tiers[i - 1]
            .hits
            .iter()
            .filter(|&&t| inside(t, now, w))
            .count() as u64
    }

    /// Rule 4 for one hit; returns whether it caused a burst, or None if
    /// rejected.
    fn one_hit(&self, d: &mut NaiveDomain, now: u64) -> Option<bool> {
        let i = self.current(d, now);
        if i >= 1 && self.window_count(d, i, now) < self.tiers[i - 1].limit {
            d.tiers[i - 1].hits.push(now);
            return Some(false);
        }
        let mut j = i + 1;
        loop {
            if j > self.tiers.len() {
                return None;
            }
            let cfg = self.tiers[j - 1];
            let cooling = self.phase(d, j, now) == Phase::Cooldown;
            if cooling || cfg.limit == 0 {
                if cfg.skippable {
                    j += 1;
                    continue;
                }
                return None;
            }
            d.tiers[j - 1] = NaiveTier {
                entered: Some(now),
                hits: vec![now],
            };
            return Some(true);
        }
    }

    /// n hits one after another; the state after and whether any burst.
    fn try_hits(&self, d: &NaiveDomain, now: u64, n: u64) -> Option<(NaiveDomain, bool)> {
        let mut trial = d.clone();
        let mut burst = false;
        for _ in 0..n {
            burst |= self.one_hit(&mut trial, now)?;
        }
        Some((trial, burst))
    }

    /// Whether a request for `n` at `t` would be granted (rule 5, one hit
    /// at a time, H and G counted from the lists).
    fn grants(&self, d: &NaiveDomain, t: u64, n: u64) -> bool {
        let domain_last = d.hits.iter().filter(|&&h| inside(h, t, 1000)).count() as u64;
        let global_last = self
            .global_hits
            .iter()
            .filter(|&&h| inside(h, t, 1000))
            .count() as u64;
        self.try_hits(d, t, n).is_some()
            && self.hard.is_none_or(|h| domain_last + n <= h)
            && self.global.is_none_or(|g| global_last + n <= g)
    }

    /// SPEC §10 `retry_after_ms` by brute force: every millisecond from
    /// `now` on, up to a bound past every change the generated limits can
    /// make (a window of 40, an active period of 120 and a cooldown of 80
    /// ms, the last second).
    fn retry_after(&self, d: &NaiveDomain, now: u64, min: u64) -> Option<u64> {
        (0..=RETRY_BOUND).find(|&w| self.grants(d, now + w, min))
    }

    /// SPEC §10 `reset_after_ms` by brute force: the first instant from
    /// `now` on at which every hit counted now has reached the end of its
    /// window (tier windows, the last second) and no tier is active or
    /// cooling down (tier 1 active for ever excepted: with an empty window
    /// it decides as tier 0). `None` if an upper tier active for ever is
    /// active.
    fn reset_after(&self, d: &NaiveDomain, now: u64) -> Option<u64> {
        for i in 2..=self.tiers.len() {
            if self.tiers[i - 1].active.is_none() && self.phase(d, i, now) == Phase::Active {
                return None;
            }
        }
        (0..=RETRY_BOUND).find(|&w| self.whole(d, now, now + w))
    }

    fn whole(&self, d: &NaiveDomain, now: u64, t: u64) -> bool {
        let n = self.tiers.len();
        let periods = (1..=n).all(|i| {
            self.phase(d, i, t) == Phase::Inactive || (i == 1 && self.tiers[0].active.is_none())
        });
        let tier_hits = (1..=n).all(|i| {
            let w = self.tiers[i - 1].window;
            // (a tier no longer active at t has forgotten its hits)
            self.phase(d, i, now) != Phase::Active
                || self.phase(d, i, t) != Phase::Active
                || d.tiers[i - 1]
                    .hits
                    .iter()
                    .filter(|&&h| inside(h, now, w))
                    .all(|&h| h + w <= t)
        });
        let last_second = d
            .hits
            .iter()
            .filter(|&&h| inside(h, now, 1000))
            .all(|&h| h + 1000 <= t);
        periods && tier_hits && last_second
    }

    /// `remaining`: the largest n granted at `now` (0 if none).
    fn remaining(&self, d: &NaiveDomain, now: u64) -> u64 {
        (1..=100)
            .take_while(|&n| self.grants(d, now, n))
            .last()
            .unwrap_or(0)
    }

    fn request(&mut self, domain: usize, now: u64, copies: u64, min: u64) -> RateReply {
        let d = self.domains[domain].clone();
        let domain_last = d.hits.iter().filter(|&&t| inside(t, now, 1000)).count() as u64;
        let global_last = self
            .global_hits
            .iter()
            .filter(|&&t| inside(t, now, 1000))
            .count() as u64;
        let wish = (0..=copies)
            .rev()
            .find(|&k| self.try_hits(&d, now, k).is_some())
            .unwrap_or(0);
        let hard_room = self
            .hard
            .map_or(u64::MAX, |h| h.saturating_sub(domain_last));
        let global_room = self
            .global
            .map_or(u64::MAX, |g| g.saturating_sub(global_last));
        let mut granted = 0;
        let mut burst = false;
        for n in (min..=copies).rev() {
            let Some((after, b)) = self.try_hits(&d, now, n) else {
                continue;
            };
            if self.hard.is_some_and(|h| domain_last + n > h)
                || self.global.is_some_and(|g| global_last + n > g)
            {
                continue;
            }
            self.domains[domain] = after;
            for _ in 0..n {
                self.domains[domain].hits.push(now);
                self.global_hits.push(now);
            }
            granted = n;
            burst = b;
            break;
        }
        let d = &self.domains[domain];
        let tier = self.current(d, now);
        RateReply {
            granted,
            hard_limit: self.hard,
            global_limit: self.global,
            tier_limit: if tier == 0 {
                0
            } else {
                self.tiers[tier - 1].limit
            },
            domain_hits_last_second: d.hits.iter().filter(|&&t| inside(t, now, 1000)).count()
                as u64,
            global_hits_last_second: self
                .global_hits
                .iter()
                .filter(|&&t| inside(t, now, 1000))
                .count() as u64,
            tier_hits: self.window_count(d, tier, now),
            tier,
            burst,
            hard_limited: hard_room < wish && hard_room <= global_room,
            global_limited: global_room < wish && global_room <= hard_room,
            ignored: false,
            context: TierContext {
                limit: if tier == 0 {
                    0
                } else {
                    self.tiers[tier - 1].limit
                },
                remaining: if self.with_context {
                    self.remaining(d, now)
                } else {
                    0
                },
                reset_after_ms: if self.with_context {
                    self.reset_after(d, now)
                } else {
                    None
                },
                retry_after_ms: if self.with_context {
                    self.retry_after(d, now, min)
                } else {
                    None
                },
                warning: false,
                banned: false,
            },
        }
    }
}

/// Past every instant at which the generated limits change a decision.
const RETRY_BOUND: u64 = 1_500;

#[derive(Debug, Clone)]
struct Event {
    gap: u64,
    domain: usize,
    copies: u64,
    min: u64,
}

fn event_strategy() -> impl Strategy<Value = Event> {
    (0u64..=30, 0usize..3, 1u64..=6)
        .prop_flat_map(|(gap, domain, copies)| (Just(gap), Just(domain), Just(copies), 1..=copies))
        .prop_map(|(gap, domain, copies, min)| Event {
            gap,
            domain,
            copies,
            min,
        })
}

/// Random tiers, H and G from the generator the stores' differential test
/// shares (`charon_core::testing`, in 1 ms units), and a random timeline.
fn scenario() -> impl Strategy<Value = (Vec<Tier>, Option<u64>, Option<u64>, Vec<Event>)> {
    (
        prop::collection::vec(any::<u64>(), testing::RATE_LIMITS_DRAWS),
        prop::collection::vec(event_strategy(), 1..80),
    )
        .prop_map(|(raw, events)| {
            let (tiers, hard, global) = testing::rate_limits(&mut testing::Raw::new(&raw), 1);
            (tiers, hard, global, events)
        })
}

/// Runs a timeline through the engine; `forget` applies the stores' rule
/// of dropping state from `forget_at` on (with no grace for dormant tier-1
/// state, so that the inexact case is exercised too).
fn engine_replies(
    tiers: &[Tier],
    hard: Option<u64>,
    global: Option<u64>,
    events: &[Event],
    forget: bool,
) -> Vec<RateReply> {
    let limits = RateLimits {
        hard_limit: hard,
        global_limit: global,
        tiers,
    };
    let mut states = vec![(RateState::default(), Some(0u64)); 3];
    let mut global_log = HitLog::default();
    let mut now = 0;
    events
        .iter()
        .map(|e| {
            now += e.gap;
            let (state, forget_at) = &mut states[e.domain];
            if forget && forget_at.is_some_and(|f| now >= f) {
                *state = RateState::default();
            }
            let amount = Amount::new(e.copies, e.min).expect("valid");
            let reply = decide(
                limits,
                state,
                &mut global_log,
                now,
                amount,
                Enforcement::Enforce,
            )
            .expect("within the bound");
            *forget_at = state.forget_at(tiers, 0);
            reply
        })
        .collect()
}

fn naive_replies(
    tiers: &[Tier],
    hard: Option<u64>,
    global: Option<u64>,
    events: &[Event],
    with_context: bool,
) -> Vec<RateReply> {
    let mut naive = Naive {
        with_context,
        tiers: tiers.to_vec(),
        hard,
        global,
        domains: vec![
            NaiveDomain {
                tiers: vec![NaiveTier::default(); tiers.len()],
                hits: vec![],
            };
            3
        ],
        global_hits: vec![],
    };
    let mut now = 0;
    events
        .iter()
        .map(|e| {
            now += e.gap;
            naive.request(e.domain, now, e.copies, e.min)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn engine_matches_naive_model((tiers, hard, global, events) in scenario()) {
        let engine = engine_replies(&tiers, hard, global, &events, false);
        let naive = naive_replies(&tiers, hard, global, &events, true);
        for (i, (a, b)) in engine.iter().zip(&naive).enumerate() {
            prop_assert_eq!(a, b, "event {} of {:?}", i, events);
        }
    }

    /// Dropping idle state (as the stores do) never changes a decision:
    /// the hits granted, the binding limits, the counts and, for a grant,
    /// the tier it landed in. Only `burst` and the tier context of a
    /// rejection may differ (see `RateState::forget_at`).
    #[test]
    fn forgetting_idle_state_never_changes_a_decision((tiers, hard, global, events) in scenario()) {
        let engine = engine_replies(&tiers, hard, global, &events, true);
        let naive = naive_replies(&tiers, hard, global, &events, false);
        for (i, (a, b)) in engine.iter().zip(&naive).enumerate() {
            let decision = |r: &RateReply| (r.granted, r.hard_limited, r.global_limited, r.domain_hits_last_second, r.global_hits_last_second);
            prop_assert_eq!(decision(a), decision(b), "event {} of {:?}", i, events);
            if a.granted > 0 {
                prop_assert_eq!((a.tier, a.tier_hits, a.tier_limit), (b.tier, b.tier_hits, b.tier_limit), "event {}", i);
            }
        }
    }
}
