//! The throttler's state machine (SPEC §13): a FIFO queue in front of a
//! leaky bucket over units, eviction by criticality, expiry and retry
//! times. Pure: the caller passes `now` (integer milliseconds, never going
//! back) and gets back what happened; the tower layer, `charon sidecar`,
//! `charon simulate` and the browser simulator all drive this one machine.
//!
//! **Exactness.** Units are counted in thousandths (a request of the `qps`
//! discipline is 1000; a cost is its predicted CPU-microseconds), so with
//! `rate` R units per second, `m` thousandths drain in exactly `m / R`
//! milliseconds. Time inside is kept in *ticks* of `1/R` ns, so F, the
//! time the bucket is empty, is an exact integer; a start at a fractional
//! millisecond is reported rounded up, and every wait told to a client is
//! rounded up (never too early).
//!
//! **Time.** SPEC §13 states the rules in milliseconds, and `charon
//! simulate` gives whole milliseconds ([`Throttle::arrive`],
//! [`Throttle::advance`]); a live throttler gives nanoseconds
//! ([`Throttle::arrive_ns`], [`Throttle::advance_into_ns`]), so that
//! requests arriving within one millisecond of a fast bucket are not held
//! to the next millisecond. Both feed the same rules.
//!
//! **Order at one instant.** What the machine does by itself (starts at
//! F, expiries at a deadline) at a time `t` happens before an event given
//! at `t` (an arrival, a departure). A head whose start time F is at or
//! before its deadline starts (a start at exactly `max_wait` after arrival
//! is in time).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::config::{Criticality, Discipline, ThrottleConfig};
use super::predictor::Predictor;
use crate::Millis;

/// A request's id, chosen by the caller (unique among requests queued).
pub type RequestId = u64;

/// Thousandths of a unit per unit.
const MILLI: u128 = 1000;

/// What an arrival got at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It starts now.
    Started,
    /// It waits in the queue; a [`Event::Started`], [`Event::Expired`] or
    /// eviction ([`Arrived::evicted`] of a later arrival) follows, unless
    /// its caller leaves first.
    Queued,
    /// Refused: the queue is full for it.
    Rejected {
        /// When an arrival like it would not be refused, if nothing else
        /// arrived.
        retry_after_ms: Millis,
    },
}

/// The answer to an arrival.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrived {
    /// Started, queued or rejected.
    pub admission: Admission,
    /// Whether it was counted under [`super::predictor::OTHER_CLASS`]
    /// (its own class was one too many) rather than its own class.
    pub other_class: bool,
    /// Its predicted cost at arrival, CPU-microseconds.
    pub predicted_us: u64,
    /// Queued `NOT_CRITICAL` requests it evicted, most recently queued
    /// first (each is rejected now).
    pub evicted: Vec<Evicted>,
}

/// A queued request evicted by a `CRITICAL` arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// Its id.
    pub id: RequestId,
    /// When an arrival like it would not be refused.
    pub retry_after_ms: Millis,
}

/// What happened to a queued request while time passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// It left the queue and starts.
    Started {
        /// Its id.
        id: RequestId,
        /// When, rounded up to the millisecond.
        at: Millis,
        /// When it arrived (its wait is `at - arrived`).
        arrived: Millis,
    },
    /// It waited `max_wait` without starting and is rejected.
    Expired {
        /// Its id.
        id: RequestId,
        /// Its deadline.
        at: Millis,
        /// When an arrival like it would start at once (queue and bucket
        /// empty) if nothing else arrived: it might wait in vain again if
        /// told only when it would be queued.
        retry_after_ms: Millis,
    },
}

/// Nanoseconds, the live throttler's clock.
pub type Nanos = u64;

/// Nanoseconds per millisecond.
const NS_PER_MS: u128 = 1_000_000;

/// A request waiting.
#[derive(Debug, Clone)]
struct Queued {
    id: RequestId,
    units: u128,
    /// In ns.
    arrived: u128,
    /// In ns.
    deadline: u128,
    criticality: Criticality,
}

/// The throttler's state.
#[derive(Debug, Clone)]
pub struct Throttle {
    config: ThrottleConfig,
    /// R, units per second: one tick is `1/R` ns.
    rate: u128,
    /// The most thousandths that may wait.
    bound: u128,
    /// F in ticks.
    f: u128,
    /// Waiting requests by arrival sequence (FIFO order).
    queue: BTreeMap<u64, Queued>,
    /// The sequences of queued `NOT_CRITICAL` requests.
    not_critical: BTreeSet<u64>,
    /// id → sequence, for departures.
    ids: HashMap<RequestId, u64>,
    /// Thousandths waiting.
    queued: u128,
    /// Thousandths of queued `NOT_CRITICAL` requests.
    queued_not_critical: u128,
    next_seq: u64,
    predictor: Predictor,
}

