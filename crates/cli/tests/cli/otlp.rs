//! OpenTelemetry traces of a real `charon serve --otlp-endpoint`, received
//! by a real OTLP/gRPC collector in this test process (the
//! `opentelemetry-proto` service, decoding what the server exports): a
//! span per decision with its resource, domain, operation and outcome, a
//! span per Redis script call beneath it; and a server pointed at a
//! collector that is not there keeps deciding.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{bin, holder, strict_client, within};
use charon_client::Source;
use charon_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use charon_proto::v1;
use charon_proto::v1::capacity_client::CapacityClient;
use charon_testkit::{CharonProcess, RedisServer, free_port};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;

const LIMITS: &str = r"
resources:
  - name: api/tight
    kind: rate
    tiers:
      - { limit: 2, window: 1m }
  - name: sandbox/vm
    kind: copy
    domain_limit: 2
  - { name: db/qps, kind: lease, capacity: 10, algorithm: fair_share,
      lease_length: 1m, refresh_interval: 10s, learning_mode: 0s }
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          resource: api/tight
";

/// What the collector received: every span, and the `service.name` of
/// every batch's resource.
#[derive(Debug, Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for batch in request.into_inner().resource_spans {
            if let Some(resource) = &batch.resource
                && let Some(name) = value(&resource.attributes, "service.name")
            {
                self.services.lock().unwrap().push(name);
            }
            for scope in batch.scope_spans {
                self.spans.lock().unwrap().extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Serves OTLP/gRPC on a free loopback port until the test ends.
    async fn start() -> (Self, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = Self::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (collector, addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// An attribute's value as text (strings, integers, booleans).
fn value(attributes: &[KeyValue], key: &str) -> Option<String> {
    let v = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    match v.value.as_ref()? {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    value(&span.attributes, key)
}

/// The decision span of `operation` on `resource` for `domain` that ended
/// with `outcome`.
fn decision<'a>(
    spans: &'a [Span],
    operation: &str,
    resource: &str,
    domain: &str,
    outcome: &str,
) -> Option<&'a Span> {
    spans.iter().find(|s| {
        s.name == "charon.decision"
            && attr(s, "charon.operation").as_deref() == Some(operation)
            && attr(s, "charon.resource").as_deref() == Some(resource)
            && attr(s, "charon.domain").as_deref() == Some(domain)
            && attr(s, "charon.outcome").as_deref() == Some(outcome)
    })
}

/// The Redis script calls made for `parent`.
fn redis_children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| {
            s.name == "redis.evalsha"
                && s.parent_span_id == parent.span_id
                && s.trace_id == parent.trace_id
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_and_their_redis_calls_arrive_as_spans() {
    let (collector, addr) = Collector::start().await;
    let redis = RedisServer::start();
    let endpoint = format!("http://{addr}");
    let server = CharonProcess::start(
        bin(),
        LIMITS,
        &["--store", &redis.url(), "--otlp-endpoint", &endpoint],
    );
    let client = strict_client(&server);
    let mut granted = Vec::new();
    for _ in 0..3 {
        granted.push(
            client
                .request("api/tight", "t1")
                .send()
                .await
                .unwrap()
                .granted,
        );
    }
    assert_eq!(granted, [1, 1, 0]);
    let mut hold = holder(&server, "sandbox/vm", "t7", 2);
    // Envoy's protocol: one decision span per call, outcome of the call.
    let mut envoy = RateLimitServiceClient::connect(server.endpoint())
        .await
        .unwrap();
    for _ in 0..3 {
        envoy
            .should_rate_limit(crate::support::envoy_request("edge", "tenant", "t9"))
            .await
            .unwrap();
    }
    // Doorman's capacity protocol: a span per call too.
    let mut capacity = CapacityClient::connect(server.endpoint()).await.unwrap();
    let lease = capacity
        .get_capacity(v1::GetCapacityRequest {
            client_id: "c1".to_owned(),
            resources: vec![v1::ResourceWant {
                resource: "db/qps".to_owned(),
                wants: 4.0,
                has: 0.0,
                subclients: 0,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(lease.leases[0].capacity, 4.0);
    let released = capacity
        .release_capacity(v1::ReleaseCapacityRequest {
            client_id: "c1".to_owned(),
            resources: vec!["db/qps".to_owned()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, [true]);

    let found = within(Duration::from_secs(20), async || {
        let spans = collector.spans();
        let wanted = [
            decision(&spans, "request", "api/tight", "t1", "granted"),
            decision(&spans, "request", "api/tight", "t1", "rejected"),
            decision(&spans, "reserve", "sandbox/vm", "t7", "granted"),
            decision(&spans, "envoy", "", "edge", "granted"),
            decision(&spans, "envoy", "", "edge", "rejected"),
            decision(&spans, "get_capacity", "db/qps", "c1", "granted"),
            decision(&spans, "release_capacity", "db/qps", "c1", "granted"),
        ];
        wanted
            .iter()
            .all(|d| d.is_some_and(|d| !redis_children(&spans, d).is_empty()))
    })
    .await;
    let spans = collector.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert!(found.is_some(), "spans received: {names:?}");

    let rejected = decision(&spans, "request", "api/tight", "t1", "rejected").unwrap();
    assert_eq!(attr(rejected, "charon.granted").as_deref(), Some("0"));
    let reserve = decision(&spans, "reserve", "sandbox/vm", "t7", "granted").unwrap();
    assert_eq!(attr(reserve, "charon.granted").as_deref(), Some("2"));
    let calls = redis_children(&spans, rejected);
    let call = calls[0];
    assert_eq!(attr(call, "db.system").as_deref(), Some("redis"));
    // A rate decision is rate.lua alone, or batch.lua with others.
    let script = attr(call, "charon.script").unwrap();
    assert!(["rate", "batch"].contains(&script.as_str()), "{script}");
    assert!(call.start_time_unix_nano >= rejected.start_time_unix_nano);
    assert!(call.end_time_unix_nano <= rejected.end_time_unix_nano);
    let reserve_calls = redis_children(&spans, reserve);
    assert!(
        reserve_calls
            .iter()
            .any(|c| attr(c, "charon.script").as_deref() == Some("reserve")),
        "{reserve_calls:?}"
    );
    assert!(
        collector
            .services
            .lock()
            .unwrap()
            .iter()
            .all(|s| s == "charon")
    );
    let _ = hold.kill();
    let _ = hold.wait();

    // The spans are not in the log: its filter does not see them.
    let log = server.log();
    assert!(!log.contains("charon.decision"), "{log}");
    assert!(log.contains("exporting traces (OTLP/gRPC)"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported_and_the_log_is_unchanged() {
    let (collector, _addr) = Collector::start().await;
    let server = CharonProcess::start(bin(), LIMITS, &[]);
    let client = strict_client(&server);
    for _ in 0..3 {
        client.request("api/tight", "t1").send().await.unwrap();
    }
    assert!(collector.spans().is_empty());
    let log = server.log();
    assert!(!log.contains("exporting traces"), "{log}");
    assert!(!log.contains("charon.decision"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_collector_is_gone_keeps_deciding() {
    // Nothing listens there: every export fails at once.
    keeps_deciding(&format!("http://127.0.0.1:{}", free_port())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_collector_stalls_keeps_deciding() {
    // A collector that accepts connections and never reads nor answers:
    // every export waits for its time limit.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.extend(stream.ok());
        }
    });
    keeps_deciding(&format!("http://{addr}")).await;
}

/// A server exporting to `collector` decides 5,600 requests from 8
/// callers at once, counts them, and stops cleanly.
async fn keeps_deciding(collector: &str) {
    let server = CharonProcess::start(
        bin(),
        LIMITS.replace("limit: 2,", "limit: 100000,").as_str(),
        &["--otlp-endpoint", collector],
    );
    let client = strict_client(&server);
    // More spans than the export queue holds (4096), from 8 callers at once.
    let mut callers = Vec::new();
    for c in 0..8 {
        let client = client.clone();
        callers.push(tokio::spawn(async move {
            let mut granted = 0;
            for _ in 0..700 {
                let g = client
                    .request("api/tight", format!("d{c}"))
                    .send()
                    .await
                    .expect("the server keeps answering");
                assert_eq!(g.source, Source::Server);
                granted += g.granted;
            }
            granted
        }));
    }
    let mut granted = 0;
    for caller in callers {
        granted += caller.await.unwrap();
    }
    assert_eq!(granted, 8 * 700);
    let (status, metrics) = server.http_get("/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains(
            r#"charon_decisions_total{operation="request",resource="api/tight",outcome="granted"} 5600"#
        ),
        "{metrics}"
    );
    // And it still stops cleanly: the last export is not waited for long.
    let mut server = server;
    server.signal("TERM");
    let exit = server.wait_exit(Duration::from_secs(15));
    assert_eq!(exit.and_then(|s| s.code()), Some(0), "{}", server.log());
}
