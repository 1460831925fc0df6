//! The overload experiment: an axum service with a cheap endpoint (0.1 ms
//! of CPU) and an expensive one (20 ms), on one worker thread, loaded
//! open-loop at 1×, 2× and 4× its capacity with 90 % cheap / 10 %
//! expensive requests, 20 % of them CRITICAL, without a throttler, with
//! `qps` and with `cost`. The capacity is measured first (a closed loop
//! that keeps the service busy: CPU-ms of work answered per second), as an
//! operator would size a throttler from a load test; on a shared machine
//! it is below the 1000 CPU-ms per second of a free core. Both throttlers
//! are set to 90 % of it. For each
//! run: goodput (CPU-ms of work answered 200 within the client's 1 s
//! deadline, over the capacity), CRITICAL success rate, p50/p99 latency
//! of admitted requests, and the share of failures that carried a retry
//! time. Writes `docs/throttler-overload.svg` and prints a table.
//!
//! `scripts/bench-throttle-overload` (or `cargo bench -p charon-throttle
//! --bench overload`; `OVERLOAD_SECONDS` per run, 8 by default).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use charon_core::throttle::{Discipline, ThrottleConfig};
use charon_throttle::{ThrottleLayer, cost};
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const CHEAP: Duration = Duration::from_micros(100);
const EXPENSIVE: Duration = Duration::from_millis(20);
/// Share of expensive requests.
const EXPENSIVE_SHARE: f64 = 0.10;
const CRITICAL_SHARE: f64 = 0.20;
const DEADLINE: Duration = Duration::from_secs(1);

fn burn(d: Duration) {
    let start = cost::thread_cpu();
    while cost::thread_cpu() - start < d {
        std::hint::black_box(0u64);
    }
}

fn mean_cost_ms() -> f64 {
    (1.0 - EXPENSIVE_SHARE) * CHEAP.as_secs_f64() * 1e3
        + EXPENSIVE_SHARE * EXPENSIVE.as_secs_f64() * 1e3
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    None,
    Qps,
    Cost,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::None => "no throttler",
            Mode::Qps => "qps",
            Mode::Cost => "cost",
        }
    }

    fn layer(self, capacity_ms: f64) -> Option<ThrottleLayer> {
        let capacity_rps = capacity_ms / mean_cost_ms();
        let mut c = match self {
            Mode::None => return None,
            // 90 % of the capacity in requests per second; about one
            // expensive request's worth (25 ms of work) may wait.
            Mode::Qps => {
                let rate = (capacity_rps * 0.9) as u64;
                ThrottleConfig::new(Discipline::Qps, rate, (25.0 / mean_cost_ms()).ceil() as u64)
            }
            // 90 % of the CPU; 25 CPU-ms may wait.
            Mode::Cost => ThrottleConfig::new(Discipline::Cost, (capacity_ms * 0.9) as u64, 25),
        };
        c.max_wait = 50;
        c.default_criticality = charon_core::throttle::Criticality::NotCritical;
        Some(ThrottleLayer::new(c))
    }
}

/// One request's fate.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    expensive: bool,
    critical: bool,
    ok: bool,
    latency: Duration,
    retry_after: bool,
}

#[derive(Debug)]
struct Row {
    mode: Mode,
    load: f64,
    goodput: f64,
    critical_success: f64,
    p50_ms: f64,
    p99_ms: f64,
    failures_with_retry: f64,
    sent: usize,
}

fn service(layer: Option<ThrottleLayer>) -> Router {
    let app = Router::new()
        .route(
            "/cheap",
            get(|| async {
                burn(CHEAP);
                "cheap"
            }),
        )
        .route(
            "/expensive",
            get(|| async {
                burn(EXPENSIVE);
                "expensive"
            }),
        );
    match layer {
        Some(l) => app.layer(l),
        None => app,
    }
}

/// Starts the service on its own one-thread runtime; its address.
fn start_service(layer: Option<ThrottleLayer>) -> (SocketAddr, std::sync::mpsc::Sender<()>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            addr_tx
                .send(listener.local_addr().expect("addr"))
                .expect("send");
            let server = tokio::spawn(async move { axum::serve(listener, service(layer)).await });
            tokio::task::spawn_blocking(move || {
                let _ = stop_rx.recv();
            })
            .await
            .expect("stop");
            server.abort();
        });
    });
    (addr_rx.recv().expect("address"), stop_tx)
}

/// A xorshift generator: reproducible mixes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

