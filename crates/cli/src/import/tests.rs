use charon_core::config::Config;
use charon_core::envoy::{MatchMode, Matched, Record, Windows};
use serde_json::Value;

use super::*;

fn run(format: Format, files: &[(&str, &str)]) -> Converted {
    let sources: Vec<Source<'_>> = files
        .iter()
        .map(|&(name, text)| Source { name, text })
        .collect();
    convert(format, &sources, &PeerSettings::default())
}

fn lines(findings: &[Finding]) -> Vec<String> {
    findings.iter().map(ToString::to_string).collect()
}

/// Converts, checks the result with Charon's own parser; the
/// configuration, its losses and its notes.
fn ok(format: Format, files: &[(&str, &str)]) -> (Config, Vec<String>, Vec<String>) {
    let c = run(format, files);
    assert!(c.errors.is_empty(), "errors: {:?}", lines(&c.errors));
    let value = c.config.expect("a configuration");
    let (config, _) = Config::from_value(&value)
        .unwrap_or_else(|e| panic!("the converted configuration is refused: {e:?}\n{value:#}"));
    (config, lines(&c.losses), lines(&c.notes))
}

fn errors(format: Format, text: &str) -> Vec<String> {
    let c = run(format, &[("f.yaml", text)]);
    assert!(c.config.is_none(), "{:?}", c.config);
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
      unit: DAY
      requests_per_unit: 100
";

#[test]
fn envoyproxy_files_keep_their_tree_and_get_its_settings() {
    let (config, losses, notes) = ok(Format::EnvoyRatelimit, &[("m.yaml", MESSAGING)]);
    assert!(
        losses.is_empty() && notes.is_empty(),
        "{losses:?} {notes:?}"
    );
    let e = config.envoy().expect("envoy");
    assert_eq!(e.settings.matching, MatchMode::Whole);
    assert_eq!(e.settings.record, Record::EveryHit);
    assert_eq!(e.settings.windows, Windows::Fixed);
    let m = e
        .match_descriptor(
            "messaging",
            &[("message_type", "marketing"), ("to_number", "2061111111")],
        )
        .expect("matches");
    let Matched::Limited(l) = m else {
        panic!("{m:?}")
    };
    assert_eq!(l.domain, "2061111111");
    assert_eq!(l.rate_limit.map(|r| r.requests_per_unit()), Some(5));
    // The whole descriptor must match: message_type alone is not limited.
    let m = e
        .match_descriptor("messaging", &[("message_type", "marketing")])
        .expect("matches");
    assert_eq!(m, Matched::NotLimited);
}

#[test]
fn every_field_envoyproxy_accepts_is_carried_over() {
    let file = "
domain: d
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    detailed_metric: true
    value_to_metric: true
    rate_limit: { unit: Week, requests_per_unit: 7, name: files }
  - key: vip
    rate_limit:
      unit: month
      requests_per_unit: 0
      replaces: [ { name: files } ]
  - key: year
    quota_mode: true
    shadow_mode: true
    rate_limit: { unit: year, requests_per_unit: 1 }
    metadata: { any: { thing: [1, 2] } }
    descriptors:
      - key: below
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: open
    rate_limit: { unlimited: true }
";
    let (config, losses, notes) = ok(Format::EnvoyRatelimit, &[("d.yaml", file)]);
    assert!(losses.is_empty(), "{losses:?}");
    assert_eq!(
        notes,
        [
            "d.yaml: descriptors[2].metadata: note: envoyproxy/ratelimit sends it in the reply's \
          dynamic metadata only with RESPONSE_DYNAMIC_METADATA=true; Charon sends no dynamic \
          metadata"
        ]
    );
    let yaml = config.to_yaml();
    for want in [
        "value: /files/*",
        "share_threshold: true",
        "detailed_metric: true",
        "value_to_metric: true",
        "name: files",
        "unit: week",
        "unit: month",
        "requests_per_unit: 0",
        "replaces:\n      - files",
        "quota_mode: true",
        "unlimited: true",
        "unit: year",
    ] {
        assert!(yaml.contains(want), "{want:?} in\n{yaml}");
    }
    // The shadowed limit's child is not shadowed (there, shadow_mode is a
    // rule's own).
    let e = config.envoy().expect("envoy");
    let m = e
        .match_descriptor("d", &[("year", "y"), ("below", "b")])
        .expect("matches");
    let Matched::Limited(l) = m else {
        panic!("{m:?}")
    };
    assert!(!l.shadow);
}

#[test]
fn files_envoyproxy_refuses_are_refused_with_its_reasons() {
    let e = |text: &str| errors(Format::EnvoyRatelimit, text);
    assert_eq!(
        e(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: foo, requests_per_unit: 5 }\n"
        ),
        [
            "f.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'foo' (second, minute, hour, day, week, month or year, in any case)"
        ]
    );
    assert_eq!(
        e("descriptors:\n"),
        ["f.yaml: domain: config file cannot have empty domain"]
    );
    assert_eq!(
        e("domain: d\ndescriptors:\n  - value: v\n"),
        ["f.yaml: descriptors[0]: descriptor has empty key"]
    );
    assert_eq!(
        e("domain: d\ndescriptors:\n  - key: k\n    ratelimit: { unit: day }\n"),
        ["f.yaml: descriptors[0].ratelimit: config error, unknown key 'ratelimit'"]
    );
    assert_eq!(
        e("domain: d\ndescriptors:\n  - a\n"),
        ["f.yaml: descriptors[0]: config error, yaml file contains list of type other than map: a"]
    );
    assert_eq!(
        e("0.25: d\n"),
        ["f.yaml: config error, key is not of type string: 0.25"]
    );
    assert_eq!(
        e("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n"),
        [
            "f.yaml: descriptors[1]: duplicate descriptor composite key 'd.k_v' (first at descriptors[0])"
        ]
    );
    assert_eq!(
        e("domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: day }\n"),
        ["f.yaml: descriptors[0].rate_limit: should not specify rate limit unit when unlimited"]
    );
    assert_eq!(
        e(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: self, replaces: [ { name: self } ], unit: day }\n"
        ),
        [
            "f.yaml: descriptors[0].rate_limit.replaces[0]: replaces should not contain name of same descriptor"
        ]
    );
    assert_eq!(
        e(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: self, replaces: [ { name: } ], unit: day }\n"
        ),
        ["f.yaml: descriptors[0].rate_limit.replaces[0]: should not have an empty replaces entry"]
    );
    assert_eq!(
        e("domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n"),
        [
            "f.yaml: descriptors[0].share_threshold: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'"
        ]
    );
    assert!(e("'''\n")[0].starts_with("f.yaml: error loading config file: "));
    // Two files of one domain.
    let c = run(
        Format::EnvoyRatelimit,
        &[("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")],
    );
    assert!(lines(&c.errors)[0].starts_with("b.yaml: domain: duplicate domain 'd' in config file"));
}

