//! Capacity leases on the client (SPEC §12, paper §5.1, Doorman's client):
//! instead of asking before every access, the client holds a share of a
//! resource's capacity and limits itself locally.
//!
//! - The **top half** is what the application calls: [`Lease::acquire`]
//!   waits until the local rate allows one more unit (units leave evenly at
//!   the leased capacity per second, one at a time), [`Lease::try_acquire`]
//!   answers at once.
//! - The **bottom half** is a task that refreshes the lease every
//!   `refresh_interval` the server gave, asking for what the application
//!   wants (fixed, or with [`LeaseOptions::adaptive`] what it was seen to
//!   use, up to the wants given) and saying what it holds.
//! - When no server answers, the lease in hand is used until it expires;
//!   then the client runs in the [`LeaseMode`] its user chose: optimistic
//!   (what it wants), pessimistic (nothing) or safe (the last safe capacity
//!   the server gave; nothing if it never answered).
//!
//! Dropping the [`Lease`] stops the refreshes and gives the lease back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::client::Transport;
use charon_proto::v1;
use charon_proto::v1::capacity_client::CapacityClient;
use tokio::sync::Notify;

use crate::{Client, Error, ErrorKind};

/// What a client does once its lease has expired and no server answers
/// (SPEC §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// Use what it wants: the resource is protected elsewhere too.
    Optimistic,
    /// Use nothing: better to stop than to overload the resource.
    Pessimistic,
    /// Use the safe capacity the server last gave (Doorman's default).
    Safe,
}

/// Where the capacity in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseSource {
    /// A lease from a server, not expired.
    Server,
    /// No server and no lease: [`LeaseMode::Optimistic`].
    Optimistic,
    /// No server and no lease: [`LeaseMode::Pessimistic`].
    Pessimistic,
    /// No server and no lease: [`LeaseMode::Safe`].
    Safe,
}

impl LeaseSource {
    /// `server`, `optimistic`, `pessimistic` or `safe`.
    pub fn name(self) -> &'static str {
        match self {
            LeaseSource::Server => "server",
            LeaseSource::Optimistic => "optimistic",
            LeaseSource::Pessimistic => "pessimistic",
            LeaseSource::Safe => "safe",
        }
    }
}

/// How to hold a lease.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// Who holds it: one id per process (a restarted process may reuse
    /// it, and then takes its old lease over).
    pub client_id: String,
    /// How much capacity the application would use (units per second);
    /// with `adaptive`, the most it asks for.
    pub wants: f64,
    /// What to do without a server once the lease expires.
    pub mode: LeaseMode,
    /// Ask for what was used since the last refresh (units acquired or
    /// waited for, per second, plus a fifth for growth), at most `wants`,
    /// instead of `wants` itself: capacity the application does not use
    /// goes to others.
    pub adaptive: bool,
}

impl LeaseOptions {
    /// `wants` for `client_id`, safe mode, not adaptive.
    pub fn new(client_id: impl Into<String>, wants: f64) -> Self {
        Self {
            client_id: client_id.into(),
            wants,
            mode: LeaseMode::Safe,
            adaptive: false,
        }
    }
}

/// A lease as it stands, for the application's own display or metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseStatus {
    /// The capacity in force (units per second).
    pub capacity: f64,
    /// Where it comes from.
    pub source: LeaseSource,
    /// What the last refresh asked for.
    pub wants: f64,
    /// The server's safe capacity, as last given (0 before any answer).
    pub safe_capacity: f64,
    /// How long the server's lease still holds, in milliseconds (0 if
    /// none).
    pub expires_in_ms: u64,
    /// Refreshes the server answered, and those it did not.
    pub refreshes: u64,
    /// Refreshes that failed (server errors, unreachable server).
    pub failures: u64,
}

#[derive(Debug)]
struct State {
    /// The server's lease: capacity and when it lapses here.
    lease: Option<(f64, Instant)>,
    safe_capacity: f64,
    refresh_interval: Duration,
    wants: f64,
    /// GCRA: the earliest time the next unit may go.
    next_unit: Instant,
    refreshes: u64,
    failures: u64,
    /// The last refresh's failure, if it failed.
    last_error: Option<Error>,
}

#[derive(Debug)]
struct Shared {
    resource: String,
    options: LeaseOptions,
    /// The client's options: the server's address and TLS, for errors.
    client: crate::ClientOptions,
    state: Mutex<State>,
    /// Woken when the capacity may have changed.
    changed: Notify,
    /// Units acquired or waited for since the last refresh.
    demand: AtomicU64,
    /// Given back by [`Lease::release`]: nothing left for `drop` to do.
    released: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The capacity in force at `now`, and where it comes from.
    fn in_force(&self, s: &State, now: Instant) -> (f64, LeaseSource) {
        match s.lease {
            Some((capacity, until)) if now < until => (capacity, LeaseSource::Server),
            _ => match self.options.mode {
                LeaseMode::Optimistic => (self.options.wants, LeaseSource::Optimistic),
                LeaseMode::Pessimistic => (0.0, LeaseSource::Pessimistic),
                LeaseMode::Safe => (s.safe_capacity, LeaseSource::Safe),
            },
        }
    }

