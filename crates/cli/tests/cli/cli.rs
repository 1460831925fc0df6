//! The `charon` binary's own behaviour: `config check` and `simulate` on
//! hostile input. The documentation held to the binary and the repository
//! and the house check on the workspace's source, once beside these, are
//! the binary's [`crate::docs`] and [`crate::house`] modules.

use std::io::Write;

use crate::support::{charon, simulate_in, simulate_raw};

#[test]
fn config_check_prints_the_normalized_configuration() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    write!(
        file,
        "resources:\n  - {{ name: a, kind: rate, tiers: [ {{ limit: 2, window: 2s, active: 5s }}, {{ limit: 1, window: 1s, active: 0s }} ] }}\n"
    )
    .expect("write");
    let out = charon()
        .args(["config", "check"])
        .arg(file.path())
        .output()
        .expect("run");
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        stdout.contains("active: 4s"),
        "trimmed to whole windows:\n{stdout}"
    );
    assert_eq!(
        stdout.matches("limit:").count(),
        1,
        "the tier with active 0s is gone:\n{stdout}"
    );
    let stderr = String::from_utf8(out.stderr).expect("utf-8");
    assert!(
        stderr.contains("resources[0].tiers[0].active: 5s trimmed to 4s"),
        "{stderr}"
    );
    assert!(
        stderr.contains("resources[0].tiers[1]: removed"),
        "{stderr}"
    );
}

#[test]
fn config_check_lists_every_error_and_fails() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    write!(
        file,
        "resources:\n  - {{ name: a, kind: rate, tiers: [] }}\n  - {{ name: b, kind: rate, tiers: [ {{ limit: 1, window: 1x }} ], hard_limt: 3 }}\n"
    )
    .expect("write");
    let out = charon()
        .args(["config", "check"])
        .arg(file.path())
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).expect("utf-8");
    assert!(
        stderr.contains("resources[1].tiers[0].window: \"1x\" is not a duration"),
        "{stderr}"
    );
    assert!(
        stderr.contains("resources[1].hard_limt: unknown field"),
        "{stderr}"
    );
}

/// `charon config check` of a file holding `text`: success,
/// stdout and stderr.
fn config_check(text: &str) -> (bool, String, String) {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(text.as_bytes()).expect("write");
    let out = charon()
        .args(["config", "check"])
        .arg(file.path())
        .output()
        .expect("run");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("utf-8"),
        String::from_utf8(out.stderr).expect("utf-8"),
    )
}

#[test]
fn config_check_accepts_buckets_windows_queues_soft_limits_and_bans() {
    let text = r#"
resources:
  - name: acme/new-orders
    kind: bucket
    burst: 300
    count: 300
    period: 180m
    soft_limit: 80%
    domains: { "12345678": { count: 600 } }
  - name: edge/login
    kind: window
    algorithm: sliding_counter
    limit: 2000
    window: 20m
    ban: 1h
  - name: batch/exports
    kind: queue
    rate: 10
    period: 1s
    size: 50
  - name: api/search
    kind: rate
    soft_limit: 90%
    ban: 15m
    tiers: [ { limit: 5, window: 1s } ]
"#;
    let (ok, stdout, stderr) = config_check(text);
    assert!(ok, "{stderr}");
    assert!(stderr.is_empty(), "nothing to normalize: {stderr}");
    for field in [
        "kind: bucket",
        "period: 3h",
        "soft_limit: 80%",
        "\"12345678\":",
        "algorithm: sliding_counter",
        "ban: 1h",
        "kind: queue",
        "size: 50",
        "ban: 15m",
    ] {
        assert!(stdout.contains(field), "{field} in:\n{stdout}");
    }
    // What it prints is a configuration it accepts, unchanged.
    let (ok, again, _) = config_check(&stdout);
    assert!(ok);
    assert_eq!(again, stdout);
}

