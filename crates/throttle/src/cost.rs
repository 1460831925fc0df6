//! What a request cost: the CPU time of the threads that poll its future,
//! or the wall time from its start where CPU time cannot be read.
//!
//! The cost of a request is measured around the inner service: its `call`
//! and every poll of the future it returns, summing the CPU time of the
//! thread that ran each poll (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`). A
//! tokio task moves between worker threads; per poll, the delta on the
//! thread that polled is exact. Work the service hands to other threads
//! (`spawn_blocking`, a database's own pool) is not seen: for such
//! services choose [`CostClock::Wall`], which measures from the start of
//! the call to its end and so also counts time spent waiting.

use std::future::Future;
use std::time::{Duration, Instant};

use rustix::time::{ClockId, clock_gettime};

/// How a request's cost is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CostClock {
    /// The CPU time of the polling thread, summed over the polls (the
    /// default on every platform Charon runs on: Linux and the other
    /// Unixes have a per-thread CPU clock).
    #[default]
    ThreadCpu,
    /// Wall time from the call to the response: for services whose work
    /// runs on other threads, or where the thread CPU clock is missing.
    Wall,
}

impl CostClock {
    /// The name in logs and documentation.
    pub fn name(self) -> &'static str {
        match self {
            CostClock::ThreadCpu => "thread_cpu",
            CostClock::Wall => "wall",
        }
    }
}

/// The current thread's CPU time.
pub fn thread_cpu() -> Duration {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Awaits `future` measuring it: its output and what it cost, `already`
/// (the cost of the call that made it) included. Pinned in place, so
/// measuring allocates nothing.
pub async fn measured<F: Future>(
    future: F,
    clock: CostClock,
    already: Duration,
    started: Instant,
) -> (F::Output, Duration) {
    let mut future = std::pin::pin!(future);
    match clock {
        CostClock::ThreadCpu => {
            let mut spent = already;
            let out = std::future::poll_fn(|cx| {
                let before = thread_cpu();
                let polled = future.as_mut().poll(cx);
                spent += thread_cpu().saturating_sub(before);
                polled
            })
            .await;
            (out, spent)
        }
        CostClock::Wall => {
            let out = future.await;
            (out, started.elapsed())
        }
    }
}

/// Runs `call` (the inner service's `call`) measuring it: the future it
/// made, to be wrapped in [`Measured`] with the cost so far.
pub fn measure_call<T>(clock: CostClock, call: impl FnOnce() -> T) -> (T, Duration, Instant) {
    let started = Instant::now();
    match clock {
        CostClock::ThreadCpu => {
            let before = thread_cpu();
            let out = call();
            (out, thread_cpu().saturating_sub(before), started)
        }
        CostClock::Wall => (call(), Duration::ZERO, started),
    }
}
