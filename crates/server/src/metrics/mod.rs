//! What the server counts, in one place: names, labels and buckets.
//!
//! Exposed in Prometheus text format on `/metrics`. What each metric is
//! (name, type, labels, help) is said once, by its constant in
//! [`catalog`], all of them listed in [`METRICS`]; docs/observability.md
//! gives them as a table (a test holds it to the list) and says what the
//! labels hold: `resource` is the configured name, `(unconfigured)` for
//! resources admitted by `allow_unconfigured` (unbounded names must not
//! become unbounded label values) and `(unknown)` for refused ones.
//!
//! Each is described once, in [`METRICS`]: its `# HELP` line, its type and
//! its unit. Counters that alerts watch are registered at zero when the
//! server starts (where their labels are known), so that `increase()` sees
//! their first event and a dashboard shows 0 rather than no data.

use std::sync::OnceLock;
use std::time::Duration;

use charon_core::config::Config;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub mod catalog;
mod decisions;
mod envoy;

use catalog::*;
pub use catalog::{Described, Kind, METRICS};
pub use decisions::{Decisions, Outcome};
pub use envoy::{envoy_call, envoy_descriptor};

/// Latency buckets from 10 µs (in-memory decisions) to 1 s (a struggling
/// Redis).
const BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The operations whose errors are counted from the start (at zero).
const OPERATIONS: &[&str] = &[
    "request",
    "dry_run",
    "charge",
    "refund",
    "reserve",
    "release",
    "transfer",
    "seize",
    "get_capacity",
    "release_capacity",
];

/// The kinds of [`store_error`].
const STORE_ERROR_KINDS: [&str; 4] = ["unavailable", "bad_data", "denied", "resigned"];

/// Registers at zero the series whose labels are known before anything
/// happens, so that alerts (`increase(...)`) see their first event and
/// dashboards show 0 rather than no data.
fn register_at_zero() {
    for operation in OPERATIONS {
        for class in ["client", "server"] {
            counter!(ERRORS.name, "operation" => *operation, "class" => class).increment(0);
        }
    }
    for kind in STORE_ERROR_KINDS {
        counter!(STORE_ERRORS.name, "kind" => kind).increment(0);
    }
    for result in ["applied", "refused", "failed"] {
        counter!(CONFIG_RELOADS.name, "result" => result).increment(0);
    }
    gauge!(SESSIONS_OPEN.name).increment(0.0);
    gauge!(COPIES_HELD.name).increment(0.0);
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often the server drains histogram samples into their buckets when
/// nobody scrapes `/metrics` (the recorder holds every sample until then).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the process-wide Prometheus recorder (once) and returns the
/// handle that renders it.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(DECISION_DURATION_SECONDS.name.into()),
                BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(ENVOY_CALL_DURATION_SECONDS.name.into()),
                    BUCKETS,
                )
            })
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        // Fails only if another recorder was installed first; then ours
        // renders nothing, which the tests of /metrics would catch.
        if metrics::set_global_recorder(recorder).is_ok() {
            describe_all();
            register_at_zero();
        }
        handle
    })
}

/// The `resource` label for a resource name (see the module docs).
pub fn resource_label(config: &Config, resource: &str, outcome: Outcome) -> String {
    if config.resource(resource).is_some() {
        resource.to_owned()
    } else if outcome == Outcome::ClientError {
        "(unknown)".to_owned()
    } else {
        "(unconfigured)".to_owned()
    }
}

/// Records one operation.
pub fn observe(operation: &'static str, resource: String, outcome: Outcome, elapsed: Duration) {
    counter!(DECISIONS.name, "operation" => operation, "resource" => resource, "outcome" => outcome.label())
        .increment(1);
    histogram!(DECISION_DURATION_SECONDS.name, "operation" => operation)
        .record(elapsed.as_secs_f64());
    let class = match outcome {
        Outcome::ClientError => "client",
        Outcome::ServerError => "server",
        _ => return,
    };
    counter!(ERRORS.name, "operation" => operation, "class" => class).increment(1);
}

/// The SPEC §10 flags of one reply, counted by resource so an operator
/// sees which limits clients are running into before they are rejected
/// (warnings) and who is being shut out (bans).
pub fn reply_flags(operation: &'static str, resource: &str, warning: bool, banned: bool) {
    if warning {
        counter!(WARNINGS.name, "operation" => operation, "resource" => resource.to_owned())
            .increment(1);
    }
    if banned {
        counter!(BANNED.name, "operation" => operation, "resource" => resource.to_owned())
            .increment(1);
    }
}

