//! Every error the API answers, mapped to HTTP in one place. Bodies are
//! always [`ErrorBody`] JSON, also for what axum's own extractors would
//! answer in plain text (the handlers use the extractors of `api::extract`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use charon_core::config::{ConfigErrors, ConfigIssue};

use crate::store::ConfigDbError;
use crate::wire::ErrorBody;

/// An error answer: status, stable code, message, problems.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    body: ErrorBody,
    authenticate: Option<&'static str>,
    /// Seconds for `Retry-After` (a 503 that will pass). Small, so that
    /// the error stays small.
    retry_after: Option<u16>,
}

impl ApiError {
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                error: code.to_owned(),
                message: message.into(),
                problems: Vec::new(),
                current_version: None,
            },
            authenticate: None,
            retry_after: None,
        }
    }

    /// 400: the request is wrong; every problem with its path.
    pub fn invalid(problems: Vec<ConfigIssue>) -> Self {
        let message = match problems.as_slice() {
            [one] => one.to_string(),
            many => format!("{} problems; nothing was changed", many.len()),
        };
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid", message);
        e.body.problems = problems;
        e
    }

    /// 400 with one problem.
    pub fn invalid_at(path: &str, message: impl Into<String>) -> Self {
        Self::invalid(vec![ConfigIssue {
            path: path.to_owned(),
            message: message.into(),
        }])
    }

    /// 400 from core's validation, paths as core gives them.
    pub fn config(errors: ConfigErrors) -> Self {
        Self::invalid(errors.0)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "already_exists", message)
    }

    /// 422: a well-formed request that does not fit the target (a group
    /// of a rate-limited resource).
    pub fn wrong_kind(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "wrong_kind", message)
    }

    /// 412: `If-Match` names a version the target has changed since.
    pub fn version_conflict(message: impl Into<String>, current: u64) -> Self {
        let mut e = Self::new(StatusCode::PRECONDITION_FAILED, "version_conflict", message);
        e.body.current_version = Some(current);
        e
    }

    /// 401 with `WWW-Authenticate: Bearer`.
    pub fn unauthorized(message: impl Into<String>, invalid_token: bool) -> Self {
        let mut e = Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
        e.authenticate = Some(if invalid_token {
            r#"Bearer realm="charon-config", error="invalid_token""#
        } else {
            r#"Bearer realm="charon-config""#
        });
        e
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
        )
    }

    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this method is not allowed on this path",
        )
    }
}

impl From<ConfigDbError> for ApiError {
    fn from(e: ConfigDbError) -> Self {
        match e.unavailability() {
            Some(why) => {
                tracing::warn!(
                    error = %e,
                    retry_after_s = why.retry_after().as_secs(),
                    "configuration database unavailable ({}); answering 503",
                    why.describe()
                );
                let mut answer = Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!(
                        "the configuration database is unavailable: {}; nothing was changed, \
                         try again later",
                        why.describe()
                    ),
                );
                let seconds = why.retry_after().as_secs().clamp(1, u64::from(u16::MAX));
                answer.retry_after = u16::try_from(seconds).ok();
                answer
            }
            None => {
                tracing::error!(error = %e, "configuration database error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("{e}; nothing was changed"),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body)).into_response();
        if let Some(challenge) = self.authenticate {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
