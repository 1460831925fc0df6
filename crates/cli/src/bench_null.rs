//! `charon bench-null`: the transport floor the benchmarks compare the
//! server with (see `charon_server::null`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

/// Flags of `charon bench-null`.
#[derive(Args, Debug)]
pub struct NullArgs {
    /// The gRPC address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// HTTP/2 keep-alive, as `charon serve --keepalive` (half of it is the
    /// ping interval and timeout).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    keepalive: Duration,
}

/// Serves the null `Limiter` until the process is killed, on the same
/// multi-threaded runtime `charon serve` builds.
pub fn run(args: &NullArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        charon_server::null::serve_null(listener, args.keepalive).await?;
        Ok(ExitCode::SUCCESS)
    })
}