impl Throttle {
    /// An idle throttler (empty queue, empty bucket).
    pub fn new(config: ThrottleConfig) -> Self {
        let mut t = Self {
            rate: 1,
            bound: 0,
            f: 0,
            queue: BTreeMap::new(),
            not_critical: BTreeSet::new(),
            ids: HashMap::new(),
            queued: 0,
            queued_not_critical: 0,
            next_seq: 0,
            predictor: Predictor::default(),
            config: config.clone(),
        };
        t.rate = u128::from(config.rate.max(1));
        t.bound = u128::from(config.queue) * MILLI;
        t
    }

    /// The configuration in force.
    pub fn config(&self) -> &ThrottleConfig {
        &self.config
    }

    /// Puts a new configuration in force, keeping the queue, the bucket and
    /// the estimates: F is carried over to the new rate rounded up (never
    /// earlier), queued requests keep their units and get deadlines of the
    /// new `max_wait` from their arrival. A lower `queue` never evicts; it
    /// applies to arrivals.
    pub fn reconfigure(&mut self, config: ThrottleConfig) {
        let rate = u128::from(config.rate.max(1));
        self.f = (self.f * rate).div_ceil(self.rate);
        self.rate = rate;
        self.bound = u128::from(config.queue) * MILLI;
        for q in self.queue.values_mut() {
            q.deadline = q.arrived + u128::from(config.max_wait) * NS_PER_MS;
        }
        self.config = config;
    }

    /// Requests waiting.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Units waiting (requests, or predicted CPU-ms), exactly.
    pub fn queued_units(&self) -> f64 {
        self.queued as f64 / MILLI as f64
    }

    /// Whether `id` is waiting.
    pub fn is_queued(&self, id: RequestId) -> bool {
        self.ids.contains_key(&id)
    }

    /// The class `class` is counted under and its prediction now, in
    /// CPU-microseconds.
    pub fn predict(&self, class: &str) -> (String, u64) {
        let name = self.predictor.class_name(class);
        let cold = self.config.cold_cost_us(name);
        (name.to_owned(), self.predictor.predict_us(name, cold))
    }

    /// How many measurements `class` has taught its estimate.
    pub fn samples(&self, class: &str) -> u64 {
        self.predictor.samples(self.predictor.class_name(class))
    }

    /// Records a finished request's measured cost; returns its class's new
    /// estimate, CPU-microseconds.
    pub fn record(&mut self, class: &str, cpu_us: u64) -> u64 {
        self.predictor.record(class, cpu_us)
    }

    /// When [`Throttle::advance`] next has something to do (a start or an
    /// expiry), in ms rounded up; `None` with an empty queue.
    pub fn next_event(&self) -> Option<Millis> {
        self.next_event_at().map(|ns| clamp(ns.div_ceil(NS_PER_MS)))
    }

    /// [`Throttle::next_event`] in ns, rounded up.
    pub fn next_event_ns(&self) -> Option<Nanos> {
        self.next_event_at().map(clamp)
    }

    fn next_event_at(&self) -> Option<u128> {
        let head = self.queue.values().next()?;
        Some(if self.f <= self.ticks(head.deadline) {
            self.f.div_ceil(self.rate)
        } else {
            head.deadline
        })
    }

    /// Moves time to `now`: every start and expiry due by then, in time
    /// order.
    pub fn advance(&mut self, now: Millis) -> Vec<Event> {
        let mut events = Vec::new();
        self.advance_into(now, &mut events);
        events
    }

    /// [`Throttle::advance`] into a caller's buffer (no allocation when
    /// nothing is due).
    pub fn advance_into(&mut self, now: Millis, events: &mut Vec<Event>) {
        self.advance_at(u128::from(now) * NS_PER_MS, events);
    }

    /// [`Throttle::advance_into`] with `now` in ns.
    pub fn advance_into_ns(&mut self, now: Nanos, events: &mut Vec<Event>) {
        self.advance_at(u128::from(now), events);
    }

    fn advance_at(&mut self, now: u128, events: &mut Vec<Event>) {
        let now_ticks = self.ticks(now);
        while let Some((&seq, head)) = self.queue.first_key_value() {
            let deadline = head.deadline;
            if self.f <= self.ticks(deadline) {
                if self.f > now_ticks {
                    break;
                }
                let (id, arrived, units) = (head.id, clamp(head.arrived / NS_PER_MS), head.units);
                let at = self.ms_up(self.f);
                self.remove(seq);
                self.f += units * NS_PER_MS;
                events.push(Event::Started { id, at, arrived });
            } else {
                if deadline > now {
                    break;
                }
                let id = head.id;
                self.remove(seq);
                let retry_after_ms = self.until_idle(deadline);
                events.push(Event::Expired {
                    id,
                    at: clamp(deadline.div_ceil(NS_PER_MS)),
                    retry_after_ms,
                });
            }
        }
    }

    /// An arrival at `now` (call [`Throttle::advance`] to `now` first).
    /// `id` must not be waiting already.
    pub fn arrive(
        &mut self,
        now: Millis,
        id: RequestId,
        class: &str,
        criticality: Criticality,
    ) -> Arrived {
        self.arrive_at(u128::from(now) * NS_PER_MS, id, class, criticality)
    }

