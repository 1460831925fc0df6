//! What the throttler counts, through the `metrics` facade (whoever runs
//! the service installs the recorder: `charon sidecar` exports them on its
//! `/metrics`):
//! - `charon_throttle_requests_total{criticality, outcome, reason}`:
//!   outcome `admitted` (started, at once or after waiting), `queued`,
//!   `rejected` (reason `queue_full`, `client_limit`, `global_limit`,
//!   `global_unavailable`), `evicted`, `expired`, `left` (caller gone
//!   while queued); reason is `none` except for rejections;
//! - `charon_throttle_queue_length` and `charon_throttle_queue_units`
//!   (requests, or predicted CPU-ms) waiting, `charon_throttle_rate_units`
//!   (the configured release rate);
//! - `charon_throttle_wait_seconds{criticality}`: how long admitted
//!   requests waited in the queue (a histogram);
//! - per class, predicted against measured cost:
//!   `charon_throttle_cost_predicted_microseconds_total{class}`,
//!   `charon_throttle_cost_measured_microseconds_total{class}`,
//!   `charon_throttle_finished_total{class}` and the estimate in force,
//!   `charon_throttle_cost_estimate_seconds{class}`. Classes are bounded
//!   (a thousand, then `(other)`).
//!
//! The counters of admission are registered once (at zero) and kept as
//! handles, so that counting costs no lookup on the request path.

use std::time::Duration;

use charon_core::throttle::{Criticality, Discipline, Throttle};
use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

use crate::reject::Reason;

/// The metric names, for exporters that configure them (buckets).
pub const WAIT_SECONDS: &str = "charon_throttle_wait_seconds";

/// Describes every metric of the throttler (`# HELP` lines); call once
/// after installing a recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "charon_throttle_requests_total",
        "Requests by criticality and outcome (admitted, queued, rejected, evicted, expired, left) and rejection reason"
    );
    describe_gauge!(
        "charon_throttle_queue_length",
        "Requests waiting in the throttler's queue"
    );
    describe_gauge!(
        "charon_throttle_queue_units",
        "Units waiting: requests (qps) or predicted CPU-milliseconds (cost)"
    );
    describe_gauge!(
        "charon_throttle_rate_units",
        "The configured release rate, units per second"
    );
    describe_histogram!(
        WAIT_SECONDS,
        metrics::Unit::Seconds,
        "How long admitted requests waited in the queue"
    );
    describe_counter!(
        "charon_throttle_finished_total",
        "Requests finished, by class"
    );
    describe_counter!(
        "charon_throttle_cost_predicted_microseconds_total",
        "Predicted cost of finished requests, CPU-microseconds, by class"
    );
    describe_counter!(
        "charon_throttle_cost_measured_microseconds_total",
        "Measured cost of finished requests, CPU-microseconds, by class"
    );
    describe_gauge!(
        "charon_throttle_cost_estimate_seconds",
        "The cost estimate in force per class, CPU-seconds"
    );
}

/// What happened to a request, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Started.
    Admitted,
    /// Put in the queue.
    Queued,
    /// Refused.
    Rejected(Reason),
    /// Taken out of the queue by a CRITICAL arrival.
    Evicted,
    /// Waited `max_wait` in vain.
    Expired,
    /// Its caller went away while it waited.
    Left,
}

const OUTCOMES: [&str; 5] = ["admitted", "queued", "evicted", "expired", "left"];
const CRITICALITIES: [Criticality; 2] = [Criticality::Critical, Criticality::NotCritical];

/// Counter handles, registered once.
#[derive(Debug)]
pub(crate) struct Counters {
    /// [criticality][outcome index of OUTCOMES]
    plain: [[Counter; 5]; 2],
    /// [criticality][reason index of Reason::REFUSALS]
    rejected: [[Counter; 4]; 2],
    waited: [Histogram; 2],
    queue_length: Gauge,
    queue_units: Gauge,
    rate: Gauge,
}

fn crit_index(c: Criticality) -> usize {
    match c {
        Criticality::Critical => 0,
        Criticality::NotCritical => 1,
    }
}

impl Counters {
    pub(crate) fn new(discipline: Discipline) -> Self {
        let plain = CRITICALITIES.map(|c| {
            OUTCOMES.map(|o| {
                counter!("charon_throttle_requests_total", "criticality" => c.name(), "outcome" => o, "reason" => "none")
            })
        });
        let rejected = CRITICALITIES.map(|c| {
            Reason::REFUSALS.map(|r| {
                counter!("charon_throttle_requests_total", "criticality" => c.name(), "outcome" => "rejected", "reason" => r.name())
            })
        });
        let waited = CRITICALITIES.map(|c| histogram!(WAIT_SECONDS, "criticality" => c.name()));
        Self {
            plain,
            rejected,
            waited,
            queue_length: gauge!("charon_throttle_queue_length"),
            queue_units: gauge!("charon_throttle_queue_units", "discipline" => discipline.name()),
            rate: gauge!("charon_throttle_rate_units", "discipline" => discipline.name()),
        }
    }

    pub(crate) fn outcome(&self, c: Criticality, outcome: Outcome) {
        let row = crit_index(c);
        let counter = match outcome {
            Outcome::Admitted => &self.plain[row][0],
            Outcome::Queued => &self.plain[row][1],
            Outcome::Evicted => &self.plain[row][2],
            Outcome::Expired => &self.plain[row][3],
            Outcome::Left => &self.plain[row][4],
            Outcome::Rejected(Reason::Evicted) => &self.plain[row][2],
            Outcome::Rejected(Reason::Expired) => &self.plain[row][3],
            Outcome::Rejected(r) => {
                let i = Reason::REFUSALS.iter().position(|x| *x == r).unwrap_or(0);
                &self.rejected[row][i]
            }
        };
        counter.increment(1);
    }

    pub(crate) fn waited(&self, c: Criticality, d: Duration) {
        self.waited[crit_index(c)].record(d.as_secs_f64());
    }

    pub(crate) fn queue(&self, machine: &Throttle) {
        self.queue_length.set(machine.queue_len() as f64);
        self.queue_units.set(machine.queued_units());
        self.rate.set(machine.config().rate as f64);
    }
}

/// One class's counters of finished requests, made once.
#[derive(Debug)]
pub(crate) struct ClassCounters {
    finished: Counter,
    predicted: Counter,
    measured: Counter,
    estimate: Gauge,
}

impl ClassCounters {
    pub(crate) fn new(class: &str) -> Self {
        let class = class.to_owned();
        Self {
            finished: counter!("charon_throttle_finished_total", "class" => class.clone()),
            // Whole microseconds (exact); a dashboard's rate() of both
            // gives predicted against measured per class.
            predicted: counter!("charon_throttle_cost_predicted_microseconds_total", "class" => class.clone()),
            measured: counter!("charon_throttle_cost_measured_microseconds_total", "class" => class.clone()),
            estimate: gauge!("charon_throttle_cost_estimate_seconds", "class" => class),
        }
    }

    pub(crate) fn finished(&self, predicted_us: u64, cost_us: u64, estimate_us: u64) {
        self.finished.increment(1);
        self.predicted.increment(predicted_us);
        self.measured.increment(cost_us);
        self.estimate.set(estimate_us as f64 / 1e6);
    }
}
