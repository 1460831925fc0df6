//! The page in headless Chromium: `e2e/run.sh` against this crate's router,
//! served in-process on a free port.
//!
//! Ignored by default because it needs more than cargo: Debian's `chromium`
//! and `playwright-core`, which `e2e/install.sh` installs. `scripts/test`
//! runs both; by hand:
//!
//! ```text
//! crates/simulator-web/e2e/install.sh
//! cargo test -p charon-simulator-web --test simulator_web e2e:: -- --ignored
//! ```
//!
//! Screenshots go to `target/e2e/` at the workspace root.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs chromium and playwright-core (e2e/install.sh); run with --ignored"]
fn the_page_shows_burst_rejections_and_cooldown_in_chromium() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a free port");
    let addr = listener.local_addr().expect("its address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(async move {
        axum::serve(listener, charon_simulator_web::router())
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/run.sh");
    let status = Command::new("bash")
        .arg(&script)
        .env("CHARON_URL", format!("http://{addr}"))
        .status()
        .expect("bash runs e2e/run.sh");

    let _ = stop.send(());
    runtime
        .block_on(server)
        .expect("the server task")
        .expect("the server");
    assert!(status.success(), "e2e/run.sh failed: {status}");
}
