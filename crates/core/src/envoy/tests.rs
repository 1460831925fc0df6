//! Descriptor matching (SPEC §11), rule by rule, on configurations parsed
//! the way the server parses them.

use super::*;
use crate::config::Config;

/// SPEC §11's example (`examples/envoy.yaml`, shown in docs/envoy.md), with
/// the resources and a sibling tree for the other rules.
fn example() -> String {
    let file = include_str!("../../../../examples/envoy.yaml");
    // After api/search, the example's one resource.
    let more = "period: 1s }
  - { name: api/search-vip, kind: window, algorithm: fixed, limit: 100, window: 1s }
  - { name: api/users, kind: rate, tiers: [ { limit: 5, window: 1s } ] }
";
    format!("{}{USERS}", file.replacen("period: 1s }\n", more, 1))
}

/// The sibling tree: a domain of its own after the example's.
const USERS: &str = r#"
    - domain: users
      descriptors:
        - key: user
          resource: api/users
          descriptors:
            - key: path
              descriptors:
                - key: method
                  value: POST
                  resource: api/search-vip
        - key: user
          value: vip
          resource: api/search-vip
        - key: region
          descriptors:
            - key: client
              mask: { ipv4: 24 }
              rate_limit: { unit: second, requests_per_unit: 5 }
            - key: unlimited_below
              unlimited: true
              descriptors:
                - key: x
                  shadow_mode: false
                  rate_limit: { unit: day, requests_per_unit: 1 }
        - key: plan
          value: trial
          shadow_mode: true
          descriptors:
            - key: user
              resource: api/users
            - key: paid
              shadow_mode: false
              resource: api/users
"#;

fn config() -> Config {
    Config::from_yaml(&example()).expect("valid").0
}

fn envoy(c: &Config) -> &Envoy {
    c.envoy().expect("an envoy section")
}

/// The resource and Charon domain a descriptor is limited under.
#[track_caller]
fn limited(c: &Config, domain: &str, entries: &[(&str, &str)]) -> (String, String, bool) {
    match envoy(c).match_descriptor(domain, entries) {
        Ok(Matched::Limited(l)) => (l.resource.to_string(), l.domain, l.shadow),
        other => panic!("{entries:?}: {other:?}"),
    }
}

#[track_caller]
fn limit<'a>(c: &'a Config, domain: &str, entries: &[(&str, &str)]) -> Limit<'a> {
    match envoy(c).match_descriptor(domain, entries) {
        Ok(Matched::Limited(l)) => *l,
        other => panic!("{entries:?}: {other:?}"),
    }
}

#[test]
fn the_spec_example_matches_by_address() {
    let c = config();
    let (r, d, shadow) = limited(
        &c,
        "edge",
        &[("generic_key", "search"), ("remote_address", "203.0.113.7")],
    );
    assert_eq!(
        (r.as_str(), d.as_str(), shadow),
        ("api/search", "203.0.113.7/32", false)
    );
    // Another search value matches nothing: not limited.
    let m = envoy(&c)
        .match_descriptor(
            "edge",
            &[("generic_key", "other"), ("remote_address", "1.2.3.4")],
        )
        .expect("valid");
    assert_eq!(m, Matched::NotLimited);
    // The value node alone names no action: not limited either.
    let m = envoy(&c)
        .match_descriptor("edge", &[("generic_key", "search")])
        .expect("valid");
    assert_eq!(m, Matched::NotLimited);
}

#[test]
fn a_value_beats_the_value_less_node_of_the_same_key() {
    let c = config();
    assert_eq!(limited(&c, "users", &[("user", "vip")]).0, "api/search-vip");
    let (r, d, _) = limited(&c, "users", &[("user", "alice")]);
    assert_eq!((r.as_str(), d.as_str()), ("api/users", "alice"));
    // The vip node has no children: its deeper entries match nothing, and
    // the vip node still applies (the deepest matched node with an action).
    assert_eq!(
        limited(&c, "users", &[("user", "vip"), ("path", "/x")]).0,
        "api/search-vip"
    );
}

#[test]
fn the_deepest_matched_node_with_an_action_applies() {
    let c = config();
    // user → path (no action) → method=POST: the deepest with an action.
    let (r, d, _) = limited(
        &c,
        "users",
        &[("user", "bob"), ("path", "/a"), ("method", "POST")],
    );
    assert_eq!((r.as_str(), d.as_str()), ("api/search-vip", "bob|/a"));
    // method=GET matches no node: user applies, its domain only bob.
    let (r, d, _) = limited(
        &c,
        "users",
        &[("user", "bob"), ("path", "/a"), ("method", "GET")],
    );
    assert_eq!((r.as_str(), d.as_str()), ("api/users", "bob"));
    // Order matters: entries are matched level by level.
    let m = envoy(&c)
        .match_descriptor("users", &[("path", "/a"), ("user", "bob")])
        .expect("valid");
    assert_eq!(m, Matched::NotLimited);
}

