//! The TLS crypto provider, which both a single Redis connection and a
//! Redis Cluster's need before their first handshake.

/// Makes ring rustls' process-wide crypto provider unless one is set:
/// rustls cannot choose by itself when a build enables both of its
/// providers (ring here, aws-lc-rs through some other crate), and would
/// panic at the first handshake.
pub(crate) fn install_crypto() {
    // An error only says that a provider is installed already: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
