use charon_core::config::Config;
use charon_core::envoy::{Action as CoreAction, Matched};
use serde_json::json;

use super::*;

fn run(format: Format, files: &[(&str, &str)]) -> Converted {
    let sources: Vec<Source<'_>> = files
        .iter()
        .map(|&(name, text)| Source { name, text })
        .collect();
    convert(format, &sources)
}

fn lines(findings: &[Finding]) -> Vec<String> {
    findings.iter().map(ToString::to_string).collect()
}

/// Converts, checks the result with Charon's own parser, returns it and
/// the dropped findings.
fn ok(format: Format, files: &[(&str, &str)]) -> (Config, Vec<String>) {
    let c = run(format, files);
    assert!(c.errors.is_empty(), "errors: {:?}", lines(&c.errors));
    let value = c.config.expect("a configuration");
    let (config, _) = Config::from_value(&value)
        .unwrap_or_else(|e| panic!("the converted configuration is refused: {e:?}\n{value:#}"));
    (config, lines(&c.dropped))
}

fn errors(format: Format, text: &str) -> Vec<String> {
    let c = run(format, &[("f.yaml", text)]);
    assert!(c.config.is_none());
    lines(&c.errors)
}

const MESSAGING: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[test]
fn the_messaging_example_converts_to_inline_day_limits() {
    let (config, dropped) = ok(Format::EnvoyRatelimit, &[("m.yaml", MESSAGING)]);
    assert!(dropped.is_empty(), "{dropped:?}");
    let e = config.envoy().expect("envoy");
    let marketing = e
        .match_descriptor(
            "messaging",
            &[("message_type", "marketing"), ("to_number", "2061111111")],
        )
        .expect("matches");
    let Matched::Limited(l) = marketing else {
        panic!("{marketing:?}")
    };
    assert_eq!(
        l.resource,
        "envoy/messaging/message_type=marketing/to_number"
    );
    assert_eq!(l.domain, "2061111111");
    assert_eq!(l.rate_limit.map(|r| r.requests_per_unit()), Some(5));
    let any = e
        .match_descriptor("messaging", &[("to_number", "2061111111")])
        .expect("matches");
    let Matched::Limited(l) = any else {
        panic!("{any:?}")
    };
    assert_eq!(l.rate_limit.map(|r| r.requests_per_unit()), Some(100));
    assert_eq!(l.rate_limit.map(|r| r.unit().name()), Some("day"));
}

#[test]
fn replaces_names_and_detailed_metrics_are_reported_by_path() {
    let text = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    detailed_metric: true
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: { name: specific_limit, requests_per_unit: 5, unit: second }
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [ { name: specific_limit } ]
          requests_per_unit: 10
          unit: second
";
    let (_, dropped) = ok(Format::EnvoyRatelimit, &[("e7.yaml", text)]);
    assert_eq!(dropped.len(), 3, "{dropped:?}");
    assert!(dropped[0].starts_with(
        "e7.yaml: descriptors[0].detailed_metric: not carried over: Charon's metrics"
    ));
    assert!(
        dropped[1].starts_with(
            "e7.yaml: descriptors[0].descriptors[0].rate_limit.name: not carried over:"
        )
    );
    assert!(dropped[2].starts_with(
        "e7.yaml: descriptors[1].descriptors[0].rate_limit.replaces: not carried over: Charon decides every descriptor"
    ));
}

