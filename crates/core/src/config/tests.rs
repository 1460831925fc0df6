use super::*;

const SPEC_EXAMPLE: &str = r#"
namespaces:
  billing: { allow_unconfigured: true, ignore_configured: false }
resources:
  - name: api/search
    kind: rate
    hard_limit: 100          # optional
    global_limit: 1000       # optional
    tiers:
      - { limit: 5,  window: 1s, cooldown: 0s }            # active omitted = infinite
      - { limit: 25, window: 1s, active: 5s, cooldown: 15s, skippable: false }
    domains:
      tenant-42: { hard_limit: 200, tiers: [ { limit: 50, window: 1s } ] }
  - name: sandbox/vm
    kind: copy
    domain_limit: 4
    global_limit: 100        # optional
    domains: { tenant-7: { domain_limit: 10 } }
    groups:
      - { name: probation, limit: 5, domains: [new-1, new-2] }
"#;

/// Checks that error `i` of `e` starts with `prefix` (the rest is a hint
/// that may change).
#[track_caller]
fn assert_starts(e: &[String], i: usize, prefix: &str) {
    assert!(e[i].starts_with(prefix), "{e:?}");
}

/// Checks that one of the errors `e` starts with `prefix`.
#[track_caller]
fn assert_any(e: &[String], prefix: &str) {
    assert!(e.iter().any(|x| x.starts_with(prefix)), "{e:?}");
}

