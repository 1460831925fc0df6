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
use std::task::Poll;
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

/// Calls `call` (the inner service's `call`) and awaits the future it
/// makes, measuring both: the output and what it cost. The future is
/// pinned in place (measuring allocates nothing), and a request answered
/// in the poll that made it costs two clock readings, not four.
pub async fn measured<F: Future>(
    clock: CostClock,
    call: impl FnOnce() -> F,
) -> (F::Output, Duration) {
    match clock {
        CostClock::ThreadCpu => {
            let mut call = Some(call);
            let mut future = std::pin::pin!(None::<F>);
            let mut spent = Duration::ZERO;
            let out = std::future::poll_fn(|cx| {
                let before = thread_cpu();
                if let Some(call) = call.take() {
                    future.set(Some(call()));
                }
                let polled = match future.as_mut().as_pin_mut() {
                    Some(f) => f.poll(cx),
                    None => Poll::Pending,
                };
                spent += thread_cpu().saturating_sub(before);
                polled
            })
            .await;
            (out, spent)
        }
        CostClock::Wall => {
            let started = Instant::now();
            let out = call().await;
            (out, started.elapsed())
        }
    }
}
