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
    assert!(
        e[0].starts_with("resources[1].tiers[0].window: \"1x\" is not a duration"),
        "{e:?}"
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
        "resources[2].kind: expected rate or copy",
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
    assert!(
        e[0].starts_with("resources[1].name: duplicate resource \"a\""),
        "{e:?}"
    );
    let e = errors(
        "resources:\n  - name: a\n    kind: copy\n    domain_limit: 1\n    groups:\n      - { name: g, limit: 1, domains: [x, x] }\n      - { name: g, limit: 1 }\n",
    );
    assert!(
        e.iter()
            .any(|x| x.starts_with("resources[0].groups[0].domains[1]: duplicate domain")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|x| x.starts_with("resources[0].groups[1].name: duplicate group")),
        "{e:?}"
    );
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
    for text in ["", "  \n\t\n", "# only a comment\n", "---\n", "~", "null"] {
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
    assert!(e[0].starts_with("resources[0].domain_limit:"), "{e:?}");
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
