//! What the server counts, in one place: names, labels and buckets.
//!
//! Exposed in Prometheus text format on `/metrics`:
//! - `charon_decisions_total{operation, resource, outcome}` — outcome is
//!   `granted`, `partial` (fewer than asked), `rejected`, `client_error` or
//!   `server_error`; `resource` is the configured name, `(unconfigured)` for
//!   resources admitted by `allow_unconfigured` (unbounded names must not
//!   become unbounded label values) and `(unknown)` for refused ones;
//!   `operation` is `request`, `dry_run`, `charge`, `refund` or a copy
//!   operation (a charge or refund counts as `granted`);
//! - `charon_warnings_total{operation, resource}` — replies over a soft
//!   limit, and `charon_banned_total{operation, resource}` — replies to a
//!   banned domain (every rate-like kind, SPEC §10);
//! - `charon_decision_duration_seconds{operation}` — a histogram;
//! - `charon_errors_total{operation, class}`;
//! - `charon_sessions_open`, `charon_copies_held` (by this server's
//!   sessions), `charon_transfers_staged_copies` (read from the store);
//! - `charon_config_reloads_total{result}`, `charon_config_version`;
//! - TLS (`charon serve --tls-cert`): `charon_tls_reloads_total{result}`
//!   (`applied`, `refused`), `charon_tls_reload_failing` (1 while the
//!   files on disk are refused) and
//!   `charon_tls_handshake_failures_total{listener}`;
//! - capacity leases (SPEC §12), per configured lease resource, read from
//!   the store at each scrape: `charon_lease_capacity{resource}`,
//!   `charon_lease_leased{resource}` (the sum of live leases),
//!   `charon_lease_wanted{resource}` and `charon_lease_clients{resource}`;
//! - Envoy's service (SPEC §11), labelled by Envoy `domain` (configured
//!   ones only: an unknown domain is refused first) and matched `node` (its
//!   id, `envoy/DOMAIN/KEY[=VALUE]/…`, bounded by the configuration; never
//!   a request's value; `(none)` when nothing matched):
//!   `charon_envoy_descriptors_total{domain, node}`,
//!   `charon_envoy_over_limit_total{domain, node}` (shadowed ones included),
//!   `charon_envoy_near_limit_total{domain, node}` (over the soft limit),
//!   `charon_envoy_shadow_total{domain, node}` (over, but shadowed: OK),
//!   `charon_envoy_invalid_addresses_total{domain, node}` (a masked value
//!   that was not an IP address), `charon_envoy_calls_total{domain, code}`
//!   (`ok`, `over_limit`), `charon_envoy_errors_total{class}` and
//!   `charon_envoy_call_duration_seconds` (a histogram).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use charon_core::config::Config;
use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets from 10 µs (in-memory decisions) to 1 s (a struggling
/// Redis).
const BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

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
                Matcher::Full("charon_decision_duration_seconds".into()),
                BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("charon_envoy_call_duration_seconds".into()),
                    BUCKETS,
                )
            })
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        // Fails only if another recorder was installed first; then ours
        // renders nothing, which the tests of /metrics would catch.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything asked for was granted.
    Granted,
    /// Fewer copies than asked for, at least `min_copies`.
    Partial,
    /// Refused by a limit.
    Rejected,
    /// The caller's fault (SPEC §5 class `client`).
    ClientError,
    /// Charon's fault (SPEC §5 class `server`); clients degrade.
    ServerError,
}

impl Outcome {
    /// The outcome of a grant of `granted` out of `asked`.
    pub fn of_grant(granted: u64, asked: u64) -> Self {
        match granted {
            0 => Outcome::Rejected,
            g if g < asked => Outcome::Partial,
            _ => Outcome::Granted,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Partial => "partial",
            Outcome::Rejected => "rejected",
            Outcome::ClientError => "client_error",
            Outcome::ServerError => "server_error",
        }
    }

    /// The outcome's place in [`LabelHandles`].
    fn index(self) -> usize {
        match self {
            Outcome::Granted => 0,
            Outcome::Partial => 1,
            Outcome::Rejected => 2,
            Outcome::ClientError => 3,
            Outcome::ServerError => 4,
        }
    }

    /// The SPEC §5 class of an error outcome.
    fn class(self) -> Option<&'static str> {
        match self {
            Outcome::ClientError => Some("client"),
            Outcome::ServerError => Some("server"),
            Outcome::Granted | Outcome::Partial | Outcome::Rejected => None,
        }
    }
}

/// The operations recorded through handles resolved once ([`Decisions`]):
/// the unary calls and the rate operations of sessions, which is where the
/// traffic is. Copy operations resolve their series by name on each call.
const HOT_OPERATIONS: [&str; 4] = ["request", "dry_run", "charge", "refund"];

