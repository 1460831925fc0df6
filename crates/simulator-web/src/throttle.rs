//! The throttler view of the page (`POST /simulator/api/throttle`): a
//! service of a given capacity, a request mix (cheap and expensive,
//! CRITICAL and not), an overload factor; the server generates the
//! arrivals (Poisson, from a seed), runs them through charon-core's
//! throttler machine (SPEC §13) and a simulated service that works off
//! started requests in order at its capacity, and answers the queue,
//! admissions and rejections over time. As everywhere on the page, no
//! decision is made in JavaScript.
//!
//! The service: started requests are worked off one after the other, a
//! request of cost `c` CPU-ms taking `c × 1000 / capacity` ms; when one
//! finishes, its cost teaches its class's estimate (the `cost`
//! discipline predicts from it). A request is *good* when it finishes
//! within 1 s of its arrival (a client's deadline). `discipline: "none"`
//! starts every request at once: the service's own backlog grows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use charon_core::config::ConfigIssue;
use charon_core::fields::{self, Issues, Path};
use charon_core::throttle::{Admission, Criticality, Discipline, Event, Throttle, ThrottleConfig};
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The most arrivals one run may generate.
pub const MAX_ARRIVALS: f64 = 200_000.0;
/// The longest run, seconds.
pub const MAX_SECONDS: u64 = 120;
const DEADLINE_MS: f64 = 1000.0;

const FIELDS: &[&str] = &[
    "discipline",
    "capacity",
    "queue_ms",
    "max_wait_ms",
    "cheap_ms",
    "expensive_ms",
    "expensive_share",
    "critical_share",
    "overload",
    "seconds",
    "seed",
    "bucket_ms",
];

/// A run, read from the body.
#[derive(Debug)]
struct Setup {
    discipline: Option<Discipline>,
    capacity: f64,
    queue_ms: u64,
    max_wait_ms: u64,
    cheap_us: u64,
    expensive_us: u64,
    expensive_share: f64,
    critical_share: f64,
    overload: f64,
    seconds: u64,
    seed: u64,
    bucket_ms: u64,
}

impl Setup {
    fn mean_cost_ms(&self) -> f64 {
        ((1.0 - self.expensive_share) * self.cheap_us as f64
            + self.expensive_share * self.expensive_us as f64)
            / 1000.0
    }
}

pub(crate) fn number_in(
    m: &Map<String, Value>,
    key: &str,
    default: f64,
    (lo, hi): (f64, f64),
    issues: &mut Issues,
) -> f64 {
    let p = Path::root().key(key);
    match m.get(key) {
        None | Some(Value::Null) => default,
        Some(v) => match fields::number(v, &p, issues) {
            Some(x) if x.is_finite() && (lo..=hi).contains(&x) => x,
            Some(x) => {
                issues.push(&p, format!("{x} is out of range ({lo} to {hi})"));
                default
            }
            None => default,
        },
    }
}

pub(crate) fn count_in(
    m: &Map<String, Value>,
    key: &str,
    default: u64,
    (lo, hi): (u64, u64),
    issues: &mut Issues,
) -> u64 {
    let p = Path::root().key(key);
    match fields::count_or(m, key, default, &Path::root(), issues) {
        Some(n) if (lo..=hi).contains(&n) => n,
        Some(n) => {
            issues.push(&p, format!("{n} is out of range ({lo} to {hi})"));
            default
        }
        None => default,
    }
}

fn setup(v: &Value) -> Result<Setup, Vec<ConfigIssue>> {
    let mut issues = Issues::default();
    let root = Path::root();
    let Some(m) = fields::object(v, &root, &mut issues, "a throttler run", FIELDS) else {
        return Err(issues.into_vec());
    };
    let discipline = match m.get("discipline") {
        None | Some(Value::Null) => Some(Some(Discipline::Cost)),
        Some(d) => fields::one_of(
            d,
            &["qps", "cost", "none"],
            &root.key("discipline"),
            &mut issues,
        )
        .map(|d| match d {
            "qps" => Some(Discipline::Qps),
            "cost" => Some(Discipline::Cost),
            _ => None,
        }),
    };
    let s = Setup {
        discipline: discipline.unwrap_or(None),
        capacity: number_in(m, "capacity", 1000.0, (1.0, 100_000.0), &mut issues),
        queue_ms: count_in(m, "queue_ms", 100, (0, 1_000_000), &mut issues),
        max_wait_ms: count_in(m, "max_wait_ms", 200, (0, 60_000), &mut issues),
        cheap_us: (number_in(m, "cheap_ms", 1.0, (0.001, 10_000.0), &mut issues) * 1000.0).round()
            as u64,
        expensive_us: (number_in(m, "expensive_ms", 40.0, (0.001, 10_000.0), &mut issues) * 1000.0)
            .round() as u64,
        expensive_share: number_in(m, "expensive_share", 0.1, (0.0, 1.0), &mut issues),
        critical_share: number_in(m, "critical_share", 0.2, (0.0, 1.0), &mut issues),
        overload: number_in(m, "overload", 2.0, (0.05, 20.0), &mut issues),
        seconds: count_in(m, "seconds", 10, (1, MAX_SECONDS), &mut issues),
        seed: count_in(m, "seed", 1, (0, charon_core::MAX_COUNT), &mut issues),
        bucket_ms: count_in(m, "bucket_ms", 100, (10, 60_000), &mut issues),
    };
    if !issues.is_empty() {
        return Err(issues.into_vec());
    }
    let arrivals = s.overload * s.capacity / s.mean_cost_ms() * s.seconds as f64;
    if arrivals > MAX_ARRIVALS {
        issues.push(
            &root,
            format!(
                "about {arrivals:.0} arrivals; a run makes at most {MAX_ARRIVALS} (fewer seconds, a lower overload or a smaller capacity)"
            ),
        );
        return Err(issues.into_vec());
    }
    Ok(s)
}

