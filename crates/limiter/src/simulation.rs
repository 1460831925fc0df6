//! `charon simulate`: events in, replies out, on a virtual clock.
//!
//! The simulation runs the real limiter over the real in-memory store; only
//! the clock is virtual (set to each event's `t`), so what it prints is what
//! a server would have answered at those instants. Rules for odd input, all
//! answered with a client-error line and changing nothing:
//! - a line that is not a JSON object, a missing or ill-typed field, an
//!   unknown field, a negative, fractional or oversized number;
//! - a `t` earlier than the latest accepted `t` (the clock never goes back).
//!
//! Blank lines are not events and get no reply.

use std::collections::HashMap;
use std::sync::Arc;

use charon_core::config::Config;
use charon_core::copy::{CopyStatus, Hold, ReserveReply, Staged};
use charon_core::rate::RateReply;
use charon_core::request::Amount;
use charon_core::{ClientError, MAX_COUNT, ManualClock};
use charon_store::MemoryStore;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::{LimitError, Limiter, Session};

const DEFAULT_SESSION: &str = "default";

/// A running simulation: a limiter on a virtual clock, and named sessions.
#[derive(Debug)]
pub struct Simulation {
    clock: Arc<ManualClock>,
    limiter: Arc<Limiter>,
    sessions: HashMap<String, Session>,
    last_t: Option<u64>,
}

