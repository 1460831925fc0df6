//! The overload experiment: an axum service with a cheap endpoint (0.1 ms
//! of CPU) and an expensive one (20 ms), on one worker thread, loaded
//! open-loop at 1×, 2× and 4× its capacity with a mix of cheap and
//! expensive requests (10 % expensive unless `OVERLOAD_EXPENSIVE_SHARE`
//! says otherwise), 20 % of them CRITICAL, without a throttler, with `qps`
//! and with `cost`. The capacity is measured first (a closed loop that
//! keeps the service busy: CPU-ms of work answered per second), as an
//! operator would size a throttler from a load test; on a shared machine
//! it is below the 1000 CPU-ms per second of a free core. Both throttlers
//! are set to a share of it (`OVERLOAD_RATE_SHARE`, 0.95) with
//! `OVERLOAD_QUEUE_MS` (40) of work allowed to wait and
//! `OVERLOAD_MAX_WAIT_MS` (100). For each run: goodput (CPU-ms of work
//! answered 200 within the client's 1 s deadline, over the capacity),
//! CRITICAL success rate, p50/p99 latency of admitted requests, and the
//! share of failures that carried a retry time; then the same arrivals
//! through the rules alone on a virtual clock (an ideal server), which
//! separates what the rules allow from what the machine took. Writes
//! `docs/throttler-overload.svg` and prints both tables.
//!
//! `scripts/bench-throttle-overload` (or `cargo bench -p charon-throttle
//! --bench overload`; `OVERLOAD_SECONDS` per run, 8 by default;
//! `OVERLOAD_MODEL_ONLY=1` for the rules alone at a nominal capacity;
//! `OVERLOAD_FIGURE` names the figure's file in `docs/`).

#[path = "overload/svg.rs"]
mod svg;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use charon_core::throttle::{Admission, Criticality, Discipline, Event, Throttle, ThrottleConfig};
use charon_throttle::{ThrottleLayer, cost};
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const CHEAP: Duration = Duration::from_micros(100);
const EXPENSIVE: Duration = Duration::from_millis(20);
const CRITICAL_SHARE: f64 = 0.20;
const DEADLINE: Duration = Duration::from_secs(1);

/// The experiment's knobs, from the environment so that one build can run
/// several mixes and throttler sizings.
#[derive(Debug)]
struct Settings {
    /// Seconds per run (`OVERLOAD_SECONDS`, 8).
    seconds: f64,
    /// Share of expensive requests (`OVERLOAD_EXPENSIVE_SHARE`, 0.10).
    expensive_share: f64,
    /// The throttlers' rate as a share of the measured capacity
    /// (`OVERLOAD_RATE_SHARE`, 0.95).
    rate_share: f64,
    /// CPU-ms of work that may wait (`OVERLOAD_QUEUE_MS`, 40: two
    /// expensive requests).
    queue_ms: f64,
    /// `max_wait` in ms (`OVERLOAD_MAX_WAIT_MS`, 100).
    max_wait_ms: u64,
}

fn settings() -> &'static Settings {
    static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
    SETTINGS.get_or_init(|| {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            std::env::var(name)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(default)
        }
        Settings {
            seconds: var("OVERLOAD_SECONDS", 8.0),
            expensive_share: var("OVERLOAD_EXPENSIVE_SHARE", 0.10),
            rate_share: var("OVERLOAD_RATE_SHARE", 0.95),
            queue_ms: var("OVERLOAD_QUEUE_MS", 40.0),
            max_wait_ms: var("OVERLOAD_MAX_WAIT_MS", 100),
        }
    })
}

fn burn(d: Duration) {
    let start = cost::thread_cpu();
    while cost::thread_cpu() - start < d {
        std::hint::black_box(0u64);
    }
}

