//! Bearer tokens. Mutating endpoints need a token with the `write` role;
//! reads are open unless the service is told to require a token for them
//! too (then a `read` or `write` token will do).
//!
//! Every token has a name, which the audit trail records with each commit
//! (`GET /v1/audit`): given (`write:ci=SECRET`) or derived from its role
//! and position (`write-1`, `read-2`), never the secret itself.

use std::fmt;
use std::sync::Arc;

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
    entries: Vec<Entry>,
    reads_need_token: bool,
}

/// One accepted token.
#[derive(Clone)]
struct Entry {
    name: String,
    secret: String,
    role: Role,
}

/// Whether `name` can name a token: a letter first, then letters, digits,
/// `.`, `_` or `-` (at most 64), so it prints plainly in logs and the audit.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print a secret.
        f.debug_struct("Tokens")
            .field(
                "tokens",
                &self
                    .entries
                    .iter()
                    .map(|e| (&e.name, e.role))
                    .collect::<Vec<_>>(),
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

    /// Accepts `secret` for writes (and reads), named `write-N` (the N-th
    /// write token).
    pub fn writer(self, secret: impl Into<String>) -> Self {
        let name = self.derived_name(Role::Write);
        self.push(name, Role::Write, secret.into())
    }

    /// Accepts `secret` for reads only (a write with it is refused, 403),
    /// named `read-N`.
    pub fn reader(self, secret: impl Into<String>) -> Self {
        let name = self.derived_name(Role::Read);
        self.push(name, Role::Read, secret.into())
    }

    /// Accepts `secret` with `role` under `name`, which the audit trail
    /// records for each commit made with it. Fails when the name is not a
    /// plain name (see the module) or is taken.
    pub fn named(
        self,
        name: impl Into<String>,
        role: Role,
        secret: impl Into<String>,
    ) -> Result<Self, String> {
        let name = name.into();
        if !valid_name(&name) {
            return Err(format!(
                "token name {name:?} must start with a letter and hold only letters, digits, \
                 '.', '_' or '-' (at most 64)"
            ));
        }
        if self.entries.iter().any(|e| e.name == name) {
            return Err(format!("two tokens are named {name:?}"));
        }
        Ok(self.push(name, role, secret.into()))
    }

    fn push(mut self, name: String, role: Role, secret: String) -> Self {
        self.entries.push(Entry { name, secret, role });
        self
    }

    /// `write-N` or `read-N`: the first such name not taken.
    fn derived_name(&self, role: Role) -> String {
        let prefix = match role {
            Role::Read => "read",
            Role::Write => "write",
        };
        (1..)
            .map(|n| format!("{prefix}-{n}"))
            .find(|name| self.entries.iter().all(|e| &e.name != name))
            .unwrap_or_else(|| prefix.to_owned())
    }

    /// Requires a token for reads too (by default reads are open).
    pub fn reads_need_token(mut self, yes: bool) -> Self {
        self.reads_need_token = yes;
        self
    }

    /// Parses a comma-separated list of tokens, as flags and environment
    /// variables give them: `write:SECRET`, `read:SECRET` or a bare
    /// `SECRET` (a write token), each optionally named with `NAME=` before
    /// the secret (`write:ci=SECRET`, `read:grafana=SECRET`, `ops=SECRET`).
    /// An item is named only when what follows its first `=` is not empty
    /// and does not start with `=`, so a base64 secret with its padding
    /// (`c2VjcmV0==`) still reads as a bare secret. Unnamed tokens get
    /// `write-N` / `read-N`. An error never quotes a secret.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut tokens = Self::new();
        for (index, item) in spec
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .enumerate()
        {
            let at = index + 1;
            let (role, rest) = match item.split_once(':') {
                Some(("write", s)) => (Role::Write, s),
                Some(("read", s)) => (Role::Read, s),
                _ => (Role::Write, item),
            };
            let (name, secret) = match rest.split_once('=') {
                Some((name, secret)) if !secret.is_empty() && !secret.starts_with('=') => {
                    (Some(name), secret)
                }
                _ => (None, rest),
            };
            if secret.is_empty() {
                return Err(format!("token {at} of the list has an empty secret"));
            }
            if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "token {at} of the list: a token must not contain spaces or control characters"
                ));
            }
            tokens = match name {
                Some(name) => tokens
                    .named(name, role, secret)
                    .map_err(|e| format!("token {at} of the list: {e}"))?,
                None if role == Role::Write => tokens.writer(secret),
                None => tokens.reader(secret),
            };
        }
        Ok(tokens)
    }

    /// Parses a tokens file: the items of [`Tokens::parse`], separated by
    /// commas or line breaks, lines starting with `#` ignored. A file that
    /// lists no token (empty, only comments: what a truncated write looks
    /// like) is an error, not a service that nobody may write to.
    pub fn parse_file(text: &str) -> Result<Self, String> {
        let items: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let tokens = Self::parse(&items.join(","))?;
        if tokens.entries.is_empty() {
            return Err("no tokens (an empty file?): list at least one".to_owned());
        }
        Ok(tokens)
    }

    /// Whether any token allows writes.
    pub fn has_writer(&self) -> bool {
        self.entries.iter().any(|e| e.role == Role::Write)
    }

    /// The names of the tokens and their roles (never the secrets), for a
    /// startup log line.
    pub fn names(&self) -> Vec<(String, Role)> {
        self.entries
            .iter()
            .map(|e| (e.name.clone(), e.role))
            .collect()
    }

    /// The role and name of the token `presented`, if it is one of ours.
    fn lookup(&self, presented: &str) -> Option<(Role, &str)> {
        // Compare against every entry (no early exit) in constant time
        // (`subtle`), so the answer time does not tell how much of a
        // secret was right. Two entries with one secret: the stronger
        // role wins.
        let mut found: Option<(Role, &str)> = None;
        for e in &self.entries {
            if bool::from(e.secret.as_bytes().ct_eq(presented.as_bytes()))
                && found.is_none_or(|(role, _)| e.role > role)
            {
                found = Some((e.role, &e.name));
            }
        }
        found
    }

    #[cfg(test)]
    fn role_of(&self, presented: &str) -> Option<Role> {
        self.lookup(presented).map(|(role, _)| role)
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
                    Presented::Token(
                        self.lookup(token)
                            .map(|(role, name)| (role, Arc::<str>::from(name))),
                    )
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
#[derive(Debug, Clone)]
enum Presented {
    /// No header.
    Nothing,
    /// A header that is not `Bearer TOKEN`.
    Malformed,
    /// A bearer token, with its role and name if it is one of ours.
    Token(Option<(Role, Arc<str>)>),
}

/// The request's credentials, checked against the tokens: an extractor for
/// the one operation whose need depends on the request (`PUT /v1/config`
/// reads for a dry run, writes otherwise). The others take [`Reader`] or
/// [`Writer`], which run before every other extractor, so that a client
/// without the right token learns nothing about its URL, headers or body.
#[derive(Debug, Clone)]
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
        match &self.presented {
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
            Presented::Token(Some((role, _))) if *role < need => Err(ApiError::forbidden(
                "this token may read the configuration but not change it",
            )),
            Presented::Token(Some(_)) => Ok(()),
        }
    }

    /// The name of the valid token the request carried, if any: what the
    /// audit trail records for a commit.
    pub(crate) fn token_name(&self) -> Option<Arc<str>> {
        match &self.presented {
            Presented::Token(Some((_, name))) => Some(Arc::clone(name)),
            _ => None,
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
/// configuration (`WRITE`) or read it: [`Writer`], [`Reader`]. It holds
/// the name of the token that allowed it (none for an open read).
#[derive(Debug, Clone)]
pub(crate) struct Allowed<const WRITE: bool>(pub(crate) Option<Arc<str>>);

/// Lets a request through when it may read.
pub(crate) type Reader = Allowed<false>;

/// Lets a request through when it may change the configuration.
pub(crate) type Writer = Allowed<true>;

impl<const WRITE: bool> FromRequestParts<AppState> for Allowed<WRITE> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let need = if WRITE { Role::Write } else { Role::Read };
        let access = Access::from_request_parts(parts, state).await?;
        access.require(need)?;
        Ok(Allowed(access.token_name()))
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

    #[test]
    fn a_tokens_file_lists_one_per_line_or_comma_and_never_none() {
        let t = Tokens::parse_file("# rotated 2026-11\nwrite:ci=c1\n\n  read:grafana=g1, ops=o1\n")
            .expect("valid");
        assert_eq!(t.role_of("c1"), Some(Role::Write));
        assert_eq!(t.role_of("g1"), Some(Role::Read));
        assert_eq!(t.role_of("o1"), Some(Role::Write));
        for empty in ["", "\n  \n", "# nothing yet\n", ",\n,"] {
            let e = Tokens::parse_file(empty).expect_err(empty);
            assert!(e.contains("no tokens"), "{e}");
        }
        assert!(Tokens::parse_file("read:\n").is_err());
    }

    #[test]
    fn names_given_or_derived_never_the_secret() {
        let t = Tokens::parse("w1,read:grafana=r1,write:ci=c2VjcmV0,write:YWI=,write:YQ==,read:r2")
            .expect("valid");
        let names: Vec<String> = t.names().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["write-1", "grafana", "ci", "write-2", "write-3", "read-1"]
        );
        assert_eq!(t.lookup("r1"), Some((Role::Read, "grafana")));
        assert_eq!(t.lookup("c2VjcmV0"), Some((Role::Write, "ci")));
        // base64 padding keeps a bare secret a bare secret
        assert_eq!(t.lookup("YWI="), Some((Role::Write, "write-2")));
        assert_eq!(t.lookup("YQ=="), Some((Role::Write, "write-3")));
        assert!(Tokens::parse("write:a=x,read:a=y").is_err());
        let bad = Tokens::parse("write:1bad=s3cret").expect_err("a name starts with a letter");
        assert!(!bad.contains("s3cret"), "{bad}");
        assert!(!format!("{t:?}").contains("c2VjcmV0"));
    }
}