fn errors(yaml: &str) -> Vec<String> {
    match Config::from_yaml(yaml) {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn the_spec_example_loads() {
    let (c, adjustments) = Config::from_yaml(SPEC_EXAMPLE).expect("valid");
    assert!(adjustments.is_empty(), "{adjustments:?}");
    assert!(c.namespace("billing").allow_unconfigured);
    let (search, e) = c.rate("api/search").expect("rate resource");
    assert_eq!(e, Enforcement::Enforce);
    assert_eq!(search.hard_limit, Some(100));
    assert_eq!(search.global_limit, Some(1000));
    assert_eq!(
        search.tiers[1],
        Tier {
            limit: 25,
            window: 1_000,
            active: Some(5_000),
            cooldown: 15_000,
            skippable: false
        }
    );
    assert_eq!(search.tiers[0].active, None, "omitted active is infinite");
    let t42 = search.limits_for("tenant-42");
    assert_eq!(
        (t42.hard_limit, t42.global_limit, t42.tiers.len()),
        (Some(200), Some(1000), 1)
    );
    assert_eq!(search.limits_for("someone").tiers.len(), 2);
    let (vm, _) = c.copy("sandbox/vm", "reserve").expect("copy resource");
    let l = vm.limits_for("new-2");
    assert_eq!((l.domain_limit, l.global_limit), (4, Some(100)));
    assert_eq!(
        l.groups,
        vec![GroupLimit {
            name: "probation".into(),
            limit: 5
        }]
    );
    assert_eq!(vm.limits_for("tenant-7").domain_limit, 10);
    assert!(vm.limits_for("tenant-7").groups.is_empty());
}

#[test]
fn errors_name_the_exact_place() {
    let e = errors(
        "resources:\n  - { name: a, kind: rate, tiers: [] }\n  - { name: b, kind: rate, tiers: [ { limit: 1, window: 1x } ] }\n",
    );
    assert_eq!(e.len(), 1);
    assert_starts(
        &e,
        0,
        "resources[1].tiers[0].window: \"1x\" is not a duration",
    );
}

#[test]
fn every_error_is_reported_not_only_the_first() {
    let e = errors(
        r#"
resources:
  - name: a
    kind: rate
    hard_limit: -1
    tiers:
      - { limit: 1.5, window: 0s }
      - { limt: 3, window: 1s, skippable: "yes" }
  - name: b
    kind: copy
    tiers: []
  - name: a
    kind: dial
namespaces:
  "x/y": { allow_unconfigured: 1 }
extra: 1
"#,
    );
    let want = [
        "resources[0].hard_limit: -1 is negative",
        "resources[0].tiers[0].limit: 1.5 is not a whole number",
        "resources[0].tiers[0].window: must be at least 1ms",
        "resources[0].tiers[1].limt: unknown field",
        "resources[0].tiers[1].limit: is required",
        "resources[0].tiers[1].skippable: expected true or false",
        "resources[1].tiers: not a field of a copy resource",
        "resources[1].domain_limit: is required",
        "resources[2].kind: expected rate, copy, bucket, window, queue or lease",
        "namespaces[\"x/y\"]: a namespace name cannot contain '/'",
        "namespaces[\"x/y\"].allow_unconfigured: expected true or false",
        "extra: unknown field",
    ];
    for w in want {
        assert!(
            e.iter().any(|x| x.starts_with(w)),
            "missing {w:?} in {e:#?}"
        );
    }
}

#[test]
fn duplicate_resources_groups_and_domains_are_errors() {
    let e = errors(
        "resources:\n  - { name: a, kind: copy, domain_limit: 1 }\n  - { name: a, kind: copy, domain_limit: 1 }\n",
    );
    assert_starts(&e, 0, "resources[1].name: duplicate resource \"a\"");
    let e = errors(
        "resources:\n  - name: a\n    kind: copy\n    domain_limit: 1\n    groups:\n      - { name: g, limit: 1, domains: [x, x] }\n      - { name: g, limit: 1 }\n",
    );
    assert_any(&e, "resources[0].groups[0].domains[1]: duplicate domain");
    assert_any(&e, "resources[0].groups[1].name: duplicate group");
}

#[test]
fn malformed_yaml_is_an_error_not_a_panic() {
    for text in [
        "resources: [",
        "\u{0}",
        "- - -\n  :",
        "resources: !!binary x",
        "a: &a [*a]",
        "{",
    ] {
        assert!(Config::from_yaml(text).is_err(), "{text:?}");
    }
}

#[test]
fn empty_config_file_is_refused() {
    for text in [
        "",
        "  \n\t\n",
        "# only a comment\n",
        "---\n",
        "~",
        "null",
        // A file cut after its first line(s): keys with nothing after them.
        "resources:\n",
        "resources:\nenvoy:\n",
        "namespaces: ~\nresources: null\n",
    ] {
        assert_eq!(
            errors(text),
            vec![EMPTY_CONFIGURATION.to_owned()],
            "{text:?}"
        );
    }
    assert_eq!(
        Config::from_value(&serde_json::Value::Null)
            .expect_err("refused")
            .to_string(),
        EMPTY_CONFIGURATION
    );
    // Meaning no resources is said so.
    let (c, _) = Config::from_yaml("resources: []\n").expect("valid");
    assert!(c.resources().is_empty());
    // A section left empty beside one that says something is as before.
    let (c, _) = Config::from_yaml("resources: []\nenvoy:\n").expect("valid");
    assert!(c.envoy().is_none());
}

fn tiers_json(n: usize) -> serde_json::Value {
    serde_json::Value::Array(
        (0..n)
            .map(|i| serde_json::json!({"limit": i + 1, "window": "1s"}))
            .collect(),
    )
}

fn value_errors(v: &serde_json::Value) -> Vec<String> {
    match Config::from_value(v) {
        Ok(_) => panic!("expected errors"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn config_size_bounds_name_the_path_and_the_bound() {
    use serde_json::json;
    let rate = |extra: serde_json::Value| {
        let mut r = json!({"name": "a", "kind": "rate", "tiers": tiers_json(1)});
        for (k, v) in extra.as_object().expect("object") {
            r[k] = v.clone();
        }
        json!({ "resources": [r] })
    };
    // At the bound: accepted.
    assert!(Config::from_value(&rate(json!({"tiers": tiers_json(MAX_TIERS)}))).is_ok());
    assert_eq!(
        value_errors(&rate(json!({"tiers": tiers_json(100_000)}))),
        vec![format!(
            "resources[0].tiers: 100000 tiers, at most {MAX_TIERS}"
        )]
    );
    let overrides = |n: usize, tiers: usize| {
        let ds: serde_json::Map<String, serde_json::Value> = (0..n)
            .map(|i| (format!("d{i}"), json!({"tiers": tiers_json(tiers)})))
            .collect();
        rate(json!({ "domains": ds }))
    };
    assert!(Config::from_value(&overrides(MAX_DOMAIN_OVERRIDES, 1)).is_ok());
    assert_eq!(
        value_errors(&overrides(100_000, 1)),
        vec![format!(
            "resources[0].domains: 100000 domain overrides, at most {MAX_DOMAIN_OVERRIDES}"
        )]
    );
    assert_eq!(
        value_errors(&overrides(2_000, 60)),
        vec![format!(
            "resources[0].domains: 120001 tiers in the resource and its overrides, at most \
             {MAX_TIERS_PER_RESOURCE}"
        )]
    );
    let e = value_errors(&rate(json!({"domains": {"x": {"tiers": tiers_json(65)}}})));
    assert_eq!(
        e,
        vec!["resources[0].domains.x.tiers: 65 tiers, at most 64"]
    );

    let copy = |groups: serde_json::Value, domains: serde_json::Value| {
        json!({"resources": [{"name": "c", "kind": "copy", "domain_limit": 1,
                              "groups": groups, "domains": domains}]})
    };
    let members: Vec<String> = (0..MAX_GROUP_MEMBERS + 1)
        .map(|i| format!("m{i}"))
        .collect();
    assert_eq!(
        value_errors(&copy(
            json!([{"name": "g", "limit": 1, "domains": members}]),
            json!({})
        )),
        vec![format!(
            "resources[0].groups: {} domains in groups, at most {MAX_GROUP_MEMBERS}",
            MAX_GROUP_MEMBERS + 1
        )]
    );
    let groups: Vec<serde_json::Value> = (0..MAX_GROUPS + 1)
        .map(|i| json!({"name": format!("g{i}"), "limit": 1}))
        .collect();
    assert_eq!(
        value_errors(&copy(json!(groups), json!({}))),
        vec![format!(
            "resources[0].groups: {} groups, at most {MAX_GROUPS}",
            MAX_GROUPS + 1
        )]
    );
    let ds: serde_json::Map<String, serde_json::Value> = (0..MAX_DOMAIN_OVERRIDES + 1)
        .map(|i| (format!("d{i}"), json!({"domain_limit": 1})))
        .collect();
    assert_eq!(
        value_errors(&copy(json!([]), json!(ds))),
        vec![format!(
            "resources[0].domains: {} domain overrides, at most {MAX_DOMAIN_OVERRIDES}",
            MAX_DOMAIN_OVERRIDES + 1
        )]
    );
    let many: Vec<serde_json::Value> = (0..MAX_RESOURCES + 1)
        .map(|i| json!({"name": format!("r{i}"), "kind": "copy", "domain_limit": 1}))
        .collect();
    assert_eq!(
        value_errors(&json!({ "resources": many })),
        vec![format!(
            "resources: {} resources, at most {MAX_RESOURCES}",
            MAX_RESOURCES + 1
        )]
    );
    let nss: serde_json::Map<String, serde_json::Value> = (0..MAX_NAMESPACES + 1)
        .map(|i| (format!("n{i}"), json!({})))
        .collect();
    assert_eq!(
        value_errors(&json!({ "namespaces": nss, "resources": [] })),
        vec![format!(
            "namespaces: {} namespaces, at most {MAX_NAMESPACES}",
            MAX_NAMESPACES + 1
        )]
    );
    // The same bounds for one resource alone (the config API's body).
    let one = json!({"name": "a", "kind": "rate", "tiers": tiers_json(65)});
    assert_eq!(
        parse_resource(&one).expect_err("refused").to_string(),
        "tiers: 65 tiers, at most 64"
    );
}

#[test]
fn huge_and_odd_numbers_are_refused() {
    let e =
        errors("resources:\n  - { name: a, kind: copy, domain_limit: 99999999999999999999999 }\n");
    assert_starts(&e, 0, "resources[0].domain_limit:");
    let e = errors("resources:\n  - { name: a, kind: copy, domain_limit: 9007199254740992 }\n");
    assert!(e[0].contains("too large"), "{e:?}");
}

#[test]
fn normalization_follows_spec_section_2() {
    let (c, adj) = Config::from_yaml(
        r#"
resources:
  - name: r
    kind: rate
    tiers:
      - { limit: 1, window: 1s, active: 0s }
      - { limit: 2, window: 10s, active: 3s }
      - { limit: 3, window: 2s, active: 7s, cooldown: 1s }
      - { limit: 4, window: 2s, active: 8s }
  - name: c
    kind: copy
    domain_limit: 50
    global_limit: 10
    domains: { big: { domain_limit: 20 }, small: { domain_limit: 2 } }
    groups: [ { name: g, limit: 11, domains: [a] } ]
"#,
    )
    .expect("valid");
    let (r, _) = c.rate("r").expect("rate");
    let shape: Vec<_> = r
        .tiers
        .iter()
        .map(|t| (t.limit, t.window, t.active))
        .collect();
    assert_eq!(
        shape,
        vec![
            (2, 3_000, Some(3_000)),
            (3, 2_000, Some(6_000)),
            (4, 2_000, Some(8_000))
        ]
    );
    let (cp, _) = c.copy("c", "reserve").expect("copy");
    assert_eq!(cp.domain_limit, 10);
    assert_eq!(cp.domains["big"], 10);
    assert_eq!(cp.domains["small"], 2);
    assert_eq!(cp.groups[0].limit, 10);
    let paths: Vec<_> = adj.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "resources[0].tiers[0]",
            "resources[0].tiers[1].window",
            "resources[0].tiers[2].active",
            "resources[1].domain_limit",
            "resources[1].domains[\"big\"].domain_limit",
            "resources[1].groups[0].limit",
        ]
    );
}

#[test]
fn rendering_round_trips() {
    let (c, _) = Config::from_yaml(SPEC_EXAMPLE).expect("valid");
    let yaml = c.to_yaml();
    let (again, adj) = Config::from_yaml(&yaml).expect("rendered config parses");
    assert!(adj.is_empty());
    assert_eq!(again, c, "{yaml}");
}

#[test]
fn namespaces_resolve_unknown_resources() {
    let (c, _) = Config::from_yaml(
        r#"
namespaces:
  open: { allow_unconfigured: true }
  off: { ignore_configured: true }
resources:
  - { name: off/r, kind: rate, tiers: [] }
  - { name: plain, kind: copy, domain_limit: 1 }
"#,
    )
    .expect("valid");
    let (r, e) = c.rate("open/anything").expect("permissive");
    assert_eq!(
        (r.tiers[0].limit, r.hard_limit, e),
        (UNBOUNDED, None, Enforcement::Enforce)
    );
    assert!(matches!(
        c.rate("closed/x"),
        Err(ClientError::UnknownResource(_))
    ));
    assert!(
        matches!(c.rate("x"), Err(ClientError::UnknownResource(_))),
        "namespace default"
    );
    assert_eq!(c.rate("off/r").expect("configured").1, Enforcement::Ignore);
    assert!(matches!(
        c.rate("plain"),
        Err(ClientError::WrongKind { .. })
    ));
    assert!(matches!(
        c.copy("off/r", "reserve"),
        Err(ClientError::WrongKind { .. })
    ));
    assert_eq!(namespace_of("plain"), "default");
    assert_eq!(namespace_of("a/b/c"), "a");
}

// ---- buckets, windows, queues, soft limits and bans (SPEC §7–10) ----

use crate::meter::{Ban, FieldError, Policy, SoftLimit};
use crate::window::Algorithm;
use crate::{MAX_COUNT, bucket, queue, window};

const KINDS_EXAMPLE: &str = r#"
resources:
  - name: acme/new-orders
    kind: bucket
    burst: 300
    count: 300
    period: 180m
    soft_limit: 80%
    domains: { "12345678": { count: 600 }, slow: { burst: 10, ban: 1h } }
  - name: edge/login
    kind: window
    algorithm: fixed
    limit: 2000
    window: 20m
    ban: 1h
    domains: { sliding: { algorithm: sliding_counter, limit: 7, window: 1m, soft_limit: 50% } }
  - name: batch/exports
    kind: queue
    rate: 10
    period: 1s
    size: 50
    domains: { big: { size: 500 } }
  - name: api/search
    kind: rate
    soft_limit: 90%
    ban: 15m
    tiers: [ { limit: 5, window: 1s } ]
    domains: { t: { soft_limit: 50% }, u: { ban: 1s } }
"#;

fn policy(soft: Option<u64>, ban: Option<u64>) -> Policy {
    Policy {
        soft_limit: soft.map(|p| SoftLimit::percent(p).expect("valid")),
        ban: ban.map(|b| Ban::new(b).expect("valid")),
    }
}

fn bucket_params(burst: u64, count: u64, period: u64, p: Policy) -> Meter {
    Meter::Bucket(bucket::Params::new(burst, count, period, p).expect("valid"))
}

#[test]
fn every_kind_loads_and_overrides_replace_what_they_name() {
    let (c, adjustments) = Config::from_yaml(KINDS_EXAMPLE).expect("valid");
    assert!(adjustments.is_empty(), "{adjustments:?}");
    let r = "acme/new-orders";
    let p80 = policy(Some(80), None);
    assert_eq!(
        c.meter(r, "anyone"),
        Some(bucket_params(300, 300, 10_800_000, p80))
    );
    assert_eq!(
        c.meter(r, "12345678"),
        Some(bucket_params(300, 600, 10_800_000, p80)),
        "an override that doubles the rate keeps the burst"
    );
    assert_eq!(
        c.meter(r, "slow"),
        Some(bucket_params(
            10,
            300,
            10_800_000,
            policy(Some(80), Some(3_600_000))
        ))
    );
    assert_eq!(
        c.meter("edge/login", "x"),
        Some(Meter::Window(
            window::Params::new(
                Algorithm::Fixed,
                2000,
                1_200_000,
                policy(None, Some(3_600_000))
            )
            .expect("valid")
        ))
    );
    assert_eq!(
        c.meter("edge/login", "sliding"),
        Some(Meter::Window(
            window::Params::new(
                Algorithm::SlidingCounter,
                7,
                60_000,
                policy(Some(50), Some(3_600_000))
            )
            .expect("valid")
        ))
    );
    let q = |size| {
        Some(Meter::Queue(
            queue::Params::new(10, 1_000, size, Policy::default()).expect("valid"),
        ))
    };
    assert_eq!(c.meter("batch/exports", "x"), q(50));
    assert_eq!(c.meter("batch/exports", "big"), q(500));
    assert!(matches!(
        c.meter("batch/exports", "x"),
        Some(Meter::Queue(_))
    ));
    // Rate keeps its soft limit and ban, per override too.
    assert_eq!(
        c.meter("api/search", "t"),
        None,
        "a rate resource has no meter"
    );
    let (rate, _) = c.rate("api/search").expect("rate");
    assert_eq!(rate.policy, policy(Some(90), Some(900_000)));
    assert_eq!(rate.policy_for("t"), policy(Some(50), Some(900_000)));
    assert_eq!(rate.policy_for("u"), policy(Some(90), Some(1_000)));
    assert_eq!(rate.policy_for("v"), rate.policy);
    // Kinds are named and refused for the wrong operation.
    let kinds: Vec<_> = c.resources().iter().map(|r| r.kind.name()).collect();
    assert_eq!(kinds, ["bucket", "window", "queue", "rate"]);
    assert!(matches!(
        c.rate("acme/new-orders"),
        Err(ClientError::WrongKind {
            actual: "bucket",
            ..
        })
    ));
    assert!(matches!(
        c.copy("edge/login", "reserve"),
        Err(ClientError::WrongKind {
            actual: "window",
            ..
        })
    ));
}

#[test]
fn every_new_field_round_trips() {
    let (c, _) = Config::from_yaml(KINDS_EXAMPLE).expect("valid");
    let yaml = c.to_yaml();
    for field in [
        "kind: bucket",
        "burst: 300",
        "period: 3h",
        "soft_limit: 80%",
        "ban: 1h",
        "algorithm: sliding_counter",
        "size: 500",
    ] {
        assert!(yaml.contains(field), "{field} in\n{yaml}");
    }
    let (again, adj) = Config::from_yaml(&yaml).expect("rendered config parses");
    assert!(adj.is_empty());
    assert_eq!(again, c, "{yaml}");
    // An override renders only what it names.
    let v = c.to_value();
    assert_eq!(
        v["resources"][0]["domains"]["12345678"],
        serde_json::json!({"count": 600})
    );
    let (from_json, _) = Config::from_value(&v).expect("JSON too");
    assert_eq!(from_json, c);
}

fn one(resource: &str) -> Vec<String> {
    errors(&format!("resources:\n  - {resource}\n"))
}

#[test]
fn bad_values_of_the_new_kinds_name_the_exact_path() {
    let cases: &[(&str, &str)] = &[
        (
            "{ name: a, kind: bucket, burst: 1, count: 1, period: 0s }",
            "resources[0].period: \"0s\" must be positive (at least 1ms)",
        ),
        (
            "{ name: a, kind: bucket, burst: 0, count: 1, period: 1s }",
            "resources[0].burst: 0 must be at least 1",
        ),
        (
            "{ name: a, kind: bucket, burst: 1, count: 0, period: 1s }",
            "resources[0].count: 0 must be at least 1",
        ),
        (
            "{ name: a, kind: bucket, burst: -1, count: 1, period: 1s }",
            "resources[0].burst: -1 is negative; counts start at 0",
        ),
        (
            "{ name: a, kind: bucket, burst: 9007199254740992, count: 1, period: 1s }",
            "resources[0].burst: 9007199254740992 is too large (at most 9007199254740991)",
        ),
        (
            "{ name: a, kind: bucket, burst: 1, count: 1, period: 1x }",
            "resources[0].period: \"1x\" is not a duration",
        ),
        (
            "{ name: a, kind: bucket, burst: 1, count: 1, period: 40000 years }",
            "resources[0].period: \"40000 years\" must be at most 1125899906842624ms (2^50 ms)",
        ),
        (
            "{ name: a, kind: window, algorithm: fixed, limit: 0, window: 1s }",
            "resources[0].limit: 0 must be at least 1",
        ),
        (
            "{ name: a, kind: window, algorithm: fixed, limit: 1, window: 0ms }",
            "resources[0].window: \"0ms\" must be positive (at least 1ms)",
        ),
        (
            "{ name: a, kind: window, algorithm: slow, limit: 1, window: 1s }",
            "resources[0].algorithm: expected fixed, sliding_counter or first_hit, found the string \"slow\"",
        ),
        (
            "{ name: a, kind: queue, rate: 0, period: 1s, size: 1 }",
            "resources[0].rate: 0 must be at least 1",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 0 }",
            "resources[0].size: 0 must be at least 1",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 0s, size: 1 }",
            "resources[0].period: \"0s\" must be positive (at least 1ms)",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, soft_limit: 0% }",
            "resources[0].soft_limit: \"0%\" must be above 0% and at most 100%",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, soft_limit: 101% }",
            "resources[0].soft_limit: \"101%\" must be above 0% and at most 100%",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, soft_limit: 99999999999999999999999% }",
            "resources[0].soft_limit: \"99999999999999999999999%\" must be above 0% and at most 100%",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, soft_limit: -5% }",
            "resources[0].soft_limit: \"-5%\" must be a whole percentage above 0% and at most 100%",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, soft_limit: 80.5% }",
            "resources[0].soft_limit: \"80.5%\" must be a whole percentage above 0% and at most 100%",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, soft_limit: 80 }",
            "resources[0].soft_limit: expected a percentage such as \"80%\", found the number 80",
        ),
        (
            "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, soft_limit: high }",
            "resources[0].soft_limit: \"high\" is not a percentage (write it like \"80%\")",
        ),
        (
            "{ name: a, kind: rate, tiers: [], ban: 0s }",
            "resources[0].ban: \"0s\" must be positive (at least 1ms)",
        ),
        (
            "{ name: a, kind: rate, tiers: [], domains: { d: { soft_limit: 0% } } }",
            "resources[0].domains.d.soft_limit: \"0%\" must be above 0% and at most 100%",
        ),
        (
            "{ name: a, kind: window, algorithm: fixed, limit: 1, window: 1s, ban: 40000 years }",
            "resources[0].ban: \"40000 years\" must be at most 1125899906842624ms (2^50 ms)",
        ),
        (
            "{ name: a, kind: bucket, burst: 1, count: 1, period: 1s, domains: { d: { period: 0s } } }",
            "resources[0].domains.d.period: \"0s\" must be positive (at least 1ms)",
        ),
        (
            "{ name: a, kind: window, algorithm: fixed, limit: 1, window: 1s, domains: { d: { limit: 0 } } }",
            "resources[0].domains.d.limit: 0 must be at least 1",
        ),
    ];
    for (resource, want) in cases {
        let got = one(resource);
        assert!(
            got.len() == 1 && got[0].starts_with(want),
            "{resource}\nwant {want}\ngot {got:#?}"
        );
    }
}