#[test]
fn shadow_mode_stays_on_its_own_rule_and_whitelisted_nodes_stay_unlimited() {
    let text = "
domain: d
descriptors:
  - key: service
    rate_limit: { unit: second, requests_per_unit: 10 }
    shadow_mode: true
    descriptors:
      - key: user
        rate_limit: { unit: second, requests_per_unit: 20 }
      - key: health
";
    let (config, dropped) = ok(Format::EnvoyRatelimit, &[("d.yaml", text)]);
    assert!(dropped.is_empty(), "{dropped:?}");
    let e = config.envoy().expect("envoy");
    let top = e.domain("d").expect("d").descriptors();
    assert_eq!(top[0].shadow_mode(), Some(true));
    assert_eq!(top[0].descriptors()[0].shadow_mode(), Some(false));
    let Ok(Matched::Limited(user)) = e.match_descriptor("d", &[("service", "a"), ("user", "u")])
    else {
        panic!("user is limited")
    };
    assert!(!user.shadow);
    let Ok(Matched::Limited(service)) = e.match_descriptor("d", &[("service", "a")]) else {
        panic!("service is limited")
    };
    assert!(service.shadow);
    // (service, health) matched a node without a limit in envoyproxy/ratelimit.
    assert!(matches!(
        e.match_descriptor("d", &[("service", "a"), ("health", "x")]),
        Ok(Matched::Unlimited { .. })
    ));
}

#[test]
fn odd_units_and_zero_limits_become_resources() {
    let text = "
domain: edge
descriptors:
  - key: remote_address
    value: 50.0.0.5
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: api_key
    rate_limit: { unit: WEEK, requests_per_unit: 1000 }
  - key: plan
    value: 7
    rate_limit: { unit: month, requests_per_unit: 1 }
  - key: ldap
    rate_limit: { unlimited: true }
";
    let (config, dropped) = ok(Format::EnvoyRatelimit, &[("edge.yaml", text)]);
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    assert_eq!(
        dropped[0],
        "edge.yaml: descriptors[2].value: note: the number 7 is used as the text \"7\"; if the \
         file wrote it otherwise (leading zeros, 0x…), quote it there"
    );
    assert!(dropped[1].starts_with(
        "edge.yaml: descriptors[2].rate_limit.unit: not carried over: a month has no fixed length"
    ));
    let names: Vec<&str> = config.resources().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["imported/deny-all", "imported/edge/api_key"]);
    let nodes = config
        .envoy()
        .expect("envoy")
        .domain("edge")
        .expect("edge")
        .descriptors();
    assert_eq!(
        nodes[0].action(),
        Some(&CoreAction::Resource("imported/deny-all".into()))
    );
    assert_eq!(nodes[2].value(), Some("7"), "numbers are read as text");
    assert_eq!(nodes[2].action(), None);
    assert_eq!(nodes[3].action(), Some(&CoreAction::Unlimited));
    let v = config.to_value();
    assert_eq!(v["resources"][1]["window"], json!("7days"));
}

#[test]
fn bad_envoy_ratelimit_files_are_errors_by_path() {
    assert_eq!(
        errors(Format::EnvoyRatelimit, "descriptors: []\n"),
        ["f.yaml: domain: is required"]
    );
    let e = errors(
        Format::EnvoyRatelimit,
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: -1 }\n  - { key: b, colour: red }\n  - { key: c }\n  - { key: c }\n",
    );
    assert_eq!(
        e,
        [
            "f.yaml: descriptors[0].rate_limit.requests_per_unit: expected a whole number from 0 to 9007199254740991, found the number -1",
            "f.yaml: descriptors[0].rate_limit.unit: expected second, minute, hour, day, week, month or year, found \"fortnight\"",
            "f.yaml: descriptors[1].colour: unknown field \"colour\" (known: key, value, rate_limit, descriptors, shadow_mode, detailed_metric, value_to_metric)",
            "f.yaml: descriptors[3]: the descriptor key \"c\" is also at descriptors[2] (envoyproxy/ratelimit refuses duplicates too)",
        ]
    );
    assert!(
        errors(Format::EnvoyRatelimit, "domain: [unclosed\n")[0]
            .starts_with("f.yaml: not valid YAML")
    );
    // Scalars whose text YAML did not keep.
    assert_eq!(
        errors(
            Format::EnvoyRatelimit,
            "domain: d\ndescriptors:\n  - { key: a, value: yes }\n  - { key: b, value: 1.50 }\n"
        ),
        [
            "f.yaml: descriptors[0].value: the boolean true is not text, and YAML does not keep how it was written (yes, on, n, 1.50, …): quote it",
            "f.yaml: descriptors[1].value: the number 1.5 is not text, and YAML does not keep how it was written (yes, on, n, 1.50, …): quote it",
        ]
    );
    assert_eq!(
        errors(Format::EnvoyRatelimit, "- 1\n"),
        ["f.yaml: expected an envoyproxy/ratelimit configuration (a mapping), found a list"]
    );
    let two = run(
        Format::EnvoyRatelimit,
        &[("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")],
    );
    assert_eq!(lines(&two.errors).len(), 1);
    assert!(
        lines(&two.errors)[0].starts_with("b.yaml: domain: the domain \"d\" is in an earlier file")
    );
}

