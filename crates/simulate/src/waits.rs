//! Reserves that wait for copies (SPEC §14) on the virtual clock.
//!
//! A waiting reserve gets its line when it is decided: at the event that
//! serves it, or at its deadline. Between events, time alone changes
//! copies at two kinds of instants, which the simulation visits in order
//! before an event at a later (or the same) ms: a waiter's deadline, and a
//! staged transfer's expiry (its copies come back and the queue is
//! served). At one instant the lines are: what triggered it (the event's
//! own reply, or the rejections of the waiters whose deadline it is), then
//! the waiters it served, in queue order.

use std::collections::BTreeSet;

use charon_limiter::{LimitError, Ticket};
use serde_json::Value;

use crate::{Outcome, Reply, Simulation, reply_value};

/// A reserve waiting for copies.
#[derive(Debug)]
struct Pending {
    ticket: Ticket,
    session: String,
    deadline: u64,
    id: Option<Value>,
}

/// The reserves waiting, in arrival order, and the instants staged
/// transfers expire.
#[derive(Debug, Default)]
pub(crate) struct Waits {
    pending: Vec<Pending>,
    expiries: BTreeSet<(u64, String)>,
    /// The `id` of the event being applied.
    pub(crate) next_id: Option<Value>,
}

impl Waits {
    /// A reserve of `session` now waiting until `deadline`.
    pub(crate) fn wait(&mut self, ticket: Ticket, session: String, deadline: u64) {
        self.pending.push(Pending {
            ticket,
            session,
            deadline,
            id: self.next_id.take(),
        });
    }

    /// Copies of `resource` staged until `at`.
    pub(crate) fn expires(&mut self, at: u64, resource: &str) {
        self.expiries.insert((at, resource.to_owned()));
    }

    /// Forgets the waiters of an ended session (it took them out of their
    /// queues); returns how many there were.
    pub(crate) fn forget_session(&mut self, session: &str) -> u64 {
        let before = self.pending.len();
        self.pending.retain(|p| p.session != session);
        (before - self.pending.len()) as u64
    }

    /// The next instant at or before `t` when time alone changes copies.
    fn next(&self, t: u64) -> Option<u64> {
        let deadline = self.pending.iter().map(|p| p.deadline).min();
        let expiry = self.expiries.first().map(|(at, _)| *at);
        deadline.into_iter().chain(expiry).min().filter(|&x| x <= t)
    }
}

impl Simulation {
    /// Visits every instant up to `t` at which time alone changes copies,
    /// in order, and returns the lines they make.
    pub(crate) async fn advance(&mut self, t: u64) -> Vec<Value> {
        let mut lines = Vec::new();
        while let Some(x) = self.waits.next(t) {
            self.clock.set(x);
            self.last_t = Some(self.last_t.map_or(x, |last| last.max(x)));
            let mut resources: Vec<String> = self
                .waits
                .pending
                .iter()
                .filter(|p| p.deadline == x)
                .map(|p| p.ticket.resource.clone())
                .collect();
            while let Some((at, _)) = self.waits.expiries.first()
                && *at == x
            {
                let (_, r) = self.waits.expiries.pop_first().expect("looked at");
                resources.push(r);
            }
            for r in resources {
                if let Err(e) = self.limiter.store().tick(&r).await {
                    lines.push(error_line(x, None, &LimitError::Server(e)));
                }
            }
            lines.extend(self.collect(x, Some(x)).await);
        }
        lines
    }

    /// The lines of the waiters decided by now (`t`): with `deadline`, the
    /// waiters rejected at that deadline first, then the others in queue
    /// order.
    pub(crate) async fn collect(&mut self, t: u64, deadline: Option<u64>) -> Vec<Value> {
        let mut lines = Vec::new();
        let mut first = Vec::new();
        let mut i = 0;
        while let Some(p) = self.waits.pending.get(i) {
            let Some(session) = self.sessions.get_mut(&p.session) else {
                i += 1;
                continue;
            };
            let ticket = p.ticket.clone();
            let answer = session.poll_wait(&ticket).await;
            if let Ok(None) = answer {
                i += 1;
                continue;
            }
            let p = self.waits.pending.remove(i);
            let line = match answer {
                Ok(Some(reply)) => {
                    let at_deadline =
                        deadline == Some(p.deadline) && reply.granted == 0 && !reply.result_ready;
                    let line = reply_value(&Reply {
                        t: t.into(),
                        op: "reserve".into(),
                        id: p.id,
                        outcome: Outcome::Reserve {
                            session: p.session,
                            reply,
                        },
                    });
                    if at_deadline {
                        first.push(line);
                        continue;
                    }
                    line
                }
                Err(e) => error_line(t, p.id, &e),
                Ok(None) => unreachable!("kept above"),
            };
            lines.push(line);
        }
        first.append(&mut lines);
        first
    }
}

/// The line of a waiter that could not be followed up.
fn error_line(t: u64, id: Option<Value>, e: &LimitError) -> Value {
    let (error, message) = match e {
        LimitError::Client(e) => ("client", e.to_string()),
        LimitError::Server(e) => ("server", e.to_string()),
    };
    reply_value(&Reply {
        t: t.into(),
        op: "reserve".into(),
        id,
        outcome: Outcome::Error { error, message },
    })
}
