//! Decision events: one structured event per decision, the Charon paper's
//! Riemann stream (§4.2) in today's terms, written as JSON lines to a file
//! (rotated) or to stdout, and a live view of the busiest and most limited
//! (resource, domain) pairs ([`top`], `GET /v1/top`).
//!
//! Decisions never wait for it. The hot path ([`Events::emit`]) samples
//! (a thread-local random number, no lock), checks the per-second cap (one
//! atomic word), builds the event only then (two string copies) and pushes
//! it into a bounded queue without blocking; a full queue drops the event.
//! A dedicated writer thread (the `writer` module) drains the queue in
//! batches, feeds the live view, serializes and writes; a write that fails
//! (a full disk, a broken pipe) drops its events, is logged at most every
//! 30 s, and the file is opened again a second later, so the stream
//! recovers when space returns. Every drop is counted by reason:
//! `charon_events_dropped_total{reason="queue_full"|"rate_cap"|"write_error"}`,
//! and every event written in `charon_events_written_total`.
//!
//! The line format, flags and figures: `docs/events.md`.

pub mod top;
mod writer;

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use charon_core::Clock;
use charon_store::SystemClock;
use metrics::{Counter, counter};
use serde::{Deserialize, Serialize};

pub use top::{PairCount, Top, TopReport};

/// The default of `--events-queue`: events waiting for the writer at
/// most; more are dropped (`queue_full`). About 1.6 s of the default cap,
/// a few MB at most.
pub const QUEUE_EVENTS: usize = 16 * 1024;

/// The default of `--events-max-per-second`: far above what an operator
/// reads, far below what would make the writer thread compete with
/// decisions for the CPU (see `docs/events.md` for the figures).
pub const DEFAULT_MAX_PER_SECOND: u32 = 10_000;

/// The default of `--events-max-bytes`: a file is rotated past 100 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 100 * 1024 * 1024;

/// The default of `--events-keep`: rotated files kept (`PATH.1` … `PATH.5`).
pub const DEFAULT_KEEP: u32 = 5;

/// Where the events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventSink {
    /// The process's standard output (`--events -`).
    Stdout,
    /// A file, appended to and rotated (a FIFO or a device works too; only
    /// regular files are rotated).
    File(PathBuf),
}

/// How the decision stream is set up (`charon serve --events…`).
#[derive(Debug, Clone, PartialEq)]
pub struct EventSettings {
    /// Where the events go.
    pub sink: EventSink,
    /// The share of decisions that become events, in (0, 1].
    pub sample: f64,
    /// The most events per second (after sampling); 0: no cap.
    pub max_per_second: u32,
    /// A file is rotated before it would grow past this many bytes; 0:
    /// never.
    pub max_bytes: u64,
    /// Rotated files kept: `PATH.1` (the newest) … `PATH.keep`.
    pub keep: u32,
    /// Events waiting for the writer at most (at least 1).
    pub queue: usize,
}

impl EventSettings {
    /// The defaults for `sink`: every decision, at most
    /// [`DEFAULT_MAX_PER_SECOND`] a second, rotated at [`DEFAULT_MAX_BYTES`]
    /// keeping [`DEFAULT_KEEP`].
    pub fn new(sink: EventSink) -> Self {
        Self {
            sink,
            sample: 1.0,
            max_per_second: DEFAULT_MAX_PER_SECOND,
            max_bytes: DEFAULT_MAX_BYTES,
            keep: DEFAULT_KEEP,
            queue: QUEUE_EVENTS,
        }
    }
}

/// How a decision ended, as the stream tells it: finer than the metrics'
/// outcome (a queue's grant that must wait is `delayed`; an Envoy
/// descriptor over its limit but in shadow mode is `shadowed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventOutcome {
    /// Everything asked for, now.
    Granted,
    /// Fewer than asked for, at least `min_copies`.
    Partial,
    /// Granted, but the client must wait `delay_ms` first (queues).
    Delayed,
    /// Refused by a limit.
    Rejected,
    /// Over its limit and let through (Envoy's shadow mode).
    Shadowed,
    /// The caller's fault (SPEC §5 class `client`).
    ClientError,
    /// Charon's fault (SPEC §5 class `server`).
    ServerError,
}

impl EventOutcome {
    /// Whether a limit stood in the way: what "most limited" counts.
    pub fn is_limited(self) -> bool {
        matches!(
            self,
            Self::Partial | Self::Delayed | Self::Rejected | Self::Shadowed
        )
    }

