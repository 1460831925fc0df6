//! The latency `charon sidecar` adds on loopback (the goal: at most
//! 150 µs at the median): a trivial upstream (an axum handler answering
//! "ok") called directly and through a sidecar whose throttler never
//! queues (qps, a rate no run reaches), one request at a time over a
//! kept-alive HTTP/1.1 connection, then the same over HTTP/2. Upstream,
//! sidecar and client run on their own threads of one process; on a
//! 2-core machine they share the cores, like a sidecar and its service
//! would.
//!
//! `cargo bench -p charon-sidecar --bench added_latency`
//! (`LATENCY_REQUESTS`, 20000 by default).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use charon_sidecar::{Listeners, Settings};
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

fn spawn_runtime(workers: usize, f: impl FnOnce(tokio::runtime::Handle) + Send + 'static) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    let handle = rt.handle().clone();
    std::thread::spawn(move || {
        f(handle);
        rt.block_on(std::future::pending::<()>());
    });
}

fn upstream() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    spawn_runtime(1, move |h| {
        h.spawn(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            axum::serve(l, Router::new().route("/", get(|| async { "ok" }))).await
        });
    });
    addr
}

fn sidecar(upstream: SocketAddr, dir: &std::path::Path) -> SocketAddr {
    let config = dir.join("sidecar.yaml");
    std::fs::write(
        &config,
        "resources: []\nthrottle: { discipline: qps, rate: 1000000000, queue: 0 }\n",
    )
    .expect("write");
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let admin = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = proxy.local_addr().expect("addr");
    for l in [&proxy, &admin] {
        l.set_nonblocking(true).expect("nonblocking");
    }
    let settings = Settings::new(config, format!("http://{upstream}"));
    spawn_runtime(1, move |h| {
        h.spawn(async move {
            let listeners = Listeners {
                proxy: tokio::net::TcpListener::from_std(proxy).expect("listener"),
                admin: tokio::net::TcpListener::from_std(admin).expect("listener"),
            };
            charon_sidecar::run(settings, listeners, std::future::pending()).await
        });
    });
    addr
}

async fn measure(addr: SocketAddr, http2: bool, n: usize) -> Vec<Duration> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http();
    let get = || {
        Request::get(format!("http://{addr}/"))
            .body(Empty::new())
            .expect("request")
    };
    // Warm-up (connections, caches).
    for _ in 0..1000 {
        let r = client.request(get()).await.expect("answer");
        r.into_body().collect().await.expect("body");
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = client.request(get()).await.expect("answer");
        assert!(r.status().is_success());
        r.into_body().collect().await.expect("body");
        out.push(t.elapsed());
    }
    out.sort();
    out
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
}

fn main() {
    let n: usize = std::env::var("LATENCY_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let dir = tempfile::tempdir().expect("dir");
    let up = upstream();
    let side = sidecar(up, dir.path());
    std::thread::sleep(Duration::from_millis(300));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("| protocol | path | p50 | p99 |");
    println!("| --- | --- | --- | --- |");
    for http2 in [false, true] {
        let proto = if http2 { "HTTP/2" } else { "HTTP/1.1" };
        let direct = rt.block_on(measure(up, http2, n));
        let through = rt.block_on(measure(side, http2, n));
        println!(
            "| {proto} | direct | {:.0} µs | {:.0} µs |",
            pct(&direct, 0.5),
            pct(&direct, 0.99)
        );
        println!(
            "| {proto} | through the sidecar | {:.0} µs | {:.0} µs |",
            pct(&through, 0.5),
            pct(&through, 0.99)
        );
        println!(
            "| {proto} | **added** | **{:.0} µs** | {:.0} µs |",
            pct(&through, 0.5) - pct(&direct, 0.5),
            pct(&through, 0.99) - pct(&direct, 0.99)
        );
    }
}
