//! Bearer tokens. Mutating endpoints need a token with the `write` role;
//! reads are open unless the service is told to require a token for them
//! too (then a `read` or `write` token will do).

use std::fmt;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::ApiError;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read the configuration (only matters when reads need a token).
    Read,
    /// Read and change it.
    Write,
}

/// The tokens the service accepts. With no `write` token configured every
/// mutating request is refused (401): the service never runs open for
/// writes by accident.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<(String, Role)>,
    reads_need_token: bool,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print a secret.
        f.debug_struct("Tokens")
            .field(
                "roles",
                &self.entries.iter().map(|(_, r)| r).collect::<Vec<_>>(),
            )
            .field("reads_need_token", &self.reads_need_token)
            .finish()
    }
}

impl Tokens {
    /// No tokens: reads open, writes refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `secret` for writes (and reads).
    pub fn writer(mut self, secret: impl Into<String>) -> Self {
        self.entries.push((secret.into(), Role::Write));
        self
    }

    /// Accepts `secret` for reads only; a write with it is refused (403).
    pub fn reader(mut self, secret: impl Into<String>) -> Self {
        self.entries.push((secret.into(), Role::Read));
        self
    }

    /// Requires a token for reads too (by default reads are open).
    pub fn reads_need_token(mut self, yes: bool) -> Self {
        self.reads_need_token = yes;
        self
    }

    /// Parses a comma-separated list of `write:SECRET`, `read:SECRET` or a
    /// bare `SECRET` (a write token), as flags and environment variables
    /// give them.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut tokens = Self::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (role, secret) = match item.split_once(':') {
                Some(("write", s)) => (Role::Write, s),
                Some(("read", s)) => (Role::Read, s),
                _ => (Role::Write, item),
            };
            if secret.is_empty() {
                return Err(format!("token {item:?} has an empty secret"));
            }
            if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err("a token must not contain spaces or control characters".to_owned());
            }
            tokens.entries.push((secret.to_owned(), role));
        }
        Ok(tokens)
    }

    /// Whether any token allows writes.
    pub fn has_writer(&self) -> bool {
        self.entries.iter().any(|(_, r)| *r == Role::Write)
    }

    fn role_of(&self, presented: &str) -> Option<Role> {
        // Compare against every entry (no early exit) in constant time
        // (`subtle`), so the answer time does not tell how much of a
        // secret was right.
        let mut found = None;
        for (secret, role) in &self.entries {
            if bool::from(secret.as_bytes().ct_eq(presented.as_bytes())) {
                found = found.max(Some(*role));
            }
        }
        found
    }

    /// What the `Authorization` header of a request is allowed.
    fn access(&self, headers: &HeaderMap) -> Access {
        let presented = match headers.get(header::AUTHORIZATION) {
            None => Presented::Nothing,
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|v| {
                    let (scheme, token) = v.trim().split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
                })
                .map_or(Presented::Malformed, |token| {
                    Presented::Token(self.role_of(token))
                }),
        };
        Access {
            presented,
            reads_need_token: self.reads_need_token,
            has_writer: self.has_writer(),
        }
    }
}

/// What a request's `Authorization` header held.
#[derive(Debug, Clone, Copy)]
enum Presented {
    /// No header.
    Nothing,
    /// A header that is not `Bearer TOKEN`.
    Malformed,
    /// A bearer token, with its role if it is one of ours.
    Token(Option<Role>),
}

/// The request's credentials, checked against the tokens: an extractor for
/// the one operation whose need depends on the request (`PUT /v1/config`
/// reads for a dry run, writes otherwise). The others take [`Reader`] or
/// [`Writer`], which run before every other extractor, so that a client
/// without the right token learns nothing about its URL, headers or body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access {
    presented: Presented,
    reads_need_token: bool,
    has_writer: bool,
}

impl Access {
    /// Allows an operation that needs `need`, or answers 401 or 403.
    pub(crate) fn require(&self, need: Role) -> Result<(), ApiError> {
        if need == Role::Read && !self.reads_need_token {
            return Ok(());
        }
        match self.presented {
            Presented::Nothing => {
                let why = if need == Role::Write && !self.has_writer {
                    "this service has no write token configured; changes are refused"
                } else {
                    "a bearer token is required (Authorization: Bearer TOKEN)"
                };
                Err(ApiError::unauthorized(why, false))
            }
            Presented::Malformed => Err(ApiError::unauthorized(
                "the Authorization header must be `Bearer TOKEN`",
                true,
            )),
            Presented::Token(None) => Err(ApiError::unauthorized(
                "the bearer token is not valid",
                true,
            )),
            Presented::Token(Some(role)) if role < need => Err(ApiError::forbidden(
                "this token may read the configuration but not change it",
            )),
            Presented::Token(Some(_)) => Ok(()),
        }
    }
}

impl FromRequestParts<AppState> for Access {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(state.tokens().access(&parts.headers))
    }
}

/// An extractor that lets a request through when it may change the
/// configuration (`WRITE`) or read it: [`Writer`], [`Reader`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Allowed<const WRITE: bool>;

/// Lets a request through when it may read.
pub(crate) type Reader = Allowed<false>;

/// Lets a request through when it may change the configuration.
pub(crate) type Writer = Allowed<true>;

impl<const WRITE: bool> FromRequestParts<AppState> for Allowed<WRITE> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let need = if WRITE { Role::Write } else { Role::Read };
        let access = Access::from_request_parts(parts, state).await?;
        access.require(need).map(|()| Allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_roles() {
        let t = Tokens::parse("w1, read:r1,write:w2").expect("valid");
        assert_eq!(t.role_of("w1"), Some(Role::Write));
        assert_eq!(t.role_of("w2"), Some(Role::Write));
        assert_eq!(t.role_of("r1"), Some(Role::Read));
        assert_eq!(t.role_of("r2"), None);
        assert!(Tokens::parse("read:").is_err());
        assert!(Tokens::parse("a b").is_err());
        assert!(!format!("{t:?}").contains("w1"));
    }
}