    /// Takes one unit if the local rate allows it now; else how long until
    /// it may (`None`: not at this capacity, wait for a change).
    fn take(&self, now: Instant) -> Result<(), Option<Duration>> {
        let mut s = self.lock();
        let (capacity, _) = self.in_force(&s, now);
        if capacity.is_nan() || capacity <= 0.0 {
            return Err(None);
        }
        if s.next_unit > now {
            return Err(Some(s.next_unit - now));
        }
        // One unit every 1/capacity seconds; an idle lease does not save up
        // a burst.
        let gap = Duration::try_from_secs_f64(1.0 / capacity).unwrap_or(Duration::MAX);
        s.next_unit = now
            .checked_add(gap)
            .unwrap_or(now + Duration::from_secs(86_400));
        Ok(())
    }
}

/// A capacity lease held by this process: see the module documentation.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    refresher: tokio::task::JoinHandle<()>,
    grpc: CapacityClient<Transport>,
    timeout: Duration,
}

impl Client {
    /// Takes a lease on `resource` (a `kind: lease` resource) and keeps it
    /// refreshed until the [`Lease`] is dropped. A client error (unknown
    /// resource, wrong kind, bad numbers) is returned; a server that cannot
    /// be reached is not an error: the lease starts in its mode and the
    /// refreshes go on trying.
    pub async fn lease(
        &self,
        resource: impl Into<String>,
        options: LeaseOptions,
    ) -> Result<Lease, Error> {
        if !options.wants.is_finite() || options.wants < 0.0 {
            return Err(Error::invalid(format!(
                "wants must be a finite number at least 0, not {}",
                options.wants
            )));
        }
        let shared = Arc::new(Shared {
            resource: resource.into(),
            state: Mutex::new(State {
                lease: None,
                safe_capacity: 0.0,
                refresh_interval: Duration::from_secs(1),
                wants: options.wants,
                next_unit: Instant::now(),
                refreshes: 0,
                failures: 0,
                last_error: None,
            }),
            options,
            client: self.inner.options.clone(),
            changed: Notify::new(),
            demand: AtomicU64::new(0),
            released: std::sync::atomic::AtomicBool::new(false),
        });
        let grpc = self.inner.capacity.clone();
        let timeout = self.inner.options.request_timeout;
        let wants = shared.options.wants;
        if let Err(e) = refresh(&shared, &grpc, timeout, wants).await
            && e.is_client()
        {
            return Err(e);
        }
        let refresher = tokio::spawn(refresh_loop(shared.clone(), grpc.clone(), timeout));
        Ok(Lease {
            shared,
            refresher,
            grpc,
            timeout,
        })
    }
}

/// One refresh: asks for `wants`, saying what is held; updates the state.
async fn refresh(
    shared: &Shared,
    grpc: &CapacityClient<Transport>,
    timeout: Duration,
    wants: f64,
) -> Result<(), Error> {
    let has = {
        let s = shared.lock();
        s.lease
            .filter(|&(_, until)| Instant::now() < until)
            .map_or(0.0, |(c, _)| c)
    };
    let req = v1::GetCapacityRequest {
        client_id: shared.options.client_id.clone(),
        resources: vec![v1::ResourceWant {
            resource: shared.resource.clone(),
            wants,
            has,
            subclients: 1,
        }],
    };
    let mut grpc = grpc.clone();
    let address = shared.client.endpoint.as_str();
    let deadline = tokio::time::Instant::now() + timeout;
    let result = match tokio::time::timeout_at(deadline, grpc.get_capacity(req)).await {
        Ok(Ok(reply)) => reply.into_inner().leases.into_iter().next().ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                format!("{address} sent a reply without a lease"),
            )
        }),
        Ok(Err(status)) => Err(crate::client::classify(&shared.client, &status, deadline).await),
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!("no answer from {address} within {timeout:?}"),
        )),
    };
    let mut s = shared.lock();
    s.wants = wants;
    let outcome = match result {
        Ok(lease) => {
            // The server's expiry is Unix time on its clock; the wall clock
            // is the only time the two share (skew shortens or lengthens
            // the lease by as much; the client has no charon_core::Clock).
            #[allow(clippy::disallowed_methods)]
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let left = Duration::from_millis(lease.expires_at_ms.saturating_sub(now_ms));
            // A server's expiry is not trusted to fit this clock: far is
            // as good as a year.
            let until = Instant::now()
                .checked_add(left)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 86_400));
            // Nor its numbers: NaN or below zero is nothing.
            let capacity = if lease.capacity.is_nan() {
                0.0
            } else {
                lease.capacity.max(0.0)
            };
            s.lease = Some((capacity, until));
            s.safe_capacity = lease.safe_capacity;
            s.refresh_interval = Duration::from_millis(lease.refresh_interval_ms.max(1));
            s.refreshes += 1;
            s.last_error = None;
            Ok(())
        }
        Err(e) => {
            s.failures += 1;
            s.last_error = Some(e.clone());
            Err(e)
        }
    };
    drop(s);
    shared.changed.notify_waiters();
    outcome
}