    /// The outcome of a grant of `granted` out of `asked`, to be taken up
    /// after `delay_ms`.
    pub fn of_grant(granted: u64, asked: u64, delay_ms: Option<u64>) -> Self {
        match granted {
            0 => Self::Rejected,
            g if g < asked => Self::Partial,
            _ if delay_ms.is_some_and(|d| d > 0) => Self::Delayed,
            _ => Self::Granted,
        }
    }
}

impl From<crate::metrics::Outcome> for EventOutcome {
    fn from(o: crate::metrics::Outcome) -> Self {
        use crate::metrics::Outcome;
        match o {
            Outcome::Granted => Self::Granted,
            Outcome::Partial => Self::Partial,
            Outcome::Rejected => Self::Rejected,
            Outcome::ClientError => Self::ClientError,
            Outcome::ServerError => Self::ServerError,
        }
    }
}

/// A count of an event: whole units, or a lease's capacity (a rate, which
/// need not be whole).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Count {
    /// Copies, hits, units.
    Whole(u64),
    /// A capacity lease's wants or grant.
    Real(f64),
}

/// One decision. Built by the hot path only once it is sampled and under
/// the cap; the writer adds the server's name and the time's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When it was decided, in milliseconds since the Unix epoch; written
    /// as RFC 3339 (`time`, UTC, milliseconds).
    #[serde(rename = "time", with = "rfc3339")]
    pub time_ms: u64,
    /// The server that decided (host and process id); empty until written.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server: String,
    /// `request`, `dry_run`, `charge`, `refund`, `reserve`, `release`,
    /// `transfer`, `seize`, `session` (an operation refused before it was
    /// read), `get_capacity`, `release_capacity` or `envoy`.
    pub operation: Cow<'static, str>,
    /// The resource (empty where the operation never named one).
    pub resource: String,
    /// The domain: a lease's client id, an Envoy descriptor's domain key.
    pub domain: String,
    /// How it ended.
    pub outcome: EventOutcome,
    /// The burst tier the pair is in after the decision (kind `rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<u32>,
    /// What was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<Count>,
    /// What was granted (charged, refunded, released, staged, seized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<Count>,
    /// How many more units would be granted now (rate-like kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// Copies the domain holds after the operation (copy resources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    /// Queues: the wait before the client proceeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Usage is at least the soft limit (SPEC §10).
    #[serde(default, skip_serializing_if = "is_false")]
    pub warning: bool,
    /// The domain is banned from the resource (SPEC §10).
    #[serde(default, skip_serializing_if = "is_false")]
    pub banned: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Event {
    /// An event of `operation` on (`resource`, `domain`) at `time_ms` with
    /// no counts yet.
    pub fn new(
        time_ms: u64,
        operation: &'static str,
        resource: &str,
        domain: &str,
        outcome: EventOutcome,
    ) -> Self {
        Self {
            time_ms,
            server: String::new(),
            operation: Cow::Borrowed(operation),
            resource: resource.to_owned(),
            domain: domain.to_owned(),
            outcome,
            tier: None,
            requested: None,
            granted: None,
            remaining: None,
            held: None,
            delay_ms: None,
            warning: false,
            banned: false,
        }
    }
}

