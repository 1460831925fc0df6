//! The throttler's events in `charon simulate` (SPEC §13): `arrive`,
//! `finish` and `leave` drive [`charon_core::throttle::Throttle`] on the
//! virtual clock, and what the throttler does by itself (a queued request
//! starting, expiring) is written as its own line at the time it happens,
//! before the reply to any later event.
//!
//! Lines:
//! - `arrive` answers `{"t", "id", "outcome": "started" | "queued" |
//!   "rejected", "predicted_ms", "retry_after_ms" (rejected only)}`, then
//!   one `{"t", "id", "outcome": "evicted", "retry_after_ms"}` per request
//!   it evicted, most recently queued first;
//! - later, `{"t", "id", "outcome": "started"}` when a queued request
//!   starts (`t` rounded up to the millisecond), `{"t", "id", "outcome":
//!   "expired", "retry_after_ms"}` when it waited `max_wait` in vain;
//! - `finish` answers `{"t", "id", "class", "predicted_ms"}`, the class's
//!   new estimate; `leave` answers `{"t", "id", "outcome": "left"}`.
//!
//! At the end of the input the throttler runs on until its queue is empty
//! (every request waiting starts or expires), so no line is lost.

use std::collections::HashMap;

use charon_core::fields::{self, Issues, Path};
use charon_core::throttle::{Admission, Criticality, Event, Throttle, ThrottleConfig};
use serde_json::{Map, Value, json};

/// The ops of the throttler.
pub(crate) const OPS: &[&str] = &["arrive", "finish", "leave"];

/// The fields each throttler op may have.
pub(crate) fn fields_of(op: &str) -> &'static [&'static str] {
    match op {
        "arrive" => &["t", "op", "id", "class", "critical"],
        "finish" => &["t", "op", "id", "cpu_ms"],
        _ => &["t", "op", "id"],
    }
}

/// The most CPU time one `finish` may report: an hour.
const MAX_CPU_MS: f64 = 3_600_000.0;

/// A throttler event, checked.
pub(crate) enum ThrottleOp {
    Arrive {
        id: String,
        class: String,
        critical: Option<bool>,
    },
    Finish {
        id: String,
        cpu_us: u64,
    },
    Leave {
        id: String,
    },
}

/// Reads the fields of a throttler op (the caller checked `t`, `op` and
/// unknown fields).
pub(crate) fn read(op: &str, m: &Map<String, Value>, issues: &mut Issues) -> Option<ThrottleOp> {
    let root = Path::root();
    let id = fields::required(m, "id", &root, issues)
        .and_then(|v| fields::string(v, &root.key("id"), issues));
    match op {
        "arrive" => {
            let class = fields::required(m, "class", &root, issues)
                .and_then(|v| fields::string(v, &root.key("class"), issues));
            let critical = match m.get("critical") {
                None | Some(Value::Null) => Some(None),
                Some(Value::Bool(b)) => Some(Some(*b)),
                Some(other) => {
                    issues.push(
                        &root.key("critical"),
                        format!("expected true or false, found {}", fields::describe(other)),
                    );
                    None
                }
            };
            Some(ThrottleOp::Arrive {
                id: id?,
                class: class?,
                critical: critical?,
            })
        }
        "finish" => {
            let p = root.key("cpu_ms");
            let cpu = fields::required(m, "cpu_ms", &root, issues)
                .and_then(|v| fields::number(v, &p, issues));
            let cpu_us = cpu.and_then(|ms| {
                if ms.is_finite() && (0.0..=MAX_CPU_MS).contains(&ms) {
                    // Whole microseconds, to the nearest.
                    Some((ms * 1000.0).round() as u64)
                } else {
                    issues.push(
                        &p,
                        format!("{ms} is not a CPU time from 0 to {MAX_CPU_MS} ms"),
                    );
                    None
                }
            });
            Some(ThrottleOp::Finish {
                id: id?,
                cpu_us: cpu_us?,
            })
        }
        _ => Some(ThrottleOp::Leave { id: id? }),
    }
}

/// Where a named request is.
enum Status {
    Queued,
    Running,
    Unknown,
}

/// The throttler of a simulation and the requests it knows by name.
#[derive(Debug)]
pub(crate) struct Throttler {
    machine: Throttle,
    /// Queued requests: machine id → (name, class).
    queued: HashMap<u64, (String, String)>,
    /// Queued requests by name → machine id.
    queued_names: HashMap<String, u64>,
    /// Started, not finished: name → class.
    running: HashMap<String, String>,
    next_id: u64,
    /// Time the machine was advanced to.
    now: u64,
    events: Vec<Event>,
}

impl Throttler {
    pub(crate) fn new(config: ThrottleConfig) -> Self {
        Self {
            machine: Throttle::new(config),
            queued: HashMap::new(),
            queued_names: HashMap::new(),
            running: HashMap::new(),
            next_id: 0,
            now: 0,
            events: Vec::new(),
        }
    }

