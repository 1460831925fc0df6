//! The catalogue of what the server exports: one constant per metric
//! (its name, type, labels, unit and `# HELP` text) and [`METRICS`], the
//! one list of them that the recorder's descriptions and the check of
//! docs/observability.md are derived from. Code that records a metric
//! names it through its constant (`counter!(DECISIONS.name, …)`), never by
//! a second string.

use metrics::{KeyName, SharedString, Unit};

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

/// `charon_decisions_total`.
pub const DECISIONS: Described = Described {
    name: "charon_decisions_total",
    kind: Kind::Counter,
    labels: "operation, resource, outcome",
    unit: Some(Unit::Count),
    help: "Operations decided, by operation (request, dry_run, charge, refund, reserve, release, transfer, seize, get_capacity, release_capacity), resource ((unconfigured), (unknown) for names not configured) and outcome (granted, partial, rejected, client_error, server_error).",
};

/// `charon_decision_duration_seconds`.
pub const DECISION_DURATION_SECONDS: Described = Described {
    name: "charon_decision_duration_seconds",
    kind: Kind::Histogram,
    labels: "operation",
    unit: Some(Unit::Seconds),
    help: "Time from reading an operation to its answer, by operation.",
};

/// `charon_errors_total`.
pub const ERRORS: Described = Described {
    name: "charon_errors_total",
    kind: Kind::Counter,
    labels: "operation, class",
    unit: Some(Unit::Count),
    help: "Operations answered with an error, by operation and class (client: the request is wrong; server: Charon could not decide, clients degrade).",
};

/// `charon_warnings_total`.
pub const WARNINGS: Described = Described {
    name: "charon_warnings_total",
    kind: Kind::Counter,
    labels: "operation, resource",
    unit: Some(Unit::Count),
    help: "Replies over a soft limit, by operation and resource.",
};

/// `charon_banned_total`.
pub const BANNED: Described = Described {
    name: "charon_banned_total",
    kind: Kind::Counter,
    labels: "operation, resource",
    unit: Some(Unit::Count),
    help: "Replies to a banned domain, by operation and resource.",
};

/// `charon_sessions_open`.
pub const SESSIONS_OPEN: Described = Described {
    name: "charon_sessions_open",
    kind: Kind::Gauge,
    labels: "",
    unit: Some(Unit::Count),
    help: "Session streams open on this server.",
};

/// `charon_copies_held`.
pub const COPIES_HELD: Described = Described {
    name: "charon_copies_held",
    kind: Kind::Gauge,
    labels: "",
    unit: Some(Unit::Count),
    help: "Copies held by the sessions of this server.",
};

/// `charon_copy_queue_length`.
pub const COPY_QUEUE_LENGTH: Described = Described {
    name: "charon_copy_queue_length",
    kind: Kind::Gauge,
    labels: "resource",
    unit: Some(Unit::Count),
    help: "Callers waiting for a copy, by resource, read from the store at each scrape.",
};

/// `charon_copy_waits_total`.
pub const COPY_WAITS: Described = Described {
    name: "charon_copy_waits_total",
    kind: Kind::Counter,
    labels: "resource, outcome",
    unit: Some(Unit::Count),
    help: "Reserves allowed to wait, by how they ended: at_once (answered on arrival), handed_over (a released copy went to them), result_ready, queue_full, deadline (rejected when their wait ran out).",
};

/// `charon_copy_wait_duration_seconds`.
pub const COPY_WAIT_DURATION_SECONDS: Described = Described {
    name: "charon_copy_wait_duration_seconds",
    kind: Kind::Histogram,
    labels: "",
    unit: Some(Unit::Seconds),
    help: "How long reserves allowed to wait waited for their answer.",
};

/// `charon_transfers_staged_copies`.
pub const TRANSFERS_STAGED_COPIES: Described = Described {
    name: "charon_transfers_staged_copies",
    kind: Kind::Gauge,
    labels: "",
    unit: Some(Unit::Count),
    help: "Copies waiting in transfer staging areas, read from the store at each scrape.",
};

/// `charon_config_reloads_total`.
pub const CONFIG_RELOADS: Described = Described {
    name: "charon_config_reloads_total",
    kind: Kind::Counter,
    labels: "result",
    unit: Some(Unit::Count),
    help: "Attempts to put a newer configuration in force, by result: applied, refused (an invalid file; the previous one stays), failed (the configuration service could not be reached or answered something invalid).",
};

/// `charon_config_version`.
pub const CONFIG_VERSION: Described = Described {
    name: "charon_config_version",
    kind: Kind::Gauge,
    labels: "",
    unit: None,
    help: "Version of the configuration in force (0 for a file).",
};

/// `charon_config_loaded`.
pub const CONFIG_LOADED: Described = Described {
    name: "charon_config_loaded",
    kind: Kind::Gauge,
    labels: "",
    unit: None,
    help: "1 once a configuration is in force; 0 while a server fed by a configuration service has never reached it (it answers server errors).",
};

