//! Extractors that answer like the rest of the API: axum's own rejections
//! are plain text; these turn every rejection into an [`ApiError`] JSON
//! body, so what the OpenAPI document promises holds for malformed
//! requests too.

use axum::body::Bytes;
use axum::extract::{
    FromRequest, FromRequestParts, OptionalFromRequestParts, Path, Query, Request,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

/// Defines `$name<T>`, axum's `$axum<T>` with its rejection answered as a
/// 400 that says `$what`.
macro_rules! answered {
    ($(#[$doc:meta])* $name:ident, $axum:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub(crate) struct $name<T>(pub T);

        impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for $name<T> {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                <$axum<T> as FromRequestParts<S>>::from_request_parts(parts, state)
                    .await
                    .map(|$axum(v)| $name(v))
                    .map_err(|e| ApiError::invalid_at("", format!("{}: {}", $what, e.body_text())))
            }
        }
    };
}

answered!(
    /// Path parameters (percent-decoded: a resource name `api/search`
    /// arrives as `api%2Fsearch`).
    UrlParams,
    Path,
    "bad URL"
);

answered!(
    /// Query parameters.
    QueryParams,
    Query,
    "bad query string"
);

/// The raw body, with the size limit answered as JSON.
#[derive(Debug)]
pub(crate) struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::payload_too_large(e.body_text())
                } else {
                    ApiError::invalid_at("", format!("cannot read the body: {}", e.body_text()))
                }
            })
    }
}

/// Whether the request's `Content-Type` is JSON (or absent).
pub(crate) fn is_json(headers: &HeaderMap) -> Result<bool, ApiError> {
    let Some(v) = headers.get(header::CONTENT_TYPE) else {
        return Ok(true);
    };
    let v = v
        .to_str()
        .map_err(|_| ApiError::unsupported_media_type("unreadable Content-Type"))?;
    let essence = v
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    Ok(essence == "application/json" || essence.ends_with("+json"))
}

/// A JSON body, parsed but not yet validated (charon-core does that).
#[derive(Debug)]
pub(crate) struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json(req.headers())? {
            return Err(ApiError::unsupported_media_type(
                "send the body as application/json",
            ));
        }
        let RawBody(bytes) = RawBody::from_request(req, state).await?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::invalid_at("", format!("the body is not valid JSON: {e}")))
    }
}

/// A parsed `If-Match` header: the version(s) a write was based on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IfMatch {
    /// `*`: the target must exist.
    Exists,
    /// One or more versions (`"7"`, `7`, `"7", "8"`).
    Versions(Vec<u64>),
}

/// `Option<IfMatch>` as an extractor: `None` when the header is absent.
impl<S: Send + Sync> OptionalFromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, ApiError> {
        IfMatch::from_headers(&parts.headers)
    }
}

impl IfMatch {
    /// Reads the header; `None` when absent.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, ApiError> {
        let mut all = headers.get_all(header::IF_MATCH).iter().peekable();
        if all.peek().is_none() {
            return Ok(None);
        }
        let bad = || {
            ApiError::invalid_at(
                "If-Match",
                "expected the version the change is based on, as an ETag (\"7\") or a number (7), or *",
            )
        };
        let mut versions = Vec::new();
        let mut exists = false;
        for value in all {
            let text = value.to_str().map_err(|_| bad())?;
            for item in text.split(',').map(|s| s.trim_matches([' ', '\t'])) {
                if item == "*" {
                    exists = true;
                    continue;
                }
                let unquoted = item
                    .strip_prefix('"')
                    .and_then(|s| s.strip_suffix('"'))
                    .unwrap_or(item);
                if unquoted.is_empty() || !unquoted.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                versions.push(unquoted.parse().map_err(|_| bad())?);
            }
        }
        if exists {
            return Ok(Some(IfMatch::Exists));
        }
        Ok(Some(IfMatch::Versions(versions)))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn parse(v: &str) -> Result<Option<IfMatch>, ApiError> {
        let mut h = HeaderMap::new();
        h.insert(header::IF_MATCH, HeaderValue::from_str(v).expect("header"));
        IfMatch::from_headers(&h)
    }

    #[test]
    fn if_match_forms() {
        assert_eq!(IfMatch::from_headers(&HeaderMap::new()).ok(), Some(None));
        assert_eq!(parse("7").ok(), Some(Some(IfMatch::Versions(vec![7]))));
        assert_eq!(
            parse("\"7\", \"9\"").ok(),
            Some(Some(IfMatch::Versions(vec![7, 9])))
        );
        assert_eq!(parse("*").ok(), Some(Some(IfMatch::Exists)));
        assert!(parse("W/\"7\"").is_err());
        assert!(parse("seven").is_err());
        assert!(parse("\"\"").is_err());
        assert!(parse("-1").is_err());
        assert!(parse("*, x").is_err());
        assert!(parse("5,,6").is_err());
        assert!(parse("\"5").is_err());
    }
}