/// The `time` field: RFC 3339 in UTC with milliseconds, read back by
/// `charon top`.
mod rfc3339 {
    use std::time::{Duration, UNIX_EPOCH};

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(ms: &u64, s: S) -> Result<S::Ok, S::Error> {
        let t = UNIX_EPOCH + Duration::from_millis(*ms);
        s.collect_str(&humantime::format_rfc3339_millis(t))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let t = humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom)?;
        let since = t
            .duration_since(UNIX_EPOCH)
            .map_err(|_| serde::de::Error::custom("a time before 1970"))?;
        Ok(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Milliseconds since the epoch as a [`SystemTime`] (for formatting).
pub fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// What the stream counts, registered once (with their `# HELP`) so every
/// series shows in `/metrics` from the start, at 0. Drops at the cap are
/// counted in `capped` (striped: every decision past the cap counts one)
/// and copied into `rate_cap` by [`EventCounters::sync`], which the writer
/// thread runs between batches and `/metrics` before it renders.
#[derive(Debug, Clone)]
struct EventCounters {
    written: Counter,
    queue_full: Counter,
    rate_cap: Counter,
    write_error: Counter,
    capped: Arc<Striped>,
}

impl EventCounters {
    fn register() -> Self {
        crate::metrics::install();
        let dropped = |reason: &'static str| counter!(crate::metrics::catalog::EVENTS_DROPPED.name, "reason" => reason);
        let c = Self {
            written: counter!(crate::metrics::catalog::EVENTS_WRITTEN.name),
            queue_full: dropped("queue_full"),
            rate_cap: dropped("rate_cap"),
            write_error: dropped("write_error"),
            capped: Arc::default(),
        };
        for counter in [&c.written, &c.queue_full, &c.rate_cap, &c.write_error] {
            counter.increment(0);
        }
        c
    }

    /// Brings `rate_cap` up to the striped count.
    fn sync(&self) {
        self.rate_cap.absolute(self.capped.sum());
    }
}

/// A count that threads add to without sharing a cache line: each thread
/// adds to one of [`STRIPES`] padded cells (its own, round robin), and a
/// reader sums them. On the hot path past the cap, where every decision
/// counts a drop, one shared counter would bounce its cache line between
/// the cores on every decision.
#[derive(Debug, Default)]
struct Striped {
    cells: [Padded; STRIPES],
}

/// Cells of a [`Striped`] count: more than the cores a server is given.
const STRIPES: usize = 16;

/// An atomic alone on its cache line (128 bytes: two lines, for the
/// adjacent-line prefetcher).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Striped {
    fn add(&self, n: u64) {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static CELL: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
        }
        let i = CELL.with(|c| *c);
        self.cells[i].0.fetch_add(n, Ordering::Relaxed);
    }

