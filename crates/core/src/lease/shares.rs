//! Doorman's distribution algorithms (paper §5.1, SPEC §12) as one value:
//! [`Shares`] is computed once from the capacity and every client's
//! `(wants, subclients)`, then tells any of those clients its share.
//!
//! The share is the algorithm's *target*, what the client would hold once
//! every client has refreshed with the same wants (the fixed point). What a
//! refresh hands out is the target capped by what others do not hold yet;
//! that cap is the lease set's business ([`super::get_capacity`]).
//!
//! Subclients weigh a client: a leaf server asking its parent for its
//! clients' wants counts as that many clients, so its share is the sum of
//! theirs.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::quantity::{Quantity, mul_div_floor};

/// How a resource's capacity is divided among the clients that want it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Everyone gets what it wants: no limit, may over-commit (a resource
    /// only watched, or one whose real limit is elsewhere).
    None,
    /// `capacity` is per client (per subclient): everyone gets what it
    /// wants up to that.
    Static,
    /// Everyone gets up to an equal share; what clients below their equal
    /// share leave is topped up to the others in proportion to how much
    /// more than the equal share they want.
    ProportionalShare,
    /// Max-min fairness: everyone gets up to an equal share, and what
    /// clients below it leave is split equally among the others, in rounds,
    /// until nothing is left or everyone has what it wants.
    FairShare,
}

impl Algorithm {
    /// Every algorithm as configuration files write it.
    pub const NAMES: &'static [&'static str] =
        &["none", "static", "proportional_share", "fair_share"];

    /// The name configuration files use.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::None => "none",
            Algorithm::Static => "static",
            Algorithm::ProportionalShare => "proportional_share",
            Algorithm::FairShare => "fair_share",
        }
    }

    /// Whether the algorithm divides one capacity among all clients, so
    /// that no grant may exceed what the others do not hold: true for
    /// `proportional_share` and `fair_share`. `static` bounds each client
    /// alone and `none` bounds nobody.
    pub fn shares_capacity(self) -> bool {
        matches!(self, Algorithm::ProportionalShare | Algorithm::FairShare)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Algorithm::None),
            "static" => Ok(Algorithm::Static),
            "proportional_share" => Ok(Algorithm::ProportionalShare),
            "fair_share" => Ok(Algorithm::FairShare),
            _ => Err(format!(
                "{s:?} is not an algorithm (one of {})",
                Algorithm::NAMES.join(", ")
            )),
        }
    }
}

/// The share each client of one resource is entitled to, for one set of
/// wants. Computing it costs O(n) for `proportional_share` and O(n log n)
/// for `fair_share` (a sort, where Doorman's rounds are quadratic);
/// [`Shares::of`] is then O(1), so a [`super::LeaseSet`] keeps the last
/// one until a want changes.
///
/// All arithmetic is exact: millionths in `u128`, with the equal share
/// `capacity × subclients / N` kept as the fraction it is (every amount is
/// scaled by N, the total of subclients) and the one product that may need
/// more than 128 bits done by an exact `floor(a × b / c)`. A share is rounded down to
/// the millionth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares(Rule);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    /// Everyone gets what it wants (`none`, or the wants fit).
    Wants,
    /// At most this many millionths per subclient.
    PerSubclient(u128),
    /// `proportional_share` over capacity: with `E = capacity × s` and
    /// `W = wants × N` (shares scaled by N), a client with `W ≤ E` gets its
    /// wants, the others `(E + (W − E) × extra / need) / N`.
    Proportional {
        capacity: u128,
        n: u128,
        /// Σ (E − W) over clients below their equal share (the capacity
        /// they leave, scaled by N).
        extra: u128,
        /// Σ (W − E) over the others (what they want beyond it, scaled).
        need: u128,
    },
    /// `fair_share` over capacity: every client gets
    /// `min(wants, level × subclients)` with `level = remaining / weight`.
    Level { remaining: u128, weight: u128 },
}

impl Shares {
    /// The shares of `capacity` among `clients`, each `(wants,
    /// subclients)` with at least one subclient (a client with none
    /// counts as one).
    pub fn new(
        algorithm: Algorithm,
        capacity: Quantity,
        clients: impl IntoIterator<Item = (Quantity, u64)>,
    ) -> Self {
        let capacity_micros = u128::from(capacity.micros());
        let clients = clients
            .into_iter()
            .map(|(w, s)| (u128::from(w.micros()), u128::from(s.max(1))));
        match algorithm {
            Algorithm::None => Shares(Rule::Wants),
            Algorithm::Static => Shares(Rule::PerSubclient(capacity_micros)),
            Algorithm::ProportionalShare => Self::proportional(capacity_micros, clients.collect()),
            Algorithm::FairShare => Self::fair(capacity_micros, clients.collect()),
        }
    }