#[test]
fn nested_inline_limits_get_a_fixed_window_and_a_stable_name() {
    let c = config();
    let l = limit(
        &c,
        "users",
        &[("region", "eu"), ("client", "198.51.100.77")],
    );
    assert_eq!(l.resource, "envoy/users/region/client");
    assert_eq!(l.label, &*l.resource);
    assert_eq!(l.domain, "eu|198.51.100.0/24");
    let rl = l.rate_limit.expect("inline");
    assert_eq!((rl.unit(), rl.requests_per_unit()), (Some(Unit::Second), 5));
    let Some(crate::meter::Meter::Window(p)) = rl.meter() else {
        panic!("a window")
    };
    assert_eq!(
        (p.algorithm(), p.window()),
        (crate::window::Algorithm::Fixed, 1_000)
    );
    // A node without value named by its key; with a value, key=value.
    let l = limit(&c, "edge", &[("tenant", "acme")]);
    assert_eq!(
        (&*l.resource, l.domain.as_str()),
        ("envoy/edge/tenant", "acme")
    );
    let vip = &envoy(&c).domain("users").expect("users").descriptors()[1];
    assert_eq!(vip.id(), "envoy/users/user=vip");
}

#[test]
fn unlimited_applies_when_deepest_and_a_deeper_action_beats_it() {
    let c = config();
    let m = envoy(&c)
        .match_descriptor("edge", &[("health", "ok")])
        .expect("valid");
    assert!(matches!(m, Matched::Unlimited { node } if node.key() == "health"));
    let m = envoy(&c)
        .match_descriptor("users", &[("region", "eu"), ("unlimited_below", "y")])
        .expect("valid");
    assert!(matches!(m, Matched::Unlimited { .. }));
    let l = limit(
        &c,
        "users",
        &[("region", "eu"), ("unlimited_below", "y"), ("x", "1")],
    );
    assert_eq!(l.domain, "eu|y|1");
    assert_eq!(l.rate_limit.and_then(|r| r.unit()), Some(Unit::Day));
}

#[test]
fn nothing_matches_means_not_limited() {
    let c = config();
    for entries in [
        &[("nobody", "x")][..],
        &[("remote_address", "1.2.3.4")],
        &[("region", "eu")],
        &[("plan", "paid"), ("user", "u")],
    ] {
        assert_eq!(
            envoy(&c).match_descriptor("users", entries),
            Ok(Matched::NotLimited),
            "{entries:?}"
        );
    }
}

#[test]
fn ipv4_and_ipv6_are_masked_to_their_networks() {
    let c = config();
    let at = |ip: &str| {
        limited(
            &c,
            "edge",
            &[("generic_key", "search"), ("remote_address", ip)],
        )
        .1
    };
    assert_eq!(at("10.1.2.3"), "10.1.2.3/32");
    // /48: every address of a site is one client.
    assert_eq!(at("2001:db8:abcd:12:1:2:3:4"), "2001:db8:abcd::/48");
    assert_eq!(at("2001:db8:abcd:ffff::1"), "2001:db8:abcd::/48");
    assert_ne!(at("2001:db8:abce::1"), at("2001:db8:abcd::1"));
    // An IPv4-mapped IPv6 address is its IPv4 address.
    assert_eq!(at("::ffff:10.1.2.3"), "10.1.2.3/32");
    // mask: {ipv4: 24} keeps the IPv6 default of /48.
    let l = limit(
        &c,
        "users",
        &[("region", "us"), ("client", "2001:db8:1:2::9")],
    );
    assert_eq!(l.domain, "us|2001:db8:1::/48");
    let m = Mask { ipv4: 0, ipv6: 128 };
    assert_eq!(m.network("192.0.2.1").as_deref(), Some("0.0.0.0/0"));
    assert_eq!(m.network("2001:db8::1").as_deref(), Some("2001:db8::1/128"));
    let m = Mask { ipv4: 20, ipv6: 0 };
    assert_eq!(m.network("192.0.31.255").as_deref(), Some("192.0.16.0/20"));
    assert_eq!(m.network("2001:db8::1").as_deref(), Some("::/0"));
}

