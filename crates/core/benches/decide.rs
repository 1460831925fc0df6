//! One decision of the pure engine, on a hot (resource, domain) pair and
//! across a million pairs: the cost that every store pays on top of its
//! own locking or round trip.

use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::rate::{HitLog, RateState, decide};
use charon_core::request::Amount;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn tier(limit: u64, window: u64, active: Option<u64>, cooldown: u64) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable: false,
    }
}

fn bench(c: &mut Criterion, name: &str, tiers: &[Tier]) {
    let limits = RateLimits {
        hard_limit: Some(1_000_000),
        global_limit: Some(10_000_000),
        tiers,
    };
    let one = Amount::exactly(1).expect("valid");
    let mut group = c.benchmark_group(name);
    group.bench_function("grant", |b| {
        let mut state = RateState::default();
        let mut global = HitLog::default();
        let mut now = 0u64;
        b.iter(|| {
            now += 1;
            black_box(decide(
                limits,
                &mut state,
                &mut global,
                now,
                one,
                Enforcement::Enforce,
            ))
        });
    });
    group.bench_function("grant/1M-keys", |b| {
        // A million pairs visited in a stride that defeats the prefetcher:
        // the cost once states no longer sit in the cache.
        const KEYS: usize = 1_000_000;
        let mut states: Vec<RateState> = (0..KEYS).map(|_| RateState::default()).collect();
        let mut global = HitLog::default();
        let mut i = 0usize;
        let mut now = 0u64;
        b.iter(|| {
            i = (i + 7_919) % KEYS;
            now += 1;
            black_box(decide(
                limits,
                &mut states[i],
                &mut global,
                now,
                one,
                Enforcement::Enforce,
            ))
        });
    });
    group.bench_function("reject", |b| {
        let mut state = RateState::default();
        let mut global = HitLog::default();
        let full = Amount::exactly(u64::from(u32::MAX)).expect("valid");
        b.iter(|| {
            black_box(decide(
                limits,
                &mut state,
                &mut global,
                5,
                full,
                Enforcement::Enforce,
            ))
        });
    });
    group.finish();
}

fn decisions(c: &mut Criterion) {
    bench(c, "decide/1-tier", &[tier(1_000_000, 1_000, None, 0)]);
    bench(
        c,
        "decide/4-tier",
        &[
            tier(5, 1_000, None, 0),
            tier(25, 1_000, Some(5_000), 15_000),
            tier(100, 1_000, Some(10_000), 60_000),
            tier(1_000_000, 1_000, Some(3_600_000), 0),
        ],
    );
}

criterion_group!(benches, decisions);
criterion_main!(benches);
