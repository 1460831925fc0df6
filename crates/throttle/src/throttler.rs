//! The throttler shared by every clone of the layer: the core state
//! machine behind a mutex, the requests waiting for their turn, and one
//! timer task that starts them (or expires them) when their time comes.
//!
//! Time is the nanoseconds since the throttler was made, from tokio's
//! clock (so tests may pause it). Everything the machine decides happens
//! inside the lock and costs no allocation on the path of a request that
//! starts at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use charon_core::throttle::{Admission, Criticality, Event, Throttle, ThrottleConfig};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::metrics::{ClassCounters, Counters, Outcome};
use crate::reject::{Reason, Rejection};

/// What a queued request is told when its turn comes (or does not).
#[derive(Debug)]
enum Wake {
    Started,
    Rejected(Rejection),
}

#[derive(Debug)]
struct Waiter {
    tx: oneshot::Sender<Wake>,
    criticality: Criticality,
}

#[derive(Debug)]
struct State {
    machine: Throttle,
    waiters: HashMap<u64, Waiter>,
    events: Vec<Event>,
    classes: HashMap<String, ClassCounters>,
}

/// The shared part.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    base: Instant,
    wake: Notify,
    next_id: AtomicU64,
    counters: Counters,
}

/// The throttler of one service (SPEC §13). Cheap to share: the layer
/// holds it in an `Arc`.
#[derive(Debug)]
pub struct Throttler {
    shared: Arc<Shared>,
    driver: Mutex<Option<JoinHandle<()>>>,
}

/// After a class has this many measurements, one request in
/// [`MEASURE_EVERY`] is measured: reading a thread's CPU clock is a system
/// call (no vDSO), the largest part of what the layer costs a request.
pub const MEASURE_ALL_UNTIL: u64 = charon_core::throttle::predictor::WINDOW;

/// See [`MEASURE_ALL_UNTIL`].
pub const MEASURE_EVERY: u64 = 4;

/// A request admitted (started): what its finish reports.
#[derive(Debug)]
pub struct Ticket {
    /// Whether its cost is measured (every request of a class until it has
    /// [`MEASURE_ALL_UNTIL`] measurements, then one in [`MEASURE_EVERY`]).
    pub measure: bool,
    /// The class it was counted under.
    pub class: String,
    /// Its predicted cost, CPU-microseconds.
    pub predicted_us: u64,
    /// Its criticality.
    pub criticality: Criticality,
}