#[test]
fn several_files_are_several_domains() {
    let (config, _) = ok(
        Format::EnvoyRatelimit,
        &[
            ("m.yaml", MESSAGING),
            (
                "i.yaml",
                "domain: internal\ndescriptors:\n  - { key: azure, rate_limit: { unit: minute, requests_per_unit: 100 } }\n",
            ),
        ],
    );
    let names: Vec<&str> = config
        .envoy()
        .expect("envoy")
        .domains()
        .iter()
        .map(charon_core::envoy::EnvoyDomain::name)
        .collect();
    assert_eq!(names, ["messaging", "internal"]);
}

const LIMITS: &str = r#"
- namespace: example.org
  max_value: 10
  seconds: 60
  conditions:
    - "req.method == 'GET'"
  variables:
    - user_id
- namespace: example.org
  max_value: 5
  seconds: 60
  conditions:
    - "req.method == 'POST'"
  variables:
    - user_id
  name: posts
- namespace: example.org
  max_value: 1000
  seconds: 90
  conditions: []
  variables:
    - "descriptors[0]['api_key']"
- namespace: other
  max_value: 3
  seconds: 1
  conditions:
    - "descriptors[0].plan == \"free\""
  variables: []
- namespace: example.org
  max_value: 1
  seconds: 1
  conditions:
    - "req.method != 'GET'"
  variables: [ user_id ]
- namespace: example.org
  max_value: 1
  seconds: 1
  conditions: [ "descriptors[0]['a'] == 'x' && descriptors[0]['b'] == 'y'" ]
  variables: []
"#;

#[test]
fn limitador_limits_become_paths_of_the_namespace_domain() {
    let (config, dropped) = ok(Format::Limitador, &[("limits.yaml", LIMITS)]);
    let e = config.envoy().expect("envoy");
    let Ok(Matched::Limited(get)) = e.match_descriptor(
        "example.org",
        &[("req.method", "GET"), ("user_id", "alice")],
    ) else {
        panic!("GET is limited")
    };
    assert_eq!(get.domain, "alice");
    assert_eq!(get.rate_limit.map(|r| r.requests_per_unit()), Some(10));
    let Ok(Matched::Limited(post)) = e.match_descriptor(
        "example.org",
        &[("req.method", "POST"), ("user_id", "alice")],
    ) else {
        panic!("POST is limited")
    };
    assert_eq!(post.rate_limit.map(|r| r.requests_per_unit()), Some(5));
    let Ok(Matched::Limited(key)) = e.match_descriptor("example.org", &[("api_key", "k1")]) else {
        panic!("api_key is limited")
    };
    assert_eq!(key.resource, "imported/example.org/api_key");
    assert!(key.rate_limit.is_none());
    let Ok(Matched::Limited(free)) = e.match_descriptor("other", &[("plan", "free")]) else {
        panic!("plan=free is limited")
    };
    assert_eq!(free.domain, "*");
    assert_eq!(
        config.to_value()["resources"][0],
        json!({"name": "imported/example.org/api_key", "kind": "window", "algorithm": "fixed", "limit": 1000, "window": "1m 30s"})
    );
    assert_eq!(dropped.len(), 4, "{dropped:?}");
    assert!(dropped[0].starts_with("limits.yaml: [1].name: not carried over"));
    assert!(dropped[1].starts_with(
        "limits.yaml: [4].conditions[0]: not carried over: the condition \"req.method != 'GET'\" cannot be expressed"
    ));
    assert!(dropped[2].starts_with("limits.yaml: [5].conditions[0]: not carried over:"));
    assert!(
        dropped[3].starts_with("limits.yaml: note: Limitador finds a limit's keys in any order")
    );
}

