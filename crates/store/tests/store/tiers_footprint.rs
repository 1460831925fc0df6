//! Bytes per burst-tiers pair in the in-memory store, all in: the table's
//! slots, the entry and every heap allocation it owns, as requested from
//! the allocator (counted by this test binary's allocator, in a process
//! of its own so that tests running beside it do not blur the count). N domains of 16 bytes
//! on one resource of 16 bytes, as `benches/meter_footprint.rs` measures
//! buckets and windows; every figure is printed.
//!
//! Few hits (3 or 6 requests, the usual domain) must stay under 120 bytes
//! per pair with 1 tier and with 3; many hits (40) are kept unencoded
//! (spilled, `memory/rates.rs`), printed and held to a per-hit bound.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use charon_core::ManualClock;
use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::request::Amount;
use charon_store::{MemoryStore, Store};

/// The system allocator, counting the bytes live (in the whole process:
/// the measurement runs in a process of its own, see
/// [`tiers_pair_bytes_in_memory`]).
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// Bytes allocated and not freed.
fn live() -> i64 {
    i64::try_from(ALLOCATOR.allocated()).unwrap_or(i64::MAX)
}

/// Set in the process that measures.
const CHILD: &str = "CHARON_TIERS_FOOTPRINT_CHILD";

/// Runs a future of the in-memory store, which never waits (a runtime
/// would allocate on its own).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory store does not wait"),
    }
}

const RESOURCE: &str = "api/v2/search-eu";

fn tier(limit: u64, window: u64, active: Option<u64>, cooldown: u64) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable: false,
    }
}

/// Bytes per pair once `pairs` domains made a request at each offset (ms
/// from the start) of `at`, and how many hits each was granted.
fn bytes_per_pair(tiers: &[Tier], hard_limit: Option<u64>, pairs: u64, at: &[u64]) -> (f64, u64) {
    let limits = RateLimits {
        hard_limit,
        global_limit: None,
        tiers,
    };
    let one = Amount::exactly(1).unwrap();
    let start = 1_700_000_000_000;
    let clock = Arc::new(ManualClock::new(start));
    let store = MemoryStore::new(clock.clone());
    let names: Vec<String> = (0..pairs).map(|i| format!("customer-{i:07}")).collect();
    let before = live();
    let mut granted = 0;
    for &t in at {
        clock.set(start + t);
        for d in &names {
            let r = ready(store.request(RESOURCE, d, limits, one, Enforcement::Enforce)).unwrap();
            granted += r.granted;
        }
    }
    let bytes = live() - before;
    assert_eq!(store.pair_count() as u64, pairs);
    (bytes as f64 / pairs as f64, granted / pairs)
}

/// Runs [`measure`] in a process of its own (this test binary again, with
/// only this test), so that no test running beside it allocates while it
/// counts, and prints what it printed.
#[test]
fn tiers_pair_bytes_in_memory() {
    if std::env::var_os(CHILD).is_some() {
        return measure();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "tiers_footprint::tiers_pair_bytes_in_memory",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the measuring process failed");
    assert!(stdout.contains("bytes per pair"), "nothing measured");
}

fn measure() {
    // 100 per minute, for ever: the common single tier.
    let one_tier = [tier(100, 60_000, None, 0)];
    // 5 per second; bursts of 25 per second for 5 s (then 15 s of
    // cooldown), of 100 per 10 s for a minute (then 5 minutes).
    let three_tiers = [
        tier(5, 1_000, None, 0),
        tier(25, 1_000, Some(5_000), 15_000),
        tier(100, 10_000, Some(60_000), 300_000),
    ];
    let few = [0, 150, 400];
    let some = [0, 90, 150, 400, 410, 700];
    let many: Vec<u64> = (0..40).map(|i| i * 23).collect();
    // 60,000 pairs leave each of the 64 shards' tables just doubled (less
    // than half full): near the most bytes per pair the slots ever cost.
    let cases: [(&str, &[Tier], &[u64], u64); 6] = [
        ("1 tier, few hits", &one_tier, &few, 60_000),
        ("3 tiers, few hits", &three_tiers, &few, 60_000),
        ("1 tier, some hits", &one_tier, &some, 60_000),
        ("3 tiers, some hits", &three_tiers, &some, 60_000),
        ("1 tier, many hits", &one_tier, &many, 10_000),
        ("3 tiers, many hits", &three_tiers, &many, 10_000),
    ];
    let mut measured = Vec::new();
    for (name, tiers, at, pairs) in cases {
        let (bytes, hits) = bytes_per_pair(tiers, Some(100), pairs, at);
        println!(
            "in-memory tiers pair, {name}: {bytes:.1} bytes per pair ({pairs} pairs, {} requests at distinct ms, {hits} granted each)",
            at.len()
        );
        measured.push((name, bytes, hits));
    }
    for (name, bytes, hits) in measured {
        if hits <= 6 {
            // Encoded: a few bytes a hit.
            assert!(bytes < 120.0, "{name}: {bytes:.1} bytes per pair");
        } else {
            // Spilled (kept unencoded, as every pair was before): each hit
            // at its own millisecond an entry of its tier's log and of the
            // last second, 16 bytes each, in logs that grow by doubling.
            assert!(
                bytes < 120.0 + 80.0 * hits as f64,
                "{name}: {bytes:.1} bytes per pair for {hits} hits"
            );
        }
    }
}
