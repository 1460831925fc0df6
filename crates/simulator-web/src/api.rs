//! The JSON API of the page: handlers and the one mapping of errors
//! ([`ApiError`]) to HTTP.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::StreamExt;

use crate::error::ApiError;
use crate::input::{self, MAX_EVENT_TIERS, MAX_EVENTS};
use crate::replay::{self, MAX_HIT_TIMES, MAX_LISTED_TIER_STATES};
use crate::{BODY_LIMIT, MAX_CONCURRENT_REPLAYS, presets};

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            ApiError::Invalid(issues) => {
                let message = issues
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n");
                (
                    StatusCode::BAD_REQUEST,
                    json!({"error": "invalid", "message": message, "issues": issues}),
                )
            }
            ApiError::TooManyEvents(n) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({
                    "error": "too_many_events",
                    "message": format!("{n} events; a replay holds at most {MAX_EVENTS} (reset the simulation to go on)"),
                    "max_events": MAX_EVENTS,
                }),
            ),
            ApiError::TooMuchWork { events, tiers } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({
                    "error": "too_much_work",
                    "message": format!("{events} events × {tiers} tiers = {}; a replay does at most {MAX_EVENT_TIERS} (reset the simulation or use fewer tiers)", events * tiers),
                    "max_event_tiers": MAX_EVENT_TIERS,
                }),
            ),
            ApiError::TooManyTierStates => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({
                    "error": "too_many_tier_states",
                    "message": format!("detail \"full\" would list more than {MAX_LISTED_TIER_STATES} tier states (listed events × tiers); ask for \"detail\": \"replies\" or a later \"report_from\""),
                    "max_listed_tier_states": MAX_LISTED_TIER_STATES,
                }),
            ),
            ApiError::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({
                    "error": "body_too_large",
                    "message": format!("the body is over {BODY_LIMIT} bytes"),
                    "max_body_bytes": BODY_LIMIT,
                }),
            ),
            ApiError::Busy => {
                let body = json!({
                    "error": "busy",
                    "message": format!("{MAX_CONCURRENT_REPLAYS} replays are running; try again in a second"),
                    "max_concurrent_replays": MAX_CONCURRENT_REPLAYS,
                });
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, "1")],
                    Json(body),
                )
                    .into_response();
            }
            ApiError::TooManyHitTimes => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({
                    "error": "too_many_hit_times",
                    "message": format!("the tier snapshots would list more than {MAX_HIT_TIMES} hit times; ask for \"detail\": \"replies\" or a later \"report_from\""),
                    "max_hit_times": MAX_HIT_TIMES,
                }),
            ),
            ApiError::Internal(message) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal", "message": message}),
            ),
        };
        (status, Json(body)).into_response()
    }
}

/// `GET /simulator/api/presets`: the cookbook and the limits of the API.
pub(crate) async fn presets() -> Json<Value> {
    Json(json!({
        "max_events": MAX_EVENTS,
        "max_tiers": input::MAX_TIERS,
        "max_event_tiers": MAX_EVENT_TIERS,
        "presets": presets::all(),
    }))
}

/// Admits a call that parses a body: a permit of `gate` first (none left:
/// 429, the body read and dropped, never kept), then the body, at most
/// [`BODY_LIMIT`] bytes. So at most [`MAX_CONCURRENT_REPLAYS`] bodies are
/// held and worked on at a time, however many clients call.
async fn admit(
    gate: &Arc<Semaphore>,
    request: Request,
) -> Result<(OwnedSemaphorePermit, Bytes), ApiError> {
    let body = request.into_body();
    let Ok(permit) = gate.clone().try_acquire_owned() else {
        // Read what the client sends so it gets the answer instead of a
        // reset connection; nothing is kept.
        let mut stream = body.into_data_stream();
        let mut seen = 0;
        while let Some(Ok(chunk)) = stream.next().await {
            seen += chunk.len();
            if seen > BODY_LIMIT {
                break;
            }
        }
        return Err(ApiError::Busy);
    };
    let bytes = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .map_err(|_| ApiError::TooLarge)?;
    Ok((permit, bytes))
}

/// A JSON answer sent in 64 KiB pieces, holding `permit` until the last
/// piece is taken: an answer waiting for a slow reader still counts
/// against [`MAX_CONCURRENT_REPLAYS`], so answers cannot pile up.
fn json_holding(permit: OwnedSemaphorePermit, json: Vec<u8>) -> Response {
    const PIECE: usize = 64 * 1024;
    let bytes = Bytes::from(json);
    let pieces: Vec<Bytes> = (0..bytes.len())
        .step_by(PIECE)
        .map(|i| bytes.slice(i..(i + PIECE).min(bytes.len())))
        .collect();
    let stream = tokio_stream::iter(pieces).map(move |piece| {
        let _held = &permit;
        Ok::<Bytes, Infallible>(piece)
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// `POST /simulator/api/run`: replays the body's events from empty state.
pub(crate) async fn run(gate: Arc<Semaphore>, request: Request) -> Result<Response, ApiError> {
    let (permit, bytes) = admit(&gate, request).await?;
    // A full replay is milliseconds of CPU, but a server's other work must
    // not wait behind it on an async worker.
    let json = tokio::task::spawn_blocking(move || {
        // The body and its parsed form are dropped before the replay runs.
        let replay = input::replay(&input::body(&bytes)?)?;
        drop(bytes);
        replay::run(&replay)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the replay failed: {e}")))??;
    Ok(json_holding(permit, json))
}

/// `POST /simulator/api/yaml`: the configuration as SPEC §6 YAML, rendered
/// by charon-core (normalized, so it is what a server would enforce).
pub(crate) async fn yaml(gate: Arc<Semaphore>, request: Request) -> Result<Response, ApiError> {
    let (_permit, bytes) = admit(&gate, request).await?;
    let body = input::body(&bytes)?;
    let setup = input::yaml_setup(&body)?;
    Ok(Json(json!({
        "yaml": setup.config.to_yaml(),
        "adjustments": setup.adjustments,
    }))
    .into_response())
}

/// `POST /simulator/api/throttle`: a throttler run (the `throttle`
/// module): the arrivals, the decisions and the service, all on the server.
pub(crate) async fn throttle(gate: Arc<Semaphore>, request: Request) -> Result<Response, ApiError> {
    let (permit, bytes) = admit(&gate, request).await?;
    let json = tokio::task::spawn_blocking(move || crate::throttle::run(&bytes))
        .await
        .map_err(|e| ApiError::Internal(format!("the throttler run failed: {e}")))??;
    Ok(json_holding(permit, json))
}

/// `POST /simulator/api/stampede`: a hot-page stampede run three ways (the
/// `stampede` module), every copy decision made by `charon simulate`.
pub(crate) async fn stampede(gate: Arc<Semaphore>, request: Request) -> Result<Response, ApiError> {
    let (permit, bytes) = admit(&gate, request).await?;
    let json = tokio::task::spawn_blocking(move || crate::stampede::run(&bytes))
        .await
        .map_err(|e| ApiError::Internal(format!("the stampede run failed: {e}")))??;
    Ok(json_holding(permit, json))
}