/// The bottom half: refreshes every refresh interval until aborted.
async fn refresh_loop(shared: Arc<Shared>, grpc: CapacityClient<Transport>, timeout: Duration) {
    let mut last = Instant::now();
    loop {
        let interval = shared.lock().refresh_interval;
        tokio::time::sleep(interval).await;
        let wants = if shared.options.adaptive {
            let used = shared.demand.swap(0, Ordering::Relaxed) as f64;
            let seconds = last.elapsed().as_secs_f64().max(0.001);
            (used / seconds * 1.2).min(shared.options.wants)
        } else {
            shared.options.wants
        };
        last = Instant::now();
        // Failures are kept in the state (see `Lease::status`); the lease
        // in hand, then the mode, apply meanwhile.
        let _ = refresh(&shared, &grpc, timeout, wants).await;
        // Wake waiters when the lease expires, as the mode may then allow
        // what the lease did not.
        let expiry = shared.lock().lease.map(|(_, until)| until);
        if let Some(until) = expiry {
            let shared = shared.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(until.into()).await;
                shared.changed.notify_waiters();
            });
        }
    }
}

impl Lease {
    /// Waits until the local rate allows one more unit, and takes it.
    pub async fn acquire(&self) {
        self.shared.demand.fetch_add(1, Ordering::Relaxed);
        loop {
            let changed = self.shared.changed.notified();
            match self.shared.take(Instant::now()) {
                Ok(()) => return,
                Err(Some(wait)) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = changed => {}
                    }
                }
                Err(None) => changed.await,
            }
        }
    }

    /// Takes one unit if the local rate allows it now.
    pub fn try_acquire(&self) -> bool {
        self.shared.demand.fetch_add(1, Ordering::Relaxed);
        self.shared.take(Instant::now()).is_ok()
    }

    /// The capacity in force now (units per second).
    pub fn capacity(&self) -> f64 {
        let s = self.shared.lock();
        self.shared.in_force(&s, Instant::now()).0
    }

    /// The lease as it stands.
    pub fn status(&self) -> LeaseStatus {
        let now = Instant::now();
        let s = self.shared.lock();
        let (capacity, source) = self.shared.in_force(&s, now);
        LeaseStatus {
            capacity,
            source,
            wants: s.wants,
            safe_capacity: s.safe_capacity,
            expires_in_ms: s.lease.map_or(0, |(_, until)| {
                u64::try_from(until.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
            }),
            refreshes: s.refreshes,
            failures: s.failures,
        }
    }

    /// Why the last refresh failed, if it did.
    pub fn last_error(&self) -> Option<Error> {
        self.shared.lock().last_error.clone()
    }

    /// Waits until the lease may have changed (a refresh answered or
    /// failed, or the lease expired).
    pub async fn changed(&self) {
        self.shared.changed.notified().await;
    }

    /// Gives the lease back now and stops refreshing; what `drop` does
    /// without waiting for the answer.
    pub async fn release(self) -> Result<bool, Error> {
        self.refresher.abort();
        self.shared.released.store(true, Ordering::Relaxed);
        let req = v1::ReleaseCapacityRequest {
            client_id: self.shared.options.client_id.clone(),
            resources: vec![self.shared.resource.clone()],
        };
        let mut grpc = self.grpc.clone();
        let deadline = tokio::time::Instant::now() + self.timeout;
        let address = self.shared.client.endpoint.as_str();
        match tokio::time::timeout_at(deadline, grpc.release_capacity(req)).await {
            Ok(Ok(r)) => Ok(r.into_inner().released.first().copied().unwrap_or(false)),
            Ok(Err(status)) => {
                Err(crate::client::classify(&self.shared.client, &status, deadline).await)
            }
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("no answer from {address} to the release"),
            )),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.refresher.abort();
        if self.shared.released.load(Ordering::Relaxed) {
            return;
        }
        // Give the lease back in the background if a runtime is there; if
        // not, it lapses at its expiry.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let req = v1::ReleaseCapacityRequest {
                client_id: self.shared.options.client_id.clone(),
                resources: vec![self.shared.resource.clone()],
            };
            let mut grpc = self.grpc.clone();
            let timeout = self.timeout;
            handle.spawn(async move {
                let _ = tokio::time::timeout(timeout, grpc.release_capacity(req)).await;
            });
        }
    }
}
