//! The event-file runner behind `charon simulate`: events in, replies out,
//! on a virtual clock.
//!
//! The simulation runs the real limiter over the real in-memory store; only
//! the clock is virtual (set to each event's `t`), so what it prints is what
//! a server would have answered at those instants. Rules for odd input, all
//! answered with a client-error line and changing nothing:
//! - a line that is not a JSON object, a missing or ill-typed field, an
//!   unknown field, a negative, fractional or oversized number: checked by
//!   [`charon_core::fields`], as configuration files and the simulator API
//!   are, every problem of the line in the message (one a line, each as
//!   `field: problem`);
//! - a `t` earlier than the latest accepted `t` (the clock never goes back).
//!
//! A `request` is decided by [`Limiter::decide`], so buckets, windows and
//! queues answer with the reply context of SPEC §10 (`limit`, `remaining`,
//! `reset_after_ms`, `retry_after_ms`, `warning`, `banned`, `delay_ms` for
//! queues) while `kind: rate` keeps its tier reply. `"dry_run": true` on a
//! request and the ops `charge` and `refund` (`resource`, `domain`,
//! `copies`) are SPEC §10's dry run, charge and refund.
//!
//! Blank lines are not events and get no reply.
//!
//! With a `throttle:` section ([`Simulation::with_throttle`]), the ops
//! `arrive`, `finish` and `leave` drive the server throttler of SPEC §13
//! (see the `throttle` module): [`Simulation::lines`] answers a line with
//! every line it produces, the throttler's own events due by then first,
//! and [`Simulation::end`] writes what happens after the last event.

#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod redis;
mod waits;

use std::collections::HashMap;
use std::sync::Arc;

use charon_core::config::{Config, ConfigErrors};
use charon_core::copy::{CopyStatus, ReserveReply, Staged};
use charon_core::fields::{self, Issues, Path};
use charon_core::lease::LeaseReply;
use charon_core::meter;
use charon_core::rate::RateReply;
use charon_core::throttle::ThrottleConfig;
use charon_core::{ClientError, ManualClock};
use charon_limiter::{Decision, LimitError, Limiter, RequestOptions, Session};
use charon_store::{MemoryStore, Store};
use serde::Serialize;
use serde_json::Value;

mod event;
mod throttle;

use event::{Op, Parsed, amount, echo, read_event};

const DEFAULT_SESSION: &str = "default";

/// A running simulation: a limiter on a virtual clock, and named sessions.
#[derive(Debug)]
pub struct Simulation {
    clock: Arc<ManualClock>,
    limiter: Arc<Limiter>,
    sessions: HashMap<String, Session>,
    last_t: Option<u64>,
    throttler: Option<throttle::Throttler>,
    /// Transfer ids as shown (`t1`, `t2`, …) to the store's own, so that
    /// every store prints the same lines.
    transfer_ids: HashMap<String, String>,
    /// Reserves waiting for copies, and the instants time alone changes
    /// copies (see the `waits` module).
    waits: waits::Waits,
}

