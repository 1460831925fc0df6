//! One decision through the in-memory store: hashing, shard lock, the
//! engine and the global count, for a hot single domain (asking every 1,
//! 50 or 250 ms) and across a million distinct domains (the table no
//! longer fits in cache).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use charon_core::ManualClock;
use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::request::Amount;
use charon_store::{MemoryStore, Store};
use criterion::{Criterion, criterion_group, criterion_main};

/// The memory store never waits, so its futures are ready on first poll.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory store does not wait"),
    }
}

fn tier(limit: u64, window: u64, active: Option<u64>, cooldown: u64) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable: false,
    }
}

const DOMAINS: usize = 1_000_000;

fn bench(c: &mut Criterion, name: &str, tiers: &[Tier]) {
    let limits = RateLimits {
        hard_limit: None,
        global_limit: Some(u64::MAX / 4),
        tiers,
    };
    let one = Amount::exactly(1).expect("valid");
    let mut group = c.benchmark_group(name);
    // A domain asking every millisecond (its logs hold a second of hits:
    // a thousand entries), every 50 ms (twenty) and every 250 ms (four).
    for (id, gap) in [
        ("hot-domain", 1),
        ("hot-domain-50ms", 50),
        ("hot-domain-250ms", 250),
    ] {
        group.bench_function(id, |b| {
            let clock = Arc::new(ManualClock::new(0));
            let store = MemoryStore::new(clock.clone());
            b.iter(|| {
                clock.advance(gap);
                black_box(ready(store.request(
                    "api/search",
                    "tenant-42",
                    limits,
                    one,
                    Enforcement::Enforce,
                )))
            });
        });
    }
    group.bench_function("1M-domains", |b| {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(clock.clone());
        let names: Vec<String> = (0..DOMAINS).map(|i| format!("tenant-{i}")).collect();
        for d in &names {
            let _ = ready(store.request("api/search", d, limits, one, Enforcement::Enforce));
        }
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 7_919) % DOMAINS;
            clock.advance(1);
            black_box(ready(store.request(
                "api/search",
                &names[i],
                limits,
                one,
                Enforcement::Enforce,
            )))
        });
    });
    group.finish();
}

fn store_decisions(c: &mut Criterion) {
    bench(c, "memory-store/1-tier", &[tier(1_000_000, 1_000, None, 0)]);
    bench(
        c,
        "memory-store/4-tier",
        &[
            tier(5, 1_000, None, 0),
            tier(25, 1_000, Some(5_000), 15_000),
            tier(100, 1_000, Some(10_000), 60_000),
            tier(1_000_000, 1_000, Some(3_600_000), 0),
        ],
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = store_decisions
}
criterion_main!(benches);
