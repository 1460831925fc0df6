//! The HTTP side of the server: metrics, health, readiness and the leases
//! page. Built as a router that tests call without a socket.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::ServerState;
use crate::{events, metrics};

/// `/metrics`, `/healthz`, `/readyz`, `/v1/leases` and `/v1/top`.
pub fn router(state: Arc<ServerState>) -> Router {
    metrics::install();
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/v1/leases", get(leases))
        .route("/leases", get(leases_page))
        .route("/v1/top", get(top))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(state)
}

async fn render_metrics(State(state): State<Arc<ServerState>>) -> impl IntoResponse {
    let store = state.limiter.store();
    if let Ok(Ok(staged)) =
        tokio::time::timeout(Duration::from_secs(1), store.staged_copies()).await
    {
        metrics::transfers_staged(staged);
    }
    if let Ok(Ok(lengths)) =
        tokio::time::timeout(Duration::from_secs(1), store.queue_lengths()).await
    {
        let config = state.limiter.config();
        let labelled: Vec<(String, u64)> = lengths
            .into_iter()
            .map(|(r, n)| {
                let label = metrics::resource_label(&config, &r, metrics::Outcome::Granted);
                (label, n)
            })
            .collect();
        metrics::copy_queues(&labelled);
    }
    if let Ok(Ok((_, summaries))) =
        tokio::time::timeout(Duration::from_secs(1), state.limiter.lease_summaries()).await
    {
        metrics::leases(&summaries);
    }
    let up = matches!(
        tokio::time::timeout(Duration::from_secs(1), store.ping()).await,
        Ok(Ok(()))
    );
    metrics::store_up(up);
    if let Some(events) = state.events() {
        events.sync_metrics();
    }
    let handle = metrics::install();
    handle.run_upkeep();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
}

/// The live leases of every configured lease resource (SPEC §12), as JSON:
/// `{"now_ms": …, "resources": [{resource, capacity, algorithm, leased,
/// wanted, clients, leases: [{client, capacity, wants, subclients,
/// expires_at_ms}]}]}`. A server error (503) when the store does not
/// answer within a second.
async fn leases(State(state): State<Arc<ServerState>>) -> axum::response::Response {
    match tokio::time::timeout(Duration::from_secs(1), state.limiter.lease_summaries()).await {
        Ok(Ok((now_ms, resources))) => {
            axum::Json(serde_json::json!({"now_ms": now_ms, "resources": resources}))
                .into_response()
        }
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store: no answer within 1s\n",
        )
            .into_response(),
    }
}

/// `GET /v1/top` parameters.
#[derive(Debug, serde::Deserialize)]
struct TopQuery {
    /// `10s` by default, 1 s to 60 s.
    window: Option<String>,
    /// Pairs in each list, 10 by default, at most 1000.
    limit: Option<usize>,
}

/// The live view of the decision stream (`charon top --server`): the
/// busiest and most limited (resource, domain) pairs over the last
/// `window`, as JSON ([`events::TopReport`]). 404 when the server runs
/// without `--events`; 400 on a bad window or limit. Reads what the
/// stream's writer thread counted, never what decisions touch.
async fn top(
    State(state): State<Arc<ServerState>>,
    query: Result<axum::extract::Query<TopQuery>, axum::extract::rejection::QueryRejection>,
) -> axum::response::Response {
    let bad = |why: String| (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
    let Ok(axum::extract::Query(query)) = query else {
        return bad("expected ?window=DURATION&limit=N".to_owned());
    };
    let Some(events) = state.events() else {
        return (
            StatusCode::NOT_FOUND,
            "decision events are off: start the server with --events PATH|- \
             (--events /dev/null for the live view alone)\n",
        )
            .into_response();
    };
    let window = match query.window.as_deref().map(humantime::parse_duration) {
        None => Duration::from_secs(10),
        Some(Ok(w)) if w >= Duration::from_secs(1) && w <= events::top::MAX_WINDOW => w,
        Some(Ok(w)) => return bad(format!("window {w:?}: from 1s to 60s")),
        Some(Err(e)) => return bad(format!("window: {e}")),
    };
    let limit = match query.limit {
        None => 10,
        Some(n @ 1..=1000) => n,
        Some(n) => return bad(format!("limit {n}: from 1 to 1000")),
    };
    axum::Json(events.top(window, limit)).into_response()
}

/// The same as [`leases`], as a small HTML page for a browser: one table
/// per lease resource, refreshed every 2 seconds.
async fn leases_page(State(state): State<Arc<ServerState>>) -> axum::response::Response {
    let Ok(Ok((now, resources))) =
        tokio::time::timeout(Duration::from_secs(1), state.limiter.lease_summaries()).await
    else {
        return (StatusCode::SERVICE_UNAVAILABLE, "store: no answer\n").into_response();
    };
    let mut html = String::from(
        "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=2>\
         <title>Charon leases</title><h1>Capacity leases</h1>",
    );
    if resources.is_empty() {
        html.push_str("<p>No lease resource is configured.</p>");
    }
    for r in &resources {
        html.push_str(&format!(
            "<h2>{}</h2><p>{} of {} leased ({}), {} wanted, {} clients</p>\
             <table><tr><th>client<th>capacity<th>wants<th>subclients<th>expires in",
            escape(&r.resource),
            r.leased,
            r.capacity,
            r.algorithm,
            r.wanted,
            r.clients
        ));
        for l in &r.leases {
            html.push_str(&format!(
                "<tr><td>{}<td>{}<td>{}<td>{}<td>{} ms",
                escape(&l.client),
                l.capacity,
                l.wants,
                l.subclients,
                l.expires_at_ms.saturating_sub(now)
            ));
        }
        html.push_str("</table>");
    }
    axum::response::Html(html).into_response()
}

/// Text for HTML: names come from clients and configuration.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// 200 when the server can decide correctly now: not shutting down, a
/// configuration loaded, and its store answering within a second. The body
/// says which store and configuration are in force, or why not ready.
async fn ready(State(state): State<Arc<ServerState>>) -> impl IntoResponse {
    let config = state.config_report();
    let mut about = format!("config: {} version {}", config.source, config.version);
    if let Some(problem) = &config.problem {
        about.push_str(&format!(" (still in force: {problem})"));
    }
    // A refused certificate reload is no reason to stop serving: the
    // previous certificate is, and this says why the new one is not.
    if let Some(problem) = state.options.tls.as_ref().and_then(|t| t.problem()) {
        about.push_str(&format!(
            "\ntls: the files were refused ({problem}); the previous certificate is served"
        ));
    }
    // A certificate in its last day still serves (taking the server out of
    // rotation would not help: the fleet's certificates expire together),
    // but the check that polls this names it.
    if let Some(warning) = state.options.tls.as_ref().and_then(|t| t.expiry_warning()) {
        about.push_str(&format!("\ntls: {warning}"));
    }
    let unavailable = |why: String| (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n{about}\n"));
    if state.shutdown.is_triggered() {
        return unavailable("shutting down".to_owned());
    }
    if !config.loaded {
        return unavailable(crate::NotConfigured.to_string());
    }
    if !state.is_ready() {
        return unavailable("not ready".to_owned());
    }
    let store = state.limiter.store();
    match tokio::time::timeout(Duration::from_secs(1), store.ping()).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            format!("ready\nstore: {}\n{about}\n", store.kind()),
        ),
        Ok(Err(e)) => unavailable(format!("store: {e}")),
        Err(_) => unavailable("store: no answer within 1s".to_owned()),
    }
}
