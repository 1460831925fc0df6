//! The decisions' metrics on the hot path: the outcome of an operation
//! ([`Outcome`]) and the handles of `charon_decisions_total` and
//! `charon_decision_duration_seconds` resolved once per configuration
//! ([`Decisions`]), so a decision costs atomic adds rather than a lookup
//! by name.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use charon_core::config::Config;
use metrics::{Counter, Histogram, counter, histogram};

use super::catalog::{DECISION_DURATION_SECONDS, DECISIONS, ERRORS};
use super::{flags_at_zero, install, observe, resource_label};

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
                    DECISIONS.name,
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
            counter!(ERRORS.name, "operation" => operation, "class" => class).increment(1);
        }
    }
}

/// `charon_decision_duration_seconds` of each hot operation, resolved once
/// for the process (its only label is the operation).
fn durations() -> &'static [Histogram; HOT_OPERATIONS.len()] {
    static DURATIONS: OnceLock<[Histogram; HOT_OPERATIONS.len()]> = OnceLock::new();
    DURATIONS.get_or_init(|| {
        install();
        HOT_OPERATIONS
            .map(|operation| histogram!(DECISION_DURATION_SECONDS.name, "operation" => operation))
    })
}