#[test]
fn config_check_prints_the_exact_path_of_bad_values_of_the_new_kinds() {
    let (ok, stdout, stderr) = config_check(
        "resources:\n  - { name: a, kind: rate, tiers: [] }\n  - { name: b, kind: queue, rate: 1, period: 1s, size: 0 }\n  - { name: c, kind: bucket, burst: 1, count: 1, period: 0s, soft_limit: 101% }\n  - { name: d, kind: window, algorithm: fixed, limit: 9007199254740992, window: 1m, domains: { x: { ban: 0s } } }\n",
    );
    assert!(!ok);
    assert!(stdout.is_empty());
    for want in [
        "resources[1].size: 0 must be at least 1",
        "resources[2].period: \"0s\" must be positive (at least 1ms)",
        "resources[2].soft_limit: \"101%\" must be above 0% and at most 100%",
        "resources[3].limit: 9007199254740992 is too large (at most 9007199254740991)",
        "resources[3].domains.x.ban: \"0s\" must be positive (at least 1ms)",
    ] {
        assert!(stderr.contains(want), "{want} in:\n{stderr}");
    }
}

#[test]
fn config_check_prints_the_envoy_section_and_its_errors_by_path() {
    let text = r#"
resources:
  - { name: api/search, kind: bucket, burst: 10, count: 10, period: 1s }
envoy:
  headers: true
  domains:
    - domain: edge
      descriptors:
        - key: generic_key
          value: search
          descriptors:
            - { key: remote_address, mask: {}, resource: api/search }
        - { key: tenant, rate_limit: { unit: minute, requests_per_unit: 100 }, shadow_mode: true }
        - { key: health, unlimited: true }
"#;
    let (ok, stdout, stderr) = config_check(text);
    assert!(ok, "{stderr}");
    for field in [
        "envoy:",
        "headers: true",
        "domain: edge",
        "ipv6: 48",
        "resource: api/search",
        "unit: minute",
        "unlimited: true",
    ] {
        assert!(stdout.contains(field), "{field} in:\n{stdout}");
    }
    let (ok, again, _) = config_check(&stdout);
    assert!(ok);
    assert_eq!(again, stdout);
    let (ok, stdout, stderr) = config_check(
        "resources: []\nenvoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - { key: a, rate_limit: { unit: fortnight, requests_per_unit: 1 } }\n        - { key: b, value: x, mask: { ipv4: 24 }, resource: nowhere }\n",
    );
    assert!(!ok);
    assert!(stdout.is_empty());
    for want in [
        "envoy.domains[0].descriptors[0].rate_limit.unit: expected second, minute, hour, day, week, month or year, found the string \"fortnight\"",
        "envoy.domains[0].descriptors[1].mask: only a node without a value can have a mask",
    ] {
        assert!(stderr.contains(want), "{want} in:\n{stderr}");
    }
}

