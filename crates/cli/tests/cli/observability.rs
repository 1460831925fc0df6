//! Observability conventions against a real `charon serve` on a private
//! Redis: every metric family on `/metrics` has `# HELP` and `# TYPE`, and
//! every metric that the Grafana dashboard (`deploy/grafana/charon.json`)
//! and the Prometheus rules (`deploy/prometheus/charon-rules.yml`) query
//! is one the server exports, so renaming a metric fails here.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::support::{bin, holder, strict_client};
use charon_testkit::{CharonProcess, RedisServer};
use serde_json::Value;

/// A rate resource that warns, rejects and bans, a copy resource for a
/// session, and a lease resource for the lease gauges.
const LIMITS: &str = r"
resources:
  - name: api/tight
    kind: rate
    soft_limit: 50%
    ban: 1m
    tiers:
      - { limit: 2, window: 1m }
  - name: sandbox/vm
    kind: copy
    domain_limit: 2
  - name: db/queries
    kind: lease
    capacity: 100
    algorithm: fair_share
    lease_length: 60s
    refresh_interval: 5s
";

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// A server on a private Redis after some traffic (grants, a warning, a
/// rejection, a ban, a client error, a session holding copies), and what
/// its `/metrics` says meanwhile. The holder is killed before returning.
async fn scraped_after_traffic() -> (RedisServer, CharonProcess, String) {
    let redis = RedisServer::start();
    let server = CharonProcess::start(bin(), LIMITS, &["--store", &redis.url()]);
    let client = strict_client(&server);
    let mut granted = Vec::new();
    for _ in 0..4 {
        let g = client
            .request("api/tight", "t1")
            .send()
            .await
            .expect("request");
        granted.push(g.granted);
    }
    assert_eq!(granted, [1, 1, 0, 0], "two granted, then rejected");
    assert!(client.request("api/nope", "t1").send().await.is_err());
    let mut hold = holder(&server, "sandbox/vm", "t1", 2);
    let (status, metrics) = server.http_get("/metrics").expect("/metrics");
    let _ = hold.kill();
    let _ = hold.wait();
    assert_eq!(status, 200);
    (redis, server, metrics)
}

/// A `charon sidecar` process, killed when dropped.
struct SidecarProcess(std::process::Child);

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `/metrics` of a `charon sidecar` in front of `server`'s HTTP port,
/// after requests admitted at once, queued and then admitted, and refused.
fn sidecar_scraped_after_traffic(server: &CharonProcess) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sidecar.yaml");
    std::fs::write(
        &config,
        "resources: []\nthrottle: { discipline: qps, rate: 2, queue: 1, max_wait: 5s }\n",
    )
    .unwrap();
    let (proxy, admin) = (charon_testkit::free_port(), charon_testkit::free_port());
    let _sidecar = SidecarProcess(
        std::process::Command::new(bin())
            .args(["sidecar", "--config"])
            .arg(&config)
            .args([
                "--upstream",
                &format!("http://127.0.0.1:{}", server.http_port),
            ])
            .args(["--listen", &format!("127.0.0.1:{proxy}")])
            .args(["--http-listen", &format!("127.0.0.1:{admin}")])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while charon_testkit::http_get(admin, "/healthz").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sidecar did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let codes: Vec<u16> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..3)
            .map(|_| s.spawn(|| charon_testkit::http_get(proxy, "/healthz").map_or(0, |r| r.0)))
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert!(codes.contains(&200) && codes.contains(&429), "{codes:?}");
    let (status, metrics) = charon_testkit::http_get(admin, "/metrics").expect("/metrics");
    assert_eq!(status, 200);
    metrics
}

/// Families by name: their `# TYPE`, whether they have `# HELP`, and the
/// names of their samples.
#[derive(Debug, Default)]
struct Exposition {
    types: BTreeMap<String, String>,
    helps: BTreeSet<String>,
    samples: BTreeMap<String, f64>,
}

