//! A limiting server from start to stop: the configuration source and the
//! store opened (a stop asked meanwhile ends the start), the limiter and
//! its companions started, the listeners served, and the background work
//! (the stop signal, the metrics upkeep, the store's maintenance) joined
//! in one `select!` with the serving itself: whichever ends first says how
//! the server ended ([`Ended`]), a store that resigned included.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use charon_limiter::Limiter;
use charon_store::{Store, StoreError};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::source::{LimiterSource, Opened, Source};
use super::{Exit, Listeners, Settings, lease_parent, server_id, store};
use crate::ServerState;
use crate::tls::ServerTls;

/// Serves a limiter whose limits come from `source`, as [`super::run`]
/// says.
pub(super) async fn serve(
    settings: Settings,
    source: LimiterSource,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
    started: impl FnOnce(Arc<ServerState>) + Send,
) -> anyhow::Result<Exit> {
    // Before the store opens: what it counts from the start (at zero)
    // must reach the recorder that /metrics renders.
    crate::metrics::install();
    // Watched from the start: a stop asked while the configuration or the
    // store opens (Redis may take --store-connect-timeout) ends the start.
    let mut shutdown = Box::pin(shutdown);
    let mut options = settings.server_options();
    let tls = super::open_tls(settings.tls.clone())?;
    options.tls.clone_from(&tls);
    let Some(Opened {
        source,
        initial,
        from_file,
    }) = Source::open(source, &mut shutdown).await?
    else {
        return Ok(stopped_while_starting());
    };
    let store_url = settings
        .store
        .url
        .clone()
        .or_else(|| from_file.store.clone())
        .unwrap_or_else(|| "memory".to_owned());
    let store = tokio::select! {
        store = store::open(&store_url, &settings.store) => store?,
        () = &mut shutdown => return Ok(stopped_while_starting()),
    };
    let limiter = Limiter::new(initial.unwrap_or_default(), store.clone());
    let state = ServerState::new(limiter, options);
    start_companions(&state, &settings, tls.as_ref())?;
    started(state.clone());
    if let Some(report) = source.awaiting() {
        state.report_config(report);
    }
    let (grpc, http) = listeners.open(&settings, &from_file).await?;
    let http_addr = http.local_addr()?;
    let routes = source.mount(&state, charon_simulator_web::router());
    info!(
        "charon listening on {} (gRPC) and {http_addr} (HTTP){}, store {}, {}",
        grpc.local_addr()?,
        super::tls_described(tls.as_deref()),
        store.kind(),
        source.describe(http_addr),
    );
    let server = grpc.spawn_serving(&state, http, routes);
    // The feed must outlive the server: dropping its handle stops it.
    let _feed = source.follow(&state, http_addr, tls.as_ref())?;

    let mut maintenance = {
        let store = store.clone();
        tokio::spawn(async move { store.maintain().await })
    };
    let ended = until_ended(&state, server, &mut maintenance, shutdown).await;
    // A gRPC or HTTP side that stopped by itself is an error: after the
    // same clean shutdown, the process exits 1 with the reason.
    let served = ended.served?;
    if let Some(events) = state.events() {
        // What is queued is written before the process ends.
        events.close(Duration::from_secs(2));
    }
    source.close().await;
    if ended.resigned {
        return Ok(Exit::Resigned);
    }
    leave(store.as_ref()).await;
    // The process used to end here; a server run in-process stops its
    // store's upkeep instead (after leaving, as the process did).
    maintenance.abort();
    served?;
    info!("stopped");
    Ok(Exit::Stopped)
}

/// What runs beside the limiter, started before anything is served: the
/// certificate's reloader, the limiting API's tokens, the decision stream
/// and the lease parent.
fn start_companions(
    state: &Arc<ServerState>,
    settings: &Settings,
    tls: Option<&Arc<ServerTls>>,
) -> anyhow::Result<()> {
    if let Some(tls) = tls {
        tls.spawn_reloader(state.shutdown.clone());
    }
    if let Some(path) = &settings.api_tokens {
        let tokens = crate::api_auth::ApiTokens::load(path)
            .map_err(|e| anyhow::anyhow!("--api-tokens: {e}"))?;
        tracing::info!(
            file = %path.display(),
            tokens = tokens.len(),
            "the limiting API needs a token"
        );
        state.api_auth.set(tokens);
        crate::api_auth::spawn_reloader(state.clone(), path.clone());
    }
    if let Some(events) = &settings.events {
        let events =
            crate::events::Events::start(events, server_id()).context("decision events")?;
        state.set_events(events);
    }
    if let Some(parent) = &settings.lease_parent {
        lease_parent::spawn(state, parent, &settings.lease_parent_tls, server_id())?;
    }
    Ok(())
}

/// How serving ended: whether the store resigned, and what the serving
/// gave (after its graceful drain).
struct Ended {
    resigned: bool,
    served: Result<std::io::Result<()>, tokio::task::JoinError>,
}

/// Runs the background work beside `server` until the serving ends or the
/// store resigns, then waits for the serving to drain. A resignation is
/// known here, as a value, before the shutdown it causes is triggered: the
/// servers may finish draining before anyone looks, and a resignation must
/// still exit 3.
async fn until_ended(
    state: &Arc<ServerState>,
    mut server: JoinHandle<std::io::Result<()>>,
    maintenance: &mut JoinHandle<StoreError>,
    shutdown: impl Future<Output = ()>,
) -> Ended {
    tokio::select! {
        biased;
        // A maintenance that panicked is not a resignation: serving goes on.
        Ok(reason) = maintenance => {
            error!("store stopped: {reason}; shutting down");
            state.set_ready(false);
            state.shutdown.trigger();
        }
        served = &mut server => return Ended { resigned: false, served },
        never = stop_when(shutdown, state) => match never {},
        never = metrics_upkeep(state) => match never {},
    }
    Ended {
        resigned: true,
        served: server.await,
    }
}

/// Triggers the server's shutdown when `shutdown` resolves; then, or if
/// something else triggered it first, does nothing more.
async fn stop_when(shutdown: impl Future<Output = ()>, state: &ServerState) -> Infallible {
    tokio::select! {
        () = shutdown => state.shutdown.trigger(),
        () = state.shutdown.wait() => {}
    }
    std::future::pending().await
}

/// The recorder keeps every histogram sample until an upkeep drains it;
/// /metrics runs one, but a server nobody scrapes would otherwise grow by
/// 16 bytes per decision without bound. Runs until the shutdown is
/// triggered, then does nothing more.
async fn metrics_upkeep(state: &ServerState) -> Infallible {
    let mut every = tokio::time::interval(crate::metrics::UPKEEP_EVERY);
    loop {
        tokio::select! {
            _ = every.tick() => crate::metrics::install().run_upkeep(),
            () = state.shutdown.wait() => break,
        }
    }
    std::future::pending().await
}

/// Leaves the store after a clean stop; a failure only costs the others
/// a wait for this server's liveness to lapse.
async fn leave(store: &dyn Store) {
    if let Err(e) = store.leave().await {
        warn!(
            "could not leave the store cleanly ({e}); the others will clean up after this server"
        );
    }
}

/// A stop asked before the server opened its store: nothing to drain.
fn stopped_while_starting() -> Exit {
    info!("stopped before it started serving");
    Exit::Stopped
}
