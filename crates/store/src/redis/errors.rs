//! How Redis's failures become [`StoreError`]s: a refusal of this server
//! (credentials, rights, certificates) is a denial that waiting cannot
//! fix, what waiting may fix is unavailability, the rest means a bug or
//! foreign data under our keys.

use redis::{ServerError, ServerErrorKind};

use crate::StoreError;

/// A failed command: a refusal of the user is a denial, what waiting may
/// fix is unavailability, the rest means a bug or foreign data.
pub(crate) fn command_error(e: &redis::RedisError) -> StoreError {
    if denial(e).is_some()
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.code().is_some_and(cannot_serve_now)
        || matches!(
            e.kind(),
            redis::ErrorKind::ClusterConnectionNotFound
                | redis::ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
        )
    {
        unavailable(e)
    } else {
        StoreError::BadData(format!("Redis answered: {e}"))
    }
}

/// A failed round trip: [`StoreError::Denied`] if Redis refuses this
/// server for good (see [`denial`]), else unavailability.
pub(crate) fn unavailable(e: &redis::RedisError) -> StoreError {
    match denial(e) {
        Some(why) => StoreError::Denied(format!("Redis {why}: {e}")),
        None => StoreError::Unavailable(format!("Redis: {e}")),
    }
}

/// An error reply. A refusal of the user's rights is a denial; replies
/// that mean "Redis cannot serve now" are unavailability; the rest mean a
/// bug or foreign data under our keys.
/// `MISCONF` (it cannot persist: a full disk) and `NOREPLICAS` (too few
/// replicas acknowledge writes) refuse writes until the operator acts.
pub(crate) fn server_error(e: &ServerError, what: &str) -> StoreError {
    if e.code() == "NOPERM" || acl_refusal(&e.to_string()) {
        StoreError::Denied(format!(
            "Redis refused {what} to the store URL's user (NOPERM: see the ACL rules in \
             docs/redis.md): {e}"
        ))
    } else if matches!(e.code(), "NOAUTH" | "WRONGPASS") {
        StoreError::Denied(format!(
            "Redis refused {what}: the user name or password of the store URL is not accepted: {e}"
        ))
    } else if cannot_serve_now(e.code()) {
        StoreError::Unavailable(format!("Redis cannot serve {what} now: {e}"))
    } else {
        StoreError::BadData(format!("Redis refused {what}: {e}"))
    }
}

/// Whether an error code means "Redis cannot serve now" rather than a bug.
pub(crate) fn cannot_serve_now(code: &str) -> bool {
    matches!(
        code,
        "LOADING"
            | "BUSY"
            | "MASTERDOWN"
            | "READONLY"
            | "CLUSTERDOWN"
            | "TRYAGAIN"
            | "OOM"
            | "MISCONF"
            | "NOREPLICAS"
    )
}

/// An error while connecting to Redis at `shown` (the URL without its
/// password). What waiting cannot fix, the credentials or the
/// certificates, is [`StoreError::Denied`], so that a server does not keep
/// retrying at start-up; the rest is [`StoreError::Unavailable`].
///
/// A Redis that requires a client certificate none was shown for sends a
/// TLS alert and closes; if the close overtakes the alert (a reset), only
/// a dropped connection is seen, which waiting could fix as well: that
/// stays unavailability, with the likely cause named.
pub(crate) fn connect_error(
    e: &redis::RedisError,
    shown: &str,
    no_client_cert: bool,
) -> StoreError {
    if let Some(why) = denial(e) {
        return StoreError::Denied(format!("Redis at {shown} {why}: {e}"));
    }
    let hint = if no_client_cert && (e.is_io_error() || e.is_connection_dropped()) {
        " (if this Redis requires a client certificate, tls-auth-clients yes, give one: \
         see --redis-cert)"
    } else {
        ""
    };
    StoreError::Unavailable(format!("cannot connect to Redis at {shown}: {e}{hint}"))
}

/// Why `e` means that Redis refuses this server for good (until an
/// operator changes the credentials, the rights or the certificates), if
/// it does.
///
/// rustls' certificate errors reach us as I/O errors whose text is all
/// that tells them apart, so those are recognised by rustls' wording
/// ("invalid peer certificate", "received fatal alert"), which is stable
/// across rustls 0.23.
pub(crate) fn denial(e: &redis::RedisError) -> Option<&'static str> {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return Some("refused the user name or password of the store URL");
    }
    match e.code() {
        Some("WRONGPASS" | "NOAUTH") => {
            return Some("refused the user name or password of the store URL");
        }
        Some("NOPERM") => {
            return Some(
                "does not let the store URL's user run what Charon needs (NOPERM: see the ACL \
                 rules in docs/redis.md)",
            );
        }
        _ => {}
    }
    let text = e.to_string();
    // A cluster's first connections fail as one I/O error that names the
    // refusal of every node ("Password authentication failed").
    if text.contains("AuthenticationFailed") || text.contains("WRONGPASS") {
        return Some("refused the user name or password of the store URL");
    }
    if acl_refusal(&text) {
        Some(
            "does not let the store URL's user run what Charon needs (NOPERM: see the ACL rules \
             in docs/redis.md)",
        )
    } else if text.contains("invalid peer certificate") {
        Some("presented a certificate this server does not trust (see --redis-ca)")
    } else if text.contains("received fatal alert") {
        Some("ended the TLS handshake (does it require a client certificate? see --redis-cert)")
    } else {
        None
    }
}

/// Whether an error's text is an ACL refusal inside a script: Redis
/// reports those as plain `ERR` replies, not `NOPERM` ("The user executing
/// the script can't run this command…" in Redis 7.0, "ACL failure in
/// script: … no permissions …" from 7.2 and Valkey).
pub(crate) fn acl_refusal(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    text.contains("the user executing the script can't")
        || text.contains("acl failure in script")
        || text.contains("no permissions to")
}