    /// [`Throttle::arrive`] with `now` in ns (call
    /// [`Throttle::advance_into_ns`] to `now` first).
    pub fn arrive_ns(
        &mut self,
        now: Nanos,
        id: RequestId,
        class: &str,
        criticality: Criticality,
    ) -> Arrived {
        self.arrive_at(u128::from(now), id, class, criticality)
    }

    fn arrive_at(
        &mut self,
        now: u128,
        id: RequestId,
        class: &str,
        criticality: Criticality,
    ) -> Arrived {
        let name = self.predictor.class_name(class);
        let other_class = name != class;
        let predicted_us = self
            .predictor
            .predict_us(name, self.config.cold_cost_us(name));
        let units = match self.config.discipline {
            Discipline::Qps => MILLI,
            Discipline::Cost => u128::from(predicted_us),
        };
        let now_ticks = self.ticks(now);
        let mut evicted = Vec::new();
        let admission = if self.queue.is_empty() && self.f <= now_ticks {
            self.f = now_ticks + units * NS_PER_MS;
            Admission::Started
        } else if self.queued + units <= self.bound {
            self.enqueue(now, id, units, criticality);
            Admission::Queued
        } else if criticality == Criticality::Critical
            && self.queued - self.queued_not_critical + units <= self.bound
        {
            let mut gone = Vec::new();
            while self.queued + units > self.bound {
                let Some(&seq) = self.not_critical.last() else {
                    break;
                };
                if let Some(q) = self.remove(seq) {
                    gone.push(q);
                }
            }
            self.enqueue(now, id, units, criticality);
            evicted = gone
                .into_iter()
                .map(|q| Evicted {
                    id: q.id,
                    retry_after_ms: self.retry_after(now, q.units),
                })
                .collect();
            Admission::Queued
        } else {
            Admission::Rejected {
                retry_after_ms: self.retry_after(now, units),
            }
        };
        Arrived {
            admission,
            other_class,
            predicted_us,
            evicted,
        }
    }

    /// The caller of a queued request went away: it leaves the queue and
    /// its units are given back. `false` if it was not waiting.
    pub fn leave(&mut self, id: RequestId) -> bool {
        match self.ids.get(&id) {
            Some(&seq) => self.remove(seq).is_some(),
            None => false,
        }
    }

    /// The wait from `now` until an arrival of `units` thousandths would
    /// not be refused if nothing else arrived: until the queued units plus
    /// its own fit in the queue, heads starting at F one after the other;
    /// or, for more units than the queue holds, until the queue is empty
    /// and the bucket too (when it would start at once). Rounded up.
    fn retry_after(&self, now: u128, units: u128) -> Millis {
        if units > self.bound {
            return self.until_idle(now);
        }
        let now_ticks = self.ticks(now);
        let at = {
            let need = (self.queued + units).saturating_sub(self.bound);
            let mut start = self.f;
            let mut freed = 0;
            for q in self.queue.values() {
                if freed >= need {
                    break;
                }
                freed += q.units;
                if freed >= need {
                    break;
                }
                start += q.units * NS_PER_MS;
            }
            if need == 0 { now_ticks } else { start }
        };
        self.ms_up(at.saturating_sub(now_ticks))
    }

    /// The wait from `now` until the queue is empty and the bucket too, if
    /// nothing else arrived (when an arrival would start at once), rounded
    /// up.
    fn until_idle(&self, now: u128) -> Millis {
        let now_ticks = self.ticks(now);
        self.ms_up(self.f.max(now_ticks) + self.queued * NS_PER_MS - now_ticks)
    }

    fn enqueue(&mut self, now: u128, id: RequestId, units: u128, criticality: Criticality) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queued += units;
        if criticality == Criticality::NotCritical {
            self.not_critical.insert(seq);
            self.queued_not_critical += units;
        }
        self.ids.insert(id, seq);
        self.queue.insert(
            seq,
            Queued {
                id,
                units,
                arrived: now,
                deadline: now + u128::from(self.config.max_wait) * NS_PER_MS,
                criticality,
            },
        );
    }

    fn remove(&mut self, seq: u64) -> Option<Queued> {
        let q = self.queue.remove(&seq)?;
        self.ids.remove(&q.id);
        self.queued -= q.units;
        if q.criticality == Criticality::NotCritical {
            self.not_critical.remove(&seq);
            self.queued_not_critical -= q.units;
        }
        Some(q)
    }

    fn ticks(&self, ns: u128) -> u128 {
        ns * self.rate
    }

    /// Ticks to milliseconds, rounded up.
    fn ms_up(&self, ticks: u128) -> Millis {
        clamp(ticks.div_ceil(self.rate * NS_PER_MS))
    }
}

/// A time or wait that fits in 64 bits (every one a configuration allows).
fn clamp(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}
