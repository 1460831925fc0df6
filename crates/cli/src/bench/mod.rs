//! `charon bench`: a load generator for `Limiter.Request` as unary calls
//! (`--mode unary`, the default), for rate requests on session streams
//! through the Rust client (`--mode session`: pipelined, replies matched by
//! id), or with `--envoy DOMAIN` for Envoy's
//! `RateLimitService.ShouldRateLimit` (one descriptor `KEY=bench-N` per
//! call), so every protocol is measured on the same limits; `--mode lease`
//! calls `Capacity.GetCapacity` instead, `--domains` clients (`bench-N`)
//! refreshing leases on a lease resource (SPEC §12), and `--mode copies`
//! reserves a copy and releases it, both on a session stream.
//!
//! Opens N connections (each its own HTTP/2 connection; in session mode
//! each a client with its one session stream) and drives requests, either
//! closed loop (each worker sends its next request when the previous one is
//! answered) or open loop at a fixed total rate (each request is scheduled
//! in advance and its latency counted from the scheduled time, so a slow
//! server cannot hide its queueing: no coordinated omission). Latencies go
//! into an HDR histogram.
//!
//! What a decision costs besides time: with `--server-pid` the server's CPU
//! (utime + stime of `/proc/PID/stat` over the measured interval, divided
//! by the decisions measured), with `--redis` Redis' commands and CPU
//! (`INFO commandstats` and `INFO cpu` deltas), and always this process's
//! own CPU, since on one box the load tool competes with the server.

mod costs;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use charon_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use charon_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use charon_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use charon_proto::v1;
use charon_proto::v1::capacity_client::CapacityClient;
use charon_proto::v1::limiter_client::LimiterClient;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::sync::Mutex;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use self::costs::{Costs, Probe};
use crate::tls_args::ServerArgs;

/// How `charon bench` sends Charon rate requests.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One unary `Limiter.Request` call per decision.
    Unary,
    /// Rate requests pipelined on one session stream per connection,
    /// through the Rust client (`charon_client`, its default transport).
    Session,
    /// `Capacity.GetCapacity` calls: `--domains` clients (`bench-N`, each
    /// wanting 1 to 8 units) refreshing leases on `--resource`, a lease
    /// resource; "granted" is a lease above 0.
    Lease,
    /// A reserve of one copy of `--resource` (a `kind: copy` resource) on a
    /// session stream, then, if granted, its release: one "decision" is the
    /// pair, the cycle of a copy-limited caller.
    Copies,
}

