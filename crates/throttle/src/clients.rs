//! Per-client limits (seed 001: throttle and rate-based ban per client,
//! identified by ALL, IP, HTTP header, HTTP cookie, region code or user
//! IP): each request's client key is the Charon *domain* of a limit
//! decided in this process by `charon-core` over an in-memory store (no
//! network hop), and optionally of a global limit asked of a Charon server.
//!
//! Global limits are asked with the Rust client: per request, or, for key
//! `all` with a `lease:`, spent from a capacity lease that the client
//! refreshes in the background, so that the hot path makes no call. When
//! the server cannot be reached the degraded mode applies (the paper's
//! optimistic, pessimistic and safe modes): optimistic and safe admit (the
//! client library's degraded grant; a lease spends its safe capacity), and
//! pessimistic rejects.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use charon_client::{Client, ClientOptions, Lease, LeaseMode, LeaseOptions};
use charon_core::config::Config;
use charon_core::request::Amount;
use charon_core::throttle::{ClientKey, ClientLimit, Degraded, Global};
use charon_limiter::{Decision, Limiter, RequestOptions};
use charon_store::{MemoryStore, SystemClock};
use http::request::Parts;
use tokio::sync::OnceCell;
use tracing::warn;

use crate::reject::{Reason, Rejection};

/// The peer address of a connection, for hosts that are neither axum
/// (`ConnectInfo<SocketAddr>`) nor tonic (`TcpConnectInfo`): put it in the
/// request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The longest wait told for a limit that never grants (a limit of 0):
/// an hour.
const NEVER_MS: u64 = 3_600_000;

/// The per-client limits of one configuration.
#[derive(Debug, Default)]
pub struct ClientLimits {
    limits: Vec<ClientLimit>,
    local: Option<Arc<Limiter>>,
    global: Option<GlobalSide>,
}

#[derive(Debug)]
struct GlobalSide {
    client: Client,
    degraded: Degraded,
    lease: Option<(String, f64, OnceCell<Option<Lease>>)>,
}

impl ClientLimits {
    /// The limits of `limits`, the in-process ones decided by `config`'s
    /// resources, the global ones asked of `charon`.
    pub fn new(
        limits: Vec<ClientLimit>,
        config: Option<Config>,
        charon: Option<&Global>,
    ) -> Result<Self, String> {
        let local = limits.iter().any(|l| l.resource.is_some()).then(|| {
            let store = Arc::new(MemoryStore::new(Arc::new(SystemClock::new())));
            Limiter::new(config.unwrap_or_default(), store)
        });
        let global = match charon {
            None => None,
            Some(g) => {
                let mut options = ClientOptions::new(g.server.clone());
                // The hot path waits for the server at most this long, then
                // degrades.
                options.request_timeout = Duration::from_millis(250);
                options.connect_timeout = Duration::from_millis(250);
                options.fail_open = g.degraded != Degraded::Pessimistic;
                let client = Client::connect(options).map_err(|e| e.to_string())?;
                Some(GlobalSide {
                    client,
                    degraded: g.degraded,
                    lease: g
                        .lease
                        .as_ref()
                        .map(|l| (l.resource.clone(), l.wants, OnceCell::new())),
                })
            }
        };
        Ok(Self {
            limits,
            local,
            global,
        })
    }

    /// Whether there is anything to check.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty() && self.global.as_ref().is_none_or(|g| g.lease.is_none())
    }

    /// Checks every limit for the request; the first that refuses decides.
    pub async fn check(&self, parts: &Parts) -> Result<(), Rejection> {
        if let Some(g) = &self.global
            && let Some((resource, wants, lease)) = &g.lease
        {
            let lease = lease
                .get_or_init(|| async {
                    let mode = match g.degraded {
                        Degraded::Optimistic => LeaseMode::Optimistic,
                        Degraded::Pessimistic => LeaseMode::Pessimistic,
                        Degraded::Safe => LeaseMode::Safe,
                    };
                    let mut options = LeaseOptions::new("charon-throttle", *wants);
                    options.mode = mode;
                    match g.client.lease(resource.clone(), options).await {
                        Ok(l) => Some(l),
                        Err(e) => {
                            warn!(
                                resource,
                                "cannot hold a lease: {e}; the global limit is not applied"
                            );
                            None
                        }
                    }
                })
                .await;
            if let Some(lease) = lease
                && !lease.try_acquire()
            {
                let capacity = lease.capacity();
                let retry_after_ms = if capacity > 0.0 {
                    (1000.0 / capacity).ceil().min(NEVER_MS as f64) as u64
                } else {
                    1000
                };
                return Err(Rejection {
                    reason: Reason::GlobalLimit,
                    retry_after_ms: retry_after_ms.max(1),
                });
            }
        }
        for limit in &self.limits {
            let key = key_of(&limit.key, parts);
            if let (Some(resource), Some(limiter)) = (&limit.resource, &self.local) {
                local(limiter, resource, &key).await?;
            }
            if let (Some(resource), Some(g)) = (&limit.global, &self.global) {
                global(g, resource, &key).await?;
            }
        }
        Ok(())
    }
}

