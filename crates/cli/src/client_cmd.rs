//! `charon client …`: one operation against a running server, for operators
//! poking at a deployment (and for tests that need a client process).
//! Degraded mode is off here: an unreachable server is reported, not
//! papered over.

use std::process::ExitCode;
use std::time::Duration;

use charon_client::{Error, Lease, LeaseMode, LeaseOptions};
use charon_proto::v1;
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use crate::tls_args::ServerArgs;

/// Where one operation goes and on whose behalf: the flags every client
/// command shares (`charge` and `refund` take only these: a cost has no
/// `min_copies`).
#[derive(Args, Debug)]
pub struct CostTarget {
    #[command(flatten)]
    server: ServerArgs,
    /// The resource (charge: a bucket, window or queue; refund: a bucket).
    resource: String,
    /// The domain on whose behalf to ask or to record the cost.
    domain: String,
    /// How many hits or copies to ask for, or units to charge or refund.
    #[arg(long, default_value_t = 1)]
    copies: u64,
}

/// Flags of `request` and `hold`: a [`CostTarget`] and the fewest worth
/// having.
#[derive(Args, Debug)]
pub struct Target {
    #[command(flatten)]
    base: CostTarget,
    /// The fewest worth having.
    #[arg(long, default_value_t = 1)]
    min_copies: u64,
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// A rate-limited request; prints the reply as JSON.
    Request {
        #[command(flatten)]
        target: Target,
        /// Retry rejections with back-off for up to this long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        max_wait: Duration,
        /// Decide and answer as the request would be, recording nothing
        /// (every rate-like kind).
        #[arg(long)]
        dry_run: bool,
    },
    /// Record a cost after the fact (never rejected);
    /// prints the reply as JSON.
    Charge {
        #[command(flatten)]
        target: CostTarget,
    },
    /// Give tokens back to a bucket; prints the reply
    /// as JSON.
    Refund {
        #[command(flatten)]
        target: CostTarget,
    },
    /// Reserve copies, print the reply as JSON, and hold them until this
    /// process is stopped (SIGTERM or SIGINT release them; SIGKILL leaves
    /// that to the server).
    Hold {
        #[command(flatten)]
        target: Target,
    },
    /// Hold a capacity lease (`kind: lease`) until stopped, printing it as a
    /// JSON line at start and after every refresh (capacity, where it
    /// comes from, wants, safe capacity, expiry); SIGTERM or SIGINT give it
    /// back, SIGKILL leaves it to lapse at its expiry.
    Lease(LeaseArgs),
}

/// Flags of `client lease`.
#[derive(Args, Debug)]
pub struct LeaseArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// A `kind: lease` resource.
    resource: String,
    /// The capacity wanted (units per second; fractions allowed); with
    /// `--adaptive`, the most asked for.
    #[arg(long)]
    wants: f64,
    /// Who holds the lease. Default: this host's name and this process id.
    #[arg(long)]
    client_id: Option<String>,
    /// What to use once the lease expired and no server answers.
    #[arg(long, value_enum, default_value_t = Mode::Safe)]
    mode: Mode,
    /// Ask for what is used (with `--spend`), at most `--wants`.
    #[arg(long)]
    adaptive: bool,
    /// Spend the lease: take units as fast as it allows, and print how
    /// many were taken since the last line.
    #[arg(long)]
    spend: bool,
}

/// `--mode` of `client lease`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Mode {
    /// What it wants.
    Optimistic,
    /// Nothing.
    Pessimistic,
    /// The safe capacity the server last gave.
    Safe,
}

pub fn run(command: ClientCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match command {
            ClientCommand::Request {
                target,
                max_wait,
                dry_run,
            } => {
                let client = target.base.server.connect()?;
                let grant = client
                    .request(&target.base.resource, &target.base.domain)
                    .copies(target.base.copies)
                    .min_copies(target.min_copies)
                    .max_wait(max_wait)
                    .dry_run(dry_run)
                    .send()
                    .await;
                Ok(match grant {
                    Ok(g) if g.reply.as_ref().is_some_and(is_meter) => {
                        let mut out = Map::new();
                        out.insert("granted".into(), g.granted.into());
                        out.insert(
                            "source".into(),
                            format!("{:?}", g.source).to_lowercase().into(),
                        );
                        if let Some(r) = &g.reply {
                            out.extend(meter_fields(r));
                        }
                        out.insert("waited_ms".into(), (g.waited.as_millis() as u64).into());
                        println!("{}", Value::Object(out));
                        ExitCode::SUCCESS
                    }
                    Ok(g) => {
                        let mut out = Map::new();
                        out.insert("granted".into(), g.granted.into());
                        out.insert(
                            "source".into(),
                            format!("{:?}", g.source).to_lowercase().into(),
                        );
                        out.extend(tier_fields(&g.reply.unwrap_or_default()));
                        if let Some(r) = &g.reply {
                            out.extend(meter_fields(r));
                        }
                        out.insert("waited_ms".into(), (g.waited.as_millis() as u64).into());
                        println!("{}", Value::Object(out));
                        ExitCode::SUCCESS
                    }
                    Err(e) => report(&e),
                })
            }
            ClientCommand::Charge { target } => cost(target, false).await,
            ClientCommand::Refund { target } => cost(target, true).await,
            ClientCommand::Hold { target } => {
                let client = target.base.server.connect()?;
                let hold = client
                    .reserve(&target.base.resource, &target.base.domain)
                    .copies(target.base.copies)
                    .min_copies(target.min_copies)
                    .send()
                    .await;
                let mut hold = match hold {
                    Ok(h) => h,
                    Err(e) => return Ok(report(&e)),
                };
                println!(
                    "{}",
                    json!({"granted": hold.copies(), "groups": hold.groups(), "resource": hold.resource(), "domain": hold.domain()})
                );
                if !hold.is_granted() {
                    // Answered: the reply says it was not granted.
                    return Ok(ExitCode::from(crate::exit::ANSWERED));
                }
                wait_for_stop().await;
                hold.release_all().await?;
                Ok(ExitCode::SUCCESS)
            }
            ClientCommand::Lease(args) => lease(args).await,
        }
    })
}

