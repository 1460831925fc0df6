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
//! - waiting for a copy (SPEC §14): `charon_copy_queue_length{resource}`
//!   (callers waiting, read from the store at each scrape),
//!   `charon_copy_waits_total{resource, outcome}` (reserves that were
//!   allowed to wait, by how they ended: `at_once`, `handed_over`,
//!   `result_ready`, `queue_full`, `deadline`) and
//!   `charon_copy_wait_duration_seconds` (a histogram of how long they
//!   waited);
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
//!   (`ok`, `over_limit`), `charon_envoy_unknown_domain_total{answer}`
//!   (`ok`, `error`), `charon_envoy_errors_total{class}` and
//!   `charon_envoy_call_duration_seconds` (a histogram);
//! - the store: `charon_store_up` (1 when it answered a ping at the last
//!   scrape), `charon_store_errors_total{kind}` (server errors of the
//!   store: `unavailable`, `bad_data`, `denied`, `resigned`) and, Redis
//!   store, `charon_store_dead_servers_removed_total` (servers whose
//!   liveness lapsed and whose holds this server removed: a crash or a
//!   resignation elsewhere);
//! - the configuration: `charon_config_loaded` and `charon_config_stale`
//!   (the last attempt to get a newer configuration failed).
//!
//! Each is described once, in [`METRICS`]: its `# HELP` line, its type and
//! its unit. Counters that alerts watch are registered at zero when the
//! server starts (where their labels are known), so that `increase()` sees
//! their first event and a dashboard shows 0 rather than no data.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use charon_core::config::Config;
use metrics::{Counter, Histogram, KeyName, SharedString, Unit, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets from 10 µs (in-memory decisions) to 1 s (a struggling
/// Redis).
const BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The type of an exported metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A Prometheus histogram (`_bucket`, `_sum`, `_count`).
    Histogram,
}

impl Kind {
    /// As the `# TYPE` line writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One exported metric: what `# HELP` and `# TYPE` say about it.
#[derive(Debug, Clone, Copy)]
pub struct Described {
    /// The metric's name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its labels, as documentation (the recorder does not check them).
    pub labels: &'static str,
    /// Its unit, if it has one.
    pub unit: Option<Unit>,
    /// What it means (the `# HELP` text).
    pub help: &'static str,
}

const fn m(
    name: &'static str,
    kind: Kind,
    labels: &'static str,
    unit: Option<Unit>,
    help: &'static str,
) -> Described {
    Described {
        name,
        kind,
        labels,
        unit,
        help,
    }
}

/// Every metric the server exports, described once: [`install`] gives the
/// recorder these descriptions, so every family on `/metrics` has its
/// `# HELP` and `# TYPE` lines, and docs/observability.md lists them.
pub const METRICS: &[Described] = &[
    m(
        "charon_decisions_total",
        Kind::Counter,
        "operation, resource, outcome",
        Some(Unit::Count),
        "Operations decided, by operation (request, dry_run, charge, refund, reserve, release, transfer, seize, get_capacity, release_capacity), resource ((unconfigured), (unknown) for names not configured) and outcome (granted, partial, rejected, client_error, server_error).",
    ),
    m(
        "charon_decision_duration_seconds",
        Kind::Histogram,
        "operation",
        Some(Unit::Seconds),
        "Time from reading an operation to its answer, by operation.",
    ),
    m(
        "charon_errors_total",
        Kind::Counter,
        "operation, class",
        Some(Unit::Count),
        "Operations answered with an error, by operation and class (client: the request is wrong; server: Charon could not decide, clients degrade).",
    ),
    m(
        "charon_warnings_total",
        Kind::Counter,
        "operation, resource",
        Some(Unit::Count),
        "Replies over a soft limit, by operation and resource.",
    ),
    m(
        "charon_banned_total",
        Kind::Counter,
        "operation, resource",
        Some(Unit::Count),
        "Replies to a banned domain, by operation and resource.",
    ),
    m(
        "charon_sessions_open",
        Kind::Gauge,
        "",
        Some(Unit::Count),
        "Session streams open on this server.",
    ),
    m(
        "charon_copies_held",
        Kind::Gauge,
        "",
        Some(Unit::Count),
        "Copies held by the sessions of this server.",
    ),
    m(
        "charon_copy_queue_length",
        Kind::Gauge,
        "resource",
        Some(Unit::Count),
        "Callers waiting for a copy, by resource, read from the store at each scrape.",
    ),
    m(
        "charon_copy_waits_total",
        Kind::Counter,
        "resource, outcome",
        Some(Unit::Count),
        "Reserves allowed to wait, by how they ended: at_once (answered on arrival), handed_over (a released copy went to them), result_ready, queue_full, deadline (rejected when their wait ran out).",
    ),
    m(
        "charon_copy_wait_duration_seconds",
        Kind::Histogram,
        "",
        Some(Unit::Seconds),
        "How long reserves allowed to wait waited for their answer.",
    ),
    m(
        "charon_transfers_staged_copies",
        Kind::Gauge,
        "",
        Some(Unit::Count),
        "Copies waiting in transfer staging areas, read from the store at each scrape.",
    ),
    m(
        "charon_config_reloads_total",
        Kind::Counter,
        "result",
        Some(Unit::Count),
        "Attempts to put a newer configuration in force, by result: applied, refused (an invalid file; the previous one stays), failed (the configuration service could not be reached or answered something invalid).",
    ),
    m(
        "charon_config_version",
        Kind::Gauge,
        "",
        None,
        "Version of the configuration in force (0 for a file).",
    ),
    m(
        "charon_config_loaded",
        Kind::Gauge,
        "",
        None,
        "1 once a configuration is in force; 0 while a server fed by a configuration service has never reached it (it answers server errors).",
    ),
    m(
        "charon_config_stale",
        Kind::Gauge,
        "",
        None,
        "1 while the configuration in force may be outdated: the last reload was refused or the configuration service could not be reached.",
    ),
    m(
        "charon_store_up",
        Kind::Gauge,
        "",
        None,
        "1 if the store answered a ping within a second at this scrape, else 0.",
    ),
    m(
        "charon_store_errors_total",
        Kind::Counter,
        "kind",
        Some(Unit::Count),
        "Operations that failed in the store, by kind: unavailable (unreachable or timed out), bad_data, denied (credentials, rights, certificates), resigned (this server left the Redis membership).",
    ),
    m(
        charon_store::DEAD_SERVERS_REMOVED,
        Kind::Counter,
        "",
        Some(Unit::Count),
        "Redis store: other servers whose liveness lapsed and whose holds this server removed (a server crashed, stalled or resigned).",
    ),
    m(
        "charon_lease_capacity",
        Kind::Gauge,
        "resource",
        None,
        "Capacity of a lease resource, or what its parent granted.",
    ),
    m(
        "charon_lease_leased",
        Kind::Gauge,
        "resource",
        None,
        "Capacity held by live leases of a resource, in all.",
    ),
    m(
        "charon_lease_wanted",
        Kind::Gauge,
        "resource",
        None,
        "Capacity wanted by the clients of a lease resource, in all.",
    ),
    m(
        "charon_lease_clients",
        Kind::Gauge,
        "resource",
        Some(Unit::Count),
        "Clients holding a live lease of a resource.",
    ),
    m(
        "charon_envoy_descriptors_total",
        Kind::Counter,
        "domain, node",
        Some(Unit::Count),
        "Descriptors of Envoy calls, by Envoy domain and matched node.",
    ),
    m(
        "charon_envoy_over_limit_total",
        Kind::Counter,
        "domain, node",
        Some(Unit::Count),
        "Envoy descriptors over their limit (shadowed ones included).",
    ),
    m(
        "charon_envoy_near_limit_total",
        Kind::Counter,
        "domain, node",
        Some(Unit::Count),
        "Envoy descriptors over their soft limit.",
    ),
    m(
        "charon_envoy_shadow_total",
        Kind::Counter,
        "domain, node",
        Some(Unit::Count),
        "Envoy descriptors over their limit but in shadow mode (answered OK).",
    ),
    m(
        "charon_envoy_invalid_addresses_total",
        Kind::Counter,
        "domain, node",
        Some(Unit::Count),
        "Masked Envoy descriptor values that were not IP addresses.",
    ),
    m(
        "charon_envoy_calls_total",
        Kind::Counter,
        "domain, code",
        Some(Unit::Count),
        "Envoy ShouldRateLimit calls answered, by domain and overall code (ok, over_limit).",
    ),
    m(
        "charon_envoy_unknown_domain_total",
        Kind::Counter,
        "answer",
        Some(Unit::Count),
        "Envoy calls to a domain the envoy: section does not name, by the answer given (ok, error).",
    ),
    m(
        "charon_envoy_errors_total",
        Kind::Counter,
        "class",
        Some(Unit::Count),
        "Envoy calls answered with an error status, by class (client or server).",
    ),
    m(
        "charon_envoy_call_duration_seconds",
        Kind::Histogram,
        "",
        Some(Unit::Seconds),
        "Time to answer an Envoy ShouldRateLimit call.",
    ),
    m(
        "charon_tls_reloads_total",
        Kind::Counter,
        "result",
        Some(Unit::Count),
        "TLS certificate reloads (SIGHUP or changed files), by result: applied or refused.",
    ),
    m(
        "charon_tls_reload_failing",
        Kind::Gauge,
        "",
        None,
        "1 while the TLS files on disk were refused and the previous certificate is still served.",
    ),
    m(
        "charon_tls_certificate_expiry_seconds",
        Kind::Gauge,
        "",
        Some(Unit::Seconds),
        "When the TLS certificate in force expires (the earliest notAfter of its chain), in Unix seconds.",
    ),
    m(
        "charon_tls_handshake_failures_total",
        Kind::Counter,
        "listener",
        Some(Unit::Count),
        "TLS handshakes that failed or timed out, by listener (grpc, http).",
    ),
    m(
        "charon_events_written_total",
        Kind::Counter,
        "",
        Some(Unit::Count),
        "Decision events written to the --events sink.",
    ),
    m(
        "charon_events_dropped_total",
        Kind::Counter,
        "reason",
        Some(Unit::Count),
        "Decision events dropped, by reason: queue_full (the writer is behind), rate_cap (over --events-max-per-second), write_error (the sink failed).",
    ),
];

/// Gives the recorder every description of [`METRICS`].
fn describe_all() {
    metrics::with_recorder(|recorder| {
        for d in METRICS {
            let (name, help) = (
                KeyName::from_const_str(d.name),
                SharedString::const_str(d.help),
            );
            match d.kind {
                Kind::Counter => recorder.describe_counter(name, d.unit, help),
                Kind::Gauge => recorder.describe_gauge(name, d.unit, help),
                Kind::Histogram => recorder.describe_histogram(name, d.unit, help),
            }
        }
    });
}

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
            counter!("charon_errors_total", "operation" => *operation, "class" => class)
                .increment(0);
        }
    }
    for kind in STORE_ERROR_KINDS {
        counter!("charon_store_errors_total", "kind" => kind).increment(0);
    }
    for result in ["applied", "refused", "failed"] {
        counter!("charon_config_reloads_total", "result" => result).increment(0);
    }
    gauge!("charon_sessions_open").increment(0.0);
    gauge!("charon_copies_held").increment(0.0);
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
        if metrics::set_global_recorder(recorder).is_ok() {
            describe_all();
            register_at_zero();
        }
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

    /// As the `outcome` label (and the decision span) says it.
    pub fn label(self) -> &'static str {
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
        flags_at_zero(&config);
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