/// `operation`'s place in [`HOT_OPERATIONS`].
fn hot_operation(operation: &str) -> Option<usize> {
    HOT_OPERATIONS.iter().position(|&o| o == operation)
}

/// `charon_decisions_total` of one `resource` label, by hot operation and
/// outcome. Each series is registered the first time it counts, as the
/// `counter!` call on every decision did before, so `/metrics` shows the
/// same series; after that a decision costs an atomic load and an atomic
/// add, where resolving the series by name built its labels (copying the
/// resource name), hashed them and looked them up in the registry's map on
/// every call.
#[derive(Debug, Default)]
struct LabelHandles {
    counters: [[OnceLock<Counter>; 5]; HOT_OPERATIONS.len()],
}

impl LabelHandles {
    fn count(&self, label: &str, operation: usize, outcome: Outcome) {
        self.counters[operation][outcome.index()]
            .get_or_init(|| {
                counter!(
                    "charon_decisions_total",
                    "operation" => HOT_OPERATIONS[operation],
                    "resource" => label.to_owned(),
                    "outcome" => outcome.label()
                )
            })
            .increment(1);
    }
}

/// The decision counters of one configuration: a slot per configured
/// resource (in [`Config::resources`] order, filled on the resource's
/// first decision, so a configuration of many resources costs 16 bytes per
/// resource until they are used) and the two shared labels.
///
/// Kept with the configuration it was built for ([`Decisions::for_config`]):
/// whether a name is a configured resource, hence its label, depends on
/// the configuration in force, and a reload gives a new one.
#[derive(Debug)]
pub struct Decisions {
    config: Arc<Config>,
    configured: Vec<OnceLock<Box<LabelHandles>>>,
    unconfigured: LabelHandles,
    unknown: LabelHandles,
}

impl Decisions {
    /// Handles for `config` (none registered yet).
    pub fn for_config(config: Arc<Config>) -> Self {
        // A handle taken before the recorder is installed would count
        // nothing for the life of these handles.
        install();
        let configured = std::iter::repeat_with(OnceLock::new)
            .take(config.resources().len())
            .collect();
        Self {
            config,
            configured,
            unconfigured: LabelHandles::default(),
            unknown: LabelHandles::default(),
        }
    }

    /// Whether these handles were built for `config` (the same `Arc`, not
    /// merely an equal configuration: the identity is what a reload
    /// changes, and comparing it costs nothing).
    pub fn is_for(&self, config: &Arc<Config>) -> bool {
        Arc::ptr_eq(&self.config, config)
    }

    /// The configuration these handles are for.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Records one operation on `resource`, as [`observe`] does, with the
    /// label [`resource_label`] gives.
    pub fn observe(
        &self,
        operation: &'static str,
        resource: &str,
        outcome: Outcome,
        elapsed: Duration,
    ) {
        let Some(op) = hot_operation(operation) else {
            observe(
                operation,
                resource_label(&self.config, resource, outcome),
                outcome,
                elapsed,
            );
            return;
        };
        match self.config.resource_position(resource) {
            Some(i) => self.configured[i]
                .get_or_init(Box::default)
                .count(resource, op, outcome),
            None if outcome == Outcome::ClientError => {
                self.unknown.count("(unknown)", op, outcome);
            }
            None => self.unconfigured.count("(unconfigured)", op, outcome),
        }
        durations()[op].record(elapsed.as_secs_f64());
        if let Some(class) = outcome.class() {
            counter!("charon_errors_total", "operation" => operation, "class" => class)
                .increment(1);
        }
    }
}