#[test]
fn an_invalid_address_is_kept_as_its_literal_text_and_reported() {
    let c = config();
    let l = limit(
        &c,
        "edge",
        &[("generic_key", "search"), ("remote_address", "not-an-ip")],
    );
    assert_eq!((l.domain.as_str(), l.invalid_addresses), ("not-an-ip", 1));
    // A valid one is not reported.
    let l = limit(
        &c,
        "edge",
        &[("generic_key", "search"), ("remote_address", "1.2.3.4")],
    );
    assert_eq!(l.invalid_addresses, 0);
    // Text that looks like a network never shares the network's domain,
    // nor do ports, brackets or leading zeros parse.
    for (text, domain) in [
        ("1.2.3.4/32", "1.2.3.4\\/32"),
        ("1.2.3.4:80", "1.2.3.4:80"),
        ("[::1]", "[::1]"),
        ("01.2.3.4", "01.2.3.4"),
    ] {
        let l = limit(
            &c,
            "edge",
            &[("generic_key", "search"), ("remote_address", text)],
        );
        assert_eq!(
            (l.domain.as_str(), l.invalid_addresses),
            (domain, 1),
            "{text}"
        );
    }
}

#[test]
fn shadow_mode_comes_from_the_section_or_the_nearest_node() {
    let c = config();
    assert!(limited(&c, "edge", &[("tenant", "acme")]).2, "node");
    assert!(!limited(&c, "users", &[("user", "bob")]).2, "none");
    // Inherited from plan=trial by its children, unless one says false.
    assert!(limited(&c, "users", &[("plan", "trial"), ("user", "u")]).2);
    assert!(!limited(&c, "users", &[("plan", "trial"), ("paid", "p")]).2);
    // The section's shadow_mode is the server's to apply (it keeps each
    // descriptor's status): matching says what the nodes say.
    let yaml = example().replacen("shadow_mode: false", "shadow_mode: true", 1);
    let (all, _) = Config::from_yaml(&yaml).expect("valid");
    assert!(envoy(&all).settings.shadow_mode);
    assert!(!limited(&all, "users", &[("user", "bob")]).2);
}

#[test]
fn domains_without_value_less_nodes_count_together_and_values_are_escaped() {
    let c = config();
    assert_eq!(limited(&c, "users", &[("user", "vip")]).1, WHOLE_DOMAIN);
    // `|` and `\` in values cannot make two descriptors share a domain.
    let a = limited(
        &c,
        "users",
        &[("user", "a|b"), ("path", "c"), ("method", "POST")],
    )
    .1;
    let b = limited(
        &c,
        "users",
        &[("user", "a"), ("path", "b|c"), ("method", "POST")],
    )
    .1;
    assert_eq!((a.as_str(), b.as_str()), ("a\\|b|c", "a|b\\|c"));
    let t = limited(&c, "users", &[("user", "tab\there\\")]).1;
    assert_eq!(t, "tab\\u{9}here\\\\");
    assert!(crate::request::check_name("domain", &t).is_ok());
}

#[test]
fn bad_descriptors_are_client_errors_naming_the_bound() {
    let c = config();
    let e = envoy(&c);
    let err = |domain: &str, entries: &[(&str, &str)]| match e.match_descriptor(domain, entries) {
        Err(ClientError::InvalidArgument(m)) => m,
        other => panic!("{other:?}"),
    };
    assert_eq!(err("edge", &[]), "a descriptor needs at least one entry");
    assert_eq!(
        err("edge", &[("", "x")]),
        "entries[0].key must not be empty"
    );
    assert_eq!(
        err("edge", &[("tenant", "a"), ("k", "")]),
        "entries[1].value must not be empty"
    );
    let long = "v".repeat(MAX_VALUE_BYTES + 1);
    assert_eq!(
        err("edge", &[("tenant", &long)]),
        "entries[0].value is 1025 bytes long; at most 1024 are allowed"
    );
    let key = "k".repeat(MAX_KEY_BYTES + 1);
    assert_eq!(
        err("edge", &[(&key, "v")]),
        "entries[0].key is 257 bytes long; at most 256 are allowed"
    );
    let many = vec![("k", "v"); MAX_ENTRIES + 1];
    assert_eq!(
        err("edge", &many),
        "65 entries in one descriptor, at most 64"
    );
    assert!(err("nowhere", &[("k", "v")]).starts_with("unknown Envoy domain \"nowhere\""));
    // Two values that fit alone but not joined.
    let half = "h".repeat(600);
    assert!(
        err(
            "users",
            &[("user", &half), ("path", &half), ("method", "POST")]
        )
        .contains("longer than 1024 bytes")
    );
    // The longest value fits a domain alone.
    let max = "m".repeat(MAX_VALUE_BYTES);
    assert_eq!(limited(&c, "users", &[("user", &max)]).1, max);
}