/// A session opened (+1) or ended (−1).
pub fn sessions_open(delta: f64) {
    gauge!(SESSIONS_OPEN.name).increment(delta);
}

/// Copies held by this server's sessions changed by `delta`.
pub fn copies_held(delta: i64) {
    gauge!(COPIES_HELD.name).increment(delta as f64);
}

/// The leases of every configured lease resource (SPEC §12), read from
/// the store at each scrape: the capacity, what is leased and wanted in
/// all, and how many clients hold leases.
pub fn leases(summaries: &[charon_limiter::LeaseSummary]) {
    for s in summaries {
        let r = s.resource.clone();
        gauge!(LEASE_CAPACITY.name, "resource" => r.clone()).set(s.capacity.to_f64());
        gauge!(LEASE_LEASED.name, "resource" => r.clone()).set(s.leased.to_f64());
        gauge!(LEASE_WANTED.name, "resource" => r.clone()).set(s.wanted.to_f64());
        gauge!(LEASE_CLIENTS.name, "resource" => r).set(s.clients as f64);
    }
}

/// Callers waiting for copies, by resource; resources whose queue emptied
/// since the last scrape are set to 0.
pub fn copy_queues(lengths: &[(String, u64)]) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for r in seen.iter() {
        if !lengths.iter().any(|(l, _)| l == r) {
            gauge!(COPY_QUEUE_LENGTH.name, "resource" => r.clone()).set(0.0);
        }
    }
    seen.clear();
    for (r, n) in lengths {
        gauge!(COPY_QUEUE_LENGTH.name, "resource" => r.clone()).set(*n as f64);
        seen.push(r.clone());
    }
}

/// How a reserve allowed to wait ended (its wire reply), on `resource`
/// (already a bounded label).
pub fn copy_wait(resource: String, r: &charon_proto::v1::ReserveReply) {
    let waited = r.waited_ms.unwrap_or(0);
    let outcome = if r.queue_full {
        "queue_full"
    } else if r.result_ready {
        "result_ready"
    } else if waited == 0 {
        "at_once"
    } else if r.granted > 0 {
        "handed_over"
    } else {
        "deadline"
    };
    counter!(COPY_WAITS.name, "resource" => resource, "outcome" => outcome).increment(1);
    histogram!(COPY_WAIT_DURATION_SECONDS.name).record(waited as f64 / 1000.0);
}

/// Copies waiting in staging areas.
pub fn transfers_staged(copies: u64) {
    gauge!(TRANSFERS_STAGED_COPIES.name).set(copies as f64);
}

/// A configuration reload was applied (`true`) or refused.
pub fn config_reload(applied: bool) {
    let result = if applied { "applied" } else { "refused" };
    counter!(CONFIG_RELOADS.name, "result" => result).increment(1);
}

/// The TLS files were read again (SIGHUP or a change) and used
/// (`true`) or refused (the previous certificate stays in force).
pub fn tls_reload(applied: bool) {
    let result = if applied { "applied" } else { "refused" };
    counter!(TLS_RELOADS.name, "result" => result).increment(1);
    tls_reload_failing(!applied);
}

/// Whether the TLS files on disk are refused (the previous certificate
/// still served).
pub fn tls_reload_failing(failing: bool) {
    gauge!(TLS_RELOAD_FAILING.name).set(if failing { 1.0 } else { 0.0 });
}

/// When the certificate chain in force expires (Unix seconds): an alert
/// can fire weeks before it does.
pub fn tls_certificate_expiry(not_after: i64) {
    gauge!(TLS_CERTIFICATE_EXPIRY_SECONDS.name).set(not_after as f64);
}

/// A TLS handshake on `listener` (`gRPC`, `HTTP`) failed or timed out.
pub fn tls_handshake_failed(listener: &'static str) {
    let listener = if listener == "gRPC" { "grpc" } else { "http" };
    counter!(TLS_HANDSHAKE_FAILURES.name, "listener" => listener).increment(1);
}

/// The version of the configuration in force (0 for a file).
pub fn config_version(version: u64) {
    gauge!(CONFIG_VERSION.name).set(version as f64);
}

/// Masked values of an Envoy descriptor that were not IP addresses.
pub fn envoy_invalid_addresses(domain: &str, node: &str, n: usize) {
    counter!(ENVOY_INVALID_ADDRESSES.name, "domain" => domain.to_owned(), "node" => node.to_owned())
        .increment(u64::try_from(n).unwrap_or(u64::MAX));
}

