//! The sidecar's own HTTP listener: `/metrics` (Prometheus text: the
//! throttler's metrics of `charon_throttle::metrics`, the proxy's
//! `charon_sidecar_upstream_errors_total{kind}` and
//! `charon_config_reloads_total{result}`), `/healthz` (200 while the
//! process runs) and `/readyz` (200 while the upstream accepts TCP
//! connections and the sidecar is not shutting down; its JSON body says
//! what is in force).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use tokio::net::TcpListener;

use crate::SidecarState;

/// Buckets of the queue wait, from 1 ms to 10 s.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder of this process (once).
pub fn install_metrics() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(charon_throttle::metrics::WAIT_SECONDS.to_owned()),
                WAIT_BUCKETS,
            )
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Fails only if a recorder was installed first (tests running
        // several sidecars in one process): ours then sees nothing, which
        // only the metrics test would notice.
        let _ = metrics::set_global_recorder(recorder);
        charon_throttle::metrics::describe();
        handle
    })
}

/// The admin routes.
pub fn router(state: Arc<SidecarState>) -> Router {
    Router::new()
        .route("/metrics", get(|| async { install_metrics().render() }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the admin routes on `listener`.
pub async fn serve(state: Arc<SidecarState>, listener: TcpListener) {
    if let Err(e) = axum::serve(listener, router(state)).await {
        tracing::error!("the admin listener stopped: {e}");
    }
}

async fn readyz(State(state): State<Arc<SidecarState>>) -> impl IntoResponse {
    let reachable = matches!(
        tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(state.upstream.authority()),
        )
        .await,
        Ok(Ok(_))
    );
    let shutting_down = state.shutdown.is_triggered();
    let config = state.layer.throttler().config();
    let (queued, queued_units) = state.layer.throttler().queue();
    let problem = state
        .problem
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let ready = reachable && !shutting_down;
    let body = json!({
        "ready": ready,
        "shutting_down": shutting_down,
        "upstream": {"url": state.upstream.url(), "reachable": reachable},
        "config": {"source": format!("file {}", state.config.display()), "problem": problem},
        "throttle": {
            "discipline": config.discipline.name(),
            "rate": config.rate,
            "queue": config.queue,
            "queued": queued,
            "queued_units": queued_units,
        },
    });
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body))
}
