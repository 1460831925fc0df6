//! The state of one (resource, domain) pair: each tier's latest entry time
//! and the hits it holds, plus the domain's hits in the last second (for H).

use super::log::HitLog;
use crate::limits::Tier;
use crate::time::{Millis, SECOND};

/// Where a tier stands at a given time (SPEC §2 rule 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Inactive,
    Active,
    Cooldown,
}

impl Phase {
    /// The phase of `tier`, last entered at `entered`, at `now`.
    pub fn of(tier: &Tier, entered: Option<Millis>, now: Millis) -> Phase {
        let Some(e) = entered else {
            return Phase::Inactive;
        };
        let Some(active) = tier.active else {
            return Phase::Active;
        };
        let cooldown_from = e.saturating_add(active);
        if now < cooldown_from {
            Phase::Active
        } else if now < cooldown_from.saturating_add(tier.cooldown) {
            Phase::Cooldown
        } else {
            Phase::Inactive
        }
    }

    /// Lower-case name, as shown in replies and the simulator.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Inactive => "inactive",
            Phase::Active => "active",
            Phase::Cooldown => "cooldown",
        }
    }
}

/// One tier's part of the state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierState {
    /// e: the latest entry time, `None` if never entered (or forgotten).
    pub entered: Option<Millis>,
    /// Hits granted in this tier since it was entered.
    pub hits: HitLog,
}

/// The state of one (resource, domain) pair.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateState {
    /// Tier `i` (one-indexed) is `tiers[i - 1]`; tiers never touched may be
    /// missing from the end.
    pub tiers: Vec<TierState>,
    /// Every hit granted to the domain, kept for one second (for H).
    pub last_second: HitLog,
    /// The end (exclusive) of a ban of the domain from the resource
    /// (SPEC §10 `ban`), while it holds. Kept here, with the hits, so that
    /// both stores keep it exactly as long as the rest of the pair's state.
    pub banned_until: Option<Millis>,
}

impl RateState {
    /// The latest time this state has seen, so that a clock that steps back
    /// (a Redis fail-over, say) can never make a recorded hit lie in the
    /// future.
    pub fn latest(&self) -> Millis {
        let mut at = self.last_second.latest().unwrap_or(0);
        for t in &self.tiers {
            at = at
                .max(t.entered.unwrap_or(0))
                .max(t.hits.latest().unwrap_or(0));
        }
        at
    }

    /// Brings the state to `now`: tiers that became inactive forget their
    /// hits and entry; tiers in cooldown drop their hits (they can receive
    /// none, and re-entry starts empty); active windows drop what fell out.
    /// This never changes a decision, only what is remembered.
    pub fn advance(&mut self, tiers: &[Tier], now: Millis) {
        self.tiers.truncate(tiers.len());
        for (ts, tier) in self.tiers.iter_mut().zip(tiers) {
            match Phase::of(tier, ts.entered, now) {
                Phase::Inactive => {
                    ts.entered = None;
                    ts.hits.clear();
                }
                Phase::Cooldown => ts.hits.clear(),
                Phase::Active => ts.hits.prune(now, tier.window),
            }
        }
        while self.tiers.last().is_some_and(|t| t.entered.is_none()) {
            self.tiers.pop();
        }
        self.last_second.prune(now, SECOND);
        self.banned_until = self.banned_until.filter(|&u| now < u);
    }

    /// The phase of tier `i` (one-indexed) at `now`.
    pub fn phase(&self, tiers: &[Tier], i: usize, now: Millis) -> Phase {
        Phase::of(
            &tiers[i - 1],
            self.tiers.get(i - 1).and_then(|t| t.entered),
            now,
        )
    }

    /// The current tier (SPEC §2 rule 3): the active tier with the greatest
    /// index, or 0 when none is active.
    pub fn current_tier(&self, tiers: &[Tier], now: Millis) -> usize {
        (1..=tiers.len().min(self.tiers.len()))
            .rev()
            .find(|&i| self.phase(tiers, i, now) == Phase::Active)
            .unwrap_or(0)
    }

    /// Hits held by tier `i` (after [`RateState::advance`], hits in its
    /// window); 0 for tier 0.
    pub fn tier_hits(&self, i: usize) -> u64 {
        if i == 0 {
            return 0;
        }
        self.tiers.get(i - 1).map_or(0, |t| t.hits.count())
    }

    pub(super) fn tier_mut(&mut self, i: usize) -> &mut TierState {
        if self.tiers.len() < i {
            self.tiers.resize_with(i, TierState::default);
        }
        &mut self.tiers[i - 1]
    }

    /// When the pair is whole again if no other hit arrives (SPEC §10's
    /// `reset_after_ms`): every hit it counts is at the end of its window
    /// (it leaves the window the next millisecond, windows being closed on
    /// the left), and no tier is active or cooling down. Tier 1 active for
    /// ever counts as whole once its window is empty (it then decides as
    /// tier 0 would; see [`RateState::forget_at`]). `None` if never: a
    /// tier above the first with an infinite active period, once entered.
    /// A ban is not part of it (a reply tells a ban by `retry_after_ms`).
    pub fn whole_at(&self, tiers: &[Tier]) -> Option<Millis> {
        let mut at = self
            .last_second
            .latest()
            .map_or(0, |t| t.saturating_add(SECOND));
        for (i, (ts, tier)) in self.tiers.iter().zip(tiers).enumerate() {
            let Some(e) = ts.entered else { continue };
            let until = match tier.active {
                Some(active) => e.saturating_add(active).saturating_add(tier.cooldown),
                None if i == 0 => ts
                    .hits
                    .latest()
                    .map_or(0, |t| t.saturating_add(tier.window)),
                None => return None,
            };
            at = at.max(until);
        }
        Some(at)
    }

    /// From when a store may drop this state: `None` if never.
    ///
    /// Exactly when the state decides every future request as no state at
    /// all would: its last-second log is empty, every tier is inactive and
    /// no ban holds (a ban is never forgotten before it ends).
    ///
    /// One case is not exact, and is forgotten only after `dormant_grace`
    /// more: tier 1 with an infinite active period, entered, its window
    /// empty ("dormant"). Dropping it changes no grant (re-entering tier 1
    /// from tier 0 grants the same hits) but the next reply says
    /// `burst: true`, as a first request's does. Without this, every domain
    /// ever seen under the most common configurations would stay in memory
    /// forever. An upper tier with an infinite active period decides forever
    /// once entered and is never dropped.
    pub fn forget_at(&self, tiers: &[Tier], dormant_grace: Millis) -> Option<Millis> {
        let mut at = self
            .last_second
            .latest()
            .map_or(0, |t| t.saturating_add(SECOND + 1))
            .max(self.banned_until.unwrap_or(0));
        for (i, (ts, tier)) in self.tiers.iter().zip(tiers).enumerate() {
            let Some(e) = ts.entered else { continue };
            let until = match tier.active {
                Some(active) => e.saturating_add(active).saturating_add(tier.cooldown),
                // Every hit of tier 1 is at or before `latest`, so its window
                // is empty from `latest + window + 1`.
                None if i == 0 => self
                    .latest()
                    .saturating_add(tier.window)
                    .saturating_add(1)
                    .saturating_add(dormant_grace),
                None => return None,
            };
            at = at.max(until);
        }
        Some(at)
    }
}
