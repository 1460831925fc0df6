use super::*;
use crate::MAX_COUNT;
use crate::copy::fixtures::{amount, limits};

fn hold(domain: &str, groups: &[&str]) -> Hold {
    Hold::new("r", domain, groups.iter().map(|g| (*g).to_owned()))
}

/// A state where d1 (groups a, b) holds 3 and d2 (group b) holds 2.
fn held() -> CopyState {
    let mut s: CopyState = CopyState::default();
    let l = limits(10, Some(20), &[("a", 10), ("b", 10)]);
    reserve(&mut s, "d1", &l, amount(3, 3), Enforcement::Enforce).expect("within");
    let l = limits(10, Some(20), &[("b", 10)]);
    reserve(&mut s, "d2", &l, amount(2, 2), Enforcement::Enforce).expect("within");
    s
}

#[test]
fn reserve_counts_the_grant_everywhere_and_replies_with_the_counts_after() {
    let mut s = held();
    assert_eq!((s.global, s.count("d1"), s.count("d2")), (5, 3, 2));
    assert_eq!((s.group("a"), s.group("b")), (3, 5));
    let l = limits(4, Some(6), &[("b", 10)]);
    let r = reserve(&mut s, "d2", &l, amount(5, 1), Enforcement::Enforce).expect("within");
    // The global limit leaves room for one.
    assert_eq!(r.granted, 1);
    assert_eq!((r.domain_holds, r.global_holds), (3, 6));
    assert_eq!(r.groups[0].holds, 6);
    assert_eq!((s.global, s.count("d2"), s.group("b")), (6, 3, 6));
}

#[test]
fn a_rejected_reserve_changes_nothing() {
    let mut s = held();
    let before = s.clone();
    let l = limits(3, None, &[]);
    let r = reserve(&mut s, "d1", &l, amount(2, 1), Enforcement::Enforce).expect("within");
    assert_eq!(r.granted, 0);
    assert_eq!(s, before);
}

#[test]
fn a_reserve_past_the_bound_is_refused_and_changes_nothing() {
    let mut s: CopyState = CopyState::default();
    let l = limits(u64::MAX, None, &[]);
    reserve(&mut s, "d1", &l, amount(MAX_COUNT, 1), Enforcement::Enforce).expect("at the bound");
    let before = s.clone();
    assert!(reserve(&mut s, "d2", &l, amount(1, 1), Enforcement::Ignore).is_err());
    assert_eq!(s, before);
}

#[test]
fn release_takes_the_copies_back_and_drops_counts_at_zero() {
    let mut s = held();
    let st = release(&mut s, &hold("d1", &["a", "b"]), 3).expect("held");
    assert_eq!(st.domain_holds, 0);
    assert_eq!(st.global_holds, 2);
    assert_eq!(st.groups, vec![("a".into(), 0), ("b".into(), 2)]);
    assert!(!s.domains.contains_key("d1"));
    assert!(!s.groups.contains_key("a"));
    release(&mut s, &hold("d2", &["b"]), 2).expect("held");
    assert!(s.is_empty());
    assert_eq!(s, CopyState::default());
}

#[test]
fn a_short_release_changes_nothing() {
    let mut s = held();
    let before = s.clone();
    // The domain holds 3, not 4.
    let e = release(&mut s, &hold("d1", &["a"]), 4).expect_err("short");
    assert_eq!(
        e.to_string(),
        "counts of \"r\" for domain \"d1\" are below 4: refusing to go negative"
    );
    assert_eq!(s, before);
    // A group nothing is held under.
    assert!(release(&mut s, &hold("d2", &["c"]), 1).is_err());
    assert_eq!(s, before);
    // A domain that holds nothing.
    assert!(release(&mut s, &hold("d9", &[]), 1).is_err());
    assert_eq!(s, before);
}

#[test]
fn staged_copies_stay_counted_until_seized_or_expired() {
    let mut s = held();
    let h = hold("d1", &["a", "b"]);
    stage(&mut s, "t1".into(), &h, 2, 100);
    assert_eq!(s.staged_copies(), 2);
    assert_eq!((s.global, s.count("d1")), (5, 3));
    // Seized before it expires: still counted, no longer staged.
    assert_eq!(
        seize(&mut s, "t1"),
        Some(Staged {
            hold: h.clone(),
            copies: 2
        })
    );
    assert_eq!(seize(&mut s, "t1"), None);
    assert_eq!((s.global, s.staged_copies()), (5, 0));
    assert_eq!(expire(&mut s, 1_000), Vec::<String>::new());
    assert_eq!(s.global, 5);
}

#[test]
fn expiry_releases_staged_copies_at_their_ttl_and_not_before() {
    let mut s = held();
    let h = hold("d1", &["a", "b"]);
    stage(&mut s, "t1".into(), &h, 2, 100);
    stage(&mut s, "t2".into(), &h, 1, 150);
    assert!(expire(&mut s, 99).is_empty());
    assert_eq!(expire(&mut s, 100), vec!["t1".to_owned()]);
    assert_eq!((s.global, s.count("d1"), s.group("a")), (3, 1, 1));
    assert_eq!(seize(&mut s, "t1"), None);
    assert_eq!(expire(&mut s, 1_000), vec!["t2".to_owned()]);
    assert_eq!(
        (s.global, s.count("d1"), s.group("a"), s.group("b")),
        (2, 0, 0, 2)
    );
    assert!(!s.is_empty());
    release(&mut s, &hold("d2", &["b"]), 2).expect("held");
    assert!(s.is_empty());
}

#[test]
fn staging_alone_keeps_the_state() {
    let mut s: CopyState = CopyState::default();
    stage(&mut s, "t1".into(), &hold("d1", &[]), 1, 10);
    assert!(!s.is_empty());
}

#[test]
fn counts_follow_the_groups_of_the_limits() {
    let s = held();
    let l = limits(10, None, &[("b", 10), ("z", 1)]);
    assert_eq!(
        s.counts("d1", &l),
        CopyCounts {
            domain: 3,
            global: 5,
            groups: vec![5, 0]
        }
    );
}