    fn sum(&self) -> u64 {
        self.cells
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// At most `max` admissions per wall-clock second, in one atomic word: the
/// second (high 32 bits) and the count admitted in it (low 32 bits).
#[derive(Debug)]
struct RateCap {
    max: u32,
    word: AtomicU64,
}

impl RateCap {
    fn new(max: u32) -> Self {
        Self {
            max,
            word: AtomicU64::new(0),
        }
    }

    /// Whether one more event may go in second `second`. A new second
    /// starts a new count; events racing at its boundary may be counted in
    /// either second (the cap is a guard, not an accounting).
    fn admit(&self, second: u32) -> bool {
        if self.max == 0 {
            return true;
        }
        let current = self.word.load(Ordering::Relaxed);
        if (current >> 32) as u32 == second {
            if current as u32 >= self.max {
                // Over the cap: refused on a read, so decisions past it do
                // not fight over the word's cache line.
                return false;
            }
        } else {
            let _ = self.word.compare_exchange(
                current,
                u64::from(second) << 32,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        let before = self.word.fetch_add(1, Ordering::Relaxed);
        (before >> 32) as u32 == second && (before as u32) < self.max
    }
}

/// The decision stream of a server: the hot path's side ([`Events::emit`])
/// and the writer thread behind it.
#[derive(Debug)]
pub struct Events {
    /// A decision is sampled when a random `u64` is below this; `u64::MAX`
    /// with a ratio of 1 samples all without drawing.
    threshold: Option<u64>,
    cap: RateCap,
    queue: SyncSender<Event>,
    clock: SystemClock,
    counters: EventCounters,
    top: Arc<Mutex<Top>>,
    writer: Mutex<Option<writer::Handle>>,
}

impl Events {
    /// Starts the writer thread for `settings`; `server` names this server
    /// in every event. Fails if the sink's directory does not exist (a
    /// typo should stop the server, not every event).
    pub fn start(settings: &EventSettings, server: String) -> std::io::Result<Arc<Self>> {
        if !(settings.sample > 0.0 && settings.sample <= 1.0) {
            return Err(std::io::Error::other(format!(
                "--events-sample must be above 0 and at most 1, not {}",
                settings.sample
            )));
        }
        if let EventSink::File(path) = &settings.sink {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            if !dir.is_dir() {
                return Err(std::io::Error::other(format!(
                    "--events {}: {} is not a directory",
                    path.display(),
                    dir.display()
                )));
            }
        }
        // (0, 1) × 2^64, exact enough: a ratio is not finer than 2^-53.
        let threshold = (settings.sample < 1.0).then_some((settings.sample * 2f64.powi(64)) as u64);
        let counters = EventCounters::register();
        let top = Arc::new(Mutex::new(Top::new()));
        let (queue, receiver) = std::sync::mpsc::sync_channel(settings.queue.max(1));
        let writer = writer::spawn(
            receiver,
            settings,
            server,
            Arc::clone(&top),
            counters.clone(),
        )?;
        Ok(Arc::new(Self {
            threshold,
            cap: RateCap::new(settings.max_per_second),
            queue,
            clock: SystemClock::new(),
            counters,
            top,
            writer: Mutex::new(Some(writer)),
        }))
    }

    /// Records one decision: `build` makes its event from the decision's
    /// time (milliseconds since the epoch), and is called only if the
    /// decision is sampled and under the cap. Never blocks: a full queue
    /// drops the event (counted).
    #[inline]
    pub fn emit(&self, build: impl FnOnce(u64) -> Event) {
        if let Some(threshold) = self.threshold
            && rand::random::<u64>() >= threshold
        {
            return;
        }
        let now = self.clock.now();
        if !self
            .cap
            .admit(u32::try_from(now / 1000).unwrap_or(u32::MAX))
        {
            self.counters.capped.add(1);
            return;
        }
        match self.queue.try_send(build(now)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.counters.queue_full.increment(1),
            // The writer is gone (only after `close`): nothing will write.
            Err(TrySendError::Disconnected(_)) => self.counters.write_error.increment(1),
        }
    }

    /// Brings the metrics that the hot path counts apart up to date (run
    /// before `/metrics` renders; the writer thread runs it too).
    pub fn sync_metrics(&self) {
        self.counters.sync();
    }

    /// The live view over the last `window` (at most [`top::MAX_WINDOW`]):
    /// the `limit` busiest and most limited pairs.
    pub fn top(&self, window: Duration, limit: usize) -> TopReport {
        let now = self.clock.now();
        match self.top.lock() {
            Ok(top) => top.report(now, window, limit),
            Err(poisoned) => poisoned.into_inner().report(now, window, limit),
        }
    }

    /// Stops the writer after it wrote what is queued, waiting at most
    /// `grace` (a writer stuck opening a FIFO nobody reads is left behind).
    pub fn close(&self, grace: Duration) {
        let handle = match self.writer.lock() {
            Ok(mut w) => w.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(handle) = handle {
            handle.stop(grace);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_event_line_reads_back() {
        let mut e = Event::new(
            1_764_160_496_789,
            "request",
            "api/search",
            "tenant-42",
            EventOutcome::Partial,
        );
        e.tier = Some(2);
        e.requested = Some(Count::Whole(3));
        e.granted = Some(Count::Whole(2));
        e.remaining = Some(0);
        e.server = "host-1".to_owned();
        let line = serde_json::to_string(&e).unwrap();
        assert_eq!(
            line,
            r#"{"time":"2025-11-26T12:34:56.789Z","server":"host-1","operation":"request","resource":"api/search","domain":"tenant-42","outcome":"partial","tier":2,"requested":3,"granted":2,"remaining":0}"#
        );
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
        let lease = r#"{"time":"2025-11-26T12:34:56Z","operation":"get_capacity","resource":"l","domain":"c","outcome":"granted","requested":2.5,"granted":1}"#;
        let e: Event = serde_json::from_str(lease).unwrap();
        assert_eq!(e.requested, Some(Count::Real(2.5)));
        assert_eq!(e.time_ms, 1_764_160_496_000);
    }

    #[test]
    fn the_cap_admits_max_per_second() {
        let cap = RateCap::new(3);
        let admitted = (0..10).filter(|_| cap.admit(7)).count();
        assert_eq!(admitted, 3);
        assert!(cap.admit(8), "a new second starts a new count");
        assert!(RateCap::new(0).admit(1), "0 is no cap");
    }

    #[test]
    fn outcomes_of_grants() {
        assert_eq!(EventOutcome::of_grant(0, 3, None), EventOutcome::Rejected);
        assert_eq!(EventOutcome::of_grant(2, 3, None), EventOutcome::Partial);
        assert_eq!(EventOutcome::of_grant(3, 3, Some(5)), EventOutcome::Delayed);
        assert_eq!(EventOutcome::of_grant(3, 3, Some(0)), EventOutcome::Granted);
        assert!(!EventOutcome::ServerError.is_limited());
        assert!(EventOutcome::Shadowed.is_limited());
    }
}