#[test]
fn a_bad_soft_limit_or_ban_does_not_hide_bad_fields() {
    let e =
        one("{ name: a, kind: bucket, burst: 1, count: 1, period: 0s, soft_limit: 0%, ban: x }");
    assert_eq!(e.len(), 3, "{e:?}");
    assert_starts(&e, 0, "resources[0].soft_limit: \"0%\"");
    assert_starts(&e, 1, "resources[0].ban: \"x\" is not a duration");
    assert_eq!(
        e[2],
        "resources[0].period: \"0s\" must be positive (at least 1ms)"
    );
    // A field that does not parse is not checked against the others.
    let e = one("{ name: a, kind: bucket, burst: x, count: 0, period: 1s }");
    assert_eq!(
        e,
        ["resources[0].burst: expected a whole number, found the string \"x\""]
    );
}

#[test]
fn exactness_bounds_are_config_errors_with_the_path() {
    // burst × period / gcd(period, count) must stay at most 2^53 − 1.
    let e = one("{ name: a, kind: bucket, burst: 9007199254740991, count: 1, period: 1s }");
    assert_eq!(e.len(), 1, "{e:?}");
    assert_starts(
        &e,
        0,
        "resources[0].burst: 9007199254740991 is too large for 1 per 1000ms",
    );
    let e = one("{ name: a, kind: queue, rate: 3, period: 1s, size: 9007199254740991 }");
    assert_starts(&e, 0, "resources[0].size: 9007199254740991 is too large");
    // limit × window for a sliding counter.
    let e = one(
        "{ name: a, kind: window, algorithm: sliding_counter, limit: 9007199254740991, window: 1m }",
    );
    assert_starts(
        &e,
        0,
        "resources[0].limit: 9007199254740991 is too large for a sliding_counter",
    );
    // The same limit is fine for a fixed window.
    assert!(
        Config::from_yaml(
            "resources:\n  - { name: a, kind: window, algorithm: fixed, limit: 9007199254740991, window: 1m }\n"
        )
        .is_ok()
    );
    // An override whose combination with the resource fails: the field
    // it names, or the override itself when the failing field is the
    // resource's.
    let e = one(
        "{ name: a, kind: bucket, burst: 17592186044416, count: 1000, period: 1s, domains: { d: { count: 999 } } }",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_starts(
        &e,
        0,
        "resources[0].domains.d: burst 17592186044416 is too large for 999 per 1000ms",
    );
    let e = one(
        "{ name: a, kind: window, algorithm: fixed, limit: 9007199254740991, window: 1m, domains: { d: { algorithm: sliding_counter } } }",
    );
    assert_starts(
        &e,
        0,
        "resources[0].domains.d: limit 9007199254740991 is too large",
    );
    // Every failing override is reported.
    let e = one(
        "{ name: a, kind: queue, rate: 1, period: 1s, size: 1, domains: { x: { size: 0 }, y: { rate: 0 } } }",
    );
    assert_eq!(
        e,
        [
            "resources[0].domains.x.size: 0 must be at least 1",
            "resources[0].domains.y.rate: 0 must be at least 1"
        ]
    );
    // At the bound (a full bucket spans at most 2^50 ms): accepted; one
    // more token is refused.
    let at = |burst: u64| {
        Config::from_value(&serde_json::json!({"resources": [
            {"name": "a", "kind": "bucket", "burst": burst, "count": 1, "period": "1s"}
        ]}))
    };
    assert!(at((1 << 50) / 1000).is_ok());
    assert!(at((1 << 50) / 1000 + 1).is_err());
    assert!(at(MAX_COUNT).is_err());
}

#[test]
fn missing_unknown_and_foreign_fields_are_refused() {
    let e = one("{ name: a, kind: bucket }");
    assert_eq!(
        e,
        [
            "resources[0].burst: is required",
            "resources[0].count: is required",
            "resources[0].period: is required"
        ]
    );
    let e = one("{ name: a, kind: window, limit: 1, window: 1s }");
    assert_eq!(e, ["resources[0].algorithm: is required"]);
    let e = one("{ name: a, kind: queue, rate: 1, period: 1s }");
    assert_eq!(e, ["resources[0].size: is required"]);
    let e = one("{ name: a, kind: bucket, burst: 1, count: 1, period: 1s, tiers: [], limt: 3 }");
    assert_any(
        &e,
        "resources[0].tiers: not a field of a bucket resource (expected one of: name, kind, burst",
    );
    assert_any(&e, "resources[0].limt: unknown field (expected one of:");
    let e =
        one("{ name: a, kind: queue, rate: 1, period: 1s, size: 1, domains: { d: { burst: 1 } } }");
    assert_eq!(
        e,
        [
            "resources[0].domains.d.burst: unknown field (expected one of: rate, period, size, soft_limit, ban)"
        ]
    );
    let e = one("{ name: a, kind: copy, domain_limit: 1, soft_limit: 50% }");
    assert_starts(
        &e,
        0,
        "resources[0].soft_limit: not a field of a copy resource",
    );
    let e = one("{ name: a }");
    assert_eq!(
        e,
        ["resources[0].kind: is required (rate, copy, bucket, window, queue or lease)"]
    );
    // Null is absent, as for every other field.
    let e = one("{ name: a, kind: bucket, burst: 1, count: ~, period: 1s }");
    assert_eq!(e, ["resources[0].count: is required"]);
}

#[test]
fn overrides_of_the_new_kinds_are_bounded() {
    use serde_json::json;
    let bucket = |n: usize| {
        let ds: serde_json::Map<String, serde_json::Value> = (0..n)
            .map(|i| (format!("d{i}"), json!({"count": i + 1})))
            .collect();
        json!({"resources": [{"name": "b", "kind": "bucket", "burst": 5, "count": 1,
                              "period": "1s", "domains": ds}]})
    };
    let (c, _) = Config::from_value(&bucket(MAX_DOMAIN_OVERRIDES)).expect("at the bound");
    assert_eq!(
        c.meter("b", "d9"),
        Some(bucket_params(5, 10, 1_000, Policy::default()))
    );
    assert_eq!(
        value_errors(&bucket(MAX_DOMAIN_OVERRIDES + 1)),
        vec![format!(
            "resources[0].domains: {} domain overrides, at most {MAX_DOMAIN_OVERRIDES}",
            MAX_DOMAIN_OVERRIDES + 1
        )]
    );
}

#[test]
fn namespaces_apply_to_the_new_kinds_as_to_rate() {
    let (c, _) = Config::from_yaml(
        r#"
namespaces:
  open: { allow_unconfigured: true }
  off: { ignore_configured: true }
resources:
  - { name: off/b, kind: bucket, burst: 1, count: 1, period: 1s }
  - { name: open/q, kind: queue, rate: 1, period: 1s, size: 1 }
"#,
    )
    .expect("valid");
    assert_eq!(c.enforcement("off/b"), Enforcement::Ignore);
    assert!(c.meter("off/b", "d").is_some(), "ignored, still configured");
    assert_eq!(c.enforcement("open/q"), Enforcement::Enforce);
    assert!(c.meter("open/q", "d").is_some());
    // An unconfigured resource is the permissive rate resource, whatever
    // kinds its namespace configures; it has no meter.
    assert_eq!(c.meter("open/other", "d"), None);
    let (r, _) = c.rate("open/other").expect("permissive");
    assert_eq!(r.tiers[0].limit, UNBOUNDED);
    assert!(matches!(
        c.rate("closed/x"),
        Err(ClientError::UnknownResource(_))
    ));
    assert_eq!(c.meter("closed/x", "d"), None);
}

#[test]
fn meter_resources_built_in_code_are_checked_too() {
    let spec = MeterSpec {
        fields: BucketFields {
            burst: Some(1),
            count: None,
            period: Some(1_000),
        },
        policy: Policy::default(),
    };
    let e = BucketResource::new(spec, BTreeMap::new()).expect_err("count missing");
    assert_eq!(
        e,
        [(
            None,
            FieldError {
                field: "count",
                message: "is required".into()
            }
        )]
    );
    let spec = MeterSpec {
        fields: BucketFields {
            count: Some(1),
            ..spec.fields
        },
        ..spec
    };
    let o = MeterSpec {
        fields: BucketFields {
            burst: Some(0),
            ..BucketFields::default()
        },
        policy: Policy::default(),
    };
    let e = BucketResource::new(spec, BTreeMap::from([("d".to_owned(), o)])).expect_err("burst 0");
    assert_eq!(e[0].0.as_deref(), Some("d"));
    assert_eq!(e[0].1.field, "burst");
    let r = BucketResource::new(spec, BTreeMap::new()).expect("valid");
    assert_eq!(r.params(), r.params_for("anyone"));
    assert_eq!(r.params().burst(), 1);
}

/// A random `envoy:` section naming the resources `r0`…`r{resources-1}`:
/// up to three domains of trees up to three levels deep, each node with
/// or without a value, a mask, an action and a shadow mode.
fn random_envoy(d: &mut impl crate::testing::Draw, resources: u64) -> serde_json::Value {
    fn nodes(
        d: &mut impl crate::testing::Draw,
        resources: u64,
        depth: u64,
    ) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for i in 0..d.draw(0..=3) {
            let mut n = serde_json::json!({ "key": format!("k{i}") });
            if d.one_in(2) {
                n["value"] = format!("v/{i}=|{}", d.draw(0..=9)).into();
            } else if d.one_in(2) {
                let mut m = serde_json::Map::new();
                if d.one_in(2) {
                    m.insert("ipv4".into(), d.draw(0..=32).into());
                }
                if d.one_in(2) {
                    m.insert("ipv6".into(), d.draw(0..=128).into());
                }
                n["mask"] = serde_json::Value::Object(m);
            }
            match d.draw(0..=3) {
                0 => n["resource"] = format!("r{}", d.draw(0..=resources - 1)).into(),
                1 => {
                    let unit = ["second", "minute", "hour", "day"][d.draw(0..=3) as usize];
                    n["rate_limit"] = serde_json::json!({
                        "unit": unit,
                        "requests_per_unit": d.draw(1..=MAX_COUNT),
                    });
                }
                2 => n["unlimited"] = d.one_in(2).into(),
                _ => {}
            }
            if d.one_in(3) {
                n["shadow_mode"] = d.one_in(2).into();
            }
            if depth < 3 {
                n["descriptors"] = nodes(d, resources, depth + 1).into();
            }
            out.push(n);
        }
        out
    }
    let domains: Vec<_> = (0..d.draw(0..=3))
        .map(|i| {
            let mut dom = serde_json::json!({ "domain": format!("dom {i}"), "descriptors": nodes(d, resources, 1) });
            if d.one_in(2) {
                dom["same_slot"] = true.into();
            }
            dom
        })
        .collect();
    serde_json::json!({
        "shadow_mode": d.one_in(2),
        "headers": d.one_in(2),
        "domains": domains,
    })
}