/// `charon_config_stale`.
pub const CONFIG_STALE: Described = Described {
    name: "charon_config_stale",
    kind: Kind::Gauge,
    labels: "",
    unit: None,
    help: "1 while the configuration in force may be outdated: the last reload was refused or the configuration service could not be reached.",
};

/// `charon_store_up`.
pub const STORE_UP: Described = Described {
    name: "charon_store_up",
    kind: Kind::Gauge,
    labels: "",
    unit: None,
    help: "1 if the store answered a ping within a second at this scrape, else 0.",
};

/// `charon_store_errors_total`.
pub const STORE_ERRORS: Described = Described {
    name: "charon_store_errors_total",
    kind: Kind::Counter,
    labels: "kind",
    unit: Some(Unit::Count),
    help: "Operations that failed in the store, by kind: unavailable (unreachable or timed out), bad_data, denied (credentials, rights, certificates), resigned (this server left the Redis membership).",
};

/// `charon_store_dead_servers_removed_total`.
pub const DEAD_SERVERS_REMOVED: Described = Described {
    name: charon_store::DEAD_SERVERS_REMOVED,
    kind: Kind::Counter,
    labels: "",
    unit: Some(Unit::Count),
    help: "Redis store: other servers whose liveness lapsed and whose holds this server removed (a server crashed, stalled or resigned).",
};

/// `charon_lease_capacity`.
pub const LEASE_CAPACITY: Described = Described {
    name: "charon_lease_capacity",
    kind: Kind::Gauge,
    labels: "resource",
    unit: None,
    help: "Capacity of a lease resource, or what its parent granted.",
};

/// `charon_lease_leased`.
pub const LEASE_LEASED: Described = Described {
    name: "charon_lease_leased",
    kind: Kind::Gauge,
    labels: "resource",
    unit: None,
    help: "Capacity held by live leases of a resource, in all.",
};

/// `charon_lease_wanted`.
pub const LEASE_WANTED: Described = Described {
    name: "charon_lease_wanted",
    kind: Kind::Gauge,
    labels: "resource",
    unit: None,
    help: "Capacity wanted by the clients of a lease resource, in all.",
};

/// `charon_lease_clients`.
pub const LEASE_CLIENTS: Described = Described {
    name: "charon_lease_clients",
    kind: Kind::Gauge,
    labels: "resource",
    unit: Some(Unit::Count),
    help: "Clients holding a live lease of a resource.",
};

/// `charon_envoy_descriptors_total`.
pub const ENVOY_DESCRIPTORS: Described = Described {
    name: "charon_envoy_descriptors_total",
    kind: Kind::Counter,
    labels: "domain, node",
    unit: Some(Unit::Count),
    help: "Descriptors of Envoy calls, by Envoy domain and matched node.",
};

/// `charon_envoy_over_limit_total`.
pub const ENVOY_OVER_LIMIT: Described = Described {
    name: "charon_envoy_over_limit_total",
    kind: Kind::Counter,
    labels: "domain, node",
    unit: Some(Unit::Count),
    help: "Envoy descriptors over their limit (shadowed ones included).",
};

/// `charon_envoy_near_limit_total`.
pub const ENVOY_NEAR_LIMIT: Described = Described {
    name: "charon_envoy_near_limit_total",
    kind: Kind::Counter,
    labels: "domain, node",
    unit: Some(Unit::Count),
    help: "Envoy descriptors over their soft limit.",
};

/// `charon_envoy_shadow_total`.
pub const ENVOY_SHADOW: Described = Described {
    name: "charon_envoy_shadow_total",
    kind: Kind::Counter,
    labels: "domain, node",
    unit: Some(Unit::Count),
    help: "Envoy descriptors over their limit but in shadow mode (answered OK).",
};

/// `charon_envoy_invalid_addresses_total`.
pub const ENVOY_INVALID_ADDRESSES: Described = Described {
    name: "charon_envoy_invalid_addresses_total",
    kind: Kind::Counter,
    labels: "domain, node",
    unit: Some(Unit::Count),
    help: "Masked Envoy descriptor values that were not IP addresses.",
};

/// `charon_envoy_calls_total`.
pub const ENVOY_CALLS: Described = Described {
    name: "charon_envoy_calls_total",
    kind: Kind::Counter,
    labels: "domain, code",
    unit: Some(Unit::Count),
    help: "Envoy ShouldRateLimit calls answered, by domain and overall code (ok, over_limit).",
};

/// `charon_envoy_unknown_domain_total`.
pub const ENVOY_UNKNOWN_DOMAIN: Described = Described {
    name: "charon_envoy_unknown_domain_total",
    kind: Kind::Counter,
    labels: "answer",
    unit: Some(Unit::Count),
    help: "Envoy calls to a domain the envoy: section does not name, by the answer given (ok, error).",
};

/// `charon_envoy_errors_total`.
pub const ENVOY_ERRORS: Described = Described {
    name: "charon_envoy_errors_total",
    kind: Kind::Counter,
    labels: "class",
    unit: Some(Unit::Count),
    help: "Envoy calls answered with an error status, by class (client or server).",
};

