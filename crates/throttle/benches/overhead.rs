//! What the throttle layer adds to one admitted request when its queue is
//! empty (the goal: at most 1 µs of CPU): the same trivial service called
//! bare and behind the layer, in both disciplines, on one thread (so the
//! time per iteration is CPU time). The difference between `bare` and a
//! layered run is the layer's cost: deciding (a mutex, the machine, the
//! class's estimate), counting, and, with `cost`, measuring the inner
//! future's thread CPU time (two clock_gettime calls per poll) and
//! teaching the estimate.
//!
//! `cargo bench -p charon-throttle --bench overhead`

use std::convert::Infallible;
use std::hint::black_box;

use charon_core::throttle::{Discipline, ThrottleConfig};
use charon_throttle::ThrottleLayer;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use tower::{Layer, Service, ServiceExt, service_fn};

async fn answer(_req: Request<()>) -> Result<Response<()>, Infallible> {
    Ok(Response::new(()))
}

fn request() -> Request<()> {
    Request::get("/items/42").body(()).expect("request")
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("throttle_layer");
    group.bench_function("bare", |b| {
        let mut svc = service_fn(answer);
        b.iter(|| {
            runtime.block_on(async {
                black_box(svc.ready().await.expect("ready").call(request()).await)
            })
        });
    });
    for discipline in [Discipline::Qps, Discipline::Cost] {
        // A rate no benchmark reaches: the queue stays empty, every request
        // starts at once.
        let layer = ThrottleLayer::new(ThrottleConfig::new(discipline, 1_000_000_000, 0));
        let mut svc = layer.layer(service_fn(answer));
        group.bench_function(discipline.name(), |b| {
            b.iter(|| {
                runtime.block_on(async {
                    let r = svc.ready().await.expect("ready").call(request()).await;
                    assert!(
                        r.as_ref().is_ok_and(|r| r.status().is_success()),
                        "admitted"
                    );
                    black_box(r)
                })
            });
        });
        assert_eq!(layer.throttler().queue().0, 0, "the queue stayed empty");
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
