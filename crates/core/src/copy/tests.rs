use super::*;
use crate::config::CopyLimits;
use crate::copy::fixtures::{amount, limits};

fn counts(domain: u64, global: u64, groups: &[u64]) -> CopyCounts {
    CopyCounts {
        domain,
        global,
        groups: groups.to_vec(),
    }
}

/// [`reserve_grant`] under enforcement.
fn enforced(l: &CopyLimits, c: &CopyCounts, a: Amount) -> Option<u64> {
    reserve_grant(l, c, a, Enforcement::Enforce)
}

#[test]
fn domain_limit_bounds_holds_after_the_grant() {
    let l = limits(4, None, &[]);
    assert_eq!(enforced(&l, &counts(0, 0, &[]), amount(4, 4)), Some(4));
    assert_eq!(enforced(&l, &counts(3, 3, &[]), amount(2, 1)), Some(1));
    assert_eq!(enforced(&l, &counts(3, 3, &[]), amount(2, 2)), None);
    assert_eq!(enforced(&l, &counts(4, 4, &[]), amount(1, 1)), None);
}

#[test]
fn global_limit_bounds_all_domains() {
    let l = limits(10, Some(5), &[]);
    assert_eq!(enforced(&l, &counts(0, 4, &[]), amount(3, 1)), Some(1));
    assert_eq!(enforced(&l, &counts(0, 5, &[]), amount(1, 1)), None);
}

#[test]
fn every_group_of_the_domain_bounds_the_grant() {
    let l = limits(10, None, &[("probation", 5), ("eu", 3)]);
    assert_eq!(enforced(&l, &counts(0, 0, &[4, 0]), amount(3, 1)), Some(1));
    assert_eq!(enforced(&l, &counts(0, 0, &[0, 2]), amount(3, 1)), Some(1));
    assert_eq!(enforced(&l, &counts(0, 0, &[0, 3]), amount(1, 1)), None);
}

#[test]
fn a_blacklist_group_of_limit_zero_rejects_everything() {
    let l = limits(10, None, &[("blacklist", 0)]);
    assert_eq!(enforced(&l, &counts(0, 0, &[0]), amount(1, 1)), None);
}

#[test]
fn ignore_grants_all_copies() {
    let l = limits(1, Some(1), &[("g", 0)]);
    assert_eq!(
        reserve_grant(&l, &counts(1, 1, &[0]), amount(3, 3), Enforcement::Ignore),
        Some(3)
    );
}

#[test]
fn group_sets_are_canonical() {
    assert_eq!(
        group_set(["b".to_owned(), "a".to_owned(), "b".to_owned()]),
        vec!["a".to_owned(), "b".to_owned()]
    );
}