/// `client lease`: holds the lease and prints it until stopped.
async fn lease(args: LeaseArgs) -> anyhow::Result<ExitCode> {
    let client = args.server.connect()?;
    let client_id = args
        .client_id
        .clone()
        .unwrap_or_else(charon_server::server_id);
    let mut options = LeaseOptions::new(client_id.clone(), args.wants);
    options.mode = match args.mode {
        Mode::Optimistic => LeaseMode::Optimistic,
        Mode::Pessimistic => LeaseMode::Pessimistic,
        Mode::Safe => LeaseMode::Safe,
    };
    options.adaptive = args.adaptive;
    let lease = match client.lease(&args.resource, options).await {
        Ok(l) => std::sync::Arc::new(l),
        Err(e) => return Ok(report(&e)),
    };
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let spender = args.spend.then(|| {
        let (lease, taken) = (lease.clone(), taken.clone());
        tokio::spawn(async move {
            loop {
                lease.acquire().await;
                taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    });
    let print = |lease: &Lease| {
        let s = lease.status();
        let mut out = json!({
            "client_id": client_id, "resource": args.resource, "capacity": s.capacity,
            "source": s.source.name(), "wants": s.wants, "safe_capacity": s.safe_capacity,
            "expires_in_ms": s.expires_in_ms, "refreshes": s.refreshes, "failures": s.failures,
        });
        if args.spend {
            out["taken"] = taken.swap(0, std::sync::atomic::Ordering::Relaxed).into();
        }
        if let Some(e) = lease.last_error() {
            out["error"] = e.to_string().into();
        }
        println!("{out}");
    };
    print(&lease);
    let stop = wait_for_stop();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            () = lease.changed() => print(&lease),
        }
    }
    if let Some(s) = spender {
        s.abort();
        let _ = s.await;
    }
    if let Ok(lease) = std::sync::Arc::try_unwrap(lease) {
        lease.release().await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `charge` or `refund`: prints the reply as `client request` prints a
/// bucket's, window's or queue's.
async fn cost(target: CostTarget, refund: bool) -> anyhow::Result<ExitCode> {
    let client = target.server.connect()?;
    let reply = if refund {
        client
            .refund(&target.resource, &target.domain, target.copies)
            .await
    } else {
        client
            .charge(&target.resource, &target.domain, target.copies)
            .await
    };
    Ok(match reply {
        Ok(r) => {
            let mut out = Map::new();
            out.insert("granted".into(), r.granted.into());
            if !is_meter(&r) {
                out.extend(tier_fields(&r));
            }
            out.extend(meter_fields(&r));
            println!("{}", Value::Object(out));
            ExitCode::SUCCESS
        }
        Err(e) => report(&e),
    })
}

/// Whether a reply is a bucket's, window's or queue's: the tiers always
/// say their tier, or its limit (unset only for the unbounded tier 1 of an
/// unconfigured resource).
fn is_meter(r: &v1::RateReply) -> bool {
    r.limit.is_some() && r.tier_limit.is_none() && r.tier == 0
}

/// The burst tiers' own fields (SPEC §2 rule 6).
fn tier_fields(r: &v1::RateReply) -> Map<String, Value> {
    let v = json!({
        "hard_limit": r.hard_limit, "global_limit": r.global_limit, "tier_limit": r.tier_limit,
        "domain_hits_last_second": r.domain_hits_last_second,
        "global_hits_last_second": r.global_hits_last_second,
        "tier_hits": r.tier_hits, "tier": r.tier, "burst": r.burst,
        "hard_limited": r.hard_limited, "global_limited": r.global_limited,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The reply context of every rate-like kind (SPEC §10), named as
/// `charon simulate` names it; `delay_ms` only for queues.
fn meter_fields(r: &v1::RateReply) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("limit".into(), r.limit.into());
    out.insert("remaining".into(), r.remaining.into());
    out.insert("reset_after_ms".into(), r.reset_after_ms.into());
    out.insert("retry_after_ms".into(), r.retry_after_ms.into());
    out.insert("warning".into(), r.warning.into());
    out.insert("banned".into(), r.banned.into());
    if let Some(delay) = r.delay_ms {
        out.insert("delay_ms".into(), delay.into());
    }
    if r.ignored {
        out.insert("ignored".into(), true.into());
    }
    out
}

/// Prints a client's error as one JSON line on stdout (where the answer
/// would have gone): its class, kind, gRPC code and address, and the whole
/// message; exit status 1 for a client error, 3 for a server error.
fn report(e: &Error) -> ExitCode {
    println!(
        "{}",
        json!({
            "error": e.class().name(), "kind": e.kind().name(),
            "code": e.code().map(charon_client::code_name), "address": e.address(),
            "message": e.to_string(),
        })
    );
    crate::exit::of_client_error(e)
}

async fn wait_for_stop() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
