//! What the footprint benchmarks (`memory_footprint`, `meter_footprint`)
//! share: they drive the in-memory store without a runtime and count the
//! bytes it allocates, through the allocator the `charon` binary ships
//! with (mimalloc), wrapped in a counting one; and read the process's
//! resident memory around it.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// mimalloc, as in the `charon` binary, counting the bytes live.
#[global_allocator]
static ALLOCATOR: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

/// Bytes allocated and not yet freed (as requested: mimalloc rounds small
/// sizes up to a multiple of 8 or 16 bytes, which RSS shows).
pub fn allocated() -> u64 {
    ALLOCATOR.allocated() as u64
}

/// Answers `--list` as a bench harness does (cargo asks before running),
/// so the caller can return without measuring anything.
pub fn listing(name: &str) -> bool {
    let listing = std::env::args().any(|a| a == "--list");
    if listing {
        println!("{name}: bench");
    }
    listing
}

/// Runs a future of the in-memory store, which never waits: a runtime
/// would add its own memory to what is measured.
pub fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory store does not wait"),
    }
}

/// The resident set size in bytes (Linux; 0 where `/proc` is missing).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
