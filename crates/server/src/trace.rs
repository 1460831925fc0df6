//! Spans for OpenTelemetry (`charon serve --otlp-endpoint`): one per
//! decision, with its operation, resource, domain and outcome as
//! attributes; the Redis store adds one per script call beneath it.
//!
//! They are `TRACE` spans of the target [`TRACE_TARGET`], which no log
//! filter of `charon serve` enables (its `RUST_LOG` filter applies to the
//! log lines only): without an OTLP exporter, creating one is a check of
//! the global maximum level and nothing else, and the log output does not
//! change.

use tracing::Span;
use tracing::field::Empty;

use crate::metrics::Outcome;

pub use charon_store::TRACE_TARGET;

/// The span of one decision; its outcome is filled in by [`outcome`]
/// (through `observe::Decision`, which ends every decision).
pub(crate) fn decision(operation: &'static str, resource: &str, domain: &str) -> Span {
    tracing::trace_span!(
        target: "charon::otel",
        "charon.decision",
        charon.operation = operation,
        charon.resource = resource,
        charon.domain = domain,
        charon.outcome = Empty,
        charon.granted = Empty,
    )
}

/// Records how a decision ended (and how many copies it granted, if any).
pub(crate) fn outcome(span: &Span, outcome: Outcome, granted: Option<u64>) {
    if span.is_disabled() {
        return;
    }
    span.record("charon.outcome", outcome.label());
    if let Some(granted) = granted {
        span.record("charon.granted", granted);
    }
}

/// Records the resource a decision learned as it was decided (a seize's,
/// which only the store knew).
pub(crate) fn resource(span: &Span, resource: &str) {
    if span.is_disabled() {
        return;
    }
    span.record("charon.resource", resource);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_target_is_the_one_the_spans_use() {
        // The span macros need a literal; the exporter's filter uses the
        // constant.
        assert_eq!(super::TRACE_TARGET, "charon::otel");
    }
}
