//! Every operation of SPEC §3 and the namespace rules of SPEC §4 through
//! the limiter, on the in-memory store with a manual clock.

use std::sync::Arc;

use charon_core::config::Config;
use charon_core::copy::Hold;
use charon_core::request::Amount;
use charon_core::{ClientError, ManualClock};
use charon_limiter::{LimitError, Limiter};
use charon_store::MemoryStore;

const CONFIG: &str = r#"
namespaces:
  open: { allow_unconfigured: true }
  off: { ignore_configured: true }
resources:
  - name: vm
    kind: copy
    domain_limit: 4
    global_limit: 6
    domains: { big: { domain_limit: 6 } }
    groups:
      - { name: probation, limit: 3, domains: [new] }
      - { name: eu, limit: 5, domains: [new, eu-1] }
  - name: api
    kind: rate
    tiers: [ { limit: 1, window: 1s } ]
  - name: off/api
    kind: rate
    tiers: [ { limit: 1, window: 1s } ]
  - name: off/vm
    kind: copy
    domain_limit: 1
"#;

fn limiter() -> (Arc<ManualClock>, Arc<Limiter>) {
    let clock = Arc::new(ManualClock::new(0));
    let store = Arc::new(MemoryStore::with_sequential_ids(clock.clone()));
    let (config, _) = Config::from_yaml(CONFIG).expect("valid");
    (clock, Limiter::new(config, store))
}

fn n(c: u64) -> Amount {
    Amount::new(c, 1).expect("valid")
}

fn client(e: LimitError) -> ClientError {
    match e {
        LimitError::Client(c) => c,
        other => panic!("expected a client error, got {other:?}"),
    }
}

#[tokio::test]
async fn reserve_counts_domain_group_and_global_holds() {
    let (_, l) = limiter();
    let mut s = l.session();
    let r = s.reserve("vm", "new", n(5)).await.expect("ok");
    assert_eq!(r.granted, 3, "probation allows 3");
    let groups: Vec<_> = r
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.limit, g.holds))
        .collect();
    assert_eq!(groups, vec![("probation", 3, 3), ("eu", 5, 3)]);
    let r = s.reserve("vm", "eu-1", n(5)).await.expect("ok");
    assert_eq!((r.granted, r.global_holds), (2, 5), "eu has 2 left");
    let r = s.reserve("vm", "big", n(6)).await.expect("ok");
    assert_eq!(
        (r.granted, r.domain_limit, r.global_holds),
        (1, 6, 6),
        "global 6"
    );
    assert_eq!(s.held_copies(), 6);
}

#[tokio::test]
async fn release_needs_the_exact_group_set_and_no_more_than_held() {
    let (_, l) = limiter();
    let mut s = l.session();
    s.reserve("vm", "new", n(2)).await.expect("ok");
    let hold = Hold::new("vm", "new", ["eu".to_owned(), "probation".to_owned()]);
    let wrong_set = Hold::new("vm", "new", ["eu".to_owned()]);
    assert!(matches!(
        client(s.release(&wrong_set, 1).await.expect_err("not held")),
        ClientError::NotHeld { held: 0, .. }
    ));
    assert!(matches!(
        client(s.release(&hold, 3).await.expect_err("too many")),
        ClientError::NotHeld {
            held: 2,
            asked: 3,
            ..
        }
    ));
    assert!(matches!(
        client(s.release(&hold, 0).await.expect_err("zero")),
        ClientError::InvalidArgument(_)
    ));
    let status = s.release(&hold, 1).await.expect("ok");
    assert_eq!((status.domain_holds, status.global_holds), (1, 1));
    assert_eq!(
        status.groups,
        vec![("eu".to_owned(), 1), ("probation".to_owned(), 1)]
    );
    // Another session cannot release what this one holds.
    let mut other = l.session();
    assert!(other.release(&hold, 1).await.is_err());
}

#[tokio::test]
async fn holds_keep_their_group_set_when_membership_changes() {
    let (_, l) = limiter();
    let mut s = l.session();
    s.reserve("vm", "new", n(1)).await.expect("ok");
    // "new" leaves both groups: new reserves are only held to its own limit…
    let (moved, _) = Config::from_yaml(
        &CONFIG
            .replace("domains: [new]", "domains: []")
            .replace("[new, eu-1]", "[eu-1]"),
    )
    .expect("valid");
    l.replace_config(moved);
    let r = s.reserve("vm", "new", n(3)).await.expect("ok");
    assert_eq!((r.granted, r.groups.len()), (3, 0));
    // …and the old copies are released under the old group set.
    let old = Hold::new("vm", "new", ["eu".to_owned(), "probation".to_owned()]);
    let status = s.release(&old, 1).await.expect("ok");
    assert_eq!(
        status.groups,
        vec![("eu".to_owned(), 0), ("probation".to_owned(), 0)]
    );
    assert_eq!(
        s.release(&Hold::new("vm", "new", []), 3)
            .await
            .expect("ok")
            .global_holds,
        0
    );
}

