//! `charon bench`: a load generator for `Limiter.Request`.
//!
//! Opens N connections (each its own HTTP/2 connection) and drives unary
//! requests, either closed loop (each worker sends its next request when
//! the previous one is answered) or open loop at a fixed total rate (each
//! request is scheduled in advance and its latency counted from the
//! scheduled time, so a slow server cannot hide its queueing: no
//! coordinated omission). Latencies go into an HDR histogram.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

/// Flags of `charon bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The server's gRPC address.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:7070")]
    server: String,
    /// The resource to request.
    #[arg(long, default_value = "bench/api")]
    resource: String,
    /// Distinct domains to spread requests over.
    #[arg(long, default_value_t = 1)]
    domains: u64,
    /// Connections to open.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Requests in flight per connection (closed loop).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Open loop: requests per second in all (closed loop if omitted).
    #[arg(long)]
    rate: Option<u64>,
    /// How long to measure.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// How long to run before measuring.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Default)]
struct Tally {
    granted: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
}

pub fn run(args: BenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: BenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let channel: Channel = Endpoint::from_shared(args.server.clone())?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", args.server))?;
        clients.push(LimiterClient::new(channel));
    }
    let measure_from = Instant::now() + args.warmup;
    let shared = Arc::new(Shared {
        histogram: Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?),
        tally: Tally::default(),
        measure_from,
        end: measure_from + args.duration,
    });
    let next_domain = Arc::new(AtomicU64::new(0));
    let worker = |client: &LimiterClient<Channel>| Worker {
        client: client.clone(),
        resource: args.resource.clone(),
        domains: args.domains.max(1),
        next_domain: next_domain.clone(),
        shared: shared.clone(),
    };
    let mut tasks = Vec::new();
    match args.rate {
        None => {
            for client in &clients {
                for _ in 0..args.concurrency {
                    tasks.push(tokio::spawn(worker(client).closed_loop()));
                }
            }
        }
        Some(rate) => {
            let per_connection = (rate as f64 / clients.len() as f64).max(1.0);
            let interval = Duration::from_secs_f64(1.0 / per_connection);
            for client in &clients {
                tasks.push(tokio::spawn(worker(client).open_loop(interval)));
            }
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let tally = &shared.tally;
    let h = shared.histogram.lock().await;
    let measured = h.len();
    let secs = args.duration.as_secs_f64();
    let q = |p: f64| Duration::from_micros(h.value_at_quantile(p));
    let mode = match args.rate {
        None => format!("closed loop, {} in flight per connection", args.concurrency),
        Some(r) => format!("open loop at {r}/s"),
    };
    if args.json {
        println!(
            "{}",
            json!({
                "mode": mode, "connections": args.connections, "domains": args.domains,
                "requests": measured, "throughput_per_second": measured as f64 / secs,
                "granted": tally.granted.load(Ordering::Relaxed), "rejected": tally.rejected.load(Ordering::Relaxed),
                "errors": tally.errors.load(Ordering::Relaxed),
                "p50_us": q(0.5).as_micros() as u64, "p99_us": q(0.99).as_micros() as u64,
                "p999_us": q(0.999).as_micros() as u64, "max_us": h.max(),
            })
        );
    } else {
        println!(
            "charon bench: {mode}, {} connections, {} domains, {:?}",
            args.connections, args.domains, args.duration
        );
        println!("  requests   {measured} ({:.0}/s)", measured as f64 / secs);
        println!(
            "  granted    {}   rejected {}   errors {}",
            tally.granted.load(Ordering::Relaxed),
            tally.rejected.load(Ordering::Relaxed),
            tally.errors.load(Ordering::Relaxed)
        );
        println!(
            "  latency    p50 {:?}   p99 {:?}   p99.9 {:?}   max {:?}",
            q(0.5),
            q(0.99),
            q(0.999),
            Duration::from_micros(h.max())
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// What every load-generating task reports into.
struct Shared {
    histogram: Mutex<Histogram<u64>>,
    tally: Tally,
    measure_from: Instant,
    end: Instant,
}

/// One load-generating task.
struct Worker {
    client: LimiterClient<Channel>,
    resource: String,
    domains: u64,
    next_domain: Arc<AtomicU64>,
    shared: Arc<Shared>,
}

impl Worker {
    fn request(&self) -> v1::RateRequest {
        let d = self.next_domain.fetch_add(1, Ordering::Relaxed) % self.domains;
        v1::RateRequest {
            resource: self.resource.clone(),
            domain: format!("bench-{d}"),
            copies: None,
            min_copies: None,
            dry_run: false,
        }
    }

    /// Sends one request; `since` is when it was due (open loop) or sent.
    async fn one(
        mut client: LimiterClient<Channel>,
        req: v1::RateRequest,
        since: Instant,
        shared: Arc<Shared>,
    ) {
        let result = client.request(req).await;
        let done = Instant::now();
        let tally = &shared.tally;
        match result {
            Ok(r) if r.get_ref().granted > 0 => tally.granted.fetch_add(1, Ordering::Relaxed),
            Ok(_) => tally.rejected.fetch_add(1, Ordering::Relaxed),
            Err(_) => tally.errors.fetch_add(1, Ordering::Relaxed),
        };
        if since >= shared.measure_from && done <= shared.end {
            let us = u64::try_from(done.duration_since(since).as_micros())
                .unwrap_or(u64::MAX)
                .max(1);
            let _ = shared.histogram.lock().await.record(us);
        }
    }

    async fn closed_loop(self) {
        while Instant::now() < self.shared.end {
            let req = self.request();
            Self::one(
                self.client.clone(),
                req,
                Instant::now(),
                self.shared.clone(),
            )
            .await;
        }
    }

    async fn open_loop(self, interval: Duration) {
        let mut due = Instant::now();
        let mut in_flight = tokio::task::JoinSet::new();
        while due < self.shared.end {
            tokio::time::sleep_until(due.into()).await;
            let req = self.request();
            in_flight.spawn(Self::one(
                self.client.clone(),
                req,
                due,
                self.shared.clone(),
            ));
            while in_flight.try_join_next().is_some() {}
            due += interval;
        }
        while in_flight.join_next().await.is_some() {}
    }
}