fn mean_cost_ms() -> f64 {
    let share = settings().expensive_share;
    (1.0 - share) * CHEAP.as_secs_f64() * 1e3 + share * EXPENSIVE.as_secs_f64() * 1e3
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

    /// The throttler's configuration sized from the measured capacity.
    fn config(self, capacity_ms: f64) -> Option<ThrottleConfig> {
        let capacity_rps = capacity_ms / mean_cost_ms();
        let s = settings();
        let mut c = match self {
            Mode::None => return None,
            // A share of the capacity in requests per second; the queue
            // holds about `queue_ms` of work in requests of the mean.
            Mode::Qps => ThrottleConfig::new(
                Discipline::Qps,
                (capacity_rps * s.rate_share) as u64,
                (s.queue_ms / mean_cost_ms()).ceil() as u64,
            ),
            // A share of the CPU; `queue_ms` CPU-ms may wait.
            Mode::Cost => ThrottleConfig::new(
                Discipline::Cost,
                (capacity_ms * s.rate_share) as u64,
                s.queue_ms as u64,
            ),
        };
        c.max_wait = s.max_wait_ms;
        c.default_criticality = Criticality::NotCritical;
        Some(c)
    }

    fn layer(self, capacity_ms: f64) -> Option<ThrottleLayer> {
        self.config(capacity_ms).map(ThrottleLayer::new)
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

/// One request of the open-loop load.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    /// Seconds after the start.
    at_s: f64,
    expensive: bool,
    critical: bool,
}

/// Poisson arrivals of the mix at `rps`: the same sequence for a seed, so
/// that the model below sees exactly the load the service saw.
fn arrivals(rps: f64, seconds: f64, seed: u64) -> Vec<Arrival> {
    let mut rng = Rng(seed);
    let mut at_s = 0.0f64;
    (0..(rps * seconds) as usize)
        .map(|_| {
            at_s += -(1.0 - rng.next()).ln() / rps;
            Arrival {
                at_s,
                expensive: rng.next() < settings().expensive_share,
                critical: rng.next() < CRITICAL_SHARE,
            }
        })
        .collect()
}

async fn drive(addr: SocketAddr, rps: f64, seconds: f64, seed: u64) -> Vec<Outcome> {
    let clients: Vec<Client<_, Empty<Bytes>>> = (0..8)
        .map(|_| {
            Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http()
        })
        .collect();
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, a) in arrivals(rps, seconds, seed).into_iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(a.at_s)).await;
        let Arrival {
            expensive,
            critical,
            ..
        } = a;
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
    let mut out = Vec::with_capacity(tasks.len());
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
                    let expensive = rng.next() < settings().expensive_share;
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