#[test]
fn limitador_limits_that_charon_cannot_place_are_reported() {
    let text = "
- { namespace: ns, max_value: 1, seconds: 1, conditions: [], variables: [] }
- { namespace: ns, max_value: 1, seconds: 1, variables: [u] }
- { namespace: ns, max_value: 9, seconds: 3600, variables: [u] }
- { namespace: ns, max_value: 0, seconds: 1, variables: [u, u] }
- { namespace: ns, max_value: 0, seconds: 5, variables: [blocked] }
";
    let (config, dropped) = ok(Format::Limitador, &[("l.yaml", text)]);
    assert_eq!(dropped.len(), 3, "{dropped:?}");
    assert!(dropped[0].starts_with("l.yaml: [0]: not carried over: a limit with neither"));
    assert!(dropped[1].starts_with("l.yaml: [2]: not carried over: l.yaml: [1] already limits"));
    assert!(dropped[2].starts_with("l.yaml: [3]: not carried over: the key \"u\" is used twice"));
    let nodes = config
        .envoy()
        .expect("envoy")
        .domain("ns")
        .expect("ns")
        .descriptors();
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        nodes[1].action(),
        Some(&CoreAction::Resource("imported/deny-all".into()))
    );
}

#[test]
fn bad_limitador_files_are_errors_by_path() {
    assert_eq!(
        errors(Format::Limitador, "namespace: n\n"),
        ["f.yaml: expected Limitador's limits file (a list of limits), found a mapping"]
    );
    assert_eq!(
        errors(
            Format::Limitador,
            "- { namespace: ns, max_value: 1, seconds: 0, variables: [u], extra: 1 }\n- { max_value: x, seconds: 1, conditions: [3] }\n"
        ),
        [
            "f.yaml: [0].extra: unknown field \"extra\" (known: namespace, max_value, seconds, conditions, variables, name)",
            "f.yaml: [1].namespace: is required",
            "f.yaml: [1].max_value: expected a whole number from 0 to 9007199254740991, found the string \"x\"",
            "f.yaml: [1].conditions[0]: expected a string, found the number 3",
        ]
    );
}

#[test]
fn conditions_and_keys_parse_in_every_spelling_limitador_has() {
    assert_eq!(
        limitador_condition("req.method == 'GET'"),
        Ok(("req.method".into(), "GET".into()))
    );
    assert_eq!(
        limitador_condition("req.method == GET"),
        Ok(("req.method".into(), "GET".into()))
    );
    assert_eq!(
        limitador_condition("descriptors[0][\"x-y\"] == \"a b\""),
        Ok(("x-y".into(), "a b".into()))
    );
    assert!(limitador_condition("descriptors[1].a == 'b'").is_err());
    assert!(limitador_condition("size(descriptors) > 1").is_err());
    assert!(limitador_condition("a == 'b' || c == 'd'").is_err());
}

fn limitador_condition(s: &str) -> Result<(String, String), String> {
    limitador::condition(s)
}

#[test]
fn a_limitador_limit_repeated_in_another_file_is_reported_with_the_first() {
    let limit = "- { namespace: ns, max_value: 1, seconds: 1, variables: [u] }\n";
    let (config, dropped) = ok(Format::Limitador, &[("a.yaml", limit), ("b.yaml", limit)]);
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert!(
        dropped[0].starts_with("b.yaml: [0]: not carried over: a.yaml: [0] already limits"),
        "{dropped:?}"
    );
    assert_eq!(
        config
            .envoy()
            .expect("envoy")
            .domain("ns")
            .expect("ns")
            .descriptors()
            .len(),
        1
    );
}
