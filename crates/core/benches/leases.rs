//! One `get_capacity` refresh on a resource whose capacity is shared by
//! many clients, for each algorithm: the pure cost a lease server pays per
//! decision before any store, at 100 and 10,000 clients.
//! - `steady`: each client refreshes with the wants it had, so the kept
//!   shares serve (a lookup in the set, O(log n));
//! - `new-wants`: each refresh changes the client's wants, so the shares of
//!   all clients are computed anew (O(n) for proportional_share, O(n log n)
//!   for fair_share): the worst case.

use charon_core::lease::{
    Algorithm, LeaseContext, LeaseParams, LeaseSet, Quantity, Want, get_capacity,
};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn units(n: u64) -> Quantity {
    Quantity::units(n).expect("in range")
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("lease/get_capacity");
    for algorithm in [
        Algorithm::Static,
        Algorithm::ProportionalShare,
        Algorithm::FairShare,
    ] {
        for clients in [100u64, 10_000] {
            // Leases long enough that none lapses while criterion runs.
            let params = LeaseParams::new(units(clients * 10), algorithm, 1 << 40, 5_000)
                .and_then(|p| p.with_learning_mode(0))
                .expect("valid");
            // Wants from 1 to 20 units: about half the clients want less
            // than their equal share of 10, so the capacity is contended.
            let want = |i: u64| Want::new(units(1 + i % 20), Quantity::ZERO, 1).expect("valid");
            let names: Vec<String> = (0..clients).map(|i| format!("client-{i}")).collect();
            for (case, change) in [("steady", false), ("new-wants", true)] {
                let mut set = LeaseSet::new();
                for (i, name) in (0..clients).zip(&names) {
                    let ctx = LeaseContext::root(&params, 0, 0);
                    get_capacity(&mut set, &params, ctx, name, want(i));
                }
                // Kept across criterion's calls of the routine, so that
                // every pass over the clients continues the last one.
                let (mut i, mut now, mut pass) = (0u64, 1u64, 0u64);
                group.bench_with_input(
                    BenchmarkId::new(format!("{}/{case}", algorithm.name()), clients),
                    &clients,
                    |b, &clients| {
                        b.iter(|| {
                            // Refresh the clients in turn, a millisecond
                            // apart; with `change`, each pass shifts every
                            // client's wants by one unit.
                            i = (i + 1) % clients;
                            if i == 0 {
                                pass += 1;
                            }
                            now += 1;
                            let name = names.get(usize::try_from(i).unwrap_or(0));
                            let ctx = LeaseContext::root(&params, 0, now);
                            let wants = if change { i + pass } else { i };
                            black_box(get_capacity(
                                &mut set,
                                &params,
                                ctx,
                                name.map_or("", String::as_str),
                                want(wants),
                            ))
                        });
                    },
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
