//! A limiting server inside the test process, on real TCP ports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use charon_core::config::Config;
use charon_limiter::Limiter;
use charon_server::{ConfigSource, Error, Exit, Listeners, ServerOptions, ServerState, Settings};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A real `charon` server (gRPC + HTTP on 127.0.0.1, free ports, the
/// in-memory store) running in this process, started through
/// [`charon_server::run_observed`] as `charon serve` starts one.
#[derive(Debug)]
pub struct InProcessServer {
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The HTTP address.
    pub http: SocketAddr,
    state: Arc<ServerState>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<Exit, Error>>,
}

impl InProcessServer {
    /// Starts a server enforcing `config` (SPEC §6 YAML).
    pub async fn start(config: &str) -> Self {
        Self::start_with_options(config, ServerOptions::default()).await
    }

    /// Starts a server enforcing `config` with `options`.
    pub async fn start_with_options(config: &str, options: ServerOptions) -> Self {
        Self::launch(config, options, None).await
    }

    /// Starts a server enforcing `config` whose store is `store_url`
    /// (`memory`, or a private Redis's `redis://…`), as `charon serve
    /// --store` would.
    pub async fn start_with_store(config: &str, store_url: &str) -> Self {
        Self::launch(config, ServerOptions::default(), Some(store_url.to_owned())).await
    }

    /// [`InProcessServer::start_with_store`] on Redis with this liveness
    /// ttl (`charon serve --liveness-ttl`): fleet tests kill a server and
    /// wait for the others to count it dead.
    pub async fn start_on_redis(config: &str, redis_url: &str, liveness_ttl: Duration) -> Self {
        Self::launch_with(
            config,
            ServerOptions::default(),
            Some(redis_url.to_owned()),
            Some(liveness_ttl),
        )
        .await
    }

    async fn launch(config: &str, options: ServerOptions, store_url: Option<String>) -> Self {
        Self::launch_with(config, options, store_url, None).await
    }

    async fn launch_with(
        config: &str,
        options: ServerOptions,
        store_url: Option<String>,
        liveness_ttl: Option<Duration>,
    ) -> Self {
        let (config, _) = Config::from_yaml(config).expect("a valid test configuration");
        let mut settings = Settings {
            keepalive: options.keepalive,
            shutdown_grace: options.shutdown_grace,
            max_message_bytes: options.max_message_bytes,
            session_concurrency: options.session_concurrency,
            ..Settings::new(ConfigSource::Inline(config))
        };
        settings.store.url = store_url;
        if let Some(ttl) = liveness_ttl {
            settings.store.liveness_ttl = ttl;
        }
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind gRPC");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind HTTP");
        let (grpc_addr, http_addr) = (
            grpc.local_addr().expect("addr"),
            http.local_addr().expect("addr"),
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let (started, state) = oneshot::channel();
        let mut task = tokio::spawn(charon_server::run_observed(
            settings,
            Listeners::Bound { grpc, http },
            async move {
                let _ = stopped.await;
            },
            move |state| {
                let _ = started.send(state);
            },
        ));
        // The state is made unless `run` failed first: say why.
        let Ok(state) = state.await else {
            panic!(
                "the in-process server did not start: {:?}",
                (&mut task).await
            )
        };
        Self {
            grpc: grpc_addr,
            http: http_addr,
            state,
            stop,
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

    /// Shuts the server down gracefully (its shutdown future resolves) and
    /// waits until it has stopped.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let stopped = self.task.await.expect("the server task");
        assert_eq!(stopped.expect("a clean stop"), Exit::Stopped);
    }
}
