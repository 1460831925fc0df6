//! Descriptor matching (SPEC §11) on random descriptors: it never panics,
//! whatever Envoy sends; it is deterministic; the Charon domain it builds
//! is a valid domain name; and two descriptors that reach the same node
//! share a domain exactly when their value-less values are the same (so
//! no value can borrow another client's counts).

use charon_core::ClientError;
use charon_core::config::Config;
use charon_core::envoy::{Envoy, MAX_DOMAIN_BYTES, Matched};
use charon_core::request::check_name;
use proptest::prelude::*;
use std::sync::LazyLock;

const TREE: &str = r#"
resources:
  - { name: api/a, kind: window, algorithm: fixed, limit: 5, window: 1s }
  - { name: api/b, kind: rate, tiers: [ { limit: 5, window: 1s } ] }
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: ip
          mask: { ipv4: 24 }
          resource: api/a
          descriptors:
            - key: user
              rate_limit: { unit: minute, requests_per_unit: 10 }
              descriptors:
                - { key: path, value: /login, unlimited: true }
                - { key: path, resource: api/b, shadow_mode: true }
        - key: user
          resource: api/b
          descriptors:
            - { key: user, value: root, unlimited: true }
            - key: ip
              mask: {}
              descriptors:
                - { key: tenant, rate_limit: { unit: second, requests_per_unit: 1 } }
        - key: generic_key
          value: search
          descriptors:
            - { key: ip, mask: { ipv4: 0, ipv6: 0 }, resource: api/a }
"#;

/// The same tree without masks: every value-less value is kept as sent.
const PLAIN: &str = r#"
resources:
  - { name: api/a, kind: window, algorithm: fixed, limit: 5, window: 1s }
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: a
          resource: api/a
          descriptors:
            - key: b
              descriptors:
                - { key: c, resource: api/a }
"#;

fn envoy(yaml: &str) -> Envoy {
    let (c, _) = Config::from_yaml(yaml).expect("valid");
    c.envoy().expect("an envoy section").clone()
}

/// The trees, parsed once (and [`TREE`] a second time, to compare).
static TREE_ENVOY: LazyLock<Envoy> = LazyLock::new(|| envoy(TREE));
static TREE_AGAIN: LazyLock<Envoy> = LazyLock::new(|| envoy(TREE));
static PLAIN_ENVOY: LazyLock<Envoy> = LazyLock::new(|| envoy(PLAIN));

/// Keys the trees use, and some they do not.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("ip".to_owned()),
        Just("user".to_owned()),
        Just("path".to_owned()),
        Just("tenant".to_owned()),
        Just("generic_key".to_owned()),
        Just("a".to_owned()),
        Just("b".to_owned()),
        Just("c".to_owned()),
        ".{0,3}",
    ]
}

/// Values: addresses (valid and not), the tree's values, separators and
/// escapes, control characters, empty and long strings.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|o| std::net::Ipv4Addr::from(o).to_string()),
        any::<u128>().prop_map(|a| std::net::Ipv6Addr::from(a).to_string()),
        any::<[u8; 4]>().prop_map(|o| format!("::ffff:{}", std::net::Ipv4Addr::from(o))),
        Just("search".to_owned()),
        Just("/login".to_owned()),
        Just("root".to_owned()),
        "[a-z|\\\\/:.0-9]{0,8}",
        ".{0,12}",
        (1usize..1100).prop_map(|n| "x|".repeat(n / 2)),
    ]
}

fn descriptor() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((key(), value()), 0..6)
}

fn entries(d: &[(String, String)]) -> Vec<(&str, &str)> {
    d.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn matching_never_panics_and_is_deterministic(d in descriptor(), domain in prop_oneof![Just("edge".to_owned()), ".{0,5}"]) {
        let e = &*TREE_ENVOY;
        let es = entries(&d);
        let first = e.match_descriptor(&domain, &es);
        let again = e.match_descriptor(&domain, &es);
        prop_assert_eq!(&first, &again);
        match first {
            Ok(Matched::Limited(l)) => {
                prop_assert!(check_name("domain", &l.domain).is_ok(), "{:?}", l.domain);
                prop_assert!(l.domain.len() <= MAX_DOMAIN_BYTES);
                prop_assert!(check_name("resource", &l.resource).is_ok());
                prop_assert!(l.invalid_addresses <= d.len());
                // The same descriptor against a copy of the tree: the
                // domain depends on nothing but the tree and the entries.
                let other = &*TREE_AGAIN;
                let Ok(Matched::Limited(l2)) = other.match_descriptor(&domain, &es) else {
                    return Err(TestCaseError::fail("a copy matched differently"));
                };
                prop_assert_eq!(&l.domain, &l2.domain);
                prop_assert_eq!(l.label, l2.label);
            }
            Ok(Matched::NotLimited | Matched::Unlimited { .. }) => {}
            Err(ClientError::InvalidArgument(m)) => prop_assert!(!m.is_empty()),
            Err(other) => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn one_node_shares_a_domain_only_for_the_same_values(
        a in prop::collection::vec(value(), 3),
        b in prop::collection::vec(value(), 3),
        depth in 1usize..=3,
    ) {
        let e = &*PLAIN_ENVOY;
        let keys = ["a", "b", "c"];
        let da: Vec<(&str, &str)> = keys.iter().zip(&a).take(depth).map(|(k, v)| (*k, v.as_str())).collect();
        let db: Vec<(&str, &str)> = keys.iter().zip(&b).take(depth).map(|(k, v)| (*k, v.as_str())).collect();
        if let (Ok(Matched::Limited(la)), Ok(Matched::Limited(lb))) =
            (e.match_descriptor("edge", &da), e.match_descriptor("edge", &db))
            && la.label == lb.label
        {
            let used = if la.label.ends_with("/c") { 3 } else { 1 };
            prop_assert_eq!(la.domain == lb.domain, a[..used] == b[..used]);
        }
    }
}
