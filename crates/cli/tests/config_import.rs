//! `charon config import --from envoy-ratelimit|limitador` through the
//! binary on realistic files (`tests/data/`): the output passes `charon
//! config check` unchanged, what cannot be carried over is listed by path,
//! and the imported configuration decides as the source format documents
//! (the paper's §5.2 messaging example, decided with
//! `charon_core::envoy::Envoy::match_descriptor` and the meters, all or
//! nothing across a call's descriptors as SPEC §11 says).

mod support;

use std::collections::HashMap;
use std::path::PathBuf;

use charon_core::config::{Config, RateLike};
use charon_core::envoy::Matched;
use charon_core::meter::{MeterState, Op};
use charon_core::request::Amount;
use support::charon;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

/// Runs `charon config import --from FORMAT FILES…`: (success, stdout,
/// stderr).
fn import(format: &str, files: &[&str]) -> (bool, String, String) {
    let out = charon()
        .args(["config", "import", "--from", format])
        .args(files.iter().map(|f| data(f)))
        .output()
        .expect("charon runs");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("UTF-8"),
        String::from_utf8(out.stderr).expect("UTF-8"),
    )
}

/// `charon config check` of `yaml` succeeds and prints it unchanged.
fn check_is_stable(yaml: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("imported.yaml");
    std::fs::write(&path, yaml).expect("write");
    let out = charon()
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("charon runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "config check refused it: {stderr}\n{yaml}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), yaml);
}

/// Decides Envoy calls against a configuration with the core's pure
/// functions: every descriptor of a call is decided as a dry run first,
/// and recorded only if all are within their limits (SPEC §11).
struct Decider {
    config: Config,
    states: HashMap<(String, String), MeterState>,
}

impl Decider {
    fn new(yaml: &str) -> Self {
        let (config, _) = Config::from_yaml(yaml).expect("valid");
        Self {
            config,
            states: HashMap::new(),
        }
    }

    /// `true` when the call is OK (every limited descriptor granted).
    fn call(&mut self, now: u64, domain: &str, descriptors: &[&[(&str, &str)]]) -> bool {
        let envoy = self.config.envoy().expect("an envoy: section");
        let mut limited = Vec::new();
        for d in descriptors {
            match envoy
                .match_descriptor(domain, d)
                .expect("a valid descriptor")
            {
                Matched::Limited(l) => {
                    let meter = match l.rate_limit {
                        Some(r) => r.meter().expect("a limit above 0"),
                        None => match self
                            .config
                            .rate_like(l.resource, &l.domain, "request")
                            .expect("a rate-like resource")
                            .0
                        {
                            RateLike::Meter(m) => m,
                            RateLike::Tiers(_) => panic!("tiers are not decided here"),
                        },
                    };
                    limited.push((meter, (l.resource.to_owned(), l.domain.clone())));
                }
                Matched::Unlimited { .. } | Matched::NotLimited => {}
            }
        }
        let one = Amount::new(1, 1).expect("amount");
        let all = limited.iter().all(|(meter, key)| {
            let mut state = self
                .states
                .get(key)
                .copied()
                .unwrap_or_else(|| meter.empty());
            meter
                .decide(&mut state, now, Op::dry_run(one))
                .expect("decides")
                .granted
                == 1
        });
        if all {
            for (meter, key) in limited {
                let state = self.states.entry(key).or_insert_with(|| meter.empty());
                let reply = meter.decide(state, now, Op::request(one)).expect("decides");
                assert_eq!(reply.granted, 1);
            }
        }
        all
    }
}

const DAY: u64 = 86_400_000;
const MARKETING: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
const TO_NUMBER: &[(&str, &str)] = &[("to_number", "2061111111")];

#[test]
fn the_papers_messaging_example_imported_decides_as_envoy_ratelimit_documents() {
    let (ok, yaml, stderr) = import("envoy-ratelimit", &["envoy-ratelimit/messaging.yaml"]);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "", "nothing is lost from this file");
    check_is_stable(&yaml);
    let mut d = Decider::new(&yaml);
    let t = 1_000;
    // A marketing message sends both descriptors (its type and number, and
    // the number alone): 5 a day.
    for i in 0..5 {
        assert!(
            d.call(t + i, "messaging", &[MARKETING, TO_NUMBER]),
            "marketing {i}"
        );
    }
    assert!(
        !d.call(t + 5, "messaging", &[MARKETING, TO_NUMBER]),
        "the 6th marketing message"
    );
    // The refused call recorded nothing: 95 more messages of other types
    // reach the 100 a day to that number.
    for i in 0..95 {
        assert!(d.call(t + 10 + i, "messaging", &[TO_NUMBER]), "message {i}");
    }
    assert!(
        !d.call(t + 200, "messaging", &[TO_NUMBER]),
        "the 101st message"
    );
    // Another number has its own limits; the next UTC day starts afresh.
    assert!(d.call(t + 201, "messaging", &[&[("to_number", "2062222222")]]));
    assert!(d.call(DAY, "messaging", &[MARKETING, TO_NUMBER]));
    assert!(d.call(DAY + 1, "messaging", &[TO_NUMBER]));
}