    /// Doorman's ProportionalShare: if all wants fit, everyone gets them;
    /// else a client at or below its equal share gets its wants, and one
    /// above gets the equal share plus its excess times `extra / need`
    /// (paper: capacity 90, wants 100/50/10 give 45.6/34.4/10). Unlike
    /// Doorman's code, the requesting client's new wants and subclients
    /// count everywhere (in N and in the need), so the result is the same
    /// whichever client asks.
    fn proportional(capacity: u128, clients: Vec<(u128, u128)>) -> Self {
        let total_wants = clients
            .iter()
            .fold(0u128, |sum, &(w, _)| sum.saturating_add(w));
        if total_wants <= capacity {
            return Shares(Rule::Wants);
        }
        let n = clients
            .iter()
            .fold(0u128, |sum, &(_, s)| sum.saturating_add(s));
        let (mut extra, mut need) = (0u128, 0u128);
        for &(w, s) in &clients {
            let (wn, e) = (w.saturating_mul(n), capacity.saturating_mul(s));
            if wn < e {
                extra = extra.saturating_add(e - wn);
            } else {
                need = need.saturating_add(wn - e);
            }
        }
        Shares(Rule::Proportional {
            capacity,
            n,
            extra,
            need,
        })
    }

    /// Max-min fairness by water-filling: clients in increasing order of
    /// wants per subclient are given their wants while that is at most an
    /// equal split of what is left among those still waiting; the rest
    /// share what is left equally per subclient. This is where the paper's
    /// rounds end (capacity 160, wants 100/50/45/10 give 55/50/45/10);
    /// Doorman's code stops after two rounds, which can give a client more
    /// than it wants.
    fn fair(capacity: u128, mut clients: Vec<(u128, u128)>) -> Self {
        let total_wants = clients
            .iter()
            .fold(0u128, |sum, &(w, _)| sum.saturating_add(w));
        if total_wants <= capacity {
            return Shares(Rule::Wants);
        }
        // wa / sa < wb / sb ⇔ wa × sb < wb × sa (each product below 2^85).
        clients.sort_unstable_by(|&(wa, sa), &(wb, sb)| {
            wa.saturating_mul(sb).cmp(&wb.saturating_mul(sa))
        });
        let mut remaining = capacity;
        let mut weight = clients
            .iter()
            .fold(0u128, |sum, &(_, s)| sum.saturating_add(s));
        for &(w, s) in &clients {
            // w / s ≤ remaining / weight: this client's wants fit in an
            // equal split of what is left, so it is satisfied.
            if w.saturating_mul(weight) <= remaining.saturating_mul(s) {
                remaining = remaining.saturating_sub(w);
                weight = weight.saturating_sub(s);
            } else {
                break;
            }
        }
        Shares(Rule::Level { remaining, weight })
    }

    /// The share of a client with `wants` and `subclients` (at least one)
    /// among those the shares were computed for: never more than `wants`.
    pub fn of(&self, wants: Quantity, subclients: u64) -> Quantity {
        let (w, s) = (u128::from(wants.micros()), u128::from(subclients.max(1)));
        let share = match self.0 {
            Rule::Wants => w,
            Rule::PerSubclient(per) => per.saturating_mul(s),
            Rule::Proportional {
                capacity,
                n,
                extra,
                need,
            } => {
                let (wn, e) = (w.saturating_mul(n), capacity.saturating_mul(s));
                match wn.cmp(&e) {
                    Ordering::Less | Ordering::Equal => w,
                    // extra < need whenever the wants exceed the capacity,
                    // so the top-up is below the excess; `min` only guards
                    // a client that was not among those counted.
                    Ordering::Greater => mul_div_floor(wn - e, extra.min(need), need)
                        .map_or(w, |top_up| e.saturating_add(top_up) / n.max(1)),
                }
            }
            // No weight left: everyone was satisfied (the wants fit).
            Rule::Level { remaining, weight } => {
                remaining.saturating_mul(s).checked_div(weight).unwrap_or(w)
            }
        };
        Quantity::saturating_from_total(share.min(w))
    }
}
