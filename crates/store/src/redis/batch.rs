//! Batched decisions: tiers and meter operations that arrive together for
//! one hash slot go to Redis as one call (`meter_batch.lua` for meters,
//! `batch.lua` for burst tiers), which decides them in arrival order, each
//! exactly as `rate.lua`, `drain.lua` or `window.lua` would alone. One
//! script call per decision capped throughput at Redis' cost per call; a
//! batch pays it once.
//!
//! The policy adds no wait at light load: per slot at most one call is in
//! flight. An operation for a slot with nothing in flight is sent at once,
//! alone, with its own script (exactly the round trip it had before); one
//! that arrives while a call is in flight waits for it, and everything
//! waiting for that slot (at most `max_batch`) goes as the next call when
//! it returns. So batches form only when Redis is the bottleneck, and grow
//! with the load: the wait is bounded by one round trip of the call ahead.
//!
//! One task owns the queues ([`run`]); callers send it their operation and
//! wait for their reply alone, so a caller that gives up (a cancelled
//! request) never stalls a slot. An operation whose caller is gone by the
//! time its batch is sent is not sent. A failed call (a timeout, a lost
//! connection) fails every operation in it with the same error, and every
//! operation still waiting for that slot too: they would meet the same
//! stalled Redis, and each caller gets its server error within about one
//! operation timeout instead of one per batch ahead of it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;
use redis::cluster_routing::Slot;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::conn::Conn;
use super::decision_clock::DecisionClock;
use super::scripts::{Script, Scripts};
use crate::StoreError;

/// Operations waiting for the batcher in all: beyond this, callers wait
/// for room (back-pressure), within their own time limit.
const QUEUE: usize = 16_384;

/// Which script decides an operation alone, and how `batch.lua` tells
/// them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Burst tiers: `rate.lua`'s keys and its arguments after the clock.
    Tiers,
    /// A bucket, window or queue: `drain.lua` or `window.lua`'s key and its arguments
    /// after the clock.
    Meter,
}

/// One operation: its keys and its script's arguments after the clock
/// and the expiry slack.
#[derive(Debug)]
pub(crate) struct Operation {
    pub(crate) step: Step,
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<String>,
}

struct Job {
    op: Operation,
    reply: oneshot::Sender<Result<Value, StoreError>>,
    /// The span of the decision waiting for it (none unless traces are
    /// exported): the script call that carries it is its child, although
    /// it runs in the batcher's task.
    parent: tracing::Span,
}

/// How many calls carried more than one operation, and how many
/// operations those carried (for tests and `INFO`-style inspection).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) batches: AtomicU64,
    pub(crate) batched: AtomicU64,
}

/// The callers' side of the batcher.
#[derive(Debug)]
pub(crate) struct Batcher {
    jobs: mpsc::Sender<Job>,
    timeout: Duration,
    counts: Arc<Counts>,
    /// Set when batching is off (`max_batch` 1): every operation is sent
    /// at once with its own script, as many in flight as callers, as
    /// before batching (not one at a time per slot).
    direct: Option<Arc<Shared>>,
}

impl Batcher {
    /// Starts the batcher's task on `conn`; it ends when the batcher is
    /// dropped.
    pub(crate) fn start(
        conn: Conn,
        scripts: Arc<Scripts>,
        clock: DecisionClock,
        timeout: Duration,
        max_batch: usize,
    ) -> Self {
        let (jobs, rx) = mpsc::channel(QUEUE);
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Shared {
            conn,
            scripts,
            clock,
            counts: counts.clone(),
        });
        let direct = (max_batch <= 1).then(|| shared.clone());
        tokio::spawn(run(rx, shared, max_batch.max(1)));
        Self {
            jobs,
            timeout,
            counts,
            direct,
        }
    }

    /// Decides `op` (alone or in a batch) and gives its script's reply, as
    /// `rate.lua` or `drain.lua` or `window.lua` answers it.
    pub(crate) async fn run(&self, op: Operation) -> Result<Value, StoreError> {
        if let Some(shared) = &self.direct {
            return shared.alone(&op).await;
        }
        let (reply, rx) = oneshot::channel();
        // The batcher fails every operation of a call that fails, so this
        // bound is only reached if the batcher itself is stuck: two
        // operation timeouts (one for the call ahead, one for our own).
        let parent = if tracing::level_enabled!(tracing::Level::TRACE) {
            tracing::Span::current()
        } else {
            tracing::Span::none()
        };
        let wait = async {
            self.jobs
                .send(Job { op, reply, parent })
                .await
                .map_err(|_| gone())?;
            rx.await.map_err(|_| gone())?
        };
        tokio::time::timeout(self.timeout.saturating_mul(2), wait)
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "no reply from Redis within {:?} (batched)",
                    self.timeout.saturating_mul(2)
                ))
            })?
    }

    /// (calls with more than one operation, operations in those calls).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.counts.batches.load(Ordering::Relaxed),
            self.counts.batched.load(Ordering::Relaxed),
        )
    }
}

