//! Observing a decision, in one step: a [`Decision`] is made when a
//! protocol's handler starts deciding (its operation, the span naming its
//! resource and domain, its start time) and ended once, which records the
//! span's outcome, the decision metrics and the decision event together.
//! Every protocol observes its decisions through it: `charon.v1`'s unary
//! calls (`grpc/mod.rs`), the session stream's operations
//! (`grpc/session.rs`), `charon.v1.Capacity` and Envoy.
//!
//! What only some protocols add is a helper beside the ending:
//! [`Decision::count_flags`] (the warning and ban counters of a rate
//! reply), [`Decision::learned_resource`] (a seize learns its resource
//! from the store, after its span was opened), [`Decision::end_each`] (a
//! capacity call counts one decision per resource it names).
//!
//! Envoy's calls differ by design: a call is counted by its own metrics
//! (`charon_envoy_calls_total`, `charon_envoy_call_duration_seconds`, its
//! errors by class), not as a decision of `charon_decisions_total`, and
//! its events are one per
//! descriptor, made where the call's batch is read. It ends its
//! decision's span only ([`Decision::end_span`]) and records the rest
//! itself.
//!
//! Nothing here allocates: the event is built by a closure given the time
//! (generic, never boxed), and only when the event stream is on.

use std::future::Future;
use std::time::{Duration, Instant};

use charon_limiter::LimitError;
use charon_proto::v1;
use tracing::{Instrument, Span};

use crate::ServerState;
use crate::events::Event;
use crate::metrics::{self, Outcome};
use crate::trace;

/// One decision being observed, from its start until [`Decision::end`]
/// (or another ending) records it. Dropped without an ending, it records
/// nothing, and its span ends without an outcome.
#[must_use = "a decision is recorded when it is ended"]
pub(crate) struct Decision<'s> {
    state: &'s ServerState,
    operation: &'static str,
    started: Instant,
    /// Its decision span; `Span::none()` for a decision observed without
    /// one.
    span: Span,
}

impl<'s> Decision<'s> {
    /// A decision of `operation` on `resource` for `domain` starting now,
    /// with its decision span.
    pub(crate) fn start(
        state: &'s ServerState,
        operation: &'static str,
        resource: &str,
        domain: &str,
    ) -> Self {
        let started = Instant::now();
        Self {
            state,
            operation,
            started,
            span: trace::decision(operation, resource, domain),
        }
    }

    /// A decision of `operation` starting now, observed without a span
    /// (a reserve that waited for a copy; a session's operation refused
    /// before it was read).
    pub(crate) fn unspanned(state: &'s ServerState, operation: &'static str) -> Self {
        Self {
            state,
            operation,
            started: Instant::now(),
            span: Span::none(),
        }
    }

    /// The same decision, its duration counted from `started` (a call
    /// whose duration includes its token check, a reserve that waited).
    pub(crate) fn since(self, started: Instant) -> Self {
        Self { started, ..self }
    }

    /// Its operation.
    pub(crate) fn operation(&self) -> &'static str {
        self.operation
    }

    /// Its span, for what is decided inside it (the Redis calls beneath).
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Runs `decide` inside the decision's span, or fails as a server
    /// that never loaded a configuration does (without polling it).
    pub(crate) async fn decide<T>(
        &self,
        decide: impl Future<Output = Result<T, LimitError>>,
    ) -> Result<T, LimitError> {
        self.state.check_configured()?;
        decide.instrument(self.span.clone()).await
    }

    /// Counts a rate reply's warning and ban, labelled by `resource` as
    /// the decision metrics label it.
    pub(crate) fn count_flags(&self, resource: &str, outcome: Outcome, reply: &v1::RateReply) {
        if reply.warning || reply.banned {
            let decisions = self.state.decisions();
            let label = metrics::resource_label(decisions.config(), resource, outcome);
            metrics::reply_flags(self.operation, &label, reply.warning, reply.banned);
        }
    }

    /// Records on the span the resource the decision learned as it was
    /// decided (a seize's, which only the store knew).
    pub(crate) fn learned_resource(&self, resource: &str) {
        trace::resource(&self.span, resource);
    }

    /// Ends it: the span's outcome (and the copies `granted`, if any), the
    /// decision metrics of `resource`, and the event `event` builds from
    /// the time if the event stream is on.
    pub(crate) fn end(
        self,
        resource: &str,
        outcome: Outcome,
        granted: Option<u64>,
        event: impl FnOnce(u64) -> Event,
    ) {
        let elapsed = self.close_span(outcome, granted);
        self.state
            .decisions()
            .observe(self.operation, resource, outcome, elapsed);
        self.state.emit(event);
    }

    /// Ends a decision over several resources (a capacity call): the
    /// span's outcome once, then for each resource its decision metrics
    /// and the event its closure builds.
    pub(crate) fn end_each<'r, E>(
        self,
        outcome: Outcome,
        each: impl IntoIterator<Item = (&'r str, E)>,
    ) where
        E: FnOnce(u64) -> Event,
    {
        let elapsed = self.close_span(outcome, None);
        let decisions = self.state.decisions();
        for (resource, event) in each {
            decisions.observe(self.operation, resource, outcome, elapsed);
            self.state.emit(event);
        }
    }

    /// Ends the span only, and says how long the decision took: for a
    /// protocol that counts its calls with metrics of its own (Envoy).
    pub(crate) fn end_span(self, outcome: Outcome) -> Duration {
        self.close_span(outcome, None)
    }

    fn close_span(&self, outcome: Outcome, granted: Option<u64>) -> Duration {
        trace::outcome(&self.span, outcome, granted);
        self.started.elapsed()
    }
}

/// The metrics' outcome of a decision's result: `ok` says it for a reply.
pub(crate) fn outcome_of<T>(
    result: &Result<T, LimitError>,
    ok: impl FnOnce(&T) -> Outcome,
) -> Outcome {
    match result {
        Ok(reply) => ok(reply),
        Err(e) => error_outcome(e),
    }
}

/// The metrics' outcome of an error: its class.
pub(crate) fn error_outcome(e: &LimitError) -> Outcome {
    match e {
        LimitError::Client(_) => Outcome::ClientError,
        LimitError::Server(_) => Outcome::ServerError,
    }
}

#[cfg(test)]
mod tests {
    use charon_core::ClientError;
    use charon_limiter::LimitError;

    use super::outcome_of;
    use crate::NotConfigured;
    use crate::metrics::Outcome;

    #[test]
    fn an_outcome_is_the_reply_s_or_the_error_s_class() {
        let granted: Result<u64, LimitError> = Ok(3);
        assert_eq!(
            outcome_of(&granted, |&n| Outcome::of_grant(n, 5)),
            Outcome::Partial
        );
        let client: Result<u64, LimitError> = Err(ClientError::invalid("bad").into());
        assert_eq!(
            outcome_of(&client, |_| Outcome::Granted),
            Outcome::ClientError
        );
        let server: Result<u64, LimitError> = Err(NotConfigured.into());
        assert_eq!(
            outcome_of(&server, |_| Outcome::Granted),
            Outcome::ServerError
        );
    }
}
