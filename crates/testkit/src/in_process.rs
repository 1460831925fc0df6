//! A limiting server inside the test process, on real TCP ports.

use std::net::SocketAddr;
use std::sync::Arc;

use charon_core::config::Config;
use charon_limiter::Limiter;
use charon_server::{ServerOptions, ServerState};
use charon_store::{MemoryStore, SystemClock};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A real `charon` server (gRPC + HTTP on 127.0.0.1, free ports, the
/// in-memory store) running in this process.
#[derive(Debug)]
pub struct InProcessServer {
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The HTTP address.
    pub http: SocketAddr,
    state: Arc<ServerState>,
    task: JoinHandle<()>,
}

impl InProcessServer {
    /// Starts a server enforcing `config` (SPEC §6 YAML).
    pub async fn start(config: &str) -> Self {
        Self::start_with_options(config, ServerOptions::default()).await
    }

    /// Starts a server enforcing `config` with `options`.
    pub async fn start_with_options(config: &str, options: ServerOptions) -> Self {
        let (config, _) = Config::from_yaml(config).expect("a valid test configuration");
        let store = Arc::new(MemoryStore::new(Arc::new(SystemClock::new())));
        let state = ServerState::new(Limiter::new(config, store), options);
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind gRPC");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind HTTP");
        let (grpc_addr, http_addr) = (
            grpc.local_addr().expect("addr"),
            http.local_addr().expect("addr"),
        );
        let task = tokio::spawn(
            charon_server::serve(state.clone(), grpc, http, axum::Router::new()).map_ok(),
        );
        Self {
            grpc: grpc_addr,
            http: http_addr,
            state,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`, for a client.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The limiter behind the server (to change its configuration).
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.state.limiter
    }

    /// Copies held by live sessions on this server, summed from the store.
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// From now on, answers every decision with a server error, as a
    /// server that never loaded a configuration does (its configuration
    /// service not reached yet): what a client's degraded mode is for.
    pub fn answer_server_errors(&self) {
        self.state.report_config(charon_server::ConfigReport {
            source: "a configuration service, not reached yet".to_owned(),
            version: 0,
            loaded: false,
            problem: None,
        });
    }

    /// Shuts the server down gracefully and waits until it has stopped.
    pub async fn stop(self) {
        self.state.shutdown.trigger();
        let _ = self.task.await;
    }
}

trait MapOk {
    fn map_ok(self) -> impl std::future::Future<Output = ()> + Send;
}

impl<F: std::future::Future<Output = std::io::Result<()>> + Send> MapOk for F {
    async fn map_ok(self) {
        let _ = self.await;
    }
}