#[test]
fn config_check_of_a_missing_file_fails_clearly() {
    let out = charon()
        .args(["config", "check", "/nonexistent/limits.yaml"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/limits.yaml"));
}

#[test]
fn simulate_refuses_an_invalid_configuration() {
    let (lines, status, stderr) = simulate_raw("resources: [ { name: a } ]", b"");
    assert!(!status.success());
    assert!(lines.is_empty());
    assert!(
        stderr.contains("resources[0].kind: is required"),
        "{stderr}"
    );
}

#[test]
fn simulate_on_a_redis_out_of_reach_exits_3_and_a_bad_url_1() {
    let config = "resources: [ { name: api, kind: rate, tiers: [ { limit: 1, window: 1s } ] } ]";
    let (lines, status, stderr) = simulate_in(config, b"", "redis://127.0.0.1:1");
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(lines.is_empty());
    assert!(
        stderr.contains("cannot use the store redis://127.0.0.1:1"),
        "{stderr}"
    );
    let (_, status, stderr) = simulate_in(config, b"", "mysql://x");
    assert_eq!(status.code(), Some(1), "{stderr}");
}

#[test]
fn simulate_survives_random_bytes_with_one_error_line_per_line() {
    // A fixed pseudo-random stream (xorshift) so a failure reproduces.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut input = Vec::new();
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        input.push((x >> 24) as u8);
    }
    input.extend_from_slice(
        b"\n{\"t\": 1, \"op\": \"requ\n{\"t\": 99999999999999999999, \"op\": \"request\"}\n",
    );
    input.extend_from_slice(&[b'x'; 2_000_000]);
    input.extend_from_slice(
        b"\n{\"t\": 1, \"op\": \"request\", \"resource\": \"api\", \"domain\": \"d\"}",
    );
    let expected = input
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .count();
    let config = "resources: [ { name: api, kind: rate, tiers: [ { limit: 1, window: 1s } ] } ]";
    let (lines, status, stderr) = simulate_raw(config, &input);
    assert!(status.success(), "{stderr}");
    assert_eq!(lines.len(), expected);
    let (last, errors) = lines.split_last().expect("lines");
    assert!(errors.iter().all(|l| l["error"] == "client"));
    assert!(errors.iter().any(|l| {
        l["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("line longer than"))
    }));
    assert_eq!(
        last["granted"], 1,
        "the run went on after the bad lines: {last}"
    );
}

#[test]
fn simulate_replays_the_throttler_with_lines_at_the_time_they_happen() {
    let config = "resources: []\nthrottle: { discipline: qps, rate: 10, queue: 1, max_wait: 150ms, default_criticality: NOT_CRITICAL }\n";
    let input = br#"{"t": 0, "op": "arrive", "id": "a", "class": "GET /a"}
{"t": 0, "op": "arrive", "id": "b", "class": "GET /a"}
{"t": 0, "op": "arrive", "id": "c", "class": "GET /a", "critical": true}
{"t": 5, "op": "arrive", "id": "d", "class": "GET /a"}
{"t": 20, "op": "finish", "id": "a", "cpu_ms": 2.5}
{"t": 30, "op": "leave", "id": "c"}
{"t": 40, "op": "arrive", "id": "e", "class": "GET /a", "critical": true}
{"t": 50, "op": "arrive", "id": "f", "class": "GET /a", "critical": true}
"#;
    assert_eq!(
        crate::support::simulate_text(config, input),
        [
            r#"{"t":0,"id":"a","outcome":"started","predicted_ms":5.0}"#,
            r#"{"t":0,"id":"b","outcome":"queued","predicted_ms":5.0}"#,
            r#"{"t":0,"id":"c","outcome":"queued","predicted_ms":5.0}"#,
            r#"{"t":0,"id":"b","outcome":"evicted","retry_after_ms":100}"#,
            r#"{"t":5,"id":"d","outcome":"rejected","predicted_ms":5.0,"retry_after_ms":95}"#,
            r#"{"t":20,"id":"a","class":"GET /a","predicted_ms":2.5}"#,
            r#"{"t":30,"id":"c","outcome":"left"}"#,
            r#"{"t":40,"id":"e","outcome":"queued","predicted_ms":2.5}"#,
            r#"{"t":50,"id":"f","outcome":"rejected","predicted_ms":2.5,"retry_after_ms":50}"#,
            r#"{"t":100,"id":"e","outcome":"started"}"#,
        ]
    );
    // Without a throttle: section the throttler's ops are client errors.
    let (lines, _, _) = simulate_raw(
        "resources: []\n",
        br#"{"t": 0, "op": "arrive", "id": "a", "class": "x"}"#,
    );
    assert_eq!(lines[0]["error"], "client");
    assert!(
        lines[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no `throttle:` section")
    );
}

#[test]
fn sidecar_refuses_a_bad_start_with_the_reason() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("c.yaml");
    let run = |args: &[&str]| {
        let out = charon().arg("sidecar").args(args).output().expect("run");
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let path = config.to_str().expect("utf-8 path");
    let e = run(&["--config", path, "--upstream", "http://127.0.0.1:1"]);
    assert!(e.contains("cannot read"), "{e}");
    std::fs::write(&config, "resources: []\n").expect("write");
    let e = run(&["--config", path, "--upstream", "http://127.0.0.1:1"]);
    assert!(e.contains("no `throttle:` section"), "{e}");
    std::fs::write(
        &config,
        "resources: []\nthrottle: { discipline: qps, rate: 0, queue: 1 }\n",
    )
    .expect("write");
    let e = run(&["--config", path, "--upstream", "http://127.0.0.1:1"]);
    assert!(e.contains("throttle.rate: 0 is out of range"), "{e}");
    std::fs::write(
        &config,
        "resources: []\nthrottle: { discipline: qps, rate: 1, queue: 1 }\n",
    )
    .expect("write");
    let e = run(&["--config", path, "--upstream", "127.0.0.1:8080"]);
    assert!(e.contains("must start with http://"), "{e}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let e = run(&[
        "--config",
        path,
        "--upstream",
        "http://127.0.0.1:1",
        "--listen",
        &addr,
    ]);
    assert!(
        e.contains(&format!("cannot listen on {addr} (--listen)")),
        "{e}"
    );
}
