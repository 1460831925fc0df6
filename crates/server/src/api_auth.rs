//! Who may use the limiting API (issue 16): with `charon serve
//! --api-tokens FILE`, every call of the `Limiter` (sessions included),
//! Envoy `RateLimitService` and `Capacity` services must carry
//! `authorization: Bearer SECRET`; the secret names a [`Principal`], which
//! may use the resources of some namespaces only. Health and reflection
//! stay open.
//!
//! Where a credential comes from and what it may do are kept apart: a
//! bearer secret is looked up in [`ApiTokens::by_secret`]; under mutual
//! TLS (`--tls-client-ca`), a call without a bearer token is made by the
//! principal whose `certificate_name` is the subject common name of the
//! client certificate the handshake verified ([`ApiTokens::by_certificate`]);
//! both lead to the same [`Principal`]. A bearer token, when sent, wins.
//!
//! The file, YAML:
//!
//! ```yaml
//! - name: tenant-a            # what logs and errors call it
//!   secret: 9f1c…             # or secret_file: /run/secrets/tenant-a
//!   namespaces: [tenant-a]    # or ["*"]: every namespace
//! - name: tenant-b
//!   certificate_name: checkout.tenant-b   # a client certificate's CN
//!   namespaces: [tenant-b]
//! ```
//!
//! It is reloaded on SIGHUP and when it changes; a file that does not load
//! is refused, logged, and the previous tokens stay in force.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use charon_core::config::namespace_of;
use charon_proto::v1;
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tonic::Status;
use tracing::{error, info};

use crate::ServerState;

/// A caller of the limiting API and the namespaces whose resources it may
/// use. The same whatever credential named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Its name, in logs and errors (never a secret).
    pub name: String,
    /// `None`: every namespace (`"*"`).
    namespaces: Option<BTreeSet<String>>,
}

impl Principal {
    /// A principal allowed `namespaces` (`"*"` among them: all).
    pub fn new(name: impl Into<String>, namespaces: &[String]) -> Self {
        let all = namespaces.iter().any(|n| n == "*");
        Self {
            name: name.into(),
            namespaces: (!all).then(|| namespaces.iter().cloned().collect()),
        }
    }

    /// Whether it may use the resources of `namespace`.
    pub fn may_use_namespace(&self, namespace: &str) -> bool {
        self.namespaces
            .as_ref()
            .is_none_or(|set| set.contains(namespace))
    }

    /// Whether it may use `resource` (its namespace: SPEC §1, the text
    /// before the first `/`, `default` without one).
    pub fn may_use(&self, resource: &str) -> bool {
        self.may_use_namespace(namespace_of(resource))
    }

    /// Why it may not use `namespace`: for an error.
    fn refusal(&self, namespace: &str) -> String {
        format!(
            "permission denied: token {:?} may not use namespace {namespace:?}",
            self.name
        )
    }
}

/// One entry of the tokens file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    secret_file: Option<PathBuf>,
    #[serde(default)]
    certificate_name: Option<String>,
    namespaces: Vec<String>,
}

/// One principal and the credentials that name it.
#[derive(Clone)]
struct Credentials {
    secret: Option<String>,
    certificate_name: Option<String>,
    principal: Arc<Principal>,
}

/// The principals of the limiting API, by secret and by name.
#[derive(Clone, Default)]
pub struct ApiTokens {
    entries: Vec<Credentials>,
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        f.debug_list()
            .entries(self.entries.iter().map(|c| &c.principal))
            .finish()
    }
}