/// The rules alone, on a virtual clock: the same arrivals through
/// `charon_core`'s throttler (its predictions already learnt) into an ideal
/// server that works through started requests one at a time at the
/// measured capacity. What the throttling rules allow for this mix and
/// sizing, without the machine's noise or the cost of refusing; the gap to
/// the measured row is the machine's.
fn model(mode: Mode, load: f64, seconds: f64, capacity_ms: f64) -> Row {
    let arrivals = arrivals(capacity_ms / mean_cost_ms() * load, seconds, 42);
    let ns = |s: f64| (s * 1e9) as u64;
    let mut starts: Vec<(u64, usize)> = Vec::new();
    match mode.config(capacity_ms) {
        None => starts.extend(arrivals.iter().enumerate().map(|(i, a)| (ns(a.at_s), i))),
        Some(mut c) => {
            c.classes = [("cheap", CHEAP), ("expensive", EXPENSIVE)]
                .map(|(k, d)| (k.to_owned(), d.as_micros() as u64))
                .into();
            let mut throttle = Throttle::new(c);
            let mut events = Vec::new();
            let started = |events: &mut Vec<Event>, starts: &mut Vec<(u64, usize)>| {
                for e in events.drain(..) {
                    if let Event::Started { id, at, .. } = e {
                        starts.push((at * 1_000_000, id as usize));
                    }
                }
            };
            for (i, a) in arrivals.iter().enumerate() {
                let now = ns(a.at_s);
                throttle.advance_into_ns(now, &mut events);
                started(&mut events, &mut starts);
                let class = if a.expensive { "expensive" } else { "cheap" };
                let criticality = if a.critical {
                    Criticality::Critical
                } else {
                    Criticality::NotCritical
                };
                let arrived = throttle.arrive_ns(now, i as u64, class, criticality);
                if arrived.admission == Admission::Started {
                    starts.push((now, i));
                }
            }
            throttle.advance_into_ns(u64::MAX / 2, &mut events);
            started(&mut events, &mut starts);
        }
    }
    // Not started: refused by the throttler, with a retry time.
    let mut outcomes: Vec<Outcome> = arrivals
        .iter()
        .map(|a| Outcome {
            expensive: a.expensive,
            critical: a.critical,
            ok: false,
            latency: Duration::ZERO,
            retry_after: true,
        })
        .collect();
    starts.sort_by_key(|&(at, _)| at);
    let wall_ms_per_cpu_ms = 1000.0 / capacity_ms;
    let mut busy_until_ms = 0.0f64;
    for (at, i) in starts {
        let a = arrivals[i];
        let cost = if a.expensive { EXPENSIVE } else { CHEAP };
        busy_until_ms =
            busy_until_ms.max(at as f64 / 1e6) + cost.as_secs_f64() * 1e3 * wall_ms_per_cpu_ms;
        let latency = Duration::from_secs_f64((busy_until_ms - a.at_s * 1e3).max(0.0) / 1e3);
        outcomes[i] = Outcome {
            ok: latency <= DEADLINE,
            latency,
            retry_after: false,
            ..outcomes[i]
        };
    }
    summarize(mode, load, seconds, capacity_ms, &outcomes)
}

fn print_table(rows: &[Row]) {
    println!(
        "| load | throttler | sent | goodput | CRITICAL success | admitted p50 | admitted p99 | failures with a retry time |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
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
}

fn main() {
    // `cargo bench` passes --bench; this harness takes no other argument.
    let seconds = settings().seconds;
    println!("{:?}", settings());
    if std::env::var_os("OVERLOAD_MODEL_ONLY").is_some() {
        // The rules alone, for a free core: seconds, not minutes, and no
        // machine noise (for sizing a throttler before a load test).
        let models: Vec<Row> = [1.0, 2.0, 4.0]
            .into_iter()
            .flat_map(|load| {
                [Mode::None, Mode::Qps, Mode::Cost].map(|m| model(m, load, seconds, 1000.0))
            })
            .collect();
        let unloaded = model(Mode::None, 0.25, seconds, 1000.0);
        println!(
            "the rules on a virtual clock, capacity 1000 CPU-ms/s (unloaded p99 {:.1} ms):\n",
            unloaded.p99_ms
        );
        print_table(&models);
        return;
    }
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
    let mut models = Vec::new();
    for load in [1.0, 2.0, 4.0] {
        for mode in [Mode::None, Mode::Qps, Mode::Cost] {
            let r = run(mode, load, seconds, capacity_ms, &rt);
            eprintln!("{} at {load}×: {r:?}", mode.name());
            rows.push(r);
            models.push(model(mode, load, seconds, capacity_ms));
        }
    }
    println!("\nmeasured:\n");
    print_table(&rows);
    let unloaded = model(Mode::None, 0.25, seconds, capacity_ms);
    println!(
        "\nthe rules on a virtual clock (the same arrivals, an ideal server at the measured capacity; unloaded p99 {:.1} ms):\n",
        unloaded.p99_ms
    );
    print_table(&models);
    let figure =
        std::env::var("OVERLOAD_FIGURE").unwrap_or_else(|_| "throttler-overload.svg".into());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(figure);
    std::fs::write(&path, svg::svg(&rows, base.p99_ms)).expect("write the figure");
    println!("\nfigure: {}", path.display());
}