/// A random configuration of every rate-like kind (the generators of
/// `meter::testing`), with overrides, soft limits and bans, and a random
/// `envoy:` section naming them, renders to YAML that parses back to the
/// same configuration.
#[test]
fn random_configurations_of_every_kind_round_trip() {
    use crate::meter::testing;
    use crate::testing::{Draw, Raw};

    fn spec_of(p: Policy) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        if let Some(s) = p.soft_limit {
            m.insert("soft_limit".into(), format!("{}%", s.as_percent()).into());
        }
        if let Some(b) = p.ban {
            m.insert("ban".into(), format!("{}ms", b.duration()).into());
        }
        serde_json::Value::Object(m)
    }

    let values: Vec<u64> = (0..200_000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17))
        .collect();
    let mut d = Raw::new(&values);
    let mut envoy_nodes = 0;
    for round in 0..100 {
        let mut resources = Vec::new();
        for i in 0..d.draw(1..=6) {
            let name = format!("r{i}");
            let mut r = match d.draw(0..=3) {
                0 => {
                    let (burst, count, period, p) = testing::bucket(&mut d, 1);
                    let mut v = spec_of(p);
                    v["kind"] = "bucket".into();
                    v["burst"] = burst.into();
                    v["count"] = count.into();
                    v["period"] = format!("{period}ms").into();
                    v
                }
                1 => {
                    let (algorithm, limit, window, p) = testing::window(&mut d, 1);
                    let mut v = spec_of(p);
                    v["kind"] = "window".into();
                    v["algorithm"] = algorithm.name().into();
                    v["limit"] = limit.into();
                    v["window"] = format!("{window}ms").into();
                    v
                }
                2 => {
                    let (rate, period, size, p) = testing::queue(&mut d, 1);
                    let mut v = spec_of(p);
                    v["kind"] = "queue".into();
                    v["rate"] = rate.into();
                    v["period"] = format!("{period}ms").into();
                    v["size"] = size.into();
                    v
                }
                _ => {
                    let p = testing::policy(&mut d, 1);
                    let mut v = spec_of(p);
                    v["kind"] = "rate".into();
                    v["tiers"] = serde_json::json!([{"limit": d.draw(0..=9), "window": "1s"}]);
                    v
                }
            };
            r["name"] = name.into();
            // Overrides: each names a random subset of the kind's fields.
            let kind = r["kind"].as_str().unwrap_or_default().to_owned();
            let mut ds = serde_json::Map::new();
            for o in 0..d.draw(0..=3) {
                let p = testing::policy(&mut d, 1);
                let mut ov = spec_of(p);
                match kind.as_str() {
                    "bucket" if d.one_in(2) => ov["count"] = d.draw(1..=9).into(),
                    "bucket" => ov["burst"] = d.draw(1..=9).into(),
                    "window" if d.one_in(2) => ov["algorithm"] = "sliding_counter".into(),
                    "window" => ov["window"] = format!("{}ms", d.draw(1..=99_999)).into(),
                    "queue" if d.one_in(2) => ov["size"] = d.draw(1..=9).into(),
                    "queue" => ov["period"] = format!("{}ms", d.draw(1..=99_999)).into(),
                    _ => ov["hard_limit"] = d.draw(0..=9).into(),
                }
                ds.insert(format!("d{o}"), ov);
            }
            r["domains"] = serde_json::Value::Object(ds);
            resources.push(r);
        }
        let mut doc = serde_json::json!({ "resources": resources });
        if !d.one_in(4) {
            doc["envoy"] = random_envoy(&mut d, resources.len() as u64);
        }
        let (c, _) =
            Config::from_value(&doc).unwrap_or_else(|e| panic!("round {round}: {e}\n{doc:#}"));
        let yaml = c.to_yaml();
        let (again, adj) = Config::from_yaml(&yaml).expect("rendered config parses");
        assert!(adj.is_empty(), "{adj:?}");
        assert_eq!(again, c, "round {round}:\n{yaml}");
        assert_eq!(again.to_yaml(), yaml, "rendering is stable");
        envoy_nodes += yaml.matches("- key:").count();
    }
    assert!(envoy_nodes > 500, "{envoy_nodes} descriptor nodes in all");
}