impl Simulation {
    /// A simulation of `config` in the in-memory store, starting with
    /// empty state at time 0.
    pub fn new(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new(0));
        let store = Arc::new(MemoryStore::with_sequential_ids(clock.clone()));
        Self::with_store(config, clock, store)
    }

    /// A simulation of `config` in `store`, which decides on `clock` (the
    /// Redis store of [`redis::RedisSimulation`], say).
    pub fn with_store(config: Config, clock: Arc<ManualClock>, store: Arc<dyn Store>) -> Self {
        Self {
            clock,
            limiter: Limiter::new(config, store),
            sessions: HashMap::new(),
            last_t: None,
            throttler: None,
            transfer_ids: HashMap::new(),
            waits: waits::Waits::default(),
        }
    }

    /// The same simulation with the server throttler of a `throttle:`
    /// section (SPEC §13), driven by `arrive`, `finish` and `leave`.
    pub fn with_throttle(mut self, throttle: Option<ThrottleConfig>) -> Self {
        self.throttler = throttle.map(throttle::Throttler::new);
        self
    }

    /// Answers one input line with every output line it makes, in time
    /// order: what the throttler did by itself up to the line's `t`, then
    /// the reply (an arrival's evictions after it). A blank line makes
    /// none; an event refused makes its error line alone and changes
    /// nothing.
    pub async fn lines(&mut self, line: &[u8]) -> Vec<Value> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Vec::new();
        }
        let v = match serde_json::from_slice::<Value>(line) {
            Ok(v) => v,
            Err(e) => {
                return vec![reply_value(&Reply::client_error(format!(
                    "not a JSON event: {e}"
                )))];
            }
        };
        let throttle_op = v
            .get("op")
            .and_then(Value::as_str)
            .is_some_and(|op| throttle::OPS.contains(&op));
        if throttle_op {
            return self.throttle_event(&v);
        }
        // What time did to copies before this event's instant comes
        // first (a deadline at the event's ms before the event).
        let mut waited = match read_event(&v) {
            Ok((t, _, _)) if self.last_t.is_none_or(|last| t >= last) => self.advance(t).await,
            _ => Vec::new(),
        };
        let reply = self.reply_to(&v).await;
        let mut lines = match (&reply.outcome, self.throttler.as_mut(), self.last_t) {
            (Outcome::Error { .. }, _, _) | (_, None, _) | (_, _, None) => Vec::new(),
            (_, Some(throttler), Some(t)) => throttler.advance(t),
        };
        lines.append(&mut waited);
        let decided = !matches!(reply.outcome, Outcome::Error { .. });
        if !matches!(reply.outcome, Outcome::Waiting) {
            lines.push(reply_value(&reply));
        }
        if let (true, Some(t)) = (decided, self.last_t) {
            lines.extend(self.collect(t, None).await);
        }
        lines
    }

    /// The lines after the last event: the throttler runs on until nothing
    /// waits (every queued request starts or expires), and so does every
    /// reserve waiting for copies (served, or rejected at its deadline).
    pub async fn end(&mut self) -> Vec<Value> {
        let mut lines = self.advance(u64::MAX).await;
        lines.extend(
            self.throttler
                .as_mut()
                .map(throttle::Throttler::drain)
                .unwrap_or_default(),
        );
        lines
    }

    fn throttle_event(&mut self, v: &Value) -> Vec<Value> {
        match self.try_throttle_event(v) {
            Ok(lines) => lines,
            Err(message) => {
                let op = v.get("op").cloned().unwrap_or(Value::Null);
                vec![reply_value(&Reply {
                    t: echo(v.get("t")),
                    op: echo(Some(&op)),
                    id: None,
                    outcome: Outcome::Error {
                        error: "client",
                        message,
                    },
                })]
            }
        }
    }

    fn try_throttle_event(&mut self, v: &Value) -> Result<Vec<Value>, String> {
        let root = Path::root();
        let mut issues = Issues::default();
        let Value::Object(m) = v else {
            return Err("expected an event (a mapping)".to_owned());
        };
        let op = m.get("op").and_then(Value::as_str).unwrap_or_default();
        fields::unknown_fields(m, &root, throttle::fields_of(op), &mut issues);
        let t = fields::required(m, "t", &root, &mut issues)
            .and_then(|t| fields::count(t, &root.key("t"), &mut issues));
        let parsed = throttle::read(op, m, &mut issues);
        let (Some(t), Some(parsed)) = (t, parsed) else {
            return Err(ConfigErrors(issues.into_vec()).to_string());
        };
        if !issues.is_empty() {
            return Err(ConfigErrors(issues.into_vec()).to_string());
        }
        if let Some(last) = self.last_t.filter(|&last| t < last) {
            return Err(format!(
                "t went backwards: {t} < {last}; the clock never goes back"
            ));
        }
        let Some(throttler) = self.throttler.as_mut() else {
            return Err(format!(
                "{op}: the configuration has no `throttle:` section"
            ));
        };
        throttler.check(t, &parsed)?;
        self.last_t = Some(t);
        let mut lines = throttler.advance(t);
        lines.extend(throttler.apply(t, parsed));
        Ok(lines)
    }

    /// The limiter being simulated (to swap its configuration, say).
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Answers one input line; `None` for a blank line.
    pub async fn line(&mut self, line: &[u8]) -> Option<Value> {
        Some(reply_value(&self.reply_to_line(line).await?))
    }

    /// Answers one input line, typed; `None` for a blank line.
    pub async fn reply_to_line(&mut self, line: &[u8]) -> Option<Reply> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(match serde_json::from_slice::<Value>(line) {
            Ok(v) => self.reply_to(&v).await,
            Err(e) => Reply::client_error(format!("not a JSON event: {e}")),
        })
    }

    /// Answers one event.
    pub async fn event(&mut self, v: &Value) -> Value {
        reply_value(&self.reply_to(v).await)
    }

    /// Answers one event, typed.
    pub async fn reply_to(&mut self, v: &Value) -> Reply {
        let (t, op, id) = match v {
            Value::Object(m) => (
                echo(m.get("t")),
                echo(m.get("op")),
                m.get("id").map(|id| echo(Some(id))),
            ),
            _ => (Value::Null, Value::Null, None),
        };
        self.waits.next_id.clone_from(&id);
        let outcome = match self.apply(v).await {
            Ok(outcome) => outcome,
            Err(Failure::Client(message)) => Outcome::Error {
                error: "client",
                message,
            },
            Err(Failure::Server(message)) => Outcome::Error {
                error: "server",
                message,
            },
        };
        Reply { t, op, id, outcome }
    }

    async fn apply(&mut self, v: &Value) -> Result<Outcome, Failure> {
        let (t, session, parsed) = read_event(v).map_err(|e| Failure::Client(e.to_string()))?;
        if let Some(last) = self.last_t.filter(|&last| t < last) {
            return Err(
                format!("t went backwards: {t} < {last}; the clock never goes back").into(),
            );
        }
        // Everything is checked before the clock moves: a bad event changes
        // nothing.
        let parsed = match parsed {
            Parsed::Request(resource, domain, copies, min, dry_run) => {
                Op::Request(resource, domain, amount(copies, min)?, dry_run)
            }
            Parsed::Reserve(resource, domain, copies, min, wait_ms) => {
                Op::Reserve(resource, domain, amount(copies, min)?, wait_ms)
            }
            Parsed::Op(op) => op,
        };
        match self.run(t, session, parsed).await {
            Ok(outcome) => {
                self.last_t = Some(t);
                Ok(outcome)
            }
            Err(LimitError::Client(e)) => Err(Failure::Client(e.to_string())),
            Err(LimitError::Server(e)) => Err(Failure::Server(e.to_string())),
        }
    }

    async fn run(&mut self, t: u64, session: String, op: Op) -> Result<Outcome, LimitError> {
        self.clock.set(t);
        if let Op::End = op {
            let released = match self.sessions.remove(&session) {
                Some(s) => s.end().await.map_err(|(e, _)| e)?,
                None => 0,
            };
            let left_waiting = self.waits.forget_session(&session);
            return Ok(Outcome::EndSession {
                session,
                released,
                left_waiting,
            });
        }
        match &op {
            Op::Request(resource, domain, amount, dry_run) => {
                let options = RequestOptions { dry_run: *dry_run };
                let decision = self
                    .limiter
                    .decide(resource, domain, *amount, options)
                    .await?;
                return Ok(outcome_of(decision));
            }
            Op::Charge(resource, domain, copies) => {
                let decision = self.limiter.charge(resource, domain, *copies).await?;
                return Ok(outcome_of(decision));
            }
            Op::Refund(resource, domain, copies) => {
                let decision = self.limiter.refund(resource, domain, *copies).await?;
                return Ok(outcome_of(decision));
            }
            Op::GetCapacity(client, ask) => {
                let replies = self
                    .limiter
                    .get_capacity(client, std::slice::from_ref(ask))
                    .await?;
                let reply = replies.into_iter().next().ok_or_else(|| {
                    LimitError::Server(charon_store::StoreError::BadData(
                        "no lease in the reply".into(),
                    ))
                })?;
                return Ok(Outcome::Lease {
                    resource: ask.resource.clone(),
                    reply,
                });
            }
            Op::ReleaseCapacity(client, resource) => {
                let released = self
                    .limiter
                    .release_capacity(client, std::slice::from_ref(resource))
                    .await?;
                return Ok(Outcome::Released {
                    released: released.first().copied().unwrap_or(false),
                });
            }
            _ => {}
        }
        let s = self
            .sessions
            .entry(session.clone())
            .or_insert_with(|| self.limiter.session());
        Ok(match op {
            Op::Reserve(resource, domain, amount, wait_ms) => {
                match s.join(&resource, &domain, amount, wait_ms).await? {
                    charon_limiter::Reserved::Now(reply) => Outcome::Reserve { reply, session },
                    charon_limiter::Reserved::Waiting(ticket) => {
                        self.waits.wait(ticket, session, t.saturating_add(wait_ms));
                        Outcome::Waiting
                    }
                }
            }
            Op::Release(hold, copies, result_ready) => Outcome::Release {
                status: s.release_ready(&hold, copies, result_ready).await?,
                session,
                released: copies,
            },
            Op::Transfer(hold, copies, ttl) => {
                let stored = s.transfer(&hold, copies, ttl).await?;
                self.waits.expires(t.saturating_add(ttl), &hold.resource);
                let shown = format!("t{}", self.transfer_ids.len() + 1);
                self.transfer_ids.insert(shown.clone(), stored);
                Outcome::Transfer {
                    transfer_id: shown,
                    session,
                    copies,
                }
            }
            Op::Seize(transfer_id) => {
                let stored = self
                    .transfer_ids
                    .get(&transfer_id)
                    .map_or(transfer_id.as_str(), String::as_str);
                // A refusal names the id as the event wrote it.
                let staged = s.seize(stored).await.map_err(|e| match e {
                    LimitError::Client(ClientError::UnknownTransfer(_)) => {
                        LimitError::Client(ClientError::UnknownTransfer(transfer_id.clone()))
                    }
                    other => other,
                })?;
                Outcome::Seize {
                    staged,
                    session,
                    transfer_id,
                }
            }
            Op::Request(..)
            | Op::Charge(..)
            | Op::Refund(..)
            | Op::GetCapacity(..)
            | Op::ReleaseCapacity(..)
            | Op::End => {
                unreachable!("answered above")
            }
        })
    }
}