/// Flags of `charon bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The resource to request; several (`a,b,c`) take turns, so that on
    /// a Redis Cluster the pairs spread over the shards (one resource's
    /// keys share one slot).
    #[arg(long, default_value = "bench/api", value_delimiter = ',')]
    resource: Vec<String>,
    /// Distinct domains to spread requests over.
    #[arg(long, default_value_t = 1)]
    domains: u64,
    /// Connections to open.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Requests in flight per connection (closed loop).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Unary calls, pipelined session streams (one per connection), lease
    /// refreshes, or reserves and releases of copies.
    #[arg(long, value_enum, default_value_t = Mode::Unary)]
    mode: Mode,
    /// The server's process id: report its CPU per decision (Linux
    /// `/proc/PID/stat`, utime + stime over the measured interval).
    #[arg(long, value_name = "PID")]
    server_pid: Option<u32>,
    /// The server's Redis: report Redis commands and CPU per decision
    /// (`INFO commandstats`, `INFO cpu` over the measured interval; the
    /// bench's own `INFO` calls are not counted). Repeat it (or separate
    /// URLs with commas) for every node of a Redis Cluster: the figures
    /// are the sums over all the nodes given.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    redis: Vec<String>,
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
    if args.envoy.is_some() && args.mode != Mode::Unary {
        anyhow::bail!("--envoy calls ShouldRateLimit, a unary call: it takes no other --mode");
    }
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        if matches!(args.mode, Mode::Session | Mode::Copies) {
            clients.push(Client::Session(session_client(&args).await?));
            continue;
        }
        let server = &args.server;
        let channel: Channel =
            charon_client::endpoint(&server.url(), server.tls.client()?.as_ref())?
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| charon_client::Error::from_connect_error(e, &server.url()))?;
        let conn = InterceptedService::new(channel, server.bearer()?);
        clients.push(match args.envoy {
            None if args.mode == Mode::Lease => Client::Capacity(CapacityClient::new(conn)),
            None => Client::Charon(LimiterClient::new(conn)),
            Some(ref domain) => Client::Envoy(
                RateLimitServiceClient::new(conn),
                domain.clone(),
                args.envoy_key.clone(),
            ),
        });
    }
    let probe = Probe::new(args.server_pid, &args.redis).await?;
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
        resources: args.resource.clone().into(),
        copies: args.mode == Mode::Copies,
        domains: args.domains.max(1),
        next_domain: next_domain.clone(),
        shared: shared.clone(),
    };
    let probing = {
        let (mut probe, from, end) = (probe, shared.measure_from, shared.end);
        tokio::spawn(async move {
            tokio::time::sleep_until(from.into()).await;
            let before = probe.sample().await;
            tokio::time::sleep_until(end.into()).await;
            let after = probe.sample().await;
            (before, after)
        })
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
    let (before, after) = probing.await?;
    let (before, after) = (before?, after?);
    let tally = &shared.tally;
    let h = shared.histogram.lock().await;
    let measured = h.len();
    let secs = args.duration.as_secs_f64();
    let q = |p: f64| Duration::from_micros(h.value_at_quantile(p));
    let mut mode = match args.rate {
        None => format!("closed loop, {} in flight per connection", args.concurrency),
        Some(r) => format!("open loop at {r}/s"),
    };
    let transport = match (&args.envoy, args.mode) {
        (Some(domain), _) => {
            mode = format!("Envoy ShouldRateLimit on {domain:?}, {mode}");
            "envoy"
        }
        (None, Mode::Session) => {
            mode = format!("session streams, {mode}");
            "session"
        }
        (None, Mode::Unary) => "unary",
        (None, Mode::Lease) => {
            mode = format!("GetCapacity by {} clients, {mode}", args.domains.max(1));
            "lease"
        }
        (None, Mode::Copies) => {
            mode = format!("reserve and release of a copy on session streams, {mode}");
            "copies"
        }
    };
    let costs = Costs::between(&before, &after, measured);
    if args.json {
        println!(
            "{}",
            json!({
                "mode": mode, "transport": transport,
                "connections": args.connections, "domains": args.domains,
                "requests": measured, "throughput_per_second": measured as f64 / secs,
                "granted": tally.granted.load(Ordering::Relaxed), "rejected": tally.rejected.load(Ordering::Relaxed),
                "errors": tally.errors.load(Ordering::Relaxed),
                "p50_us": q(0.5).as_micros() as u64, "p99_us": q(0.99).as_micros() as u64,
                "p999_us": q(0.999).as_micros() as u64, "max_us": h.max(),
                "server_cpu_us_per_decision": costs.server_cpu_us,
                "bench_cpu_us_per_decision": costs.bench_cpu_us,
                "redis_commands_per_decision": costs.redis_commands,
                "redis_cpu_us_per_decision": costs.redis_cpu_us,
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
        let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        println!(
            "  per decision   server CPU {} us   bench CPU {} us   Redis commands {}   Redis CPU {} us",
            show(costs.server_cpu_us),
            show(costs.bench_cpu_us),
            show(
                costs
                    .redis_commands
                    .map(|v| v * 10.0)
                    .map(f64::round)
                    .map(|v| v / 10.0)
            ),
            show(costs.redis_cpu_us)
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// A client of its own (its own connection and session stream) for one
/// `--connections` slot in session mode. Degraded mode is off, so a server
/// error counts as an error and never as a grant; the bound on operations
/// in flight is the concurrency asked for (open loop: high enough never to
/// hold the schedule back).
async fn session_client(args: &BenchArgs) -> anyhow::Result<charon_client::Client> {
    let mut options = args.server.options()?;
    options.request_timeout = Duration::from_secs(30);
    options.max_in_flight = match args.rate {
        None => args.concurrency.max(1),
        Some(_) => 1 << 16,
    };
    Ok(charon_client::Client::connect(options)?)
}

/// What every load-generating task reports into.
struct Shared {
    histogram: Mutex<Histogram<u64>>,
    tally: Tally,
    measure_from: Instant,
    end: Instant,
}

/// One connection of a plain gRPC client, sending the bearer token (if
/// any) with every call.
type Conn = InterceptedService<Channel, charon_client::Bearer>;

/// A connection, speaking one of the two protocols.
#[derive(Clone)]
enum Client {
    Charon(LimiterClient<Conn>),
    /// The client, the Envoy domain and the descriptor's key.
    Envoy(RateLimitServiceClient<Conn>, String, String),
    /// The Rust client on its session stream.
    Session(charon_client::Client),
    /// `charon.v1.Capacity`.
    Capacity(CapacityClient<Conn>),
}

/// One call, ready to send.
enum Call {
    Charon(LimiterClient<Conn>, v1::RateRequest),
    /// A client, the resource and the domain.
    Session(charon_client::Client, String, String),
    /// A reserve, then its release: a client, the resource and the domain.
    Copies(charon_client::Client, String, String),
    Envoy(RateLimitServiceClient<Conn>, RateLimitRequest),
    Capacity(CapacityClient<Conn>, v1::GetCapacityRequest),
}

/// One load-generating task.
struct Worker {
    client: Client,
    resources: Arc<[String]>,
    /// `--mode copies`: each call a reserve and its release.
    copies: bool,
    domains: u64,
    next_domain: Arc<AtomicU64>,
    shared: Arc<Shared>,
}

impl Worker {
    fn request(&self) -> Call {
        let k = self.next_domain.fetch_add(1, Ordering::Relaxed);
        let d = k % self.domains;
        let resource = self.resources[(k % self.resources.len() as u64) as usize].clone();
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
            Client::Session(c) if self.copies => {
                Call::Copies(c.clone(), resource, format!("bench-{d}"))
            }
            Client::Session(c) => Call::Session(c.clone(), resource, format!("bench-{d}")),
            Client::Capacity(c) => Call::Capacity(
                c.clone(),
                v1::GetCapacityRequest {
                    client_id: format!("bench-{d}"),
                    resources: vec![v1::ResourceWant {
                        resource,
                        wants: (1 + d % 8) as f64,
                        has: 0.0,
                        subclients: 1,
                    }],
                },
            ),
            Client::Charon(c) => Call::Charon(
                c.clone(),
                v1::RateRequest {
                    resource,
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
            Call::Charon(mut c, req) => c
                .request(req)
                .await
                .map(|r| r.get_ref().granted > 0)
                .map_err(drop),
            Call::Session(c, resource, domain) => c
                .request(resource, domain)
                .send()
                .await
                .map(|g| g.granted > 0)
                .map_err(drop),
            Call::Copies(c, resource, domain) => Self::reserve_release(c, resource, domain).await,
            Call::Envoy(mut c, req) => c
                .should_rate_limit(req)
                .await
                .map(|r| r.get_ref().overall_code == Code::Ok as i32)
                .map_err(drop),
            Call::Capacity(mut c, req) => c
                .get_capacity(req)
                .await
                .map(|r| r.get_ref().leases.iter().any(|l| l.capacity > 0.0))
                .map_err(drop),
        };
        let done = Instant::now();
        // A call sent (or due) in the measured interval is counted, on both
        // sides: its outcome and its latency, also if its answer comes
        // after the interval ended (at most one call per worker in flight
        // then); the warm-up's count on neither. So granted + rejected +
        // errors = requests, and every call the server answered after the
        // warm-up is in them.
        if since < shared.measure_from {
            return;
        }
        let tally = &shared.tally;
        match result {
            Ok(true) => tally.granted.fetch_add(1, Ordering::Relaxed),
            Ok(false) => tally.rejected.fetch_add(1, Ordering::Relaxed),
            Err(()) => tally.errors.fetch_add(1, Ordering::Relaxed),
        };
        let us = u64::try_from(done.duration_since(since).as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        // Past the histogram's bound (a minute): counted at the bound, never
        // dropped.
        shared.histogram.lock().await.saturating_record(us);
    }

    /// Whether the reserve was granted; an error of either call is an error.
    async fn reserve_release(
        c: charon_client::Client,
        resource: String,
        domain: String,
    ) -> Result<bool, ()> {
        let mut hold = c.reserve(resource, domain).send().await.map_err(drop)?;
        if !hold.is_granted() {
            return Ok(false);
        }
        hold.release_all().await.map_err(drop)?;
        Ok(true)
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