/// SPEC §11's `envoy:` example, with the resource it names, as
/// `examples/envoy.yaml` has it and docs/envoy.md shows it.
const ENVOY_FILE: &str = include_str!("../../../../examples/envoy.yaml");

/// [`ENVOY_FILE`] with headers on, a copy resource beside, and one more
/// node: a value-less one with `mask: {}`.
fn envoy_example() -> String {
    let text = ENVOY_FILE
        .replacen("headers: false", "headers: true", 1)
        .replacen(
            "period: 1s }\n",
            "period: 1s }\n  - { name: sandbox/vm, kind: copy, domain_limit: 4 }\n",
            1,
        );
    format!("{text}        - key: client\n          mask: {{}}\n          resource: api/search\n")
}

/// docs/envoy.md shows the example file as it is (its YAML, without the
/// file's opening comment), so what the docs show is what the tests load.
#[test]
fn the_docs_show_the_envoy_example_file() {
    let docs = include_str!("../../../../docs/envoy.md");
    let yaml: String = ENVOY_FILE
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        docs.contains(&format!("```yaml\n{yaml}```\n")),
        "docs/envoy.md no longer shows examples/envoy.yaml:\n{yaml}"
    );
}

#[test]
fn the_envoy_section_loads_and_round_trips() {
    let (c, adj) = Config::from_yaml(&envoy_example()).expect("valid");
    assert!(adj.is_empty());
    let e = c.envoy().expect("envoy");
    assert!(!e.settings.shadow_mode && e.settings.headers == crate::envoy::Headers::Charon);
    let edge = e.domain("edge").expect("edge");
    assert_eq!(edge.descriptors().len(), 4);
    // `mask: {}` is /32 and /48.
    assert_eq!(
        edge.descriptors()[3].mask(),
        Some(crate::envoy::Mask { ipv4: 32, ipv6: 48 })
    );
    let yaml = c.to_yaml();
    for field in [
        "envoy:",
        "domain: edge",
        "value: search",
        "ipv6: 48",
        "resource: api/search",
        "unit: minute",
        "requests_per_unit: 100",
        "unlimited: true",
        "shadow_mode: true",
        "headers: true",
    ] {
        assert!(yaml.contains(field), "{field} in\n{yaml}");
    }
    let (again, adj) = Config::from_yaml(&yaml).expect("rendered config parses");
    assert!(adj.is_empty());
    assert_eq!(again, c, "{yaml}");
    assert_eq!(again.to_yaml(), yaml);
    let (from_json, _) = Config::from_value(&c.to_value()).expect("JSON too");
    assert_eq!(from_json, c);
}