/// A xorshift generator: the same seed gives the same run.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One bucket of the timeline.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct Bucket {
    t: u64,
    arrived: u64,
    started: u64,
    started_critical: u64,
    rejected: u64,
    rejected_critical: u64,
    evicted: u64,
    expired: u64,
    queue_length: usize,
    queue_units: f64,
    service_backlog_ms: f64,
}

#[derive(Debug, Clone, Copy)]
struct Request {
    arrived: f64,
    cost_us: u64,
    expensive: bool,
    critical: bool,
}

/// Runs a body: the JSON answer.
pub(crate) fn run(bytes: &[u8]) -> Result<Vec<u8>, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid(vec![ConfigIssue {
            path: String::new(),
            message: format!("not JSON: {e}"),
        }])
    })?;
    let s = setup(&v).map_err(ApiError::invalid)?;
    let answer = simulate(&s);
    serde_json::to_vec(&answer).map_err(|e| ApiError::Internal(e.to_string()))
}

/// The state of one run.
struct Sim<'a> {
    s: &'a Setup,
    machine: Option<Throttle>,
    requests: Vec<Request>,
    finishes: BinaryHeap<Reverse<(u64, usize)>>,
    /// When the service has worked off everything started, ms.
    service_free_at: f64,
    timeline: Vec<Bucket>,
    latencies: Vec<f64>,
    good_work_ms: f64,
    critical_sent: u64,
    critical_good: u64,
    admitted: u64,
    rejected: u64,
    evicted: u64,
    expired: u64,
    events: Vec<Event>,
}

impl Sim<'_> {
    fn bucket(&self, t: f64) -> usize {
        ((t.max(0.0) as u64) / self.s.bucket_ms).min(self.timeline.len() as u64 - 1) as usize
    }

    /// Request `i` starts at `at`: the service takes it after what it has.
    fn start(&mut self, i: usize, at: f64) {
        let r = self.requests[i];
        let begin = at.max(self.service_free_at);
        self.service_free_at = begin + r.cost_us as f64 / self.s.capacity;
        self.finishes
            .push(Reverse((self.service_free_at.ceil() as u64, i)));
        let b = self.bucket(at);
        self.timeline[b].started += 1;
        self.timeline[b].started_critical += u64::from(r.critical);
        self.admitted += 1;
    }

    /// The machine's own starts and expiries up to `t`.
    fn advance(&mut self, t: u64) {
        let Some(m) = self.machine.as_mut() else {
            return;
        };
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        m.advance_into(t, &mut events);
        for e in &events {
            match *e {
                Event::Started { id, at, .. } => self.start(id as usize, at as f64),
                Event::Expired { at, .. } => {
                    self.expired += 1;
                    let b = self.bucket(at as f64);
                    self.timeline[b].expired += 1;
                }
            }
        }
        self.events = events;
    }

    /// Everything up to `t`, in time order: finishes teach the estimates.
    fn run_until(&mut self, t: u64) {
        loop {
            match self.finishes.peek() {
                Some(&Reverse((at, i))) if at <= t => {
                    self.advance(at);
                    self.finishes.pop();
                    let r = self.requests[i];
                    let latency = at as f64 - r.arrived;
                    if latency <= DEADLINE_MS {
                        self.good_work_ms += r.cost_us as f64 / 1000.0;
                        self.critical_good += u64::from(r.critical);
                        self.latencies.push(latency);
                    }
                    if let Some(m) = self.machine.as_mut() {
                        m.record(class(r.expensive), r.cost_us);
                    }
                }
                _ => {
                    self.advance(t);
                    if self.finishes.peek().is_none_or(|f| f.0.0 > t) {
                        return;
                    }
                }
            }
        }
    }

    fn arrive(&mut self, t: f64, expensive: bool, critical: bool) {
        let now = t.floor() as u64;
        self.run_until(now);
        self.critical_sent += u64::from(critical);
        let i = self.requests.len();
        self.requests.push(Request {
            arrived: t,
            cost_us: if expensive {
                self.s.expensive_us
            } else {
                self.s.cheap_us
            },
            expensive,
            critical,
        });
        let b = self.bucket(t);
        self.timeline[b].arrived += 1;
        let Some(m) = self.machine.as_mut() else {
            self.start(i, t);
            self.timeline[b].service_backlog_ms = (self.service_free_at - t).max(0.0);
            return;
        };
        let crit = if critical {
            Criticality::Critical
        } else {
            Criticality::NotCritical
        };
        let a = m.arrive(now, i as u64, class(expensive), crit);
        let (len, units) = (m.queue_len(), m.queued_units());
        self.evicted += a.evicted.len() as u64;
        self.timeline[b].evicted += a.evicted.len() as u64;
        match a.admission {
            Admission::Started => self.start(i, t),
            Admission::Queued => {}
            Admission::Rejected { .. } => {
                self.rejected += 1;
                self.timeline[b].rejected += 1;
                self.timeline[b].rejected_critical += u64::from(critical);
            }
        }
        self.timeline[b].queue_length = len;
        self.timeline[b].queue_units = units;
        self.timeline[b].service_backlog_ms = (self.service_free_at - t).max(0.0);
    }
}