impl Simulation {
    /// A simulation of `config`, starting with empty state at time 0.
    pub fn new(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new(0));
        let store = Arc::new(MemoryStore::with_sequential_ids(clock.clone()));
        Self {
            clock,
            limiter: Limiter::new(config, store),
            sessions: HashMap::new(),
            last_t: None,
        }
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
        let (t, op) = match v {
            Value::Object(m) => (echo(m.get("t")), echo(m.get("op"))),
            _ => (Value::Null, Value::Null),
        };
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
        Reply { t, op, outcome }
    }

    async fn apply(&mut self, v: &Value) -> Result<Outcome, Failure> {
        let Value::Object(m) = v else {
            return Err("an event must be a JSON object".into());
        };
        let op = match m.get("op") {
            Some(Value::String(op)) => op.as_str(),
            Some(_) => return Err("op must be a string".into()),
            None => return Err("op is required".into()),
        };
        let allowed: &[&str] = match op {
            "request" => &["resource", "domain", "copies", "min_copies", "session"],
            "reserve" => &["resource", "domain", "copies", "min_copies", "session"],
            "release" => &["resource", "domain", "copies", "groups", "session"],
            "transfer" => &[
                "resource", "domain", "copies", "groups", "ttl_ms", "session",
            ],
            "seize" => &["transfer_id", "session"],
            "end_session" => &["session"],
            other => {
                return Err(format!(
                    "unknown op {other:?} (expected request, reserve, release, transfer, seize or end_session)"
                )
                .into());
            }
        };
        for key in m.keys() {
            if key != "t" && key != "op" && !allowed.contains(&key.as_str()) {
                return Err(format!("unknown field {key:?} for op {op}").into());
            }
        }
        let t = count(m, "t")?.ok_or("t is required")?;
        if let Some(last) = self.last_t.filter(|&last| t < last) {
            return Err(
                format!("t went backwards: {t} < {last}; the clock never goes back").into(),
            );
        }
        let ev = Fields(m);
        let session = ev.string_or("session", DEFAULT_SESSION)?;
        // Everything is parsed before the clock moves: a bad event changes
        // nothing.
        let parsed = match op {
            "request" => Op::Request(ev.string("resource")?, ev.string("domain")?, ev.amount()?),
            "reserve" => Op::Reserve(ev.string("resource")?, ev.string("domain")?, ev.amount()?),
            "release" => Op::Release(ev.hold()?, ev.count_or("copies", 1)?),
            "transfer" => Op::Transfer(
                ev.hold()?,
                ev.count_or("copies", 1)?,
                count(m, "ttl_ms")?.ok_or("ttl_ms is required")?,
            ),
            "seize" => Op::Seize(ev.string("transfer_id")?),
            _ => Op::End,
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
            return Ok(Outcome::EndSession { session, released });
        }
        if let Op::Request(resource, domain, amount) = &op {
            let reply = self.limiter.request(resource, domain, *amount).await?;
            return Ok(Outcome::Request(reply));
        }
        let s = self
            .sessions
            .entry(session.clone())
            .or_insert_with(|| self.limiter.session());
        Ok(match op {
            Op::Reserve(resource, domain, amount) => Outcome::Reserve {
                reply: s.reserve(&resource, &domain, amount).await?,
                session,
            },
            Op::Release(hold, copies) => Outcome::Release {
                status: s.release(&hold, copies).await?,
                session,
                released: copies,
            },
            Op::Transfer(hold, copies, ttl) => Outcome::Transfer {
                transfer_id: s.transfer(&hold, copies, ttl).await?,
                session,
                copies,
            },
            Op::Seize(transfer_id) => Outcome::Seize {
                staged: s.seize(&transfer_id).await?,
                session,
                transfer_id,
            },
            Op::Request(..) | Op::End => unreachable!("answered above"),
        })
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
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl Reply {
    /// A client-error line for input that is not an event at all.
    pub fn client_error(message: String) -> Self {
        Self {
            t: Value::Null,
            op: Value::Null,
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
    /// `request`: the rate reply.
    Request(RateReply),
    /// `reserve`.
    Reserve {
        session: String,
        #[serde(flatten)]
        reply: ReserveReply,
    },
    /// `release`: the counts after it.
    Release {
        session: String,
        released: u64,
        #[serde(flatten)]
        status: CopyStatus,
    },
    /// `transfer`.
    Transfer {
        session: String,
        transfer_id: String,
        copies: u64,
    },
    /// `seize`: what was staged.
    Seize {
        session: String,
        transfer_id: String,
        #[serde(flatten)]
        staged: Staged,
    },
    /// `end_session`: how many copies its end released.
    EndSession { session: String, released: u64 },
    /// `error` is `client` or `server`.
    Error {
        error: &'static str,
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

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Failure::Client(message.to_owned())
    }
}

enum Op {
    Request(String, String, Amount),
    Reserve(String, String, Amount),
    Release(Hold, u64),
    Transfer(Hold, u64, u64),
    Seize(String),
    End,
}

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn string(&self, key: &str) -> Result<String, String> {
        match self.0.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!("{key} must be a string, not {other}")),
            None => Err(format!("{key} is required")),
        }
    }

    fn string_or(&self, key: &str, default: &str) -> Result<String, String> {
        match self.0.get(key) {
            None => Ok(default.to_owned()),
            Some(_) => self.string(key),
        }
    }

    fn count_or(&self, key: &str, default: u64) -> Result<u64, String> {
        Ok(count(self.0, key)?.unwrap_or(default))
    }

    fn amount(&self) -> Result<Amount, String> {
        let copies = self.count_or("copies", 1)?;
        let min = self.count_or("min_copies", 1)?;
        Amount::new(copies, min).map_err(|e: ClientError| e.to_string())
    }

    fn hold(&self) -> Result<Hold, String> {
        let groups = match self.0.get("groups") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|g| match g {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(format!("groups must be a list of strings, not {other}")),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(format!("groups must be a list of strings, not {other}")),
        };
        Ok(Hold::new(
            self.string("resource")?,
            self.string("domain")?,
            groups,
        ))
    }
}

/// A non-negative whole number no larger than [`MAX_COUNT`], if present.
fn count(m: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match m.get(key) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v <= MAX_COUNT => Ok(Some(v)),
            Some(_) => Err(format!("{key} is too large (at most {MAX_COUNT})")),
            None if n.as_i64().is_some() || n.as_f64().is_some_and(|f| f < 0.0) => {
                Err(format!("{key} must not be negative"))
            }
            None if n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                Err(format!("{key} is too large (at most {MAX_COUNT})"))
            }
            None => Err(format!("{key} must be a whole number")),
        },
        Some(other) => Err(format!("{key} must be a number, not {other}")),
    }
}

/// What to echo for `t` or `op` in a reply: the value given if it is a
/// scalar, else null.
fn echo(v: Option<&Value>) -> Value {
    match v {
        Some(v @ (Value::Number(_) | Value::String(_) | Value::Bool(_))) => v.clone(),
        _ => Value::Null,
    }
}