#[test]
fn header_names_round_trip_next_to_headers() {
    let yaml = "resources: []\nenvoy:\n  headers: ratelimit\n  header_names: { limit: X-Quota, reset: X-Quota-Reset }\n  domains: []\n";
    let (c, _) = Config::from_yaml(yaml).expect("valid");
    let names = &c.envoy().expect("envoy").settings.header_names;
    assert_eq!(
        (names.limit.as_deref(), names.remaining.as_deref()),
        (Some("X-Quota"), None)
    );
    let out = c.to_yaml();
    assert!(
        out.contains("headers: ratelimit\n  header_names:\n    limit: X-Quota\n    reset: X-Quota-Reset\n  unknown_domain"),
        "{out}"
    );
    assert_eq!(Config::from_yaml(&out).expect("parses").0, c);
}

#[test]
fn same_slot_is_per_domain_and_round_trips() {
    let text = envoy_example().replacen(
        "      descriptors:\n",
        "      same_slot: true\n      descriptors:\n",
        1,
    );
    let text = format!("{text}    - domain: other\n");
    let (c, adj) = Config::from_yaml(&text).expect("valid");
    assert!(adj.is_empty());
    let e = c.envoy().expect("envoy");
    assert!(e.domain("edge").expect("edge").same_slot());
    assert!(!e.domain("other").expect("other").same_slot());
    let yaml = c.to_yaml();
    assert_eq!(yaml.matches("same_slot: true").count(), 1, "{yaml}");
    let (again, _) = Config::from_yaml(&yaml).expect("parses");
    assert_eq!(again, c);
    let (from_json, _) = Config::from_value(&c.to_value()).expect("JSON too");
    assert_eq!(from_json, c);
    let bad = text.replace("same_slot: true", "same_slot: sometimes");
    let err = Config::from_yaml(&bad)
        .expect_err("not a boolean")
        .to_string();
    assert!(
        err.contains("envoy.domains[0].same_slot: expected true or false"),
        "{err}"
    );
}

#[test]
fn a_configuration_without_envoy_is_unchanged() {
    let (c, _) = Config::from_yaml(SPEC_EXAMPLE).expect("valid");
    assert!(c.envoy().is_none());
    assert!(!c.to_yaml().contains("envoy"));
    assert!(c.to_value().get("envoy").is_none());
    let (n, _) = Config::from_yaml(&format!("{SPEC_EXAMPLE}envoy: null\n")).expect("valid");
    assert_eq!(n, c, "a null section is no section");
    // An empty section is a section: Envoy calls are answered, for no
    // domain.
    let (empty, _) = Config::from_yaml(&format!("{SPEC_EXAMPLE}envoy: {{}}\n")).expect("valid");
    let e = empty.envoy().expect("a section");
    assert!(e.domains().is_empty() && e.settings == crate::envoy::Settings::default());
    let (again, _) = Config::from_yaml(&empty.to_yaml()).expect("parses");
    assert_eq!(again, empty);
}

fn envoy_errors(section: &str) -> Vec<String> {
    errors(&format!(
        "resources:\n  - {{ name: api/search, kind: bucket, burst: 1, count: 1, period: 1s }}\n  - {{ name: vm, kind: copy, domain_limit: 1 }}\nenvoy:\n{section}"
    ))
}