fn gone() -> StoreError {
    StoreError::Unavailable("the Redis batcher has stopped".into())
}

/// What every call of the batcher needs.
#[derive(Debug)]
struct Shared {
    conn: Conn,
    scripts: Arc<Scripts>,
    clock: DecisionClock,
    counts: Arc<Counts>,
}

/// The batcher's task: per slot, a queue of operations and at most one
/// call in flight.
async fn run(mut jobs: mpsc::Receiver<Job>, shared: Arc<Shared>, max_batch: usize) {
    let mut waiting: HashMap<Slot, VecDeque<Job>> = HashMap::new();
    let mut flights: JoinSet<(Slot, bool)> = JoinSet::new();
    let mut open = true;
    while open || !flights.is_empty() {
        tokio::select! {
            job = jobs.recv(), if open => match job {
                None => open = false,
                Some(job) => {
                    let slot = slot_of(&job.op);
                    match waiting.get_mut(&slot) {
                        // A call is in flight for this slot: wait for it.
                        Some(queue) => queue.push_back(job),
                        None => {
                            waiting.insert(slot, VecDeque::new());
                            flights.spawn(send(shared.clone(), slot, vec![job]));
                        }
                    }
                }
            },
            Some(done) = flights.join_next(), if !flights.is_empty() => {
                // A panicking call is a bug; its slot stays marked as
                // busy only until the queue drains below.
                let Ok((slot, failed)) = done else { continue };
                let Some(queue) = waiting.get_mut(&slot) else { continue };
                if failed {
                    fail_all(queue);
                }
                if queue.is_empty() {
                    waiting.remove(&slot);
                } else {
                    let n = queue.len().min(max_batch);
                    let batch: Vec<Job> = queue.drain(..n).collect();
                    flights.spawn(send(shared.clone(), slot, batch));
                }
            }
        }
    }
}

/// The operations waiting behind a call that Redis did not answer get its
/// failure, not a
/// wait of their own for the same stalled Redis.
fn fail_all(queue: &mut VecDeque<Job>) {
    for job in queue.drain(..) {
        let _ = job.reply.send(Err(StoreError::Unavailable(
            "Redis failed the call ahead of this operation (batched)".into(),
        )));
    }
}

/// The slot of an operation: that of its first key (all of an operation's
/// keys share one hash tag).
fn slot_of(op: &Operation) -> Slot {
    Slot::for_key(op.keys.first().map_or("", String::as_str))
}

/// Sends one call for `jobs` (all of `slot`) and answers each; whether the
/// call as a whole failed.
async fn send(shared: Arc<Shared>, slot: Slot, mut jobs: Vec<Job>) -> (Slot, bool) {
    jobs.retain(|j| !j.reply.is_closed());
    let failed = match jobs.len() {
        0 => false,
        1 => {
            let job = jobs.remove(0);
            let result = shared.alone(&job.op).instrument(job.parent.clone()).await;
            let failed = matches!(result, Err(StoreError::Unavailable(_)));
            let _ = job.reply.send(result);
            failed
        }
        // The call's span is a child of the first decision it carries.
        _ => match shared
            .together(&jobs)
            .instrument(jobs[0].parent.clone())
            .await
        {
            Ok(replies) => {
                for (job, reply) in jobs.into_iter().zip(replies) {
                    let _ = job.reply.send(reply);
                }
                false
            }
            Err(e) => {
                let failed = matches!(e, StoreError::Unavailable(_));
                for job in jobs {
                    let _ = job.reply.send(Err(e.clone()));
                }
                failed
            }
        },
    };
    (slot, failed)
}

