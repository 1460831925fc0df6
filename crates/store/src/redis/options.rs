//! How a [`RedisStore`](super::RedisStore) connects and behaves: its
//! options, and the TLS it uses towards Redis.

use std::sync::Arc;
use std::time::Duration;

use charon_core::Clock;

/// The most operations one batch call carries (the default of
/// [`RedisOptions::max_batch`]).
pub(crate) const MAX_BATCH: usize = 128;

/// How to connect a [`RedisStore`](super::RedisStore).
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// This server's id, shown in logs and key names. Each start of a
    /// server is a new member (the id plus a random suffix), so a fixed id
    /// can be reused by a restarted server. Default: random.
    pub server_id: String,
    /// How long this server counts as live without renewing. It renews
    /// every third of it; after half of it without success its copy
    /// operations wait (server errors) for the next renewal. Others fence
    /// it only once its liveness has stayed lapsed for another third.
    pub liveness_ttl: Duration,
    /// The time limit of each Redis operation.
    pub op_timeout: Duration,
    /// The first part of every key name.
    pub key_prefix: String,
    /// Decide with this virtual clock instead of Redis `TIME` (the scripts
    /// are the same; the time is passed in, and keys expire a day later
    /// than it says). For `charon simulate --store redis://…`, which
    /// replays events at their own times under a key prefix of its own,
    /// and for tests; a server never sets it (servers decide with Redis
    /// `TIME` so that skewed servers agree).
    pub clock: Option<Arc<dyn Clock>>,
    /// Tests only (feature `test-clock`): `(from, to)` replaces the first
    /// `from` in the meters script (`lua/meters.lua`) by `to`, so a test can
    /// show that the batch differential catches a script that breaks a
    /// rule.
    #[cfg(feature = "test-clock")]
    pub meters_mutation: Option<(String, String)>,
    /// Tests only (feature `test-clock`): the same for every copy script
    /// (counts and the queue of waiters, `lua/wait.lua`), so a test can
    /// show that the differential test with waits catches a broken rule.
    #[cfg(feature = "test-clock")]
    pub copies_mutation: Option<(String, String)>,
    /// Tests only (feature `test-clock`): the same for the lease scripts
    /// (`lua/lease_get.lua` and `lua/lease_put.lua`), so a test can show
    /// that the lease tests catch a broken compare and set.
    #[cfg(feature = "test-clock")]
    pub leases_mutation: Option<(String, String)>,
    /// How long reserves wait after a new generation of the copy log
    /// starts (Redis lost its data, or is used for the first time), so
    /// that servers that have not noticed yet can rebuild their holds
    /// first. `None`: half the liveness ttl (servers renew every third).
    /// Zero only for tests on a Redis nobody else uses.
    pub rebuild_grace: Option<Duration>,
    /// The most tiers and meter operations of one hash slot sent to Redis
    /// as one script call when they arrive while a call for that slot is
    /// in flight (see docs/redis.md, "Batched decisions"); 1 sends every
    /// operation alone, as before batching.
    pub max_batch: usize,
    /// TLS for a `rediss://` URL: the CA to trust and the client
    /// certificate. Empty: the system's roots and no client certificate.
    pub tls: RedisTls,
}

/// The certificates of a TLS connection to Redis (`rediss://`), PEM
/// encoded. Read by the caller (`charon serve --redis-ca`, …), so that the
/// store does no file I/O and a test can pass certificates it made.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// CA certificates to trust instead of the system's roots (a private
    /// CA, as most Redis deployments with TLS have).
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate, for a Redis that requires one
    /// (`tls-auth-clients yes`: mutual TLS).
    pub client: Option<ClientCertificate>,
}

impl RedisTls {
    /// Whether nothing is set (a `rediss://` URL then trusts the system's
    /// roots and shows no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca_pem.is_none() && self.client.is_none()
    }
}

/// A client certificate chain and its private key, PEM encoded.
#[derive(Clone)]
pub struct ClientCertificate {
    /// The certificate chain, this server's certificate first.
    pub cert_pem: Vec<u8>,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

// Key material never reaches a log line: the Debug forms say only what is
// set.
impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<set>"))
            .field("client", &self.client)
            .finish()
    }
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientCertificate(<redacted>)")
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            server_id: format!("charon-{:012x}", rand::random::<u64>() >> 16),
            liveness_ttl: Duration::from_secs(10),
            op_timeout: Duration::from_secs(1),
            key_prefix: "charon".to_owned(),
            clock: None,
            #[cfg(feature = "test-clock")]
            meters_mutation: None,
            #[cfg(feature = "test-clock")]
            copies_mutation: None,
            #[cfg(feature = "test-clock")]
            leases_mutation: None,
            rebuild_grace: None,
            max_batch: MAX_BATCH,
            tls: RedisTls::default(),
        }
    }
}