/// Callers waiting for copies, by resource; resources whose queue emptied
/// since the last scrape are set to 0.
pub fn copy_queues(lengths: &[(String, u64)]) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for r in seen.iter() {
        if !lengths.iter().any(|(l, _)| l == r) {
            gauge!("charon_copy_queue_length", "resource" => r.clone()).set(0.0);
        }
    }
    seen.clear();
    for (r, n) in lengths {
        gauge!("charon_copy_queue_length", "resource" => r.clone()).set(*n as f64);
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
    counter!("charon_copy_waits_total", "resource" => resource, "outcome" => outcome).increment(1);
    histogram!("charon_copy_wait_duration_seconds").record(waited as f64 / 1000.0);
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
    let result = if applied { "applied" } else { "refused" };
    counter!("charon_tls_reloads_total", "result" => result).increment(1);
    tls_reload_failing(!applied);
}

/// Whether the TLS files on disk are refused (the previous certificate
/// still served).
pub fn tls_reload_failing(failing: bool) {
    gauge!("charon_tls_reload_failing").set(if failing { 1.0 } else { 0.0 });
}

/// When the certificate chain in force expires (Unix seconds): an alert
/// can fire weeks before it does.
pub fn tls_certificate_expiry(not_after: i64) {
    gauge!("charon_tls_certificate_expiry_seconds").set(not_after as f64);
}