#[test]
fn bad_envoy_sections_name_the_exact_path() {
    let d = "  domains:\n    - domain: edge\n      descriptors:\n";
    let cases: &[(String, &str)] = &[
        (
            format!("{d}        - {{ key: a, rate_limit: {{ unit: fortnight, requests_per_unit: 1 }} }}\n"),
            "envoy.domains[0].descriptors[0].rate_limit.unit: expected second, minute, hour, day, week, month or year, found the string \"fortnight\"",
        ),
        (
            "  domains:\n    - { domain: first }\n    - domain: edge\n      descriptors:\n        - { key: a }\n        - { key: b, descriptors: [ { key: c }, { key: d, rate_limit: { unit: sec, requests_per_unit: 1 } } ] }\n".to_owned(),
            "envoy.domains[1].descriptors[1].descriptors[1].rate_limit.unit: expected second",
        ),
        (
            format!("{d}        - {{ key: a, rate_limit: {{ unit: second, requests_per_unit: -1 }} }}\n"),
            "envoy.domains[0].descriptors[0].rate_limit.requests_per_unit: -1 is negative; counts start at 0",
        ),
        (
            format!("{d}        - {{ key: a, rate_limit: {{ unit: second, window: 2s, requests_per_unit: 1 }} }}\n"),
            "envoy.domains[0].descriptors[0].rate_limit: names unit and window; a rate_limit has one of them",
        ),
        (
            format!("{d}        - {{ key: a, name: x, replaces: [x], unlimited: true }}\n"),
            "envoy.domains[0].descriptors[0].replaces[0]: replaces should not contain name of same descriptor",
        ),
        (
            format!("{d}        - {{ key: a, replaces: [\"\"], unlimited: true }}\n"),
            "envoy.domains[0].descriptors[0].replaces[0]: should not have an empty replaces entry",
        ),
        (
            format!("{d}        - {{ key: a, value: b, share_threshold: true, unlimited: true }}\n"),
            "envoy.domains[0].descriptors[0].share_threshold: share_threshold can only be used with wildcard values (containing '*')",
        ),
        (
            "  domains:\n    - domain: ns\n      limits:\n        - { conditions: [ { key: a, equals: b, not_equals: c } ], rate_limit: { window: 1m, requests_per_unit: 1 } }\n".to_owned(),
            "envoy.domains[0].limits[0].conditions[0]: a condition has one of equals and not_equals",
        ),
        (
            "  domains:\n    - domain: ns\n      limits:\n        - { variables: [ { key: a } ] }\n".to_owned(),
            "envoy.domains[0].limits[0]: a limit needs resource or rate_limit",
        ),
        (
            "  domains:\n    - domain: ns\n      limits:\n        - { variables: [ { key: a } ], rate_limit: { window: 1m, requests_per_unit: 1 } }\n        - { variables: [ { key: a, descriptor: 0 } ], rate_limit: { unit: minute, requests_per_unit: 5 } }\n".to_owned(),
            "envoy.domains[0].limits[1]: duplicate limit: the same conditions, variables and window as envoy.domains[0].limits[0]",
        ),
        (
            "  domains:\n    - domain: ns\n      limits:\n        - { variables: [ { key: a } ], rate_limit: { window: 1s, requests_per_unit: 1 }, unlimited: true }\n".to_owned(),
            "envoy.domains[0].limits[0].unlimited: unknown field (expected one of: name, conditions, variables, resource, rate_limit)",
        ),
        (
            "  domains:\n    - domain: ns\n      limits:\n        - { variables: [ { key: a, descriptor: 1024 } ], rate_limit: { window: 1s, requests_per_unit: 1 } }\n".to_owned(),
            "envoy.domains[0].limits[0].variables[0].descriptor: 1024 is past the last descriptor a call can have (1023)",
        ),
        (
            "  header_names: { limit: X-Quota }\n".to_owned(),
            "envoy.header_names: names headers that are not sent: set headers: to true, ratelimit or x_ratelimit",
        ),
        (
            "  headers: ratelimit\n  header_names: { limit: \"X Quota\" }\n".to_owned(),
            "envoy.header_names.limit: \"X Quota\" is not a header name",
        ),
        (
            "  headers: ratelimit\n  header_names: { limit: X-Quota, reset: x-quota }\n".to_owned(),
            "envoy.header_names.reset: the same name as envoy.header_names.limit",
        ),
        (
            "  headers: ratelimit\n  header_names: { reset: retry-after }\n".to_owned(),
            "envoy.header_names.reset: Retry-After is a header of its own",
        ),
        (
            "  headers: ratelimit\n  header_names: { retry: X }\n".to_owned(),
            "envoy.header_names.retry: unknown field (expected one of: limit, remaining, reset)",
        ),
        (
            "  unknown_domain: maybe\n".to_owned(),
            "envoy.unknown_domain: expected ok or error, found the string \"maybe\"",
        ),
        (
            "  record: some\n".to_owned(),
            "envoy.record: expected all_or_nothing or every_hit, found the string \"some\"",
        ),
        (
            format!("{d}        - {{ key: a, rate_limit: {{ unit: second, requests_per_unit: 9007199254740992 }} }}\n"),
            "envoy.domains[0].descriptors[0].rate_limit.requests_per_unit: 9007199254740992 is too large (at most 9007199254740991)",
        ),
        (
            format!("{d}        - {{ key: a, rate_limit: {{ unit: second }} }}\n"),
            "envoy.domains[0].descriptors[0].rate_limit.requests_per_unit: is required",
        ),
        (
            format!("{d}        - {{ key: a, value: x, mask: {{ ipv4: 24 }}, resource: api/search }}\n"),
            "envoy.domains[0].descriptors[0].mask: only a node without a value can have a mask",
        ),
        (
            format!("{d}        - {{ key: a, mask: {{ ipv4: 33 }} }}\n"),
            "envoy.domains[0].descriptors[0].mask.ipv4: 33 is longer than an IPv4 address (32 bits)",
        ),
        (
            format!("{d}        - {{ key: a, mask: {{ ipv6: 129 }} }}\n"),
            "envoy.domains[0].descriptors[0].mask.ipv6: 129 is longer than an IPv6 address (128 bits)",
        ),
        (
            format!("{d}        - {{ key: a, mask: {{ ipv6: 99999999999 }} }}\n"),
            "envoy.domains[0].descriptors[0].mask.ipv6: 99999999999 is longer than an IPv6 address",
        ),
        (
            format!("{d}        - {{ key: a, mask: {{ ipv5: 1 }} }}\n"),
            "envoy.domains[0].descriptors[0].mask.ipv5: unknown field (expected one of: ipv4, ipv6)",
        ),
        (
            format!("{d}        - {{ key: a, resource: nowhere }}\n"),
            "envoy.domains[0].descriptors[0].resource: unknown resource \"nowhere\"",
        ),
        (
            format!("{d}        - {{ key: a, descriptors: [ {{ key: b, resource: vm }} ] }}\n"),
            "envoy.domains[0].descriptors[0].descriptors[0].resource: resource \"vm\" is copy-limited",
        ),
        (
            format!("{d}        - {{ key: a, resource: api/search, unlimited: true }}\n"),
            "envoy.domains[0].descriptors[0]: names resource and unlimited; a descriptor has at most one",
        ),
        (
            format!("{d}        - {{ key: a, value: x }}\n        - {{ key: a }}\n        - {{ key: a, value: x }}\n"),
            "envoy.domains[0].descriptors[2]: duplicate descriptor: key \"a\" and value \"x\" (first at envoy.domains[0].descriptors[0])",
        ),
        (
            format!("{d}        - {{ key: a }}\n        - {{ key: a, unlimited: true }}\n"),
            "envoy.domains[0].descriptors[1]: duplicate descriptor: key \"a\" and no value",
        ),
        (
            format!("{d}        - {{ key: a, value: 5 }}\n"),
            "envoy.domains[0].descriptors[0].value: expected a string, found the number 5; quote it: \"5\"",
        ),
        (
            format!("{d}        - {{ key: '' }}\n"),
            "envoy.domains[0].descriptors[0].key: must not be empty",
        ),
        (
            format!("{d}        - {{ value: x }}\n"),
            "envoy.domains[0].descriptors[0].key: is required",
        ),
        (
            format!("{d}        - {{ key: a, limit: 5 }}\n"),
            "envoy.domains[0].descriptors[0].limit: unknown field",
        ),
        (
            format!("{d}        - {{ key: a, shadow_mode: yes please }}\n"),
            "envoy.domains[0].descriptors[0].shadow_mode: expected true or false",
        ),
        (
            "  domains:\n    - { domain: edge }\n    - { domain: edge }\n".to_owned(),
            "envoy.domains[1].domain: duplicate Envoy domain \"edge\" (first at envoy.domains[0])",
        ),
        (
            "  domains:\n    - { descriptors: [] }\n".to_owned(),
            "envoy.domains[0].domain: is required",
        ),
        (
            "  shadow: true\n".to_owned(),
            "envoy.shadow: unknown field (expected one of: shadow_mode, headers, header_names, unknown_domain, \
             match, record, windows, descriptor_limits, domains)",
        ),
        (
            "  headers: 1\n".to_owned(),
            "envoy.headers: expected true, false, ratelimit or x_ratelimit, found the number 1",
        ),
        (
            "  - domain: edge\n".to_owned(),
            "envoy: expected the envoy section (a mapping), found a list",
        ),
    ];
    for (section, want) in cases {
        let got = envoy_errors(section);
        assert!(
            got.len() == 1 && got[0].starts_with(want),
            "{section}\nwant {want}\ngot {got:#?}"
        );
    }
}

#[test]
fn envoy_sections_are_bounded_before_they_are_read() {
    // Too deep: the 17th level is refused at the 16th's `descriptors`.
    let mut node = serde_json::json!({"key": "leaf", "unlimited": true});
    for i in 0..crate::envoy::MAX_DEPTH {
        node = serde_json::json!({"key": format!("k{i}"), "descriptors": [node]});
    }
    let doc = serde_json::json!({"envoy": {"domains": [{"domain": "d", "descriptors": [node]}]}});
    let e = Config::from_value(&doc).expect_err("too deep");
    let path = format!(
        "envoy.domains[0].descriptors[0]{}",
        ".descriptors[0]".repeat(crate::envoy::MAX_DEPTH - 1)
    );
    assert_eq!(
        e.0[0].to_string(),
        format!("{path}.descriptors: descriptors nest deeper than 16 levels, the most allowed")
    );
    // Exactly 16 levels load.
    let node = node["descriptors"][0].clone();
    let doc = serde_json::json!({"envoy": {"domains": [{"domain": "d", "descriptors": [node]}]}});
    Config::from_value(&doc).expect("16 levels");
    // Too many nodes, over all domains.
    let wide: Vec<_> = (0..=crate::envoy::MAX_NODES / 2)
        .map(|i| serde_json::json!({"key": format!("k{i}")}))
        .collect();
    let doc = serde_json::json!({"envoy": {"domains": [
        {"domain": "a", "descriptors": wide},
        {"domain": "b", "descriptors": wide},
    ]}});
    let e = Config::from_value(&doc).expect_err("too many");
    assert_eq!(
        e.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["envoy.domains: 100002 descriptor nodes, at most 100000"]
    );
    // Too long a key or value.
    let long = "v".repeat(crate::envoy::MAX_VALUE_BYTES + 1);
    let doc = serde_json::json!({"envoy": {"domains": [{"domain": "d", "descriptors": [
        {"key": "k".repeat(257), "value": long}
    ]}]}});
    let e: Vec<_> = Config::from_value(&doc)
        .expect_err("too long")
        .0
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        e,
        [
            "envoy.domains[0].descriptors[0].key: is 257 bytes long; at most 256 are allowed",
            "envoy.domains[0].descriptors[0].value: is 1025 bytes long; at most 1024 are allowed",
        ]
    );
}