impl Exposition {
    fn parse(text: &str) -> Self {
        let mut e = Self::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("#"), Some("HELP"), Some(name)) => {
                    e.helps.insert(name.to_owned());
                }
                (Some("#"), Some("TYPE"), Some(name)) => {
                    let kind = words.next().unwrap_or("").to_owned();
                    e.types.insert(name.to_owned(), kind);
                }
                (Some(first), ..) if !first.starts_with('#') => {
                    let name = line.split(['{', ' ']).next().unwrap_or_default().to_owned();
                    let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
                    // Summed over labels: enough to tell zero from not.
                    *e.samples.entry(name).or_default() += value;
                }
                _ => {}
            }
        }
        e
    }

    /// The family a sample belongs to: itself, or a histogram's.
    fn family<'a>(&self, sample: &'a str) -> &'a str {
        if self.types.contains_key(sample) {
            return sample;
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = sample.strip_suffix(suffix)
                && self.types.get(base).map(String::as_str) == Some("histogram")
            {
                return base;
            }
        }
        sample
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_has_help_and_type() {
    let (_redis, _server, text) = scraped_after_traffic().await;
    let e = Exposition::parse(&text);
    assert!(e.samples.len() > 15, "{text}");
    let mut missing = Vec::new();
    for sample in e.samples.keys() {
        let family = e.family(sample);
        if !e.types.contains_key(family) || !e.helps.contains(family) {
            missing.push(family.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "families without HELP or TYPE: {missing:?}\n{text}"
    );
    // What the traffic and the start-up registered.
    for (sample, at_least) in [
        ("charon_decisions_total", 6.0),
        ("charon_decision_duration_seconds_count", 6.0),
        ("charon_warnings_total", 1.0),
        ("charon_banned_total", 1.0),
        ("charon_sessions_open", 1.0),
        ("charon_copies_held", 2.0),
        ("charon_store_up", 1.0),
        ("charon_config_loaded", 1.0),
        ("charon_lease_capacity", 100.0),
        ("charon_errors_total", 1.0),
    ] {
        let value = e.samples.get(sample).copied();
        assert!(
            value.is_some_and(|v| v >= at_least),
            "{sample} = {value:?}, expected at least {at_least}\n{text}"
        );
    }
    // Alerts see the first event of these only if they start at zero.
    for sample in [
        "charon_store_errors_total",
        "charon_store_dead_servers_removed_total",
        "charon_config_reloads_total",
        "charon_config_stale",
    ] {
        assert_eq!(e.samples.get(sample), Some(&0.0), "{sample}\n{text}");
    }
    assert!(
        text.contains(r#"charon_decisions_total{operation="request",resource="api/tight",outcome="rejected"} 2"#),
        "{text}"
    );
    assert_eq!(e.types["charon_decision_duration_seconds"], "histogram");
    assert_eq!(e.types["charon_sessions_open"], "gauge");
}

/// PromQL words followed by a list of labels, not metric names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// PromQL words that are not metric names (besides [`LABEL_LISTS`]): functions are followed by `(`
/// and skipped by that; these are the operators and modifiers.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    // Aggregation operators, which may be followed by `by (…)` instead
    // of their parenthesis.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names an expression reads: identifiers outside label
/// matchers (`{…}`), ranges (`[…]`), strings and grouping lists (`by (…)`),
/// that are neither functions (followed by `(`) nor keywords. In Grafana's
/// `label_values(metric, label)`, only the metric.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Set after a grouping keyword: the next parenthesised list is labels.
    let mut labels_next = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' | '[' | '"' | '\'' => {
                let close = match c {
                    '{' => '}',
                    '[' => ']',
                    other => other,
                };
                i += 1;
                while i < chars.len() && chars[i] != close {
                    i += 1;
                }
                i += 1;
            }
            '(' if labels_next => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                labels_next = false;
                i += 1;
            }
            c if c.is_ascii_digit() || c == '.' => {
                i += 1;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric()
                        || chars[i] == '.'
                        || ((chars[i] == '-' || chars[i] == '+')
                            && matches!(chars[i - 1], 'e' | 'E')))
                {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' => {
                let start = i;
                // A Grafana variable (`$instance`) is one word with its `$`.
                i += 1;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let call = j < chars.len() && chars[j] == '(';
                let lower = word.to_ascii_lowercase();
                if LABEL_LISTS.contains(&lower.as_str()) {
                    labels_next = true;
                } else if word == "label_values" && call {
                    // label_values(metric, label): the metric alone.
                    let inner: String = chars[j + 1..]
                        .iter()
                        .take_while(|&&c| c != ',' && c != ')')
                        .collect();
                    names.extend(metric_names(&inner));
                    while i < chars.len() && chars[i] != ')' {
                        i += 1;
                    }
                } else if !call && !word.starts_with('$') && !KEYWORDS.contains(&lower.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_metric_name_extractor_strips_functions_labels_and_ranges() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, operation) (rate(charon_decision_duration_seconds_bucket{instance=~"$instance", x="a b"}[$__rate_interval]))) / clamp_min(sum without (class) (up), 1e-9) > 0.05 and on (instance) charon_store_up == bool 0"#,
    );
    let expected: BTreeSet<String> = [
        "charon_decision_duration_seconds_bucket",
        "up",
        "charon_store_up",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(names, expected);
    assert_eq!(
        metric_names("label_values(charon_config_version, instance)"),
        BTreeSet::from(["charon_config_version".to_owned()])
    );
}

/// Every string under a key named `expr`, `query` or `definition` (and
/// `query.query`), anywhere in a JSON document.
fn expressions(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", Value::String(s)) => {
                        // The datasource variable's `query` is a plugin id.
                        if s != "prometheus" {
                            out.push(s.clone());
                        }
                    }
                    _ => expressions(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| expressions(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alert_rules_query_only_exported_metrics() {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("deploy/grafana/charon.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let rules: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo_file("deploy/prometheus/charon-rules.yml")).unwrap(),
    )
    .expect("the rules are YAML");

    let mut dashboard_exprs = Vec::new();
    expressions(&dashboard, &mut dashboard_exprs);
    let mut rule_exprs = Vec::new();
    expressions(&rules, &mut rule_exprs);
    // The dashboard's datasource is a variable, not a fixed uid.
    assert!(dashboard.to_string().contains(r#""uid":"${datasource}""#));
    assert!(dashboard_exprs.len() >= 20, "{dashboard_exprs:?}");
    let alerts = rules["groups"][0]["rules"].as_array().unwrap();
    assert!(alerts.len() >= 6);
    for alert in alerts {
        assert!(
            alert["annotations"]["summary"].is_string()
                && alert["annotations"]["description"].is_string(),
            "{alert}"
        );
    }

    let (_redis, server, text) = scraped_after_traffic().await;
    // The throttler's row: what a sidecar exports.
    let text = text + &sidecar_scraped_after_traffic(&server);
    let mut exported = Exposition::parse(&text);
    // The certificate's metrics exist only under TLS: a server with one.
    let pki = charon_testkit::TestPki::new();
    let tls_server = pki.serve(
        bin(),
        LIMITS,
        (&pki.server_cert(), &pki.server_key()),
        &[],
        false,
    );
    let (_, tls_text) = tls_server.http_get("/metrics").expect("/metrics over TLS");
    exported
        .samples
        .extend(Exposition::parse(&tls_text).samples);
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    for (file, exprs) in [("dashboard", &dashboard_exprs), ("rules", &rule_exprs)] {
        for expr in exprs {
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{file}: no metric in {expr}");
            for name in names {
                if !exported.samples.contains_key(&name) {
                    unknown.push(format!("{file}: {name} in {expr}"));
                }
                used.insert(name);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "queried but not exported:\n{}\n\n/metrics:\n{text}",
        unknown.join("\n")
    );
    // What the issue asks the dashboard to show.
    for name in [
        "charon_decisions_total",
        "charon_decision_duration_seconds_bucket",
        "charon_sessions_open",
        "charon_copies_held",
        "charon_store_errors_total",
        "charon_config_version",
        "charon_warnings_total",
        "charon_banned_total",
        "charon_lease_leased",
        "charon_throttle_requests_total",
        "charon_throttle_queue_length",
        "charon_throttle_queue_units",
        "charon_throttle_wait_seconds_bucket",
        "charon_throttle_cost_predicted_microseconds_total",
        "charon_throttle_cost_measured_microseconds_total",
    ] {
        assert!(used.contains(name), "{name} is on no panel or rule");
    }
}

/// The sum of the samples of `name` on `server`'s `/metrics`, if any.
fn sample(server: &CharonProcess, name: &str) -> Option<f64> {
    let (_, text) = server.http_get("/metrics")?;
    Exposition::parse(&text).samples.get(name).copied()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_configuration_service_shows_as_failed_reloads_and_no_configuration() {
    // Nothing listens there.
    let url = format!("http://127.0.0.1:{}", charon_testkit::free_port());
    let server = CharonProcess::start_args(
        bin(),
        &["--config-url", &url, "--config-refresh", "100ms"],
        "/healthz",
    );
    let seen = crate::support::within(std::time::Duration::from_secs(10), async || {
        sample(&server, "charon_config_stale") == Some(1.0)
            && sample(&server, "charon_config_reloads_total").is_some_and(|n| n >= 2.0)
    })
    .await;
    let (_, text) = server.http_get("/metrics").unwrap();
    assert!(seen.is_some(), "{text}");
    assert!(
        text.contains("charon_config_loaded 0\n"),
        "never loaded: {text}"
    );
    assert!(
        text.contains(r#"charon_config_reloads_total{result="applied"} 0"#),
        "{text}"
    );
}