impl Throttler {
    /// A throttler idle at its start.
    pub fn new(config: ThrottleConfig) -> Self {
        let discipline = config.discipline;
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    machine: Throttle::new(config),
                    waiters: HashMap::new(),
                    events: Vec::new(),
                    classes: HashMap::new(),
                }),
                base: Instant::now(),
                wake: Notify::new(),
                next_id: AtomicU64::new(0),
                counters: Counters::new(discipline),
            }),
            driver: Mutex::new(None),
        }
    }

    /// Puts `config` in force, keeping the queue, the bucket and the
    /// estimates ([`Throttle::reconfigure`]).
    pub fn reconfigure(&self, config: ThrottleConfig) {
        let mut state = self.shared.lock();
        state.machine.reconfigure(config);
        drop(state);
        self.shared.wake.notify_one();
    }

    /// The configuration in force.
    pub fn config(&self) -> ThrottleConfig {
        self.shared.lock().machine.config().clone()
    }

    /// The class `class` is counted under and its prediction now,
    /// CPU-microseconds.
    pub fn estimate(&self, class: &str) -> (String, u64) {
        self.shared.lock().machine.predict(class)
    }

    /// Requests waiting and their units (requests, or predicted CPU-ms).
    pub fn queue(&self) -> (usize, f64) {
        let state = self.shared.lock();
        (state.machine.queue_len(), state.machine.queued_units())
    }

    /// Decides a request of `class` and `criticality`: `Ok` once it may
    /// start (at once, or after waiting its turn), `Err` with when to come
    /// back. A caller that drops the future while it waits leaves the queue
    /// at once, its units given back.
    pub async fn admit(
        &self,
        class: String,
        criticality: Criticality,
    ) -> Result<Ticket, Rejection> {
        let shared = &self.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (arrived, rx, measure) = {
            let mut state = shared.lock();
            let now = shared.now();
            shared.advance(&mut state, now);
            let arrived = state.machine.arrive_ns(now, id, &class, criticality);
            let measure = id.is_multiple_of(MEASURE_EVERY)
                || state.machine.samples(&class) < MEASURE_ALL_UNTIL;
            let rx = match arrived.admission {
                Admission::Queued => {
                    let (tx, rx) = oneshot::channel();
                    state.waiters.insert(id, Waiter { tx, criticality });
                    Some(rx)
                }
                _ => None,
            };
            for e in &arrived.evicted {
                if let Some(w) = state.waiters.remove(&e.id) {
                    shared.counters.outcome(w.criticality, Outcome::Evicted);
                    let _ = w.tx.send(Wake::Rejected(Rejection {
                        reason: Reason::Evicted,
                        retry_after_ms: e.retry_after_ms.max(1),
                    }));
                }
            }
            shared.counters.queue(&state.machine);
            (arrived, rx, measure)
        };
        let ticket = Ticket {
            measure,
            class: if arrived.other_class {
                charon_core::throttle::predictor::OTHER_CLASS.to_owned()
            } else {
                class
            },
            predicted_us: arrived.predicted_us,
            criticality,
        };
        match arrived.admission {
            Admission::Started => {
                shared.counters.outcome(criticality, Outcome::Admitted);
                Ok(ticket)
            }
            Admission::Rejected { retry_after_ms } => {
                shared
                    .counters
                    .outcome(criticality, Outcome::Rejected(Reason::QueueFull));
                Err(Rejection {
                    reason: Reason::QueueFull,
                    retry_after_ms: retry_after_ms.max(1),
                })
            }
            Admission::Queued => {
                shared.counters.outcome(criticality, Outcome::Queued);
                self.ensure_driver();
                shared.wake.notify_one();
                let waiting = Waiting {
                    shared,
                    id,
                    criticality,
                    done: false,
                };
                let queued_at = Instant::now();
                let wake = rx.map(|rx| waiting.wait(rx));
                let wake = match wake {
                    Some(w) => w.await,
                    None => Wake::Started,
                };
                match wake {
                    Wake::Started => {
                        shared.counters.waited(criticality, queued_at.elapsed());
                        shared.counters.outcome(criticality, Outcome::Admitted);
                        Ok(ticket)
                    }
                    Wake::Rejected(r) => Err(r),
                }
            }
        }
    }

    /// Reports a finished request's measured cost: its class learns it.
    pub fn finish(&self, ticket: &Ticket, cost: Duration) {
        let cost_us = u64::try_from(cost.as_micros()).unwrap_or(u64::MAX);
        let mut state = self.shared.lock();
        let estimate = state.machine.record(&ticket.class, cost_us);
        // The class's counters, made at its first finish (classes are
        // bounded by the predictor).
        let counters = match state.classes.get(&ticket.class) {
            Some(c) => c,
            None => state
                .classes
                .entry(ticket.class.clone())
                .or_insert_with(|| ClassCounters::new(&ticket.class)),
        };
        counters.finished(ticket.predicted_us, cost_us, estimate);
    }

    /// Counts a request rejected before the queue (per-client limits).
    pub fn rejected_before_queue(&self, criticality: Criticality, reason: Reason) {
        self.shared
            .counters
            .outcome(criticality, Outcome::Rejected(reason));
    }

    fn ensure_driver(&self) {
        let mut driver = self
            .driver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if driver.as_ref().is_some_and(|d| !d.is_finished()) {
            return;
        }
        let shared = self.shared.clone();
        *driver = Some(tokio::spawn(async move { shared.drive().await }));
    }
}

impl Drop for Throttler {
    fn drop(&mut self) {
        if let Some(d) = self
            .driver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            d.abort();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent machine (every
        // change is made before anything that can panic); go on with it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves the machine to `now` and tells the waiters what happened.
    fn advance(&self, state: &mut State, now: u64) {
        let mut events = std::mem::take(&mut state.events);
        events.clear();
        state.machine.advance_into_ns(now, &mut events);
        for e in &events {
            match *e {
                Event::Started { id, .. } => {
                    if let Some(w) = state.waiters.remove(&id) {
                        let _ = w.tx.send(Wake::Started);
                    }
                }
                Event::Expired {
                    id, retry_after_ms, ..
                } => {
                    if let Some(w) = state.waiters.remove(&id) {
                        self.counters.outcome(w.criticality, Outcome::Expired);
                        let _ = w.tx.send(Wake::Rejected(Rejection {
                            reason: Reason::Expired,
                            retry_after_ms: retry_after_ms.max(1),
                        }));
                    }
                }
            }
        }
        if !events.is_empty() {
            self.counters.queue(&state.machine);
        }
        state.events = events;
    }

    /// The timer: wakes at the machine's next event (or when a request is
    /// queued) and advances it.
    async fn drive(self: Arc<Self>) {
        loop {
            let next = {
                let mut state = self.lock();
                let now = self.now();
                self.advance(&mut state, now);
                state.machine.next_event_ns()
            };
            let notified = self.wake.notified();
            match next {
                Some(ns) => {
                    let at = self.base + Duration::from_nanos(ns);
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

/// A request in the queue; dropping it before its turn (its caller went
/// away) takes it out of the queue.
struct Waiting<'a> {
    shared: &'a Shared,
    id: u64,
    criticality: Criticality,
    done: bool,
}

impl Waiting<'_> {
    async fn wait(mut self, rx: oneshot::Receiver<Wake>) -> Wake {
        let wake = rx.await.unwrap_or(Wake::Started);
        self.done = true;
        wake
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.shared.lock();
        state.waiters.remove(&self.id);
        if state.machine.leave(self.id) {
            self.shared
                .counters
                .outcome(self.criticality, Outcome::Left);
            self.shared.counters.queue(&state.machine);
        }
    }
}
