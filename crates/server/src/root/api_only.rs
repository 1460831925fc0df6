//! The API-only mode: the embedded configuration service alone on the
//! HTTP address (no limiter, no gRPC, no store), as production runs it
//! apart from the limiting servers.

use std::future::Future;

use tracing::info;

use super::{EmbeddedService, Exit, Listeners, Settings, embedded};

/// Serves the configuration service of `service` until `shutdown`
/// resolves.
pub(super) async fn serve(
    settings: &Settings,
    service: &EmbeddedService,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Exit> {
    let tls = super::open_tls(settings.tls.clone())?;
    let app = embedded::open(service).await?;
    let http = listeners.http_only(settings).await?;
    info!(
        "charon configuration service listening on {} (HTTP){}, database {}",
        http.local_addr()?,
        super::tls_described(tls.as_deref()),
        service.db
    );
    let stopping = crate::Shutdown::new();
    embedded::follow_tokens_file(&app, service, &stopping);
    let shutdown = {
        let stopping = stopping.clone();
        async move {
            shutdown.await;
            info!("shutting down");
            stopping.trigger();
        }
    };
    let routes = charon_config_service::router(app.clone())
        .route("/healthz", axum::routing::get(|| async { "ok\n" }));
    match tls {
        None => {
            axum::serve(http, routes)
                .with_graceful_shutdown(shutdown)
                .await?;
        }
        Some(tls) => {
            tls.spawn_reloader(stopping);
            axum::serve(crate::tls::HttpListener::new(tls, http)?, routes)
                .with_graceful_shutdown(shutdown)
                .await?;
        }
    }
    app.close().await;
    info!("stopped");
    Ok(Exit::Stopped)
}
