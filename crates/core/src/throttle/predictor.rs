//! The cost predictor of the `cost` discipline (SPEC §13): per request
//! class, an estimate of the CPU time a request of the class costs, learnt
//! from the requests of that class that finished recently.
//!
//! **The estimator** is a decaying mean in whole CPU-microseconds: before
//! any measurement a class is predicted at its configured starting cost
//! (`classes:`) or `default_cost`; the first measurement replaces that
//! guess outright; the next ones are averaged, as a plain running mean up
//! to [`WINDOW`] measurements and then as an exponentially decaying mean
//! of weight 1/[`WINDOW`] (each new measurement counts for 1/16, so the
//! estimate follows a class whose cost changes within a few dozen
//! requests). Integer arithmetic, rounded to the nearest microsecond, so
//! that a replay is exact on every machine.
//!
//! Why a mean and not a high percentile: the throttler's bucket drains
//! predicted units at the rate the service can work off real CPU time;
//! only an unbiased prediction makes the two agree over many requests. A
//! percentile would over-predict every class by its spread and leave that
//! much capacity unused.
//!
//! Convergence: for a class whose cost is constant, the prediction equals
//! it from the first measurement on (so within 10 % after 20 requests, as
//! SPEC §13 asks, whatever the starting guess). After a change of a class's
//! cost from `a` to `b`, the error after `n` measurements is at most
//! `|a − b| × (15/16)^(n − 16)` once the running mean has filled (about
//! 7.6 % of the step after 40 more requests past the first 16).

use std::collections::HashMap;

/// Measurements averaged as a plain mean before the mean starts to decay;
/// then each measurement weighs 1/`WINDOW`.
pub const WINDOW: u64 = 16;

/// The most classes estimated separately; later classes share
/// [`OTHER_CLASS`], so that a classifier that returns raw paths cannot
/// make the throttler's memory (or its metrics) grow without bound.
pub const MAX_CLASSES: usize = 1_000;

/// The class that requests of classes beyond [`MAX_CLASSES`] share.
pub const OTHER_CLASS: &str = "(other)";

/// One class's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Estimate {
    /// CPU-microseconds, at least 1.
    mean_us: u64,
    /// Measurements so far (saturating).
    samples: u64,
}

/// Estimates per class.
#[derive(Debug, Clone, Default)]
pub struct Predictor {
    classes: HashMap<String, Estimate>,
}

impl Predictor {
    /// The class a request of `class` is counted under: itself, or
    /// [`OTHER_CLASS`] once [`MAX_CLASSES`] others are known.
    pub fn class_name<'a>(&self, class: &'a str) -> &'a str {
        if self.classes.contains_key(class) || self.classes.len() < MAX_CLASSES {
            class
        } else {
            OTHER_CLASS
        }
    }

    /// The prediction for `class` (already mapped by
    /// [`Predictor::class_name`]), or `cold_us` before any measurement.
    pub fn predict_us(&self, class: &str, cold_us: u64) -> u64 {
        self.classes
            .get(class)
            .map_or(cold_us, |e| e.mean_us)
            .max(1)
    }

    /// Records a measured cost of `cpu_us` for `class` (mapped by
    /// [`Predictor::class_name`]) and returns the new estimate.
    pub fn record(&mut self, class: &str, cpu_us: u64) -> u64 {
        let class = self.class_name(class);
        let e = match self.classes.get_mut(class) {
            Some(e) => e,
            None => self.classes.entry(class.to_owned()).or_insert(Estimate {
                mean_us: 0,
                samples: 0,
            }),
        };
        e.samples = e.samples.saturating_add(1);
        e.mean_us = next_mean(e.mean_us, e.samples, cpu_us);
        e.mean_us
    }

    /// How many measurements `class` has had (saturating).
    pub fn samples(&self, class: &str) -> u64 {
        self.classes.get(class).map_or(0, |e| e.samples)
    }

    /// How many classes have an estimate.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Whether no class has an estimate yet.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }
}

/// The mean after the `samples`-th measurement `x` (the first replaces the
/// cold guess; weight 1/min(samples, WINDOW)); at least 1 µs.
pub fn next_mean(mean: u64, samples: u64, x: u64) -> u64 {
    if samples <= 1 {
        return x.max(1);
    }
    let n = i128::from(samples.min(WINDOW));
    let diff = i128::from(x) - i128::from(mean);
    // Rounded to nearest, halves away from zero.
    let step = if diff >= 0 {
        (diff + n / 2) / n
    } else {
        -((-diff + n / 2) / n)
    };
    u64::try_from(i128::from(mean) + step).unwrap_or(1).max(1)
}