async fn local(limiter: &Limiter, resource: &str, key: &str) -> Result<(), Rejection> {
    let amount = Amount::new(1, 1).expect("one hit of at least one is a valid amount");
    match limiter
        .decide(resource, key, amount, RequestOptions::default())
        .await
    {
        Ok(d) if d.granted() > 0 => Ok(()),
        Ok(d) => Err(Rejection {
            reason: Reason::ClientLimit,
            retry_after_ms: retry_of(&d).unwrap_or(NEVER_MS).max(1),
        }),
        Err(e) => {
            // A key that is not a valid domain (too long, say) is not
            // limited: the throttler errs on the side of leniency.
            warn!(resource, "per-client limit not applied: {e}");
            Ok(())
        }
    }
}

fn retry_of(d: &Decision) -> Option<u64> {
    match d {
        Decision::Tiers(r) => r.context.retry_after_ms,
        Decision::Meter { reply, .. } => reply.retry_after_ms,
    }
}

async fn global(g: &GlobalSide, resource: &str, key: &str) -> Result<(), Rejection> {
    match g.client.request(resource, key).send().await {
        Ok(grant) if grant.is_granted() => Ok(()),
        Ok(grant) => Err(Rejection {
            reason: Reason::GlobalLimit,
            retry_after_ms: grant
                .retry_after()
                .map_or(NEVER_MS, |d| {
                    u64::try_from(d.as_millis()).unwrap_or(NEVER_MS)
                })
                .max(1),
        }),
        Err(e) if e.is_server() && g.degraded != Degraded::Pessimistic => Ok(()),
        Err(e) if e.is_server() => Err(Rejection {
            reason: Reason::GlobalUnavailable,
            retry_after_ms: 1000,
        }),
        Err(e) => {
            warn!(resource, "global limit not applied: {e}");
            Ok(())
        }
    }
}

/// The client key of a request (its Charon domain).
pub fn key_of(key: &ClientKey, parts: &Parts) -> String {
    match key {
        ClientKey::All => "all".to_owned(),
        ClientKey::Ip {
            ipv4,
            ipv6,
            forwarded,
        } => {
            let forwarded_ip = forwarded
                .then(|| {
                    parts
                        .headers
                        .get("x-forwarded-for")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.split(',').next())
                        .and_then(|v| v.trim().parse::<IpAddr>().ok())
                })
                .flatten();
            match forwarded_ip.or_else(|| peer_ip(parts)) {
                Some(ip) => masked(ip, *ipv4, *ipv6),
                None => "(unknown)".to_owned(),
            }
        }
        ClientKey::Header(name) | ClientKey::Region(name) => parts
            .headers
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| "(none)".to_owned(), str::to_owned),
        ClientKey::Cookie(name) => cookie(parts, name).unwrap_or_else(|| "(none)".to_owned()),
    }
}

fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    if let Some(p) = parts.extensions.get::<PeerAddr>() {
        return Some(p.0.ip());
    }
    if let Some(c) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(c.0.ip());
    }
    parts
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
        .map(|a| a.ip())
}

/// `ip` masked to its network, as `10.1.2.0/24` (the address alone at
/// full length).
pub fn masked(ip: IpAddr, ipv4: u8, ipv6: u8) -> String {
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = if ipv4 == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(ipv4))
            };
            let net = std::net::Ipv4Addr::from(bits & mask);
            if ipv4 == 32 {
                net.to_string()
            } else {
                format!("{net}/{ipv4}")
            }
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return masked(IpAddr::V4(v4), ipv4, ipv6);
            }
            let bits = u128::from(a);
            let mask = if ipv6 == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(ipv6))
            };
            let net = std::net::Ipv6Addr::from(bits & mask);
            if ipv6 == 128 {
                net.to_string()
            } else {
                format!("{net}/{ipv6}")
            }
        }
    }
}

fn cookie(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"').to_owned())
}
