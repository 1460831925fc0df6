//! A server in a tree of lease servers (SPEC §12, seed 001's leaf, region
//! and root): `charon serve --lease-parent URL` asks the parent, as one
//! client, for the sum of its own clients' wants per lease resource (with
//! as many subclients as they stand for), and shares what it gets among
//! them by the resource's algorithm.
//!
//! - Every refresh interval the parent gave (1 s before its first answer),
//!   it asks again with what it holds; resources nobody here wants any more
//!   are given back.
//! - When the parent cannot be reached, the server keeps sharing what the
//!   parent granted until that lease expires, then shares the safe capacity
//!   the parent gave (per subclient, so times its own subclients) — its
//!   clients' leases meanwhile run until their own expiry, as any lease.
//! - A resource not granted yet is shared as capacity 0: a first client
//!   gets nothing, and its share at its next refresh, once the parent was
//!   asked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use charon_core::Clock;
use charon_core::lease::Quantity;
use charon_proto::v1;
use charon_proto::v1::capacity_client::CapacityClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::{info, warn};

use crate::ServerState;

/// Before the parent's first answer, and at most, between two asks.
const MOST_BETWEEN_ASKS: Duration = Duration::from_secs(1);

/// What the parent granted for one resource.
#[derive(Debug, Clone, Copy)]
struct Granted {
    capacity: Quantity,
    /// When the parent's lease lapses, on this server's clock.
    until: Instant,
    /// The parent's safe capacity for one subclient.
    safe_per_subclient: f64,
    /// How many subclients this server stood for when it asked.
    subclients: u64,
}

impl Granted {
    /// What this server shares at `now`: the grant, or once it lapsed the
    /// safe capacity for all its subclients.
    fn in_force(&self, now: Instant) -> Quantity {
        if now < self.until {
            return self.capacity;
        }
        let safe = self.safe_per_subclient * self.subclients as f64;
        if safe.is_nan() || safe <= 0.0 {
            // A parent that says nothing sensible gives nothing.
            return Quantity::ZERO;
        }
        // Only too large remains to refuse: then the most there is.
        Quantity::parse("safe_capacity", safe).unwrap_or(Quantity::MAX)
    }
}

/// Starts following `parent`: the limiter shares what it grants from now
/// on. `client_id` names this server at the parent; `tls` is what it
/// trusts and presents over `https://` (the system's roots without a CA).
pub(crate) fn spawn(
    state: &Arc<ServerState>,
    parent: &str,
    tls: &super::ClientTlsFiles,
    client_id: String,
) -> anyhow::Result<()> {
    let mut endpoint = Endpoint::from_shared(parent.to_owned())
        .map_err(|e| anyhow::anyhow!("--lease-parent {parent:?}: {e}"))?;
    if parent.starts_with("https://") || *tls != super::ClientTlsFiles::default() {
        endpoint = endpoint
            .tls_config(tonic_tls(tls)?)
            .map_err(|e| anyhow::anyhow!("--lease-parent {parent:?}: {e}"))?;
    }
    let channel = endpoint
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    state.limiter.take_capacity_from_parent();
    info!(%parent, %client_id, "leases: sharing what the parent grants");
    let state = state.clone();
    tokio::spawn(async move {
        let mut follower = Follower {
            grpc: CapacityClient::new(channel),
            client_id,
            granted: HashMap::new(),
            every: MOST_BETWEEN_ASKS,
            clock: charon_store::SystemClock::new(),
        };
        loop {
            follower.ask(&state).await;
            tokio::select! {
                () = tokio::time::sleep(follower.every) => {}
                () = state.shutdown.wait() => break,
            }
        }
        follower.release_all().await;
    });
    Ok(())
}

