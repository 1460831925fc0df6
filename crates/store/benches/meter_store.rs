//! One decision of each rate-like kind (bucket, fixed and sliding-counter
//! window, queue) through the in-memory store: hashing, the shard lock,
//! the lookup, decoding and encoding the compact entry, and core's
//! decision; for one hot domain and across a million distinct domains
//! (the table no longer fits in cache). Burst tiers: `memory_store`.
//!
//! Run: `cargo bench -p charon-store --bench meter_store`

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use charon_core::ManualClock;
use charon_core::meter::{Meter, Op, Policy, SoftLimit};
use charon_core::request::Amount;
use charon_core::window::Algorithm;
use charon_core::{bucket, queue, window};
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

const DOMAINS: usize = 1_000_000;
const RESOURCE: &str = "api/v2/search-eu";

fn bench(c: &mut Criterion, name: &str, meter: &Meter) {
    let one = Op::request(Amount::exactly(1).expect("valid"));
    let mut group = c.benchmark_group(name);
    group.bench_function("hot-domain", |b| {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let store = MemoryStore::new(clock.clone());
        b.iter(|| {
            clock.advance(1);
            black_box(ready(store.meter(RESOURCE, "customer-0000042", meter, one)))
        });
    });
    group.bench_function("1M-domains", |b| {
        // The clock stands still so that every pair stays live (the limits
        // are far from reached): each iteration finds and rewrites an
        // entry, none is added or dropped.
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let store = MemoryStore::new(clock.clone());
        let names: Vec<String> = (0..DOMAINS).map(|i| format!("customer-{i:07}")).collect();
        for d in &names {
            let _ = ready(store.meter(RESOURCE, d, meter, one));
        }
        assert_eq!(store.meter_count(), DOMAINS);
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 7_919) % DOMAINS;
            black_box(ready(store.meter(RESOURCE, &names[i], meter, one)))
        });
        assert_eq!(store.meter_count(), DOMAINS);
    });
    group.finish();
}

fn store_decisions(c: &mut Criterion) {
    let p = Policy {
        soft_limit: Some(SoftLimit::percent(80).expect("valid")),
        ban: None,
    };
    // Limits no benchmark reaches: every decision is a grant that writes.
    let big = 1_000_000_000;
    bench(
        c,
        "memory-store/bucket",
        &Meter::Bucket(bucket::Params::new(big, big, 1_000, p).expect("valid")),
    );
    bench(
        c,
        "memory-store/window-fixed",
        &Meter::Window(window::Params::new(Algorithm::Fixed, big, 60_000, p).expect("valid")),
    );
    bench(
        c,
        "memory-store/window-sliding",
        &Meter::Window(
            window::Params::new(Algorithm::SlidingCounter, big, 60_000, p).expect("valid"),
        ),
    );
    bench(
        c,
        "memory-store/queue",
        &Meter::Queue(queue::Params::new(big, 1_000, big, p).expect("valid")),
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = store_decisions
}
criterion_main!(benches);