fn class(expensive: bool) -> &'static str {
    if expensive { "expensive" } else { "cheap" }
}

fn simulate(s: &Setup) -> Value {
    let mean = s.mean_cost_ms();
    let capacity_rps = s.capacity / mean;
    let config = s.discipline.map(|d| {
        let (rate, queue) = match d {
            Discipline::Qps => (
                capacity_rps.round().max(1.0) as u64,
                (s.queue_ms as f64 / mean).round() as u64,
            ),
            Discipline::Cost => (s.capacity.round().max(1.0) as u64, s.queue_ms),
        };
        let mut c = ThrottleConfig::new(d, rate, queue);
        c.max_wait = s.max_wait_ms;
        c.default_cost_us = (mean * 1000.0).round().max(1.0) as u64;
        c
    });
    let horizon = s.seconds * 1000;
    let buckets = horizon.div_ceil(s.bucket_ms) as usize;
    let mut sim = Sim {
        s,
        machine: config.clone().map(Throttle::new),
        requests: Vec::new(),
        finishes: BinaryHeap::new(),
        service_free_at: 0.0,
        timeline: (0..buckets)
            .map(|i| Bucket {
                t: i as u64 * s.bucket_ms,
                ..Bucket::default()
            })
            .collect(),
        latencies: Vec::new(),
        good_work_ms: 0.0,
        critical_sent: 0,
        critical_good: 0,
        admitted: 0,
        rejected: 0,
        evicted: 0,
        expired: 0,
        events: Vec::new(),
    };
    let mut rng = Rng(s.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let rate_per_ms = s.overload * capacity_rps / 1000.0;
    let mut t = 0.0f64;
    loop {
        t += -(1.0 - rng.next()).ln() / rate_per_ms;
        if t >= horizon as f64 {
            break;
        }
        let expensive = rng.next() < s.expensive_share;
        let critical = rng.next() < s.critical_share;
        sim.arrive(t, expensive, critical);
    }
    // What was started or queued by the end is worked off.
    sim.run_until(u64::MAX / 2);
    // Buckets without arrivals keep the last queue level seen.
    for i in 1..sim.timeline.len() {
        if sim.timeline[i].arrived == 0 {
            sim.timeline[i].queue_length = sim.timeline[i - 1].queue_length;
            sim.timeline[i].queue_units = sim.timeline[i - 1].queue_units;
        }
    }
    let mut latencies = std::mem::take(&mut sim.latencies);
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if latencies.is_empty() {
            Value::Null
        } else {
            json!(
                (latencies[((latencies.len() - 1) as f64 * p).round() as usize] * 10.0).round()
                    / 10.0
            )
        }
    };
    json!({
        "summary": {
            "discipline": s.discipline.map_or("none", Discipline::name),
            "rate": config.as_ref().map(|c| c.rate),
            "queue": config.as_ref().map(|c| c.queue),
            "capacity_rps": (capacity_rps * 10.0).round() / 10.0,
            "arrivals": sim.requests.len(),
            "admitted": sim.admitted,
            "rejected": sim.rejected,
            "evicted": sim.evicted,
            "expired": sim.expired,
            "goodput": (sim.good_work_ms / (s.seconds as f64 * s.capacity) * 1000.0).round() / 1000.0,
            "critical_success": if sim.critical_sent == 0 { Value::Null } else { json!((sim.critical_good as f64 / sim.critical_sent as f64 * 1000.0).round() / 1000.0) },
            "p50_ms": pct(0.5),
            "p99_ms": pct(0.99),
        },
        "timeline": sim.timeline,
    })
}
