//! `charon simulate --config FILE`: JSON lines in, JSON lines out.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use charon_simulate::redis::{RedisOptions, RedisSimulation, StoreError, redacted};
use charon_simulate::{Reply, Simulation};

use crate::config_cmd;
use crate::lines::{Line, read_bounded};

/// The longest event line accepted; longer lines get a client error.
const MAX_LINE: usize = 1 << 20;

/// `charon simulate`'s arguments.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The limits (a YAML configuration file).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Where the replay's state lives: `memory` (default), or a Redis
    /// (`redis://[user:password@]host:port`, `rediss://…`,
    /// `redis+cluster://host:port,host:port`): the same events decided by
    /// the Redis store's scripts on the virtual clock, under a key prefix
    /// of the replay's own, deleted at its end.
    #[arg(long, value_name = "URL", default_value = "memory")]
    store: String,
    /// Redis over TLS: trust the CA certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    redis_ca: Option<PathBuf>,
    /// Redis over TLS: present this PEM client certificate; with
    /// --redis-key.
    #[arg(long, value_name = "FILE", requires = "redis_key")]
    redis_cert: Option<PathBuf>,
    /// Redis over TLS: the PEM private key of --redis-cert.
    #[arg(long, value_name = "FILE", requires = "redis_cert")]
    redis_key: Option<PathBuf>,
}

pub fn run(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    let Some((config, settings)) = config_cmd::load_with_settings(&args.config)? else {
        return Ok(ExitCode::FAILURE);
    };
    // Two threads: the Redis store's upkeep runs while stdin is read.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (sim, redis) = if args.store == "memory" || args.store == "memory://" {
        (Simulation::new(config), None)
    } else {
        charon_server::check_redis_url(&args.store)?;
        let options = RedisOptions {
            tls: charon_server::redis_tls(
                args.redis_ca.as_deref(),
                args.redis_cert.as_deref(),
                args.redis_key.as_deref(),
            )?,
            ..RedisOptions::default()
        };
        let shown = redacted(&args.store);
        let (redis, sim) = runtime
            .block_on(RedisSimulation::start(&args.store, config, options))
            .map_err(|e| {
                let message = format!("cannot use the store {shown}: {e}");
                // A Redis that cannot be reached now: exit status 3.
                if matches!(e, StoreError::Unavailable(_)) {
                    anyhow::Error::new(crate::exit::Unavailable(message))
                } else {
                    anyhow::anyhow!(message)
                }
            })?;
        (sim, Some(redis))
    };
    let mut sim = sim.with_throttle(settings.throttle);
    let replayed = replay(&runtime, &mut sim);
    if let Some(redis) = redis {
        // The replay's keys go whatever happened to it.
        drop(sim);
        if let Err(e) = runtime.block_on(redis.finish()) {
            eprintln!("charon: could not delete the replay's keys ({e}); they expire within a day");
        }
    }
    replayed?;
    Ok(ExitCode::SUCCESS)
}

/// Every input line answered, in order.
fn replay(runtime: &tokio::runtime::Runtime, sim: &mut Simulation) -> anyhow::Result<()> {
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut buf = Vec::new();
    while let Some(line) = read_bounded(&mut input, &mut buf, MAX_LINE)? {
        let replies = match line {
            Line::TooLong => vec![serde_json::to_value(Reply::client_error(format!(
                "line longer than {MAX_LINE} bytes"
            )))?],
            Line::Text => runtime.block_on(sim.lines(&buf)),
        };
        for reply in replies {
            serde_json::to_writer(&mut out, &reply)?;
            out.write_all(b"\n")?;
        }
        // Each reply is seen at once by whoever drives us interactively.
        out.flush()?;
    }
    // What the throttler does after the last event (SPEC §13).
    for reply in runtime.block_on(sim.end()) {
        serde_json::to_writer(&mut out, &reply)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
