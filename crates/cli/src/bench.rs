//! `charon bench`: a load generator for `Limiter.Request`, or with
//! `--envoy DOMAIN` for Envoy's `RateLimitService.ShouldRateLimit` (one
//! descriptor `KEY=bench-N` per call), so both protocols are measured on
//! the same limits.
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

use charon_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use charon_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use charon_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
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
    /// Call Envoy's `ShouldRateLimit` on this Envoy domain instead of
    /// `Limiter.Request` (`--resource` is then unused).
    #[arg(long, value_name = "DOMAIN")]
    envoy: Option<String>,
    /// With `--envoy`: the descriptor's key (its value is `bench-N`).
    #[arg(long, value_name = "KEY", default_value = "client", requires = "envoy")]
    envoy_key: String,
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
        clients.push(match args.envoy {
            None => Client::Charon(LimiterClient::new(channel)),
            Some(ref domain) => Client::Envoy(
                RateLimitServiceClient::new(channel),
                domain.clone(),
                args.envoy_key.clone(),
            ),
        });
    }
    let measure_from = Instant::now() + args.warmup;
    let shared = Arc::new(Shared {
        histogram: Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?),
        tally: Tally::default(),
        measure_from,
        end: measure_from + args.duration,
    });
    let next_domain = Arc::new(AtomicU64::new(0));
    let worker = |client: &Client| Worker {
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
    let mut mode = match args.rate {
        None => format!("closed loop, {} in flight per connection", args.concurrency),
        Some(r) => format!("open loop at {r}/s"),
    };
    if let Some(domain) = &args.envoy {
        mode = format!("Envoy ShouldRateLimit on {domain:?}, {mode}");
    }
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

/// A connection, speaking one of the two protocols.
#[derive(Clone)]
enum Client {
    Charon(LimiterClient<Channel>),
    /// The client, the Envoy domain and the descriptor's key.
    Envoy(RateLimitServiceClient<Channel>, String, String),
}

/// One call, ready to send.
enum Call {
    Charon(LimiterClient<Channel>, v1::RateRequest),
    Envoy(RateLimitServiceClient<Channel>, RateLimitRequest),
}

/// One load-generating task.
struct Worker {
    client: Client,
    resource: String,
    domains: u64,
    next_domain: Arc<AtomicU64>,
    shared: Arc<Shared>,
}

impl Worker {
    fn request(&self) -> Call {
        let d = self.next_domain.fetch_add(1, Ordering::Relaxed) % self.domains;
        match &self.client {
            Client::Envoy(c, domain, key) => Call::Envoy(
                c.clone(),
                RateLimitRequest {
                    domain: domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: key.clone(),
                            value: format!("bench-{d}"),
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 0,
                },
            ),
            Client::Charon(c) => Call::Charon(
                c.clone(),
                v1::RateRequest {
                    resource: self.resource.clone(),
                    domain: format!("bench-{d}"),
                    copies: None,
                    min_copies: None,
                    dry_run: false,
                },
            ),
        }
    }

    /// Sends one request; `since` is when it was due (open loop) or sent.
    async fn one(call: Call, since: Instant, shared: Arc<Shared>) {
        let result = match call {
            Call::Charon(mut c, req) => c.request(req).await.map(|r| r.get_ref().granted > 0),
            Call::Envoy(mut c, req) => c
                .should_rate_limit(req)
                .await
                .map(|r| r.get_ref().overall_code == Code::Ok as i32),
        };
        let done = Instant::now();
        let tally = &shared.tally;
        match result {
            Ok(true) => tally.granted.fetch_add(1, Ordering::Relaxed),
            Ok(false) => tally.rejected.fetch_add(1, Ordering::Relaxed),
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
            let call = self.request();
            Self::one(call, Instant::now(), self.shared.clone()).await;
        }
    }

    async fn open_loop(self, interval: Duration) {
        let mut due = Instant::now();
        let mut in_flight = tokio::task::JoinSet::new();
        while due < self.shared.end {
            tokio::time::sleep_until(due.into()).await;
            let call = self.request();
            in_flight.spawn(Self::one(call, due, self.shared.clone()));
            while in_flight.try_join_next().is_some() {}
            due += interval;
        }
        while in_flight.join_next().await.is_some() {}
    }
}
