//! One decision of each rate-like kind (bucket, window, queue) on a hot
//! (resource, domain) pair, granted and rejected: the pure cost every store
//! pays on top of its own locking or round trip.

use charon_core::meter::{Ban, Level, Op, Policy, SoftLimit, State};
use charon_core::request::Amount;
use charon_core::window::Algorithm;
use charon_core::{bucket, queue, window};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn policy() -> Policy {
    Policy {
        soft_limit: Some(SoftLimit::percent(80).expect("valid")),
        ban: None,
    }
}

/// A grant every millisecond (the level never fills), and a request that
/// never fits.
fn bench<L: Level>(c: &mut Criterion, name: &str, kind: &L) {
    let one = Op::request(Amount::exactly(1).expect("valid"));
    let mut group = c.benchmark_group(name);
    group.bench_function("grant", |b| {
        let mut state = State::default();
        let mut now = 1_700_000_000_000u64;
        b.iter(|| {
            now += 1;
            black_box(charon_core::meter::decide(kind, &mut state, now, one))
        });
    });
    group.bench_function("reject", |b| {
        let mut state = State::default();
        let huge = Op::request(Amount::exactly(u64::from(u32::MAX)).expect("valid"));
        b.iter(|| black_box(charon_core::meter::decide(kind, &mut state, 5, huge)));
    });
    group.bench_function("charge", |b| {
        let mut state = State::default();
        let mut now = 1_700_000_000_000u64;
        b.iter(|| {
            now += 1;
            black_box(charon_core::meter::decide(
                kind,
                &mut state,
                now,
                Op::Charge(1),
            ))
        });
    });
    group.bench_function("grant/1M-keys", |b| {
        // A million pairs visited in a stride that defeats the prefetcher:
        // the cost once states no longer sit in the cache.
        const KEYS: usize = 1_000_000;
        let mut states: Vec<State<L::State>> = (0..KEYS).map(|_| State::default()).collect();
        let mut i = 0usize;
        let mut now = 1_700_000_000_000u64;
        b.iter(|| {
            i = (i + 7_919) % KEYS;
            now += 1;
            black_box(charon_core::meter::decide(kind, &mut states[i], now, one))
        });
    });
    group.finish();
}

fn decisions(c: &mut Criterion) {
    let bucket = bucket::Params::new(1_000, 3_000, 1_000, policy()).expect("valid");
    bench(c, "bucket", &bucket);
    let fixed = window::Params::new(Algorithm::Fixed, 1_000_000, 60_000, policy()).expect("valid");
    bench(c, "window/fixed", &fixed);
    let sliding =
        window::Params::new(Algorithm::SlidingCounter, 1_000_000, 60_000, policy()).expect("valid");
    bench(c, "window/sliding_counter", &sliding);
    let banning = Policy {
        ban: Some(Ban::new(60_000).expect("valid")),
        ..policy()
    };
    let queue = queue::Params::new(3_000, 1_000, 1_000, banning).expect("valid");
    bench(c, "queue", &queue);
}

criterion_group!(benches, decisions);
criterion_main!(benches);
