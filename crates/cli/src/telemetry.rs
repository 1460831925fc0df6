//! Logging and, with `--otlp-endpoint`, OpenTelemetry traces for `charon
//! serve`.
//!
//! Log lines go to stderr through the `RUST_LOG` filter (default `info`),
//! as before. Traces are off unless an OTLP endpoint is given: then a
//! second layer exports the spans of the target
//! [`charon_server::trace::TRACE_TARGET`] (one per decision, one per Redis
//! script call) to an OTLP/gRPC collector. Each layer has its own filter,
//! so the log output is the same with or without traces, and without them
//! those `TRACE` spans are disabled by the global maximum level (a load
//! and a compare per span).
//!
//! Export never slows decisions: a finished span is handed to a bounded
//! queue ([`QUEUE`] spans) without waiting, dropped when the queue is
//! full, and a tokio task sends batches with a time limit ([`EXPORT_TIMEOUT`]);
//! a collector that is down or slow only makes that task's sends fail.

use std::time::Duration;

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Spans waiting to be exported; more are dropped (never waited for).
pub const QUEUE: usize = 4096;
/// Spans sent in one export call.
const BATCH: usize = 512;
/// How often the queue is sent when it does not fill a batch first.
const DELAY: Duration = Duration::from_secs(1);
/// The longest one export call may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest the process waits at exit for the last spans to be sent.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(2);

/// The exporter, kept until exit to send what is left.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs logging, and the OTLP exporter if `otlp_endpoint` is given.
/// Must run inside the tokio runtime (the exporter's connection and batch
/// task live there).
pub fn init(otlp_endpoint: Option<&str>) -> anyhow::Result<Telemetry> {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        );
    let provider = otlp_endpoint.map(provider).transpose()?;
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("charon"))
            .with_filter(
                Targets::new().with_target(charon_server::trace::TRACE_TARGET, LevelFilter::TRACE),
            )
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .context("cannot install logging")?;
    if let Some(endpoint) = otlp_endpoint {
        tracing::info!(endpoint, "exporting traces (OTLP/gRPC)");
    }
    Ok(Telemetry { provider })
}

/// A tracer provider exporting to `endpoint` through a bounded batch queue.
fn provider(endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .with_context(|| format!("--otlp-endpoint {endpoint}"))?;
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(QUEUE)
        .with_max_export_batch_size(BATCH)
        .with_scheduled_delay(DELAY)
        .with_max_export_timeout(EXPORT_TIMEOUT)
        .build();
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_batch_config(config)
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("charon")
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build())
}

impl Telemetry {
    /// Sends the spans still queued, waiting at most [`FLUSH_AT_EXIT`]
    /// (a dead collector must not hold the exit up). Call it outside the
    /// runtime, while the runtime still exists: the shutdown waits for
    /// the batch task, which runs there.
    pub fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = provider.shutdown();
            let _ = done.send(());
        });
        let _ = wait.recv_timeout(FLUSH_AT_EXIT);
    }
}
