//! A server whose gRPC or HTTP side stops while it should be serving must
//! not look alive: `serve` shuts down and fails, naming the port and why,
//! so that `charon serve` exits non-zero with the reason.

use std::sync::Arc;
use std::time::Duration;

use charon_core::config::Config;
use charon_limiter::Limiter;
use charon_server::{ServerOptions, ServerState};
use charon_store::{MemoryStore, SystemClock};
use tokio::net::{TcpListener, TcpStream};

fn state() -> Arc<ServerState> {
    let (config, _) = Config::from_yaml(
        "resources: [ { name: api, kind: rate, tiers: [ { limit: 5, window: 1s } ] } ]",
    )
    .expect("a valid configuration");
    let store = Arc::new(MemoryStore::new(Arc::new(SystemClock::new())));
    ServerState::new(Limiter::new(config, store), ServerOptions::default())
}

#[tokio::test]
async fn a_grpc_listener_that_stops_fails_the_server_with_the_reason() {
    let state = state();
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http_addr = http.local_addr().expect("addr");
    let grpc_addr = "127.0.0.1:7".parse().expect("an address");
    // A stream of accepted connections that ends: the listener is gone.
    let ended = tokio_stream::empty::<std::io::Result<TcpStream>>();
    let served = tokio::time::timeout(
        Duration::from_secs(10),
        charon_server::serve_incoming(state.clone(), (grpc_addr, ended), http, axum::Router::new()),
    )
    .await
    .expect("serve returns instead of waiting for ever");
    let e = served.expect_err("a server that lost a listener fails");
    assert_eq!(
        e.to_string(),
        "the gRPC server on 127.0.0.1:7 stopped: its listener stopped accepting connections"
    );
    assert!(state.shutdown.is_triggered(), "the rest shut down too");
    assert!(
        TcpStream::connect(http_addr).await.is_err(),
        "the HTTP side is closed as well"
    );
}

#[tokio::test]
async fn a_server_asked_to_stop_returns_ok() {
    let state = state();
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let task = tokio::spawn(charon_server::serve(
        state.clone(),
        grpc,
        http,
        axum::Router::new(),
    ));
    state.shutdown.trigger();
    let served = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops")
        .expect("the task");
    assert!(served.is_ok(), "{served:?}");
}