impl ApiTokens {
    /// Reads and checks the tokens file at `path` (`secret_file`s relative
    /// to its directory). Errors name the entry, never a secret.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, dir).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the YAML list (see the module); `dir` resolves relative
    /// `secret_file`s.
    pub fn parse(text: &str, dir: &Path) -> Result<Self, String> {
        let entries: Vec<Entry> =
            serde_saphyr::from_str(text).map_err(|e| format!("not a list of tokens: {e}"))?;
        let mut tokens = Self::default();
        for (i, e) in entries.into_iter().enumerate() {
            let at = format!("token {} ({:?})", i + 1, e.name);
            if e.name.is_empty() || e.name.chars().any(char::is_control) {
                return Err(format!("{at}: a name must be non-empty text"));
            }
            if tokens.entries.iter().any(|c| c.principal.name == e.name) {
                return Err(format!("{at}: two tokens have this name"));
            }
            let secret = match (e.secret, e.secret_file) {
                (Some(s), None) => Some(s),
                (None, Some(file)) => {
                    let file = dir.join(file);
                    Some(
                        std::fs::read_to_string(&file)
                            .map_err(|err| format!("{at}: cannot read {}: {err}", file.display()))?
                            .trim()
                            .to_owned(),
                    )
                }
                (None, None) if e.certificate_name.is_some() => None,
                _ => {
                    return Err(format!(
                        "{at}: give exactly one of secret and secret_file, or a certificate_name"
                    ));
                }
            };
            if let Some(secret) = &secret {
                if secret.is_empty() || secret.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(format!(
                        "{at}: the secret must be non-empty, without spaces or control characters"
                    ));
                }
                if tokens.by_secret(secret).is_some() {
                    return Err(format!("{at}: another token has the same secret"));
                }
            }
            if let Some(cn) = &e.certificate_name {
                if cn.is_empty() || cn.chars().any(char::is_control) {
                    return Err(format!("{at}: a certificate_name must be non-empty text"));
                }
                if tokens.by_certificate_name(cn).is_some() {
                    return Err(format!("{at}: another token has the same certificate_name"));
                }
            }
            if e.namespaces.is_empty() {
                return Err(format!(
                    "{at}: namespaces is empty (list some, or [\"*\"] for all)"
                ));
            }
            tokens.entries.push(Credentials {
                secret,
                certificate_name: e.certificate_name,
                principal: Arc::new(Principal::new(e.name, &e.namespaces)),
            });
        }
        // An empty or truncated file would refuse every client, with an
        // error they do not degrade on: an outage, never what was meant.
        if tokens.entries.is_empty() {
            return Err(
                "no tokens (an empty file?): list at least one; to leave the \
                        limiting API open, start without --api-tokens"
                    .to_owned(),
            );
        }
        Ok(tokens)
    }

    /// The principal whose secret is `presented`. Compared with every
    /// entry in constant time, so the answer time tells nothing of how
    /// much of a secret was right.
    pub fn by_secret(&self, presented: &str) -> Option<Arc<Principal>> {
        let mut found = None;
        for c in &self.entries {
            let Some(secret) = &c.secret else { continue };
            if bool::from(secret.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(Arc::clone(&c.principal));
            }
        }
        found
    }

    /// The principal named `name` (tests and tools; never a credential).
    pub fn by_name(&self, name: &str) -> Option<Arc<Principal>> {
        self.entries
            .iter()
            .find(|c| c.principal.name == name)
            .map(|c| Arc::clone(&c.principal))
    }

    /// The principal whose `certificate_name` is `cn`.
    fn by_certificate_name(&self, cn: &str) -> Option<Arc<Principal>> {
        self.entries
            .iter()
            .find(|c| c.certificate_name.as_deref() == Some(cn))
            .map(|c| Arc::clone(&c.principal))
    }

    /// The principal of a client certificate (DER) that the TLS handshake
    /// verified against `--tls-client-ca`: by its subject's common name.
    /// `None` for a certificate that does not parse or names nobody.
    pub fn by_certificate(&self, der: &[u8]) -> Option<Arc<Principal>> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
        self.by_certificate_name(cn)
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none (then every call is refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Whether the limiting API checks its callers, and against which tokens:
/// off until [`ApiAuth::set`] (then for good; reloads replace the tokens).
#[derive(Debug, Default)]
pub struct ApiAuth {
    tokens: ArcSwapOption<ApiTokens>,
}

/// The caller of one call: `None` when the API is open (no tokens file).
pub type Caller = Option<Arc<Principal>>;

impl ApiAuth {
    /// Turns checking on with `tokens` (or replaces them).
    pub fn set(&self, tokens: ApiTokens) {
        self.tokens.store(Some(Arc::new(tokens)));
    }

    /// Who made `request`: `Ok(None)` when the API is open; else the
    /// principal of its bearer token, or (without one) of the client
    /// certificate its TLS handshake verified; `UNAUTHENTICATED` (class
    /// client) when neither names one.
    pub fn authenticate<T>(&self, request: &tonic::Request<T>) -> Result<Caller, Status> {
        // A guard, not a clone of the Arc: the open API's check is one
        // atomic load on the decision path.
        let tokens = self.tokens.load();
        let Some(tokens) = tokens.as_deref() else {
            return Ok(None);
        };
        let Some(value) = request.metadata().get("authorization") else {
            return request
                .peer_certs()
                .and_then(|chain| chain.first().and_then(|c| tokens.by_certificate(c)))
                .map(Some)
                .ok_or_else(|| {
                    unauthenticated(
                        "this server requires a token: send `authorization: Bearer TOKEN` \
                         metadata or a client certificate it knows",
                    )
                });
        };
        let secret = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or_else(|| unauthenticated("the authorization metadata must be `Bearer TOKEN`"))?;
        tokens
            .by_secret(secret)
            .map(Some)
            .ok_or_else(|| unauthenticated("the bearer token is not valid"))
    }
}

fn unauthenticated(message: &str) -> Status {
    charon_proto::codec::with_class(Status::unauthenticated(message), "client")
}

/// Why `caller` may not use `resource`, if it may not.
pub fn refusal(caller: &Caller, resource: &str) -> Option<String> {
    // The open API looks at nothing.
    caller.as_ref()?;
    refusal_in(caller, namespace_of(resource))
}

/// Why `caller` may not use the resources of `namespace`, if it may not.
pub fn refusal_in(caller: &Caller, namespace: &str) -> Option<String> {
    caller
        .as_deref()
        .filter(|p| !p.may_use_namespace(namespace))
        .map(|p| p.refusal(namespace))
}

/// A refusal as a unary call's status: `PERMISSION_DENIED`, class client.
pub fn denied_status(message: String) -> Status {
    charon_proto::codec::with_class(Status::permission_denied(message), "client")
}

/// A refusal as a session operation's error (class client): only that
/// operation fails.
pub fn denied_error(message: String) -> v1::Error {
    v1::Error {
        class: v1::error::Class::Client as i32,
        message,
        code: tonic::Code::PermissionDenied as i32,
    }
}

/// Reloads the tokens file at `path` into `state.api_auth` on SIGHUP and
/// when it changes (as the configuration file is:
/// `file_reload::FileWatch`), until shutdown. A file that does
/// not load is logged and the previous tokens stay in force.
pub fn spawn_reloader(state: Arc<ServerState>, path: PathBuf) {
    let mut watch = match crate::file_reload::FileWatch::new(&path, "API tokens") {
        Ok(watch) => watch,
        Err(e) => return error!("API tokens reload stopped: {e}"),
    };
    tokio::spawn(async move {
        let result = async {
            while let Some(text) = watch.next(&state.shutdown).await? {
                match text.and_then(|_| ApiTokens::load(&path)) {
                    Ok(tokens) => {
                        info!(file = %path.display(), tokens = tokens.len(), "API tokens reloaded");
                        state.api_auth.set(tokens);
                    }
                    Err(e) => {
                        error!("API tokens refused; the previous ones stay in force: {e}");
                    }
                }
            }
            Ok::<(), String>(())
        };
        if let Err(e) = result.await {
            error!("API tokens reload stopped: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_by_secret_and_by_name() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("b.secret"), "bee-secret\n").expect("write");
        let tokens = ApiTokens::parse(
            "- {name: a, secret: aa-secret, namespaces: [a]}\n\
             - {name: b, secret_file: b.secret, namespaces: [b, shared]}\n\
             - {name: ops, secret: ops-secret, namespaces: ['*']}\n",
            dir.path(),
        )
        .expect("valid");
        let a = tokens.by_secret("aa-secret").expect("a");
        assert!(a.may_use("a/vm") && !a.may_use("b/vm") && !a.may_use("vm"));
        let b = tokens.by_secret("bee-secret").expect("b");
        assert!(b.may_use("shared/x") && !b.may_use("a/x"));
        assert!(
            tokens
                .by_secret("ops-secret")
                .expect("ops")
                .may_use("anything")
        );
        assert!(tokens.by_secret("aa-secre").is_none());
        assert_eq!(tokens.by_name("b"), Some(b));
        assert!(!format!("{tokens:?}").contains("secret\""));
        for bad in [
            "- {name: a, namespaces: [a]}",
            "- {name: a, secret: s, secret_file: f, namespaces: [a]}",
            "- {name: a, secret: s, namespaces: []}",
            "- {name: a, secret: s, namespaces: [a]}\n- {name: a, secret: t, namespaces: [a]}",
            "- {name: a, secret: 'has space', namespaces: [a]}",
            "- {name: a, secret: s, namespaces: [a], extra: 1}",
            "name: a",
            // An empty or truncated file, or a list of nobody: refused,
            // not a server that refuses every client.
            "",
            "  \n",
            "# all tokens moved elsewhere\n",
            "[]",
            "~",
        ] {
            let e = ApiTokens::parse(bad, dir.path()).expect_err(bad);
            assert!(!e.contains("has space"), "{e}");
        }
    }
}
