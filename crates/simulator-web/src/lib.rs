//! The interactive limit simulator in the browser: burst tiers, buckets,
//! windows, queues and the server throttler.
//!
//! [`router`] serves one page at `/simulator` and a small JSON API under
//! `/simulator/api/`. The page keeps its own virtual clock and the list of
//! requests made so far; every time something changes it sends the whole
//! list to `POST /simulator/api/run`, which replays it from empty state
//! through [`charon_core::rate::decide`] or, for a bucket, a window or a
//! queue, [`charon_core::meter::Meter::decide`] (the functions the stores
//! call) and answers with each reply and the state: the tiers', or the
//! level over time. The API holds no state
//! between calls, so the page needs nothing from the server but this router,
//! and no decision is ever made in JavaScript.
//!
//! The router uses absolute paths: mount it at the root of the HTTP server
//! with `Router::merge`.

#![warn(clippy::print_stdout, clippy::print_stderr)]

mod api;
mod error;
mod input;
mod meters;
mod presets;
mod replay;
mod stampede;
mod throttle;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::header;
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};
use tokio::sync::Semaphore;

pub use input::{MAX_EVENT_TIERS, MAX_EVENTS, MAX_TIERS};
pub use replay::{MAX_HIT_TIMES, MAX_LISTED_TIER_STATES};
pub use stampede::{MAX_ATTEMPTS, MAX_CALLERS, MAX_SPREAD_MS, MAX_WORK_MS};

/// Where the page lives.
pub const PAGE_PATH: &str = "/simulator";

const PAGE_HTML: &str = include_str!("../assets/simulator.html");
const PAGE_JS: &str = include_str!("../assets/simulator.js");
const PAGE_CSS: &str = include_str!("../assets/simulator.css");
const THROTTLER_JS: &str = include_str!("../assets/throttler.js");
const STAMPEDE_JS: &str = include_str!("../assets/stampede.js");

/// Request bodies may be this large: the page's 20 000 events take 0.3 MB
/// (0.8 MB with copies on every one), and a body too large for it is
/// refused before it is parsed (a parsed body takes several times its size).
pub const BODY_LIMIT: usize = 1024 * 1024;

/// The most replays worked on at once, per router (and, apart, the most
/// `/yaml` renderings): one per core of a small machine. One more call is answered 429 with
/// `Retry-After: 1` at once, never queued: the page calls again on its next
/// change anyway. With [`MAX_EVENT_TIERS`] and [`BODY_LIMIT`], this bounds
/// what the unauthenticated simulator can cost the listener that also
/// serves `/metrics` and `/healthz` (32 concurrent worst-case replays: see
/// docs/operations-notes/bounded-input.md).
pub const MAX_CONCURRENT_REPLAYS: usize = 2;

/// The simulator's routes, ready to be merged into the server's router:
///
/// - `GET /simulator`: the page (HTML; its script and style sheet are served
///   beside it under `/simulator/assets/`);
/// - `GET /simulator/api/presets`: the cookbook configurations and limits;
/// - `POST /simulator/api/run`: stateless replay of a request list;
/// - `POST /simulator/api/yaml`: the page's configuration as SPEC §6 YAML;
/// - `POST /simulator/api/throttle`: a run of the server throttler (SPEC
///   §13) under a request mix and an overload, its queue, admissions and
///   rejections over time;
/// - `POST /simulator/api/stampede`: a hot-page stampede (many callers of
///   one expensive result) with no limit, with a copy limit and retries,
///   and with `wait_mode: shared_result` (SPEC §14), side by side.
///
/// See `docs/simulator.md` for the bodies and answers.
pub fn router() -> Router {
    // Separate gates: the page asks for a replay and a rendering at once.
    let run_gate = Arc::new(Semaphore::new(MAX_CONCURRENT_REPLAYS));
    let gate = Arc::new(Semaphore::new(MAX_CONCURRENT_REPLAYS));
    let throttle_gate = Arc::new(Semaphore::new(MAX_CONCURRENT_REPLAYS));
    let stampede_gate = Arc::new(Semaphore::new(MAX_CONCURRENT_REPLAYS));
    Router::new()
        .route(PAGE_PATH, get(page))
        .route(
            "/simulator/",
            get(|| async { Redirect::permanent(PAGE_PATH) }),
        )
        .route(
            "/simulator/assets/simulator.js",
            get(|| async { asset("text/javascript; charset=utf-8", PAGE_JS) }),
        )
        .route(
            "/simulator/assets/simulator.css",
            get(|| async { asset("text/css; charset=utf-8", PAGE_CSS) }),
        )
        .route("/simulator/api/presets", get(api::presets))
        .route(
            "/simulator/api/run",
            post(move |request: Request| api::run(run_gate.clone(), request)),
        )
        .route(
            "/simulator/assets/throttler.js",
            get(|| async { asset("text/javascript; charset=utf-8", THROTTLER_JS) }),
        )
        .route(
            "/simulator/api/throttle",
            post({
                let gate = throttle_gate.clone();
                move |request: Request| api::throttle(gate.clone(), request)
            }),
        )
        .route(
            "/simulator/assets/stampede.js",
            get(|| async { asset("text/javascript; charset=utf-8", STAMPEDE_JS) }),
        )
        .route(
            "/simulator/api/stampede",
            post(move |request: Request| api::stampede(stampede_gate.clone(), request)),
        )
        .route(
            "/simulator/api/yaml",
            post(move |request: Request| api::yaml(gate.clone(), request)),
        )
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// Everything the page loads comes from this router: the policy says so to
/// the browser, and nothing else may be framed, sniffed or fetched.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

async fn page() -> impl IntoResponse {
    (
        [(header::CONTENT_SECURITY_POLICY, CSP)],
        asset("text/html; charset=utf-8", PAGE_HTML),
    )
}

/// A compiled-in file. `no-cache`: a new binary must never be shown an old
/// script, and revalidating three small files costs nothing.
fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}
