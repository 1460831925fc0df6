//! `charon sidecar --config FILE --upstream URL`: the server throttler in
//! front of a service, as a reverse proxy (the crate `charon-sidecar`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use charon_sidecar::{Listeners, Settings, UpstreamHttp2};
use clap::{Args, ValueEnum};

/// Flags of `charon sidecar`.
#[derive(Args, Debug)]
pub struct SidecarArgs {
    /// The configuration file: its `throttle:` section (and the
    /// `resources:` its per-client limits name). Reloaded on SIGHUP and
    /// when it changes.
    #[arg(long, value_name = "FILE", env = "CHARON_CONFIG")]
    config: PathBuf,
    /// The service behind the sidecar, `http://127.0.0.1:8080`.
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// Where clients connect (HTTP/1.1 and cleartext HTTP/2).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7080")]
    listen: String,
    /// `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7081")]
    http_listen: String,
    /// How requests travel to the upstream: `auto` sends HTTP/2 requests
    /// (gRPC) over HTTP/2 and the others over HTTP/1.1.
    #[arg(long, value_enum, default_value = "auto")]
    upstream_http2: Http2Arg,
    /// How long the upstream may take to send response headers (then 504).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    upstream_timeout: Duration,
    /// How long a client may take to send its request headers (HTTP/1.1;
    /// slow clients are cut off).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    header_timeout: Duration,
    /// How long SIGTERM waits for requests in flight.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Http2Arg {
    Auto,
    Always,
    Never,
}

/// Runs the sidecar until SIGTERM or SIGINT (exit 0), or fails at start
/// (exit 1, with the reason).
pub fn run(args: SidecarArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let telemetry = {
        let _in_runtime = runtime.enter();
        crate::telemetry::init(None)?
    };
    let settings = Settings {
        upstream_http2: match args.upstream_http2 {
            Http2Arg::Auto => UpstreamHttp2::Auto,
            Http2Arg::Always => UpstreamHttp2::Always,
            Http2Arg::Never => UpstreamHttp2::Never,
        },
        upstream_timeout: args.upstream_timeout,
        header_timeout: args.header_timeout,
        shutdown_grace: args.shutdown_grace,
        ..Settings::new(args.config, args.upstream)
    };
    let result = runtime.block_on(async {
        let bind = |addr: String, what: &'static str| async move {
            tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} ({what}): {e}"))
        };
        let listeners = Listeners {
            proxy: bind(args.listen, "--listen").await?,
            admin: bind(args.http_listen, "--http-listen").await?,
        };
        charon_sidecar::run(settings, listeners, charon_server::terminated()).await
    });
    telemetry.shutdown();
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("charon sidecar: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