    /// Checks `op` at `t` against the requests known then (after what the
    /// throttler does by itself up to `t`), without changing anything: the
    /// message of the client error it would be.
    pub(crate) fn check(&self, t: u64, op: &ThrottleOp) -> Result<(), String> {
        let (ThrottleOp::Arrive { id, .. }
        | ThrottleOp::Finish { id, .. }
        | ThrottleOp::Leave { id }) = op;
        let status = self.status_at(t, id);
        match (op, status) {
            (ThrottleOp::Arrive { .. }, Status::Queued | Status::Running) => {
                Err(format!("request {id:?} is already in the throttler"))
            }
            (ThrottleOp::Finish { .. }, Status::Queued) => {
                Err(format!("request {id:?} is queued; it has not started"))
            }
            (ThrottleOp::Finish { .. }, Status::Unknown) => {
                Err(format!("no request {id:?} is running"))
            }
            (ThrottleOp::Leave { .. }, Status::Unknown) => {
                Err(format!("no request {id:?} is queued or running"))
            }
            _ => Ok(()),
        }
    }

    /// Where request `name` will be at `t`: a queued one may start or
    /// expire by then (worked out on a copy of the machine, so nothing
    /// changes).
    fn status_at(&self, t: u64, name: &str) -> Status {
        if self.running.contains_key(name) {
            return Status::Running;
        }
        let Some(&n) = self.queued_names.get(name) else {
            return Status::Unknown;
        };
        let mut ahead = self.machine.clone();
        let started = ahead.advance(t).iter().find_map(|e| match *e {
            Event::Started { id, .. } if id == n => Some(true),
            Event::Expired { id, .. } if id == n => Some(false),
            _ => None,
        });
        match started {
            None => Status::Queued,
            Some(true) => Status::Running,
            Some(false) => Status::Unknown,
        }
    }

    /// The lines of what happened by itself up to `t`, in time order.
    pub(crate) fn advance(&mut self, t: u64) -> Vec<Value> {
        self.now = self.now.max(t);
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        self.machine.advance_into(t, &mut events);
        let lines = events.iter().filter_map(|e| self.line_of(*e)).collect();
        self.events = events;
        lines
    }

    /// Runs on until nothing waits: the lines of the end of the input.
    pub(crate) fn drain(&mut self) -> Vec<Value> {
        let mut lines = Vec::new();
        while let Some(t) = self.machine.next_event() {
            lines.extend(self.advance(t));
        }
        lines
    }

    fn line_of(&mut self, event: Event) -> Option<Value> {
        match event {
            Event::Started { id, at, .. } => {
                let (name, class) = self.forget(id)?;
                let line = json!({"t": at, "id": name, "outcome": "started"});
                self.running.insert(name, class);
                Some(line)
            }
            Event::Expired {
                id,
                at,
                retry_after_ms,
            } => {
                let (name, _) = self.forget(id)?;
                Some(
                    json!({"t": at, "id": name, "outcome": "expired", "retry_after_ms": retry_after_ms}),
                )
            }
        }
    }

    fn forget(&mut self, id: u64) -> Option<(String, String)> {
        let (name, class) = self.queued.remove(&id)?;
        self.queued_names.remove(&name);
        Some((name, class))
    }

    /// Applies a checked op at `t` (advanced to already): its lines.
    pub(crate) fn apply(&mut self, t: u64, op: ThrottleOp) -> Vec<Value> {
        match op {
            ThrottleOp::Arrive {
                id,
                class,
                critical,
            } => {
                let criticality = match critical {
                    None => self.machine.config().default_criticality,
                    Some(true) => Criticality::Critical,
                    Some(false) => Criticality::NotCritical,
                };
                self.next_id += 1;
                let n = self.next_id;
                let a = self.machine.arrive(t, n, &class, criticality);
                let predicted_ms = ms(a.predicted_us);
                let mut lines = vec![match a.admission {
                    Admission::Started => {
                        json!({"t": t, "id": id, "outcome": "started", "predicted_ms": predicted_ms})
                    }
                    Admission::Queued => {
                        json!({"t": t, "id": id, "outcome": "queued", "predicted_ms": predicted_ms})
                    }
                    Admission::Rejected { retry_after_ms } => json!({
                        "t": t, "id": id, "outcome": "rejected",
                        "predicted_ms": predicted_ms, "retry_after_ms": retry_after_ms
                    }),
                }];
                let class = if a.other_class {
                    charon_core::throttle::predictor::OTHER_CLASS.to_owned()
                } else {
                    class
                };
                match a.admission {
                    Admission::Started => {
                        self.running.insert(id, class);
                    }
                    Admission::Queued => {
                        self.queued_names.insert(id.clone(), n);
                        self.queued.insert(n, (id, class));
                    }
                    Admission::Rejected { .. } => {}
                }
                for e in a.evicted {
                    if let Some((name, _)) = self.forget(e.id) {
                        lines.push(json!({
                            "t": t, "id": name, "outcome": "evicted",
                            "retry_after_ms": e.retry_after_ms
                        }));
                    }
                }
                lines
            }
            ThrottleOp::Finish { id, cpu_us } => {
                let class = self.running.remove(&id).unwrap_or_default();
                let estimate = self.machine.record(&class, cpu_us);
                vec![json!({"t": t, "id": id, "class": class, "predicted_ms": ms(estimate)})]
            }
            ThrottleOp::Leave { id } => {
                if let Some(n) = self.queued_names.remove(&id) {
                    self.queued.remove(&n);
                    self.machine.leave(n);
                } else {
                    self.running.remove(&id);
                }
                vec![json!({"t": t, "id": id, "outcome": "left"})]
            }
        }
    }
}

/// CPU-microseconds as milliseconds (exact to the microsecond).
fn ms(us: u64) -> Value {
    json!(us as f64 / 1000.0)
}