/// The `domain` label of calls to a domain the `envoy:` section does not
/// name: one label for them all, since their names come from requests.
pub const UNKNOWN_DOMAIN: &str = "(unknown)";

/// A call to a domain the `envoy:` section does not name, by the answer
/// the section's `unknown_domain:` gave it (`ok` or `error`).
pub fn envoy_unknown_domain(answer: charon_core::envoy::UnknownDomain) {
    let answer = match answer {
        charon_core::envoy::UnknownDomain::Ok => "ok",
        charon_core::envoy::UnknownDomain::Error => "error",
    };
    counter!(ENVOY_UNKNOWN_DOMAIN.name, "answer" => answer).increment(1);
}

/// An Envoy call answered with an error status, by SPEC §5 class.
pub fn envoy_error(class: &'static str) {
    counter!(ENVOY_ERRORS.name, "class" => class).increment(1);
}

/// How long an Envoy call took.
pub fn envoy_duration(elapsed: Duration) {
    histogram!(ENVOY_CALL_DURATION_SECONDS.name).record(elapsed.as_secs_f64());
}

/// An operation failed in the store (`charon_store_errors_total`); other
/// errors count nothing here. Called where errors become gRPC statuses
/// and session `Error` messages, so each failed operation counts once.
pub fn store_error(e: &charon_limiter::LimitError) {
    use charon_store::StoreError;
    let kind = match e {
        charon_limiter::LimitError::Server(StoreError::Unavailable(_)) => STORE_ERROR_KINDS[0],
        charon_limiter::LimitError::Server(StoreError::BadData(_)) => STORE_ERROR_KINDS[1],
        charon_limiter::LimitError::Server(StoreError::Denied(_)) => STORE_ERROR_KINDS[2],
        charon_limiter::LimitError::Server(StoreError::Resigned(_)) => STORE_ERROR_KINDS[3],
        charon_limiter::LimitError::Server(StoreError::Refused(_))
        | charon_limiter::LimitError::Client(_) => return,
    };
    counter!(STORE_ERRORS.name, "kind" => kind).increment(1);
}

/// Whether the store answered its ping at this scrape.
pub fn store_up(up: bool) {
    gauge!(STORE_UP.name).set(if up { 1.0 } else { 0.0 });
}

/// Whether a configuration is in force, and whether it may be outdated
/// (its last reload refused, its service unreachable).
pub fn config_state(loaded: bool, stale: bool) {
    gauge!(CONFIG_LOADED.name).set(if loaded { 1.0 } else { 0.0 });
    gauge!(CONFIG_STALE.name).set(if stale { 1.0 } else { 0.0 });
}

/// The configuration service could not be reached, or answered something
/// invalid: the view in force stays.
pub fn config_refresh_failed() {
    counter!(CONFIG_RELOADS.name, "result" => "failed").increment(1);
}

/// Registers `charon_warnings_total` and `charon_banned_total` at zero for
/// the rate requests of every configured resource that can warn (a
/// `soft_limit`) or ban (a `ban`), on itself or for a domain, so an alert
/// on their increase sees the first. Only those: a configuration of many
/// resources without either adds no series.
pub fn flags_at_zero(config: &Config) {
    use charon_core::config::{MeterFields, MeterResource, ResourceKind};
    use charon_core::meter::Policy;
    fn meter<F: MeterFields>(r: &MeterResource<F>) -> Vec<Policy> {
        std::iter::once(r.spec().policy)
            .chain(r.domains().values().map(|o| o.spec().policy))
            .collect()
    }
    for r in config.resources() {
        let policies = match &r.kind {
            ResourceKind::Rate(r) => std::iter::once(r.policy)
                .chain(r.domains.values().map(|o| o.policy))
                .collect(),
            ResourceKind::Bucket(r) => meter(r),
            ResourceKind::Window(r) => meter(r),
            ResourceKind::Queue(r) => meter(r),
            ResourceKind::Copy(_) | ResourceKind::Lease(_) => Vec::new(),
        };
        let labels = || {
            [
                ("operation", "request".to_owned()),
                ("resource", r.name.clone()),
            ]
        };
        if policies.iter().any(|p| p.soft_limit.is_some()) {
            counter!(WARNINGS.name, &labels()).increment(0);
        }
        if policies.iter().any(|p| p.ban.is_some()) {
            counter!(BANNED.name, &labels()).increment(0);
        }
    }
}