#[test]
fn inline_limit_names_are_checked_against_resources() {
    let yaml = "resources:\n  - { name: envoy/edge/tenant, kind: rate, tiers: [] }\nenvoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - { key: tenant, rate_limit: { unit: hour, requests_per_unit: 3 } }\n";
    assert_eq!(
        errors(yaml),
        [
            "envoy.domains[0].descriptors[0].rate_limit: its resource name \"envoy/edge/tenant\" is also the name of resources[0]; the two would share counts, so rename that resource"
        ]
    );
    // Names escape `/` and `=`, so these two never share counts.
    let yaml = "envoy:\n  domains:\n    - domain: a/b\n      descriptors:\n        - { key: 'c=d', rate_limit: { unit: hour, requests_per_unit: 3 } }\n    - domain: a\n      descriptors:\n        - { key: b, descriptors: [ { key: c, value: d, rate_limit: { unit: hour, requests_per_unit: 3 } } ] }\n";
    let (c, _) = Config::from_yaml(yaml).expect("valid");
    let e = c.envoy().expect("envoy");
    let first = e.domains()[0].descriptors()[0].id();
    let second = e.domains()[1].descriptors()[0].descriptors()[0].id();
    assert_eq!((first, second), ("envoy/a\\/b/c\\=d", "envoy/a/b/c=d"));
    // A name longer than a resource name may be is refused at its node.
    let long = "d".repeat(1000);
    let yaml = format!(
        "envoy:\n  domains:\n    - domain: {long}\n      descriptors:\n        - {{ key: tenant, value: {long}, rate_limit: {{ unit: hour, requests_per_unit: 3 }} }}\n"
    );
    let e = errors(&yaml);
    assert_starts(
        &e,
        0,
        "envoy.domains[0].descriptors[0].rate_limit: its resource name, derived from the domain, keys and values on its path, cannot be used: resource is 2014 bytes long",
    );
}

// `kind: lease` (SPEC §12).

const LEASE_EXAMPLE: &str = r#"
resources:
  - name: bigtable/qps
    kind: lease
    capacity: 1000          # what is handed out in all (static: per client)
    algorithm: fair_share   # none | static | proportional_share | fair_share
    lease_length: 60s
    refresh_interval: 5s
    safe_capacity: 10       # optional; else capacity / number of clients
    learning_mode: 60s      # optional, default lease_length; 0 turns it off
  - name: bigtable/scan
    kind: lease
    capacity: 2.5
    algorithm: proportional_share
    lease_length: 10s
    refresh_interval: 10s
"#;

#[test]
fn the_lease_example_of_spec_12_loads_and_round_trips() {
    use crate::lease::{Algorithm as Share, Quantity};
    let (c, adj) = Config::from_yaml(LEASE_EXAMPLE).expect("valid");
    assert!(adj.is_empty());
    let Some(Resource {
        kind: ResourceKind::Lease(l),
        ..
    }) = c.resource("bigtable/qps")
    else {
        panic!("a lease resource")
    };
    let p = l.params();
    assert_eq!(p.capacity(), Quantity::units(1000).expect("small"));
    assert_eq!(p.algorithm(), Share::FairShare);
    assert_eq!((p.lease_length(), p.refresh_interval()), (60_000, 5_000));
    assert_eq!(p.configured_safe_capacity(), Quantity::units(10));
    assert_eq!(p.learning_mode(), 60_000);
    let Some(Resource {
        kind: ResourceKind::Lease(scan),
        ..
    }) = c.resource("bigtable/scan")
    else {
        panic!("a lease resource")
    };
    assert_eq!(
        scan.params().capacity(),
        Quantity::from_micros(2_500_000).expect("small")
    );
    assert_eq!(scan.params().learning_mode(), 10_000, "one lease length");
    assert_eq!(scan.params().configured_safe_capacity(), None);
    let yaml = c.to_yaml();
    assert!(yaml.contains("capacity: 2.5"), "{yaml}");
    let (again, adj) = Config::from_yaml(&yaml).expect("rendered config parses");
    assert!(adj.is_empty());
    assert_eq!(again, c, "{yaml}");
    assert_eq!(again.to_yaml(), yaml, "rendering is stable");
}

#[test]
fn lease_resources_are_not_for_requests_nor_envoy() {
    let (c, _) = Config::from_yaml(LEASE_EXAMPLE).expect("valid");
    assert_eq!(
        c.rate_like("bigtable/qps", "d", "request")
            .expect_err("a lease is not rate-like")
            .to_string(),
        "resource \"bigtable/qps\" is lease-limited; request needs a rate-limited resource"
    );
    assert!(c.copy("bigtable/qps", "reserve").is_err());
    assert!(c.meter("bigtable/qps", "d").is_none());
    let e = errors(&format!(
        "{LEASE_EXAMPLE}envoy:\n  domains:\n    - domain: d\n      descriptors:\n        - {{ key: k, resource: bigtable/qps }}\n"
    ));
    assert_eq!(
        e,
        [
            "envoy.domains[0].descriptors[0].resource: resource \"bigtable/qps\" is a capacity \
             lease; an Envoy descriptor needs a rate-like one (rate, bucket, window or queue)"
        ]
    );
}

#[test]
fn bad_lease_fields_are_errors_at_their_path() {
    let lease = |fields: &str| format!("resources:\n  - {{ name: l/x, kind: lease, {fields} }}\n");
    let ok = "capacity: 10, algorithm: static, lease_length: 10s, refresh_interval: 1s";
    assert!(Config::from_yaml(&lease(ok)).is_ok());
    let cases = [
        (
            "algorithm: static, lease_length: 10s, refresh_interval: 1s",
            "resources[0].capacity: is required",
        ),
        (
            "capacity: -1, algorithm: static, lease_length: 10s, refresh_interval: 1s",
            "resources[0].capacity: capacity is -1; capacities start at 0",
        ),
        (
            "capacity: \"ten\", algorithm: static, lease_length: 10s, refresh_interval: 1s",
            "resources[0].capacity: expected a number such as 100 or 2.5, found",
        ),
        (
            "capacity: 1e300, algorithm: static, lease_length: 10s, refresh_interval: 1s",
            "resources[0].capacity: capacity is 1e300; the largest capacity Charon keeps exactly is",
        ),
        (
            "capacity: 10, algorithm: fair, lease_length: 10s, refresh_interval: 1s",
            "resources[0].algorithm: expected none, static, proportional_share or fair_share",
        ),
        (
            "capacity: 10, algorithm: static, lease_length: 1s, refresh_interval: 10s",
            "resources[0].refresh_interval: \"10s\" must not be longer than lease_length (1000ms)",
        ),
        (
            "capacity: 10, algorithm: static, lease_length: 0s, refresh_interval: 0s",
            "resources[0].lease_length: \"0s\" must be positive",
        ),
        (
            "capacity: 10, algorithm: static, lease_length: 10s, refresh_interval: 1s, safe_capacity: -2",
            "resources[0].safe_capacity: safe_capacity is -2; capacities start at 0",
        ),
        (
            "capacity: 10, algorithm: static, lease_length: 10s, refresh_interval: 1s, learning_mode: soon",
            "resources[0].learning_mode: ",
        ),
        (
            "capacity: 10, algorithm: static, lease_length: 10s, refresh_interval: 1s, domains: {}",
            "resources[0].domains: not a field of a lease resource",
        ),
    ];
    for (fields, want) in cases {
        let e = errors(&lease(fields));
        assert_any(&e, want);
    }
}

#[test]
fn copy_waiting_fields_are_checked_and_rendered() {
    let e = one("{ name: a, kind: copy, domain_limit: 1, queue_limit: -1, wait_mode: any }");
    assert_any(&e, "resources[0].queue_limit:");
    assert_any(
        &e,
        "resources[0].wait_mode: expected exclusive or shared_result, found the string \"any\"",
    );
    let e = one("{ name: a, kind: copy, domain_limit: 1, queue_limit: 1000001 }");
    assert_any(
        &e,
        "resources[0].queue_limit: 1000001 is more than the 1000000",
    );
    let yaml = "resources:\n  - { name: a, kind: copy, domain_limit: 1, queue_limit: 7, wait_mode: shared_result }\n  - { name: b, kind: copy, domain_limit: 1 }\n";
    let c = Config::from_yaml(yaml).expect("valid").0;
    let (a, _) = c.copy("a", "reserve").expect("a copy resource");
    assert_eq!(
        (a.queue_limit, a.wait_mode),
        (7, crate::copy::WaitMode::SharedResult)
    );
    let (b, _) = c.copy("b", "reserve").expect("a copy resource");
    assert_eq!(
        (b.queue_limit, b.wait_mode),
        (100, crate::copy::WaitMode::Exclusive)
    );
    let again = Config::from_yaml(&c.to_yaml()).expect("renders valid").0;
    assert_eq!(again, c);
}
