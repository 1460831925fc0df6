//! Serves the simulator alone, for the end-to-end test and for trying the
//! page before `charon serve` mounts it:
//!
//! ```text
//! cargo run -p charon-simulator-web --example serve -- 127.0.0.1:7071
//! ```
//!
//! Prints `listening on http://ADDR/simulator` once the socket is bound
//! (port 0 picks a free port) and stops on Ctrl-C or SIGTERM.

use std::process::ExitCode;

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> ExitCode {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7071".to_owned());
    let listener = match TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("serve: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("listening on http://{a}/simulator"),
        Err(e) => eprintln!("serve: {e}"),
    }
    let shutdown = async {
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    if let Err(e) = axum::serve(listener, charon_simulator_web::router())
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("serve: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