#[test]
fn text_is_kept_as_envoyproxy_reads_it() {
    let (config, _, _) = ok(
        Format::EnvoyRatelimit,
        &[(
            "d.yaml",
            "domain: d\ndescriptors:\n  - key: code\n    value: 0123\n    rate_limit: { unit: day, requests_per_unit: 1 }\n  - key: flag\n    value: yes\n    rate_limit: { unit: day, requests_per_unit: 1 }\n",
        )],
    );
    let yaml = config.to_yaml();
    assert!(
        yaml.contains("value: \"0123\"") && yaml.contains("value: \"yes\""),
        "{yaml}"
    );
}

#[test]
fn limitador_limits_keep_their_conditions_on_any_descriptor() {
    let file = r#"
- namespace: ns
  max_value: 5
  seconds: 60
  name: per-user gets
  conditions:
    - "descriptors[0]['req.method'] == 'GET'"
    - "descriptors[1].y != '2'"
  variables: ["descriptors[0]['user_id']"]
- namespace: ns
  max_value: 1000
  seconds: 90
  conditions:
  variables:
- namespace: other
  seconds: 1
  conditions: ["req_method == 'POST'"]
  variables: ["app_id"]
  unknown_thing: 1
"#;
    let (config, losses, notes) = ok(Format::Limitador, &[("l.yaml", file)]);
    assert!(losses.is_empty(), "{losses:?}");
    assert_eq!(notes.len(), 3, "{notes:?}");
    let e = config.envoy().expect("envoy");
    assert_eq!(e.settings.windows, Windows::FirstHit);
    assert_eq!(e.settings.record, Record::AllOrNothing);
    let ns = e.domain("ns").expect("ns");
    assert_eq!(ns.limits().len(), 2);
    assert_eq!(ns.limits()[0].conditions().len(), 2);
    assert_eq!(ns.limits()[0].name(), Some("per-user gets"));
    assert!(ns.limits()[1].conditions().is_empty() && ns.limits()[1].variables().is_empty());
    // max_value defaults to 0.
    let other = e.domain("other").expect("other");
    let yaml = config.to_yaml();
    assert!(yaml.contains("requests_per_unit: 0"), "{yaml}");
    assert_eq!(other.limits()[0].variables()[0].key, "app_id");
}

#[test]
fn limitador_cel_charon_cannot_express_is_a_loss_and_duplicates_a_note() {
    let file = r#"
- namespace: ns
  max_value: 5
  seconds: 60
  conditions: ["descriptors[0].a == '1' || descriptors[0].b == '2'"]
  variables: []
- namespace: ns
  max_value: 5
  seconds: 60
  conditions: ["descriptors[0].a == '1'"]
  variables: []
- namespace: ns
  max_value: 50
  seconds: 60
  conditions: ["descriptors[0].a == '1'"]
  variables: []
"#;
    let c = run(Format::Limitador, &[("l.yaml", file)]);
    assert!(c.errors.is_empty());
    let losses = lines(&c.losses);
    assert_eq!(losses.len(), 1);
    assert!(
        losses[0].starts_with("l.yaml: [0].conditions[0]: not carried over: "),
        "{losses:?}"
    );
    assert!(lines(&c.notes)[0].starts_with("l.yaml: [2]: note: an earlier limit has the same"));
    assert_eq!(
        errors(
            Format::Limitador,
            "- namespace: ns\n  seconds: 1\n  variables: []\n"
        ),
        ["f.yaml: [0].conditions: missing field `conditions`"]
    );
    assert!(errors(Format::Limitador, "namespace: ns\n")[0].contains("expected a list of limits"));
}