/// The output of a rate-like decision: the tiers' own reply, or the reply
/// context of a bucket, window or queue as core serializes it.
fn outcome_of(decision: Decision) -> Outcome {
    match decision {
        Decision::Tiers(reply) => Outcome::Request(reply),
        Decision::Meter { reply, .. } => Outcome::Meter(reply),
    }
}

/// One output line of `charon simulate`: the event's `t` and `op` echoed,
/// then what it got.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reply {
    /// The event's `t` if it was a scalar, else null.
    pub t: Value,
    /// The event's `op` if it was a scalar, else null.
    pub op: Value,
    /// The event's `id` if it had one (a scalar, else null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// What the event got, its fields after `t` and `op`.
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl Reply {
    /// A client-error line for input that is not an event at all.
    pub fn client_error(message: String) -> Self {
        Self {
            t: Value::Null,
            op: Value::Null,
            id: None,
            outcome: Outcome::Error {
                error: "client",
                message,
            },
        }
    }
}

/// What an event got; each variant's fields follow `t` and `op` in the
/// order written here (SPEC §6 field names).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Outcome {
    /// `request` on `kind: rate`: the tiers' reply.
    Request(RateReply),
    /// `request`, `charge` or `refund` on a bucket, window or queue: the
    /// reply context of SPEC §10.
    Meter(meter::Reply),
    /// `reserve`.
    Reserve {
        /// The session that reserved.
        session: String,
        /// The store's reply.
        #[serde(flatten)]
        reply: ReserveReply,
    },
    /// `release`: the counts after it.
    Release {
        /// The session that released.
        session: String,
        /// Copies released.
        released: u64,
        /// The counts after the release.
        #[serde(flatten)]
        status: CopyStatus,
    },
    /// `transfer`.
    Transfer {
        /// The session the copies were staged from.
        session: String,
        /// The id to seize them by (`t1`, `t2`, … in a simulation).
        transfer_id: String,
        /// Copies staged.
        copies: u64,
    },
    /// `seize`: what was staged.
    Seize {
        /// The session that seized.
        session: String,
        /// The transfer seized.
        transfer_id: String,
        /// What was staged, now held by `session`.
        #[serde(flatten)]
        staged: Staged,
    },
    /// `get_capacity` (SPEC §12): the lease on the resource.
    Lease {
        /// The resource asked for.
        resource: String,
        /// The lease.
        #[serde(flatten)]
        reply: LeaseReply,
    },
    /// `release_capacity`: whether a lease (not lapsed) was given back.
    Released {
        /// Whether the client held a lease that had not lapsed.
        released: bool,
    },
    /// `end_session`: how many copies its end released.
    EndSession {
        /// The session that ended.
        session: String,
        /// Copies its end released.
        released: u64,
        /// Its reserves that were still waiting: they left the queue
        /// unanswered. In JSON only when there were any.
        #[serde(skip_serializing_if = "is_zero")]
        left_waiting: u64,
    },
    /// A reserve now waiting for copies: it gets its line when decided.
    #[serde(skip)]
    Waiting,
    /// `error` is `client` or `server`.
    Error {
        /// The class: `client` or `server`.
        error: &'static str,
        /// What was wrong, for a person.
        message: String,
    },
}

/// A reply as a JSON value (replies always encode).
fn reply_value(reply: &Reply) -> Value {
    serde_json::to_value(reply).unwrap_or_else(|e| {
        serde_json::json!({"t": null, "op": null, "error": "server", "message": format!("cannot encode the reply: {e}")})
    })
}

/// Why an event got an error line.
enum Failure {
    Client(String),
    Server(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Client(message)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