/// `charon_decision_duration_seconds` of each hot operation, resolved once
/// for the process (its only label is the operation).
fn durations() -> &'static [Histogram; HOT_OPERATIONS.len()] {
    static DURATIONS: OnceLock<[Histogram; HOT_OPERATIONS.len()]> = OnceLock::new();
    DURATIONS.get_or_init(|| {
        install();
        HOT_OPERATIONS.map(
            |operation| histogram!("charon_decision_duration_seconds", "operation" => operation),
        )
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
    counter!("charon_decisions_total", "operation" => operation, "resource" => resource, "outcome" => outcome.label())
        .increment(1);
    histogram!("charon_decision_duration_seconds", "operation" => operation)
        .record(elapsed.as_secs_f64());
    let class = match outcome {
        Outcome::ClientError => "client",
        Outcome::ServerError => "server",
        _ => return,
    };
    counter!("charon_errors_total", "operation" => operation, "class" => class).increment(1);
}

/// The SPEC §10 flags of one reply, counted by resource so an operator
/// sees which limits clients are running into before they are rejected
/// (warnings) and who is being shut out (bans).
pub fn reply_flags(operation: &'static str, resource: &str, warning: bool, banned: bool) {
    if warning {
        counter!("charon_warnings_total", "operation" => operation, "resource" => resource.to_owned())
            .increment(1);
    }
    if banned {
        counter!("charon_banned_total", "operation" => operation, "resource" => resource.to_owned())
            .increment(1);
    }
}

/// A session opened (+1) or ended (−1).
pub fn sessions_open(delta: f64) {
    gauge!("charon_sessions_open").increment(delta);
}

/// Copies held by this server's sessions changed by `delta`.
pub fn copies_held(delta: i64) {
    gauge!("charon_copies_held").increment(delta as f64);
}

/// The leases of every configured lease resource (SPEC §12), read from
/// the store at each scrape: the capacity, what is leased and wanted in
/// all, and how many clients hold leases.
pub fn leases(summaries: &[charon_limiter::LeaseSummary]) {
    for s in summaries {
        let r = s.resource.clone();
        gauge!("charon_lease_capacity", "resource" => r.clone()).set(s.capacity.to_f64());
        gauge!("charon_lease_leased", "resource" => r.clone()).set(s.leased.to_f64());
        gauge!("charon_lease_wanted", "resource" => r.clone()).set(s.wanted.to_f64());
        gauge!("charon_lease_clients", "resource" => r).set(s.clients as f64);
    }
}

/// Copies waiting in staging areas.
pub fn transfers_staged(copies: u64) {
    gauge!("charon_transfers_staged_copies").set(copies as f64);
}

/// A configuration reload was applied (`true`) or refused.
pub fn config_reload(applied: bool) {
    let result = if applied { "applied" } else { "refused" };
    counter!("charon_config_reloads_total", "result" => result).increment(1);
}

/// The TLS files were read again (SIGHUP or a change) and used
/// (`true`) or refused (the previous certificate stays in force).
pub fn tls_reload(applied: bool) {
    metrics::describe_counter!(
        "charon_tls_reloads_total",
        "TLS certificate reloads (SIGHUP or changed files), by result: applied or refused"
    );
    metrics::describe_gauge!(
        "charon_tls_reload_failing",
        "1 while the TLS files on disk were refused and the previous certificate is still served"
    );
    let result = if applied { "applied" } else { "refused" };
    counter!("charon_tls_reloads_total", "result" => result).increment(1);
    tls_reload_failing(!applied);
}

/// Whether the TLS files on disk are refused (the previous certificate
/// still served).
pub fn tls_reload_failing(failing: bool) {
    gauge!("charon_tls_reload_failing").set(if failing { 1.0 } else { 0.0 });
}

/// A TLS handshake on `listener` (`gRPC`, `HTTP`) failed or timed out.
pub fn tls_handshake_failed(listener: &'static str) {
    metrics::describe_counter!(
        "charon_tls_handshake_failures_total",
        "TLS handshakes that failed or timed out, by listener (grpc, http)"
    );
    let listener = if listener == "gRPC" { "grpc" } else { "http" };
    counter!("charon_tls_handshake_failures_total", "listener" => listener).increment(1);
}

/// The version of the configuration in force (0 for a file).
pub fn config_version(version: u64) {
    gauge!("charon_config_version").set(version as f64);
}

/// One descriptor of an Envoy call: counted, and whether it was over its
/// limit, over its soft limit, and over but shadowed.
pub fn envoy_descriptor(domain: &str, node: &str, over: bool, near: bool, shadow: bool) {
    let labels = [("domain", domain.to_owned()), ("node", node.to_owned())];
    counter!("charon_envoy_descriptors_total", &labels).increment(1);
    if over {
        counter!("charon_envoy_over_limit_total", &labels).increment(1);
    }
    if near {
        counter!("charon_envoy_near_limit_total", &labels).increment(1);
    }
    if shadow {
        counter!("charon_envoy_shadow_total", &labels).increment(1);
    }
}

/// Masked values of an Envoy descriptor that were not IP addresses.
pub fn envoy_invalid_addresses(domain: &str, node: &str, n: usize) {
    counter!("charon_envoy_invalid_addresses_total", "domain" => domain.to_owned(), "node" => node.to_owned())
        .increment(u64::try_from(n).unwrap_or(u64::MAX));
}

/// One answered Envoy call and its overall code.
pub fn envoy_call(domain: &str, over: bool) {
    let code = if over { "over_limit" } else { "ok" };
    counter!("charon_envoy_calls_total", "domain" => domain.to_owned(), "code" => code)
        .increment(1);
}

/// An Envoy call answered with an error status, by SPEC §5 class.
pub fn envoy_error(class: &'static str) {
    counter!("charon_envoy_errors_total", "class" => class).increment(1);
}

/// How long an Envoy call took.
pub fn envoy_duration(elapsed: Duration) {
    histogram!("charon_envoy_call_duration_seconds").record(elapsed.as_secs_f64());
}