#[tokio::test]
async fn transfer_then_seize_moves_the_hold_to_another_session() {
    let (clock, l) = limiter();
    let mut a = l.session();
    let mut b = l.session();
    a.reserve("vm", "eu-1", n(3)).await.expect("ok");
    let hold = Hold::new("vm", "eu-1", ["eu".to_owned()]);
    assert!(matches!(
        client(a.transfer(&hold, 1, 0).await.expect_err("ttl 0")),
        ClientError::InvalidArgument(_)
    ));
    let id = a.transfer(&hold, 2, 1_000).await.expect("ok");
    assert_eq!(a.held_copies(), 1);
    assert!(
        a.release(&hold, 2).await.is_err(),
        "staged copies cannot be released"
    );
    clock.set(999);
    let staged = b.seize(&id).await.expect("ok");
    assert_eq!((staged.hold.clone(), staged.copies), (hold.clone(), 2));
    assert_eq!(b.held_copies(), 2);
    assert!(matches!(
        client(l.session().seize(&id).await.expect_err("seized")),
        ClientError::UnknownTransfer(_)
    ));
    assert!(matches!(
        client(b.seize("t999").await.expect_err("unknown")),
        ClientError::UnknownTransfer(_)
    ));
    assert_eq!(b.release(&hold, 2).await.expect("ok").domain_holds, 1);
}

#[tokio::test]
async fn a_transfer_not_seized_in_time_is_released() {
    let (clock, l) = limiter();
    let mut a = l.session();
    a.reserve("vm", "big", n(6)).await.expect("ok");
    let id = a
        .transfer(&Hold::new("vm", "big", []), 6, 500)
        .await
        .expect("ok");
    assert_eq!(
        a.end().await.expect("ok"),
        0,
        "nothing held after the transfer"
    );
    clock.set(500);
    assert!(l.session().seize(&id).await.is_err());
    assert_eq!(
        l.session()
            .reserve("vm", "big", n(6))
            .await
            .expect("ok")
            .granted,
        6
    );
}

#[tokio::test]
async fn ending_a_session_releases_every_hold() {
    let (_, l) = limiter();
    let mut a = l.session();
    a.reserve("vm", "new", n(1)).await.expect("ok");
    a.reserve("vm", "eu-1", n(1)).await.expect("ok");
    a.reserve("vm", "big", n(2)).await.expect("ok");
    assert_eq!(a.end().await.expect("ok"), 4);
    let r = l.session().reserve("vm", "x", n(4)).await.expect("ok");
    assert_eq!(r.global_holds, 4, "only the new hold remains");
}

#[tokio::test]
async fn wrong_kind_unknown_resource_and_bad_names_are_client_errors() {
    let (_, l) = limiter();
    let mut s = l.session();
    assert!(matches!(
        client(s.reserve("api", "d", n(1)).await.expect_err("rate")),
        ClientError::WrongKind { .. }
    ));
    assert!(matches!(
        client(l.request("vm", "d", n(1)).await.expect_err("copy")),
        ClientError::WrongKind { .. }
    ));
    assert!(matches!(
        client(l.request("nope", "d", n(1)).await.expect_err("unknown")),
        ClientError::UnknownResource(_)
    ));
    assert!(matches!(
        client(l.request("api", "", n(1)).await.expect_err("empty")),
        ClientError::InvalidArgument(_)
    ));
    assert!(matches!(
        client(l.request("api", "a\u{7}", n(1)).await.expect_err("control")),
        ClientError::InvalidArgument(_)
    ));
}

#[tokio::test]
async fn ignore_configured_grants_everything_but_records_it() {
    let (_, l) = limiter();
    for i in 0..3 {
        let r = l.request("off/api", "d", n(2)).await.expect("ok");
        assert_eq!(
            (r.granted, r.ignored, r.domain_hits_last_second),
            (2, true, 2 * (i + 1))
        );
    }
    let mut s = l.session();
    let r = s.reserve("off/vm", "d", n(5)).await.expect("ok");
    assert_eq!((r.granted, r.domain_holds, r.ignored), (5, 5, true));
    assert_eq!(s.end().await.expect("ok"), 5);
}

#[tokio::test]
async fn allow_unconfigured_is_the_most_permissive_configuration() {
    let (_, l) = limiter();
    let r = l
        .request("open/anything", "d", n(1_000_000))
        .await
        .expect("ok");
    assert_eq!(
        (r.granted, r.hard_limit, r.global_limit, r.tier),
        (1_000_000, None, None, 1)
    );
    let mut s = l.session();
    assert_eq!(
        s.reserve("open/vm", "d", n(1_000))
            .await
            .expect("ok")
            .granted,
        1_000
    );
}
