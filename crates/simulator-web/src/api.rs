//! The JSON API of the page: handlers and the one mapping of errors to HTTP.

use axum::Json;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use charon_core::config::ConfigIssue;
use serde_json::{Value, json};

use crate::input::{self, MAX_EVENTS};
use crate::presets;
use crate::replay::{self, MAX_HIT_TIMES};

/// Why a call got no answer. A rejected request is not an error: it is an
/// ordinary reply inside a successful replay.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The body is wrong; every issue with its path.
    Invalid(Vec<ConfigIssue>),
    /// More events than [`MAX_EVENTS`].
    TooManyEvents(usize),
    /// The tier snapshots would list more than [`MAX_HIT_TIMES`] hits.
    TooManyHitTimes,
    /// The replay task died (a bug; reported, not hidden).
    Internal(String),
}

impl ApiError {
    pub(crate) fn invalid(issues: Vec<ConfigIssue>) -> Self {
        Self::Invalid(issues)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            ApiError::Invalid(issues) => {
                let message = issues
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n");
                let issues: Vec<Value> = issues
                    .iter()
                    .map(|i| json!({"path": i.path, "message": i.message}))
                    .collect();
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
        "presets": presets::all(),
    }))
}

/// `POST /simulator/api/run`: replays the body's events from empty state.
pub(crate) async fn run(body: Bytes) -> Result<Response, ApiError> {
    // A full replay is milliseconds of CPU, but a server's other work must
    // not wait behind it on an async worker.
    tokio::task::spawn_blocking(move || {
        let body = input::body(&body)?;
        let replay = input::replay(&body)?;
        let answer = replay::run(&replay)?;
        Ok(Json(answer).into_response())
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the replay failed: {e}")))?
}

/// `POST /simulator/api/yaml`: the configuration as SPEC §6 YAML, rendered
/// by charon-core (normalized, so it is what a server would enforce).
pub(crate) async fn yaml(body: Bytes) -> Result<Json<Value>, ApiError> {
    let body = input::body(&body)?;
    let setup = input::yaml_setup(&body)?;
    Ok(Json(json!({
        "yaml": setup.config.to_yaml(),
        "adjustments": setup.adjustments_json(),
    })))
}