impl Shared {
    fn clock_args(&self) -> [String; 2] {
        [self.clock.arg(), self.clock.expiry_slack().to_string()]
    }

    /// One operation with its own script: the call it had before batching.
    async fn alone(&self, op: &Operation) -> Result<Value, StoreError> {
        let script = match op.step {
            Step::Tiers => &self.scripts.rate,
            // A meter's first argument is its kind: 'w' a window, 'b' or
            // 'q' a bucket or queue (see `meter::args`).
            Step::Meter if op.args.first().is_some_and(|k| k == "w") => &self.scripts.window,
            Step::Meter => &self.scripts.drain,
        };
        let mut args = Vec::with_capacity(op.args.len() + 2);
        args.extend(self.clock_args());
        args.extend(op.args.iter().cloned());
        let keys: Vec<&str> = op.keys.iter().map(String::as_str).collect();
        self.conn.eval(script, &keys, &args, &[]).await
    }

    /// Several operations: each one's reply, or the error the script
    /// caught for it alone. Meter operations go in one lean
    /// `meter_batch.lua` call (one read and one write per key), burst tiers
    /// in one `batch.lua` call; a batch holding both (two resources of
    /// different kinds in one slot) makes the two calls at once: they
    /// share no key, so their order does not matter.
    async fn together(&self, jobs: &[Job]) -> Result<Vec<Result<Value, StoreError>>, StoreError> {
        let meters: Vec<&Job> = jobs.iter().filter(|j| j.op.step == Step::Meter).collect();
        let tiers: Vec<&Job> = jobs.iter().filter(|j| j.op.step == Step::Tiers).collect();
        let (meter_replies, tier_replies) = match (meters.is_empty(), tiers.is_empty()) {
            (false, true) => (
                self.call(&self.scripts.meter_batch, &meters).await?,
                Vec::new(),
            ),
            (true, false) => (Vec::new(), self.call(&self.scripts.batch, &tiers).await?),
            _ => {
                let (m, t) = tokio::join!(
                    self.call(&self.scripts.meter_batch, &meters),
                    self.call(&self.scripts.batch, &tiers)
                );
                (m?, t?)
            }
        };
        let (mut m, mut t) = (meter_replies.into_iter(), tier_replies.into_iter());
        let replies = jobs
            .iter()
            .map(|j| match j.op.step {
                Step::Meter => m.next(),
                Step::Tiers => t.next(),
            })
            .map(|r| {
                r.map_or_else(
                    || Err(StoreError::BadData("batch: no reply".into())),
                    caught,
                )
            })
            .collect();
        self.counts.batches.fetch_add(1, Ordering::Relaxed);
        self.counts
            .batched
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        Ok(replies)
    }

    /// One call of `script` for `jobs`, all of one step: one reply each.
    async fn call(&self, script: &Script, jobs: &[&Job]) -> Result<Vec<Value>, StoreError> {
        let mut args = Vec::with_capacity(2 + jobs.iter().map(|j| j.op.args.len()).sum::<usize>());
        args.extend(self.clock_args());
        let mut keys: Vec<&str> = Vec::new();
        for job in jobs {
            args.extend(job.op.args.iter().cloned());
            keys.extend(job.op.keys.iter().map(String::as_str));
        }
        let reply = self.conn.eval(script, &keys, &args, &[]).await?;
        let Value::Array(replies) = reply else {
            return Err(StoreError::BadData(format!(
                "{}: expected one reply per operation, got {reply:?}",
                script.name
            )));
        };
        if replies.len() != jobs.len() {
            return Err(StoreError::BadData(format!(
                "{}: {} replies for {} operations",
                script.name,
                replies.len(),
                jobs.len()
            )));
        }
        Ok(replies)
    }
}

/// An operation's reply from a batch script, or the error it caught for that
/// operation (`{'error', message}`), as the error the operation's own
/// script would have raised.
fn caught(reply: Value) -> Result<Value, StoreError> {
    if let Value::Array(items) = &reply
        && let [Value::BulkString(tag), message] = items.as_slice()
        && tag.as_slice() == b"error"
    {
        let text = match message {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        };
        return Err(StoreError::BadData(format!("batch: {text}")));
    }
    Ok(reply)
}