async fn drive(addr: SocketAddr, rps: f64, seconds: f64, seed: u64) -> Vec<Outcome> {
    let clients: Vec<Client<_, Empty<Bytes>>> = (0..8)
        .map(|_| {
            Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http()
        })
        .collect();
    let mut rng = Rng(seed);
    let start = tokio::time::Instant::now();
    let n = (rps * seconds) as usize;
    let mut tasks = tokio::task::JoinSet::new();
    let mut at = 0.0f64;
    for i in 0..n {
        // Poisson arrivals.
        at += -(1.0 - rng.next()).ln() / rps;
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let expensive = rng.next() < EXPENSIVE_SHARE;
        let critical = rng.next() < CRITICAL_SHARE;
        let client = clients[i % clients.len()].clone();
        let req = Request::get(format!(
            "http://{addr}/{}",
            if expensive { "expensive" } else { "cheap" }
        ))
        .header(
            "charon-criticality",
            if critical { "CRITICAL" } else { "NOT_CRITICAL" },
        )
        .body(Empty::new())
        .expect("request");
        tasks.spawn(async move {
            let sent = Instant::now();
            let (ok, retry_after) = match tokio::time::timeout(DEADLINE, client.request(req)).await
            {
                Ok(Ok(r)) => (
                    r.status().is_success(),
                    r.headers().contains_key("retry-after"),
                ),
                _ => (false, false),
            };
            Outcome {
                expensive,
                critical,
                ok,
                latency: sent.elapsed(),
                retry_after,
            }
        });
    }
    let mut out = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        out.push(r.expect("joined"));
    }
    out
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn summarize(mode: Mode, load: f64, seconds: f64, capacity_ms: f64, outcomes: &[Outcome]) -> Row {
    let work: f64 = outcomes
        .iter()
        .filter(|o| o.ok)
        .map(|o| if o.expensive { EXPENSIVE } else { CHEAP }.as_secs_f64() * 1e3)
        .sum();
    let critical: Vec<_> = outcomes.iter().filter(|o| o.critical).collect();
    let mut admitted: Vec<Duration> = outcomes
        .iter()
        .filter(|o| o.ok)
        .map(|o| o.latency)
        .collect();
    admitted.sort();
    let failures: Vec<_> = outcomes.iter().filter(|o| !o.ok).collect();
    Row {
        mode,
        load,
        goodput: work / seconds / capacity_ms,
        critical_success: critical.iter().filter(|o| o.ok).count() as f64
            / critical.len().max(1) as f64,
        p50_ms: percentile(&admitted, 0.50),
        p99_ms: percentile(&admitted, 0.99),
        failures_with_retry: if failures.is_empty() {
            f64::NAN
        } else {
            failures.iter().filter(|o| o.retry_after).count() as f64 / failures.len() as f64
        },
        sent: outcomes.len(),
    }
}

/// CPU-ms of work the service answers per second when kept busy: 4
/// requests of the mix always in flight, for 3 s.
fn calibrate(rt: &tokio::runtime::Runtime) -> f64 {
    let (addr, stop) = start_service(None);
    let work = rt.block_on(async move {
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let end = Instant::now() + Duration::from_secs(3);
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..4u64 {
            let client = client.clone();
            tasks.spawn(async move {
                let mut rng = Rng(w + 1);
                let mut work = 0.0;
                while Instant::now() < end {
                    let expensive = rng.next() < EXPENSIVE_SHARE;
                    let path = if expensive { "expensive" } else { "cheap" };
                    let req = Request::get(format!("http://{addr}/{path}"))
                        .body(Empty::new())
                        .expect("request");
                    if client
                        .request(req)
                        .await
                        .is_ok_and(|r| r.status().is_success())
                    {
                        work += if expensive { EXPENSIVE } else { CHEAP }.as_secs_f64() * 1e3;
                    }
                }
                work
            });
        }
        let mut work = 0.0;
        while let Some(w) = tasks.join_next().await {
            work += w.expect("joined");
        }
        work
    });
    let _ = stop.send(());
    work / 3.0
}

fn run(mode: Mode, load: f64, seconds: f64, capacity_ms: f64, rt: &tokio::runtime::Runtime) -> Row {
    let (addr, stop) = start_service(mode.layer(capacity_ms));
    let capacity_rps = capacity_ms / mean_cost_ms();
    // Warm-up at capacity: connections open, the cost classes learnt.
    rt.block_on(drive(addr, capacity_rps * 0.5, 1.5, 7));
    let outcomes = rt.block_on(drive(addr, capacity_rps * load, seconds, 42));
    let _ = stop.send(());
    summarize(mode, load, seconds, capacity_ms, &outcomes)
}

