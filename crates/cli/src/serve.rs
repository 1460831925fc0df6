//! `charon serve`: wiring only. Flags become settings, settings become a
//! store, a limiter and listeners; the server crate does the serving.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use charon_limiter::Limiter;
use charon_server::{ServerOptions, ServerState, reload};
use charon_store::{MemoryStore, Store, SystemClock};
use clap::Args;
use tokio::net::TcpListener;
use tracing::{error, info};

/// Flags of `charon serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The limits (SPEC §6 YAML). Reloaded on SIGHUP and when the file
    /// changes.
    #[arg(long, value_name = "FILE", env = "CHARON_CONFIG")]
    pub config: PathBuf,
    /// gRPC address.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7070",
        env = "CHARON_LISTEN"
    )]
    pub listen: String,
    /// HTTP address: /metrics, /healthz, /readyz and web pages.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7071",
        env = "CHARON_HTTP_LISTEN"
    )]
    pub http_listen: String,
    /// Where state lives: `memory` (this process only) or `redis://host:port`.
    #[arg(
        long,
        value_name = "URL",
        default_value = "memory",
        env = "CHARON_STORE"
    )]
    pub store: String,
    /// A client that stops answering is detected, and its holds released,
    /// within about this long.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = humantime::parse_duration)]
    pub keepalive: Duration,
    /// The longest a graceful shutdown (SIGTERM) may take.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
}

/// Exit code of a server that resigned or lost its store for good.
const EXIT_RESIGNED: u8 = 3;

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let config = match reload::load_file(&args.config) {
        Ok(c) => c,
        Err(errors) => bail!("invalid configuration:\n{errors}"),
    };
    let store = open_store(&args.store)?;
    let limiter = Limiter::new(config, store.clone());
    let options = ServerOptions {
        keepalive: args.keepalive,
        shutdown_grace: args.shutdown_grace,
        ..ServerOptions::default()
    };
    let state = ServerState::new(limiter, options);
    state
        .config_source
        .store(Arc::new(format!("file {}", args.config.display())));
    let grpc = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (gRPC)", args.listen))?;
    let http = TcpListener::bind(&args.http_listen)
        .await
        .with_context(|| format!("cannot listen on {} (HTTP)", args.http_listen))?;
    info!(
        "charon listening on {} (gRPC) and {} (HTTP), store {}, configuration from {}",
        grpc.local_addr()?,
        http.local_addr()?,
        store.kind(),
        args.config.display()
    );
    reload::spawn_file_reloader(state.clone(), args.config.clone());
    spawn_signal_handler(state.clone());
    let maintenance = {
        let (state, store) = (state.clone(), store.clone());
        tokio::spawn(async move {
            let reason = store.maintain().await;
            error!("store stopped: {reason}; shutting down");
            state.set_ready(false);
            state.shutdown.trigger();
            reason
        })
    };
    charon_server::serve(state, grpc, http, charon_simulator_web::router()).await?;
    if maintenance.is_finished() {
        return Ok(ExitCode::from(EXIT_RESIGNED));
    }
    info!("stopped");
    Ok(ExitCode::SUCCESS)
}

fn open_store(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    match url {
        "memory" | "memory://" => Ok(Arc::new(MemoryStore::new(Arc::new(SystemClock::new())))),
        other => bail!("unsupported store {other:?} (expected memory or redis://host:port)"),
    }
}

/// SIGTERM and SIGINT start a graceful shutdown.
fn spawn_signal_handler(state: Arc<ServerState>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            error!("cannot listen for SIGTERM/SIGINT");
            return;
        };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
        state.shutdown.trigger();
    });
}