/// tonic's TLS settings from the PEM files.
fn tonic_tls(files: &super::ClientTlsFiles) -> anyhow::Result<ClientTlsConfig> {
    use anyhow::Context;
    let read = |p: &std::path::PathBuf| {
        std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))
    };
    let mut config = ClientTlsConfig::new();
    config = match &files.ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca)?)),
        None => config.with_native_roots(),
    };
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => anyhow::bail!("--lease-parent-cert needs --lease-parent-key, and the other way"),
    }
    Ok(config)
}

struct Follower {
    grpc: CapacityClient<Channel>,
    client_id: String,
    granted: HashMap<String, Granted>,
    every: Duration,
    /// The wall clock, which the parent's Unix-time expiries are on too.
    clock: charon_store::SystemClock,
}

impl Follower {
    /// One round: ask for what the clients want, give back what they do
    /// not, and tell the limiter what to share.
    async fn ask(&mut self, state: &ServerState) {
        let now = Instant::now();
        let holding = |r: &str| {
            self.granted
                .get(r)
                .map_or(Quantity::ZERO, |g| g.in_force(now))
        };
        let (wants, idle) = match state.limiter.upstream_wants(holding).await {
            Ok(w) => w,
            Err(e) => {
                warn!("leases: cannot read this server's leases: {e}");
                return;
            }
        };
        if !wants.is_empty() {
            let req = v1::GetCapacityRequest {
                client_id: self.client_id.clone(),
                resources: wants
                    .iter()
                    .map(|(r, w)| v1::ResourceWant {
                        resource: r.clone(),
                        wants: w.wants().to_f64(),
                        has: w.has().to_f64(),
                        subclients: w.subclients(),
                    })
                    .collect(),
            };
            match tokio::time::timeout(MOST_BETWEEN_ASKS, self.grpc.get_capacity(req)).await {
                Ok(Ok(reply)) => {
                    let asked: HashMap<&str, u64> = wants
                        .iter()
                        .map(|(r, w)| (r.as_str(), w.subclients()))
                        .collect();
                    let mut every = MOST_BETWEEN_ASKS;
                    for lease in reply.into_inner().leases {
                        let left = Duration::from_millis(
                            lease.expires_at_ms.saturating_sub(self.clock.now()),
                        );
                        every = every.min(Duration::from_millis(lease.refresh_interval_ms.max(10)));
                        let granted = Granted {
                            capacity: Quantity::parse("capacity", lease.capacity)
                                .unwrap_or(Quantity::ZERO),
                            until: Instant::now()
                                .checked_add(left)
                                .unwrap_or_else(|| Instant::now() + MOST_BETWEEN_ASKS),
                            safe_per_subclient: lease.safe_capacity,
                            subclients: asked.get(lease.resource.as_str()).copied().unwrap_or(1),
                        };
                        self.granted.insert(lease.resource, granted);
                    }
                    self.every = every;
                }
                Ok(Err(status)) => warn!(
                    "leases: the parent refused: {}: {}",
                    status.code(),
                    status.message()
                ),
                Err(_) => warn!("leases: the parent did not answer within {MOST_BETWEEN_ASKS:?}"),
            }
        }
        if !idle.is_empty() {
            let given_back: Vec<String> = idle
                .into_iter()
                .filter(|r| self.granted.remove(r).is_some())
                .collect();
            self.release(given_back).await;
        }
        let now = Instant::now();
        for (resource, g) in &self.granted {
            state.limiter.set_parent_capacity(resource, g.in_force(now));
        }
    }

    async fn release(&mut self, resources: Vec<String>) {
        if resources.is_empty() {
            return;
        }
        let req = v1::ReleaseCapacityRequest {
            client_id: self.client_id.clone(),
            resources,
        };
        // Best effort: a lease not given back lapses at its expiry.
        let _ = tokio::time::timeout(MOST_BETWEEN_ASKS, self.grpc.release_capacity(req)).await;
    }

    async fn release_all(&mut self) {
        let all: Vec<String> = self.granted.drain().map(|(r, _)| r).collect();
        self.release(all).await;
    }
}