fn svg(rows: &[Row], unloaded_p99: f64) -> String {
    let (w, h) = (900.0, 330.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let charts = [
        ("Goodput (% of capacity)", 0usize, 100.0),
        ("CRITICAL success (%)", 1, 100.0),
        (
            "Admitted p99 latency (ms)",
            2,
            rows.iter()
                .map(|r| r.p99_ms)
                .filter(|x| x.is_finite())
                .fold(unloaded_p99 * 2.0, f64::max),
        ),
    ];
    let colors = ["#9e9e9e", "#4f81bd", "#c0504d"];
    let modes = [Mode::None, Mode::Qps, Mode::Cost];
    let loads = [1.0, 2.0, 4.0];
    for (ci, (title, metric, max)) in charts.iter().enumerate() {
        let x0 = 40.0 + ci as f64 * 290.0;
        let (cw, ch, y0) = (240.0, 220.0, 40.0);
        let _ = write!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-weight="bold">{title}</text>"#,
            x0 + cw / 2.0
        );
        let _ = write!(
            s,
            r#"<line x1="{x0}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
            y0 + ch,
            x0 + cw,
            y0 + ch
        );
        let _ = write!(
            s,
            r#"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{}" stroke="black"/>"#,
            y0 + ch
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{max:.0}</text>"#,
            x0 - 3.0,
            y0 + 4.0
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">0</text>"#,
            x0 - 3.0,
            y0 + ch
        );
        if *metric == 2 {
            let y = y0 + ch - (unloaded_p99 * 2.0 / max) * ch;
            let _ = write!(
                s,
                r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#2e7d32" stroke-dasharray="4 3"/><text x="{}" y="{}" fill="#2e7d32">2× unloaded p99</text>"##,
                x0 + cw,
                x0 + 4.0,
                y - 3.0
            );
        }
        for (li, load) in loads.iter().enumerate() {
            let gx = x0 + 10.0 + li as f64 * 78.0;
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{load}×</text>"#,
                gx + 30.0,
                y0 + ch + 15.0
            );
            for (mi, mode) in modes.iter().enumerate() {
                let Some(r) = rows.iter().find(|r| r.mode == *mode && r.load == *load) else {
                    continue;
                };
                let v = match metric {
                    0 => r.goodput * 100.0,
                    1 => r.critical_success * 100.0,
                    _ => r.p99_ms,
                };
                let v = if v.is_finite() { v.min(*max) } else { 0.0 };
                let bh = v / max * ch;
                let _ = write!(
                    s,
                    r#"<rect x="{}" y="{}" width="18" height="{bh:.1}" fill="{}"/>"#,
                    gx + mi as f64 * 20.0,
                    y0 + ch - bh,
                    colors[mi]
                );
            }
        }
    }
    for (mi, mode) in modes.iter().enumerate() {
        let x = 40.0 + mi as f64 * 140.0;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            h - 30.0,
            colors[mi],
            x + 16.0,
            h - 20.0,
            mode.name()
        );
    }
    s.push_str("</svg>\n");
    s
}

fn main() {
    // `cargo bench` passes --bench; this harness takes no other argument.
    let seconds: f64 = std::env::var("OVERLOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8.0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let capacity_ms = calibrate(&rt);
    let capacity_rps = capacity_ms / mean_cost_ms();
    println!(
        "capacity (measured): {capacity_ms:.0} CPU-ms/s of work, mean cost {:.2} ms: {capacity_rps:.0} requests/s; {seconds} s per run",
        mean_cost_ms()
    );
    let base = run(Mode::None, 0.25, seconds, capacity_ms, &rt);
    println!(
        "unloaded (0.25×, no throttler): p50 {:.1} ms, p99 {:.1} ms",
        base.p50_ms, base.p99_ms
    );
    let mut rows = Vec::new();
    for load in [1.0, 2.0, 4.0] {
        for mode in [Mode::None, Mode::Qps, Mode::Cost] {
            let r = run(mode, load, seconds, capacity_ms, &rt);
            eprintln!("{} at {load}×: {r:?}", mode.name());
            rows.push(r);
        }
    }
    println!();
    println!(
        "| load | throttler | sent | goodput | CRITICAL success | admitted p50 | admitted p99 | failures with a retry time |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {}× | {} | {} | {:.0} % | {:.1} % | {:.1} ms | {:.1} ms | {} |",
            r.load,
            r.mode.name(),
            r.sent,
            r.goodput * 100.0,
            r.critical_success * 100.0,
            r.p50_ms,
            r.p99_ms,
            if r.failures_with_retry.is_finite() {
                format!("{:.0} %", r.failures_with_retry * 100.0)
            } else {
                "no failures".to_owned()
            }
        );
    }
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/throttler-overload.svg");
    std::fs::write(&path, svg(&rows, base.p99_ms)).expect("write the figure");
    println!("\nfigure: {}", path.display());
}