/// A TLS handshake on `listener` (`gRPC`, `HTTP`) failed or timed out.
pub fn tls_handshake_failed(listener: &'static str) {
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
    counter!("charon_envoy_unknown_domain_total", "answer" => answer).increment(1);
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
    counter!("charon_store_errors_total", "kind" => kind).increment(1);
}

/// Whether the store answered its ping at this scrape.
pub fn store_up(up: bool) {
    gauge!("charon_store_up").set(if up { 1.0 } else { 0.0 });
}

/// Whether a configuration is in force, and whether it may be outdated
/// (its last reload refused, its service unreachable).
pub fn config_state(loaded: bool, stale: bool) {
    gauge!("charon_config_loaded").set(if loaded { 1.0 } else { 0.0 });
    gauge!("charon_config_stale").set(if stale { 1.0 } else { 0.0 });
}

/// The configuration service could not be reached, or answered something
/// invalid: the view in force stays.
pub fn config_refresh_failed() {
    counter!("charon_config_reloads_total", "result" => "failed").increment(1);
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
            counter!("charon_warnings_total", &labels()).increment(0);
        }
        if policies.iter().any(|p| p.ban.is_some()) {
            counter!("charon_banned_total", &labels()).increment(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::METRICS;

    #[test]
    fn every_metric_is_described_once_and_documented() {
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/observability.md"
        ))
        .expect("docs/observability.md");
        let mut names: Vec<&str> = METRICS.iter().map(|d| d.name).collect();
        for name in &names {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "{name} is not in the table of docs/observability.md"
            );
            assert!(name.starts_with("charon_"), "{name}");
        }
        names.sort_unstable();
        let all = names.len();
        names.dedup();
        assert_eq!(names.len(), all, "a metric is described twice");
        for d in METRICS {
            assert!(!d.help.is_empty(), "{}", d.name);
            assert_eq!(
                d.name.ends_with("_total"),
                d.kind == super::Kind::Counter,
                "{}: counters, and only they, end in _total",
                d.name
            );
        }
    }
}