/// A configuration of `envoy:` written after `resources: []`.
fn section(envoy: &str) -> Config {
    Config::from_yaml(&format!("resources: []\nenvoy:\n{envoy}"))
        .expect("valid")
        .0
}

fn plan<'a>(c: &'a Config, domain: &str, descriptors: &[&[(&str, &str)]]) -> CallPlan<'a> {
    let ds: Vec<Vec<(&str, &str)>> = descriptors.iter().map(|d| d.to_vec()).collect();
    envoy(c).plan(domain, &ds).expect("a plan")
}

const WILD: &str = "  domains:
    - domain: edge
      descriptors:
        - { key: path, value: \"/api/*\", rate_limit: { unit: minute, requests_per_unit: 5 } }
        - { key: path, value: \"/files/*\", share_threshold: true, rate_limit: { unit: minute, requests_per_unit: 5 } }
        - { key: path, value: \"/exact\", rate_limit: { unit: minute, requests_per_unit: 1 } }
        - { key: path, value: \"bar*b\", unlimited: true }
        - { key: path, rate_limit: { unit: hour, requests_per_unit: 100 } }
";

#[test]
fn wildcard_values_match_after_exact_ones_and_before_the_value_less_node() {
    let c = section(WILD);
    // An exact value first.
    assert_eq!(
        limited(&c, "edge", &[("path", "/exact")]).0,
        "envoy/edge/path=\\/exact"
    );
    // A wildcard: each value its own count, unless share_threshold.
    let (r, d, _) = limited(&c, "edge", &[("path", "/api/users")]);
    assert_eq!(
        (r.as_str(), d.as_str()),
        ("envoy/edge/path=\\/api\\/*", "/api/users")
    );
    let (r, d, _) = limited(&c, "edge", &[("path", "/files/a.txt")]);
    assert_eq!(
        (r.as_str(), d.as_str()),
        ("envoy/edge/path=\\/files\\/*", "/files/\\*")
    );
    assert_eq!(limited(&c, "edge", &[("path", "/files/b")]).1, "/files/\\*");
    // A middle wildcard, unlimited.
    let m = envoy(&c).match_descriptor("edge", &[("path", "bar-x-b")]);
    assert!(matches!(m, Ok(Matched::Unlimited { .. })), "{m:?}");
    // Nothing else: the value-less node.
    assert_eq!(
        limited(&c, "edge", &[("path", "/other")]).0,
        "envoy/edge/path"
    );
}

#[test]
fn whole_matching_applies_only_the_node_of_the_last_entry() {
    let deepest = config();
    let whole = Config::from_yaml(&example().replacen("envoy:\n", "envoy:\n  match: whole\n", 1))
        .expect("valid")
        .0;
    // The descriptor goes past the vip node (a leaf): deepest applies it,
    // whole does not (envoyproxy/ratelimit: no limit).
    let d = [("user", "vip"), ("path", "/x")];
    assert_eq!(limited(&deepest, "users", &d).0, "api/search-vip");
    assert_eq!(
        envoy(&whole).match_descriptor("users", &d),
        Ok(Matched::NotLimited)
    );
    // user → path (no action): deepest takes user's limit, whole none.
    let d = [("user", "bob"), ("path", "/a")];
    assert_eq!(limited(&deepest, "users", &d).0, "api/users");
    assert_eq!(
        envoy(&whole).match_descriptor("users", &d),
        Ok(Matched::NotLimited)
    );
    // The last entry's node has a limit: both apply it.
    let d = [("user", "bob"), ("path", "/a"), ("method", "POST")];
    assert_eq!(limited(&whole, "users", &d).0, "api/search-vip");
}

#[test]
fn a_matched_limit_switches_off_the_limits_it_replaces_in_the_same_call() {
    let c = section(
        "  domains:
    - domain: edge
      descriptors:
        - { key: user, name: per_user, rate_limit: { unit: minute, requests_per_unit: 5 } }
        - { key: vip, name: vip, replaces: [per_user], rate_limit: { unit: minute, requests_per_unit: 50 } }
",
    );
    let p = plan(&c, "edge", &[&[("user", "ann")], &[("vip", "ann")]]);
    assert_eq!(p.statuses.len(), 2);
    assert!(matches!(p.statuses[0], Status::Replaced { .. }), "{p:?}");
    assert_eq!(p.statuses[1], Status::Limited(0));
    assert_eq!(p.checks.len(), 1);
    assert_eq!(p.checks[0].limit.name, Some("vip"));
    // Alone, the user limit applies.
    let p = plan(&c, "edge", &[&[("user", "ann")]]);
    assert_eq!(p.statuses, vec![Status::Limited(0)]);
}

#[test]
fn unknown_domains_check_nothing_or_are_errors_as_the_section_says() {
    let ok = section("  domains: []\n");
    let p = plan(&ok, "nowhere", &[&[("k", "v")], &[("k", "w")]]);
    assert!(!p.known && p.checks.is_empty());
    assert_eq!(p.statuses, vec![Status::NotLimited, Status::NotLimited]);
    let error = section("  unknown_domain: error\n  domains: []\n");
    let e = envoy(&error).plan("nowhere", &[vec![("k", "v")]]);
    assert!(
        matches!(e, Err(ClientError::InvalidArgument(m)) if m.starts_with("unknown Envoy domain"))
    );
    // A malformed descriptor is an error either way, naming it.
    let e = envoy(&ok).plan("nowhere", &[vec![("k", "v")], vec![("k", "")]]);
    assert!(
        matches!(&e, Err(ClientError::InvalidArgument(m)) if m == "descriptors[1]: entries[0].value must not be empty"),
        "{e:?}"
    );
}

const LIMITS: &str = "  domains:
    - domain: ns
      limits:
        - name: gets
          conditions:
            - { key: req.method, equals: GET }
            - { descriptor: 0, key: req.path, not_equals: /health }
          variables: [ { key: app.id } ]
          rate_limit: { window: 60s, requests_per_unit: 10 }
        - conditions: [ { descriptor: 1, key: kind, equals: \"2\" } ]
          rate_limit: { window: 60s, requests_per_unit: 0 }
        - rate_limit: { unit: hour, requests_per_unit: 1000 }
";

#[test]
fn limits_apply_over_every_descriptor_in_any_entry_order() {
    let c = section(LIMITS);
    // Entries in any order; the unconditional limit always applies.
    let p = plan(
        &c,
        "ns",
        &[&[("app.id", "a1"), ("req.path", "/x"), ("req.method", "GET")]],
    );
    assert!(
        p.statuses.is_empty(),
        "a domain of limits only has no statuses"
    );
    let names: Vec<_> = p
        .checks
        .iter()
        .map(|c| (c.limit.name, c.limit.domain.as_str()))
        .collect();
    assert_eq!(names, [(Some("gets"), "a1"), (None, "*")]);
    assert!(p.checks.iter().all(|c| c.descriptor.is_none()));
    // != : the excluded value, or the key missing, does not apply.
    for d in [
        &[
            ("req.method", "GET"),
            ("req.path", "/health"),
            ("app.id", "a1"),
        ][..],
        &[("req.method", "GET"), ("app.id", "a1")],
        &[("req.method", "GET"), ("req.path", "/x")],
    ] {
        let p = plan(&c, "ns", &[d]);
        assert_eq!(p.checks.len(), 1, "{d:?}");
    }
    // A condition on the second descriptor.
    let p = plan(&c, "ns", &[&[("x", "1")], &[("kind", "2")]]);
    let rl: Vec<_> = p
        .checks
        .iter()
        .map(|c| c.limit.rate_limit.map(|r| r.requests_per_unit()))
        .collect();
    assert_eq!(rl, [Some(0), Some(1000)]);
    // Ids come from conditions, variables and window, never the order.
    let id = &p.checks[0].limit.label;
    assert_eq!(*id, "envoy/ns/limit/[1]kind==2//1m");
}

#[test]
fn detailed_and_value_metrics_carry_the_values() {
    let c = section(
        "  domains:
    - domain: edge
      descriptors:
        - key: tenant
          value_to_metric: true
          descriptors:
            - { key: user, detailed_metric: true, rate_limit: { unit: minute, requests_per_unit: 5 } }
            - { key: path, rate_limit: { unit: minute, requests_per_unit: 5 } }
        - { key: plain, rate_limit: { unit: minute, requests_per_unit: 5 } }
",
    );
    let l = limit(&c, "edge", &[("tenant", "t1"), ("user", "u1")]);
    assert_eq!(l.detail.as_deref(), Some("envoy/edge/tenant=t1/user=u1"));
    let l = limit(&c, "edge", &[("tenant", "t1"), ("path", "/p")]);
    assert_eq!(l.detail.as_deref(), Some("envoy/edge/tenant=t1/path"));
    let l = limit(&c, "edge", &[("plain", "x")]);
    assert_eq!(l.detail, None);
}