const DEFAULTS: &str = "
NewRegistrationsPerIPAddress:
  burst: 20
  count: 20
  period: 1s
NewRegistrationsPerIPv6Range:
  burst: 30
  count: 30
  period: 2s
CertificatesPerFQDNSetPerAccount:
  burst: 5
  count: 5
  period: 168h
";

#[test]
fn boulder_limits_become_buckets_with_their_overrides() {
    let seed = "
NewRegistrationsPerIPAddress:10.0.0.2:
  burst: 20
  count: 40
  period: 1s
NewRegistrationsPerIPv6Range:2001:0db8:0000::/48:
  burst: 1
  count: 1
  period: 1s
CertificatesPerFQDNSetPerAccount:12345678:Example.org,example.com,example.org:
  burst: 9
  count: 9
  period: 1h
";
    let (config, losses, _) = ok(Format::Boulder, &[("d.yaml", DEFAULTS), ("o.yaml", seed)]);
    assert!(losses.is_empty());
    let yaml = config.to_yaml();
    for want in [
        "name: boulder/NewRegistrationsPerIPAddress",
        "kind: bucket",
        "\"10.0.0.2\":",
        "\"2001:db8::/48\":",
        "\"12345678:example.com,example.org\":",
    ] {
        assert!(yaml.contains(want), "{want:?} in\n{yaml}");
    }
    let list = "
- NewRegistrationsPerIPAddress:
    burst: 40
    count: 40
    period: 1s
    ids:
      - id: 64.112.117.1
        comment: Foo
";
    let (config, _, _) = ok(Format::Boulder, &[("d.yaml", DEFAULTS), ("o.yaml", list)]);
    assert!(config.to_yaml().contains("\"64.112.117.1\":"));
}

#[test]
fn boulder_files_boulder_refuses_are_refused_and_an_override_needs_a_default() {
    let e = |files: &[(&str, &str)]| {
        let c = run(Format::Boulder, files);
        assert!(c.config.is_none());
        lines(&c.errors)
    };
    assert_eq!(
        e(&[(
            "d.yaml",
            "NewRegistrationsPerIPAddress: { burst: 0, count: 20, period: 1s }\n"
        )]),
        ["d.yaml: NewRegistrationsPerIPAddress.burst: invalid burst '0', must be > 0"]
    );
    assert!(e(&[("d.yaml", "UsageRequestsPerIPv10Address: { burst: 1, count: 1, period: 1s }\n")])[0]
        .starts_with("d.yaml: UsageRequestsPerIPv10Address: unrecognized name \"UsageRequestsPerIPv10Address\" in default limit"));
    let bad_id = "- NewRegistrationsPerIPAddress:\n    burst: 1\n    count: 1\n    period: 1s\n    ids: [ { id: 10.0.0.5 }, { id: lol } ]\n";
    assert_eq!(
        e(&[("d.yaml", DEFAULTS), ("o.yaml", bad_id)]),
        [
            "o.yaml: [0].NewRegistrationsPerIPAddress.ids[1].id: validating name NewRegistrationsPerIPAddress and id \"lol\" for override limit: invalid IP address, \"lol\" must be an IP address"
        ]
    );
    let no_default = "NewOrdersPerAccount:12345678: { burst: 1, count: 1, period: 1s }\n";
    let got = e(&[("d.yaml", DEFAULTS), ("o.yaml", no_default)]);
    assert!(
        got[0].starts_with("o.yaml: [\"NewOrdersPerAccount:12345678\"]: an override of NewOrdersPerAccount, which the defaults file does not limit"),
        "{got:?}"
    );
    assert_eq!(
        e(&[
            ("d.yaml", DEFAULTS),
            (
                "o.yaml",
                "NewRegistrationsPerIPAddress10.0.0.1: { burst: 1, count: 1, period: 1s }\n"
            )
        ]),
        [
            "o.yaml: [\"NewRegistrationsPerIPAddress10.0.0.1\"]: invalid override \"NewRegistrationsPerIPAddress10.0.0.1\", must be formatted 'name:id'"
        ]
    );
    assert!(
        e(&[(
            "d.yaml",
            "NewRegistrationsPerIPAddress: { burst: 1, count: 1, period: 1s, extra: 2 }\n"
        )])[0]
            .contains("field extra not found")
    );
}

#[test]
fn every_conversion_passes_charons_own_checks() {
    for (format, files) in [
        (Format::EnvoyRatelimit, vec![("m.yaml", MESSAGING)]),
        (Format::Boulder, vec![("d.yaml", DEFAULTS)]),
    ] {
        let c = run(format, &files);
        let v: Value = c.config.expect("converted");
        assert!(Config::from_value(&v).is_ok());
    }
}