/// `charon_envoy_call_duration_seconds`.
pub const ENVOY_CALL_DURATION_SECONDS: Described = Described {
    name: "charon_envoy_call_duration_seconds",
    kind: Kind::Histogram,
    labels: "",
    unit: Some(Unit::Seconds),
    help: "Time to answer an Envoy ShouldRateLimit call.",
};

/// `charon_tls_reloads_total`.
pub const TLS_RELOADS: Described = Described {
    name: "charon_tls_reloads_total",
    kind: Kind::Counter,
    labels: "result",
    unit: Some(Unit::Count),
    help: "TLS certificate reloads (SIGHUP or changed files), by result: applied or refused.",
};

/// `charon_tls_reload_failing`.
pub const TLS_RELOAD_FAILING: Described = Described {
    name: "charon_tls_reload_failing",
    kind: Kind::Gauge,
    labels: "",
    unit: None,
    help: "1 while the TLS files on disk were refused and the previous certificate is still served.",
};

/// `charon_tls_certificate_expiry_seconds`.
pub const TLS_CERTIFICATE_EXPIRY_SECONDS: Described = Described {
    name: "charon_tls_certificate_expiry_seconds",
    kind: Kind::Gauge,
    labels: "",
    unit: Some(Unit::Seconds),
    help: "When the TLS certificate in force expires (the earliest notAfter of its chain), in Unix seconds.",
};

/// `charon_tls_handshake_failures_total`.
pub const TLS_HANDSHAKE_FAILURES: Described = Described {
    name: "charon_tls_handshake_failures_total",
    kind: Kind::Counter,
    labels: "listener",
    unit: Some(Unit::Count),
    help: "TLS handshakes that failed or timed out, by listener (grpc, http).",
};

/// `charon_events_written_total`.
pub const EVENTS_WRITTEN: Described = Described {
    name: "charon_events_written_total",
    kind: Kind::Counter,
    labels: "",
    unit: Some(Unit::Count),
    help: "Decision events written to the --events sink.",
};

/// `charon_events_dropped_total`.
pub const EVENTS_DROPPED: Described = Described {
    name: "charon_events_dropped_total",
    kind: Kind::Counter,
    labels: "reason",
    unit: Some(Unit::Count),
    help: "Decision events dropped, by reason: queue_full (the writer is behind), rate_cap (over --events-max-per-second), write_error (the sink failed).",
};

/// Every metric the server exports, described once: [`install`](super::install) gives the
/// recorder these descriptions, so every family on `/metrics` has its
/// `# HELP` and `# TYPE` lines, and docs/observability.md lists them.
pub const METRICS: &[Described] = &[
    DECISIONS,
    DECISION_DURATION_SECONDS,
    ERRORS,
    WARNINGS,
    BANNED,
    SESSIONS_OPEN,
    COPIES_HELD,
    COPY_QUEUE_LENGTH,
    COPY_WAITS,
    COPY_WAIT_DURATION_SECONDS,
    TRANSFERS_STAGED_COPIES,
    CONFIG_RELOADS,
    CONFIG_VERSION,
    CONFIG_LOADED,
    CONFIG_STALE,
    STORE_UP,
    STORE_ERRORS,
    DEAD_SERVERS_REMOVED,
    LEASE_CAPACITY,
    LEASE_LEASED,
    LEASE_WANTED,
    LEASE_CLIENTS,
    ENVOY_DESCRIPTORS,
    ENVOY_OVER_LIMIT,
    ENVOY_NEAR_LIMIT,
    ENVOY_SHADOW,
    ENVOY_INVALID_ADDRESSES,
    ENVOY_CALLS,
    ENVOY_UNKNOWN_DOMAIN,
    ENVOY_ERRORS,
    ENVOY_CALL_DURATION_SECONDS,
    TLS_RELOADS,
    TLS_RELOAD_FAILING,
    TLS_CERTIFICATE_EXPIRY_SECONDS,
    TLS_HANDSHAKE_FAILURES,
    EVENTS_WRITTEN,
    EVENTS_DROPPED,
];

/// Gives the recorder every description of [`METRICS`].
pub(super) fn describe_all() {
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

#[cfg(test)]
mod tests {
    use super::{Kind, METRICS};

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
            // The table's row starts as the catalogue says: type, labels,
            // then the help text (which the docs may go on from).
            let labels: Vec<String> = d
                .labels
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(|l| format!("`{l}`"))
                .collect();
            let row = format!(
                "| `{}` | {} | {} | {}",
                d.name,
                d.kind.as_str(),
                labels.join(", "),
                d.help
            );
            assert!(
                docs.contains(&row),
                "docs/observability.md's row of {} differs from its constant: {row}",
                d.name
            );
            assert_eq!(
                d.name.ends_with("_total"),
                d.kind == Kind::Counter,
                "{}: counters, and only they, end in _total",
                d.name
            );
        }
    }
}