#[test]
fn a_realistic_envoy_ratelimit_setup_imports_with_what_is_lost_listed_by_path() {
    let (ok, yaml, stderr) = import(
        "envoy-ratelimit",
        &["envoy-ratelimit/edge.yaml", "envoy-ratelimit/internal.yaml"],
    );
    assert!(ok, "{stderr}");
    check_is_stable(&yaml);
    let lost: Vec<&str> = stderr
        .lines()
        .map(|l| l.split(": not carried over").next().unwrap_or(l))
        .collect();
    let file = data("envoy-ratelimit/edge.yaml").display().to_string();
    assert_eq!(
        lost,
        [
            format!("{file}: descriptors[2].descriptors[0].rate_limit.name"),
            format!("{file}: descriptors[2].descriptors[1].detailed_metric"),
            format!("{file}: descriptors[2].descriptors[1].rate_limit.replaces"),
            format!("{file}: descriptors[6].rate_limit.unit"),
        ],
        "{stderr}"
    );
    let mut d = Decider::new(&yaml);
    // 10 a second per address; the blocked one never passes; health is
    // never limited; the weekly export is a window resource.
    for i in 0..10 {
        assert!(d.call(i, "edge_proxy", &[&[("remote_address", "203.0.113.7")]]));
    }
    assert!(!d.call(10, "edge_proxy", &[&[("remote_address", "203.0.113.7")]]));
    assert!(d.call(1_000, "edge_proxy", &[&[("remote_address", "203.0.113.7")]]));
    for i in 0..50 {
        assert!(d.call(i, "edge_proxy", &[&[("generic_key", "health")]]));
    }
    for i in 0..20 {
        assert!(d.call(i, "edge_proxy", &[&[("export", "acme")]]));
    }
    assert!(!d.call(21, "edge_proxy", &[&[("export", "acme")]]));
    assert!(
        yaml.contains("name: imported/edge_proxy/export\n  kind: window"),
        "{yaml}"
    );
    // The shadowed tenant quota keeps its shadow; the enterprise plan below
    // it is enforced, as the rule of its own was.
    let envoy = d.config.envoy().expect("envoy");
    let Ok(Matched::Limited(t)) = envoy.match_descriptor("edge_proxy", &[("tenant", "acme")])
    else {
        panic!("tenant is limited")
    };
    assert!(t.shadow);
    let Ok(Matched::Limited(p)) =
        envoy.match_descriptor("edge_proxy", &[("tenant", "acme"), ("plan", "enterprise")])
    else {
        panic!("plan is limited")
    };
    assert!(!p.shadow);
    assert!(matches!(
        envoy.match_descriptor("internal", &[("ldap", "x")]),
        Ok(Matched::Unlimited { .. })
    ));
}

#[test]
fn a_limitador_limits_file_imports_and_decides() {
    let (ok, yaml, stderr) = import("limitador", &["limitador/limits.yaml"]);
    assert!(ok, "{stderr}");
    check_is_stable(&yaml);
    let file = data("limitador/limits.yaml").display().to_string();
    let lost: Vec<&str> = stderr
        .lines()
        .map(|l| l.split(": not carried over").next().unwrap_or(l))
        .collect();
    assert_eq!(lost.len(), 3, "{stderr}");
    assert_eq!(lost[0], format!("{file}: [0].name"));
    assert_eq!(lost[1], format!("{file}: [4].conditions[0]"));
    assert!(lost[2].starts_with(&format!("{file}: note: Limitador finds")));
    let mut d = Decider::new(&yaml);
    let post: &[(&str, &str)] = &[("req.method", "POST"), ("user_id", "alice")];
    // 5 POSTs per user per 10 s (a fixed window resource of 10 s).
    for i in 0..5 {
        assert!(d.call(i, "toystore-app", &[post]));
    }
    assert!(!d.call(5, "toystore-app", &[post]));
    assert!(d.call(
        5,
        "toystore-app",
        &[&[("req.method", "POST"), ("user_id", "bob")]]
    ));
    assert!(d.call(10_000, "toystore-app", &[post]));
    // Trial users: 2 a day.
    let trial: &[(&str, &str)] = &[("plan", "trial"), ("user_id", "carol")];
    assert!(d.call(0, "toystore-app", &[trial]));
    assert!(d.call(1, "toystore-app", &[trial]));
    assert!(!d.call(2, "toystore-app", &[trial]));
    // The messaging namespace has its 100 a day per number.
    for i in 0..100 {
        assert!(d.call(i, "messaging", &[TO_NUMBER]));
    }
    assert!(!d.call(100, "messaging", &[TO_NUMBER]));
}

#[test]
fn bad_files_are_refused_by_path_and_print_no_configuration() {
    let (ok, yaml, stderr) = import("envoy-ratelimit", &["envoy-ratelimit/bad.yaml"]);
    assert!(!ok);
    assert_eq!(yaml, "");
    let file = data("envoy-ratelimit/bad.yaml").display().to_string();
    for expected in [
        format!(
            "{file}: descriptors[0].rate_limit.unit: expected second, minute, hour, day, week, month or year, found \"fortnight\""
        ),
        format!("{file}: descriptors[1].colour: unknown field \"colour\""),
        format!("{file}: descriptors[2].key: is required"),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    assert!(!stderr.contains("panicked"), "{stderr}");

    let (ok, yaml, stderr) = import("limitador", &["limitador/bad.yaml"]);
    assert!(!ok);
    assert_eq!(yaml, "");
    let file = data("limitador/bad.yaml").display().to_string();
    for expected in [
        format!("{file}: [0].max_value: expected a whole number from 0 to"),
        format!("{file}: [1].colour: unknown field \"colour\""),
        format!("{file}: [2]: expected a limit (a mapping), found the string \"not a limit\""),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    // The wrong format is an error too, not a panic or an empty success.
    let (ok, _, stderr) = import("limitador", &["envoy-ratelimit/messaging.yaml"]);
    assert!(!ok);
    assert!(
        stderr.contains("expected Limitador's limits file (a list of limits), found a mapping")
    );
    // A missing file.
    let out = charon()
        .args([
            "config",
            "import",
            "--from",
            "limitador",
            "/nonexistent/limits.yaml",
        ])
        .output()
        .expect("charon runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/limits.yaml"));
}
