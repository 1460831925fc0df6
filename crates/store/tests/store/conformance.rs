//! One behaviour suite for every store (as limitador runs its tests against
//! each storage backend): the same tests, with the same expected replies,
//! against the in-memory store and the Redis store (a private redis-server,
//! deciding on the same kind of manual clock).

use charon_core::config::{CopyLimits, Enforcement, GroupLimit, RateLimits, Tier};
use charon_core::copy::Hold;
use charon_core::rate::{DORMANT_GRACE, RateReply};
use charon_core::request::Amount;
use charon_core::{MAX_COUNT, UNBOUNDED};
use charon_store::StoreError;
use charon_testkit::stores::Fixture;
use charon_testkit::{BOUND, refusal_at_bound};

fn amount(copies: u64, min: u64) -> Amount {
    Amount::new(copies, min).unwrap()
}

fn tier(limit: u64, window: u64, active: Option<u64>, cooldown: u64, skippable: bool) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable,
    }
}

fn limits(tiers: &[Tier]) -> RateLimits<'_> {
    RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers,
    }
}

async fn ask(
    f: &Fixture,
    t: u64,
    domain: &str,
    l: RateLimits<'_>,
    copies: u64,
    min: u64,
) -> RateReply {
    f.clock.set(t);
    f.store
        .request(
            "api/search",
            domain,
            l,
            amount(copies, min),
            Enforcement::Enforce,
        )
        .await
        .unwrap()
}

/// (granted, tier, tier_hits, burst)
fn brief(r: &RateReply) -> (u64, usize, u64, bool) {
    (r.granted, r.tier, r.tier_hits, r.burst)
}

/// [`ask`] at `t` for `(copies, min)`, checking the reply's [`brief`].
async fn step(
    f: &Fixture,
    t: u64,
    domain: &str,
    l: RateLimits<'_>,
    (copies, min): (u64, u64),
    want: (u64, usize, u64, bool),
    why: &str,
) -> RateReply {
    let r = ask(f, t, domain, l, copies, min).await;
    assert_eq!(brief(&r), want, "{why}");
    r
}

/// A reserve of `(copies, min)` of `vm` by `domain` that must be answered.
async fn reserve(
    f: &Fixture,
    domain: &str,
    l: &CopyLimits,
    (copies, min): (u64, u64),
    enforcement: Enforcement,
) -> charon_core::copy::ReserveReply {
    f.store
        .reserve("vm", domain, l, amount(copies, min), enforcement)
        .await
        .unwrap()
}

/// A rate request of `resource` by domain `d` that must be answered.
async fn request(
    f: &Fixture,
    resource: &str,
    l: RateLimits<'_>,
    (copies, min): (u64, u64),
    enforcement: Enforcement,
) -> RateReply {
    f.store
        .request(resource, "d", l, amount(copies, min), enforcement)
        .await
        .unwrap()
}

async fn rate_window_boundaries(f: &Fixture) {
    let tiers = [tier(2, 1_000, None, 0, false)];
    let l = limits(&tiers);
    let r = step(
        f,
        500,
        "d",
        l,
        (2, 2),
        (2, 1, 2, true),
        "first request enters tier 1",
    )
    .await;
    assert_eq!(
        (
            r.domain_hits_last_second,
            r.global_hits_last_second,
            r.tier_limit
        ),
        (2, 2, 2)
    );
    let r = step(
        f,
        1_500,
        "d",
        l,
        (1, 1),
        (0, 1, 2, false),
        "hits at 500 are in the window at 1500",
    )
    .await;
    assert_eq!(r.domain_hits_last_second, 2, "and in the last second");
    let r = step(
        f,
        1_501,
        "d",
        l,
        (1, 1),
        (1, 1, 1, false),
        "fell out at 1501",
    )
    .await;
    assert_eq!(r.domain_hits_last_second, 1);
}

async fn rate_multi_hit_through_tiers(f: &Fixture) {
    let tiers = [
        tier(2, 1_000, None, 0, false),
        tier(3, 1_000, Some(5_000), 1_000, false),
        tier(4, 1_000, Some(2_000), 0, false),
    ];
    let l = limits(&tiers);
    step(
        f,
        0,
        "d",
        l,
        (7, 1),
        (7, 3, 2, true),
        "2 in tier 1, 3 in tier 2, 2 in tier 3",
    )
    .await;
    step(
        f,
        10,
        "d",
        l,
        (5, 3),
        (0, 3, 2, false),
        "only 2 more fit: below min_copies, nothing changes",
    )
    .await;
    step(f, 10, "d", l, (5, 1), (2, 3, 4, false), "").await;
    // Tier 3's active period ends at 2000: fallback to tier 2, whose window
    // is empty by now.
    step(f, 2_000, "d", l, (1, 1), (1, 2, 1, false), "").await;
    // Tier 2 ends at 5000 and cools down until 6000: tier 1 is current,
    // full bursts cannot pass tier 2.
    step(f, 5_000, "d", l, (3, 1), (2, 1, 2, false), "").await;
    step(
        f,
        5_999,
        "d",
        l,
        (1, 1),
        (0, 1, 2, false),
        "tier 2 cools down and is not skippable",
    )
    .await;
    step(
        f,
        6_000,
        "d",
        l,
        (1, 1),
        (1, 2, 1, true),
        "cooldown over at exactly 6000",
    )
    .await;
}

async fn rate_skippable_and_zero_tiers(f: &Fixture) {
    let tiers = [
        tier(1, 1_000, None, 0, false),
        tier(0, 1_000, Some(1_000), 0, true),
        tier(1, 1_000, Some(1_000), 500, true),
        tier(2, 1_000, Some(1_000), 0, false),
    ];
    let l = limits(&tiers);
    step(
        f,
        0,
        "d",
        l,
        (2, 1),
        (2, 3, 1, true),
        "tier 2 (limit 0) is skipped",
    )
    .await;
    step(f, 1, "d", l, (1, 1), (1, 4, 1, true), "").await;
    step(
        f,
        1_000,
        "d",
        l,
        (3, 1),
        (1, 4, 2, false),
        "tier 3 cools down, tier 4 still active",
    )
    .await;
    step(
        f,
        1_001,
        "d",
        l,
        (1, 1),
        (1, 1, 1, false),
        "tier 1's hit at 0 fell out at 1001",
    )
    .await;
    step(
        f,
        1_002,
        "d",
        l,
        (1, 1),
        (1, 4, 1, true),
        "tier 3 cools down and is skipped; tier 4 is inactive again",
    )
    .await;
}

async fn rate_hard_and_global_limits(f: &Fixture) {
    let tiers = [tier(10, 1_000, None, 0, false)];
    let l = RateLimits {
        hard_limit: Some(3),
        global_limit: Some(5),
        tiers: &tiers,
    };
    let r = ask(f, 0, "a", l, 5, 1).await;
    assert_eq!(
        (r.granted, r.hard_limited, r.global_limited),
        (3, true, false)
    );
    assert_eq!((r.hard_limit, r.global_limit), (Some(3), Some(5)));
    let r = ask(f, 0, "b", l, 5, 1).await;
    assert_eq!(
        (r.granted, r.hard_limited, r.global_limited),
        (2, false, true)
    );
    assert_eq!(r.global_hits_last_second, 5);
    let r = ask(f, 1, "c", l, 1, 1).await;
    assert_eq!(
        (r.granted, r.hard_limited, r.global_limited),
        (0, false, true)
    );
    let r = ask(f, 1_001, "d", l, 2, 1).await;
    assert_eq!(
        (r.granted, r.hard_limited, r.global_limited),
        (2, false, false)
    );
    let r = ask(f, 1_001, "c", l, 4, 1).await;
    assert_eq!(
        (r.granted, r.hard_limited, r.global_limited),
        (3, true, true),
        "H and G both allow 3: both bind"
    );
    let r = ask(f, 1_001, "c", l, 4, 4).await;
    assert_eq!(r.granted, 0, "min_copies above H never passes");
}

async fn rate_ignored_and_unbounded(f: &Fixture) {
    let tiers = [tier(1, 1_000, None, 0, false)];
    f.clock.set(0);
    let r = request(f, "api/x", limits(&tiers), (3, 1), Enforcement::Ignore).await;
    assert_eq!(
        (r.granted, r.ignored, r.tier_hits, r.domain_hits_last_second),
        (3, true, 1, 3)
    );
    let r = request(f, "api/x", limits(&tiers), (1, 1), Enforcement::Enforce).await;
    assert_eq!(r.granted, 0, "the ignored hits were recorded");

    let permissive = [tier(UNBOUNDED, 1_000, None, 0, false)];
    let r = request(
        f,
        "free/x",
        limits(&permissive),
        (MAX_COUNT, 1),
        Enforcement::Enforce,
    )
    .await;
    assert_eq!(
        (r.granted, r.tier_limit, r.tier_hits),
        (MAX_COUNT, UNBOUNDED, MAX_COUNT)
    );
}

async fn rate_state_is_forgotten_after_the_dormant_grace(f: &Fixture) {
    let tiers = [tier(5, 1_000, None, 0, false)];
    let l = limits(&tiers);
    assert!(ask(f, 0, "d", l, 1, 1).await.burst);
    let r = ask(f, 1_001 + DORMANT_GRACE - 1, "d", l, 1, 1).await;
    assert!(!r.burst, "still dormant in tier 1");
    let r = ask(f, 2 * (1_001 + DORMANT_GRACE), "d", l, 1, 1).await;
    assert!(r.burst, "forgotten: the next request enters tier 1 again");
}

/// A rejection changes nothing a decision sees, but it may move the time
/// from which the state is forgotten (here: the upper tier's hits leave
/// with it, so the dormant tier 1 is forgotten earlier); the next reply
/// must say so in every store.
async fn rate_a_rejection_can_move_the_forget_time(f: &Fixture) {
    let tiers = [
        tier(5, 1_000, None, 0, false),
        tier(5, 1_000, Some(5_000), 0, false),
    ];
    let l = RateLimits {
        hard_limit: Some(6),
        global_limit: None,
        tiers: &tiers,
    };
    assert_eq!(brief(&ask(f, 0, "d", l, 5, 5).await), (5, 1, 5, true));
    assert_eq!(brief(&ask(f, 100, "d", l, 1, 1).await), (1, 2, 1, true));
    let r = ask(f, 5_100, "d", l, 7, 7).await;
    assert_eq!((r.granted, r.hard_limited), (0, true));
    step(
        f,
        1_001 + DORMANT_GRACE + 50,
        "d",
        l,
        (1, 1),
        (1, 1, 1, true),
        "forgotten from 1001 + grace, not 1101 + grace",
    )
    .await;
}

/// A client error changes nothing, not even the time from which the state
/// is forgotten: a refund on burst tiers after the hits left their window
/// (which a decision at that time would have dropped, so that the dormant
/// tier 1 is forgotten from its entry) keeps the pair as the last write left
/// it. Found by the batched differential: the in-memory store moved the
/// forget time on the error, Redis did not.
async fn rate_a_client_error_keeps_the_forget_time(f: &Fixture) {
    use charon_core::meter::{Op, Policy};
    let tiers = [tier(5, 1_000, None, 0, false)];
    let l = limits(&tiers);
    assert!(ask(f, 0, "d", l, 1, 1).await.burst);
    assert!(!ask(f, 10_000, "d", l, 1, 1).await.burst);
    f.clock.set(20_000);
    let refund = f
        .store
        .tiers(
            "api/search",
            "d",
            l,
            Policy::default(),
            Op::Refund(1),
            Enforcement::Enforce,
        )
        .await;
    assert!(matches!(refund, Err(StoreError::Refused(_))), "{refund:?}");
    step(
        f,
        1_001 + DORMANT_GRACE + 50,
        "d",
        l,
        (1, 1),
        (1, 1, 1, false),
        "kept until 11001 + grace: the refund wrote nothing",
    )
    .await;
}

fn copy_limits() -> CopyLimits {
    CopyLimits {
        domain_limit: 4,
        global_limit: Some(6),
        groups: vec![
            GroupLimit {
                name: "g1".into(),
                limit: 5,
            },
            GroupLimit {
                name: "g2".into(),
                limit: 3,
            },
        ],
    }
}

async fn copies_respect_domain_group_and_global_limits(f: &Fixture) {
    let l = copy_limits();
    let s = &f.store;
    let r = reserve(f, "a", &l, (5, 1), Enforcement::Enforce).await;
    assert_eq!(
        (r.granted, r.domain_holds, r.global_holds),
        (3, 3, 3),
        "g2 allows 3"
    );
    assert_eq!(
        r.groups
            .iter()
            .map(|g| (g.name.as_str(), g.holds))
            .collect::<Vec<_>>(),
        [("g1", 3), ("g2", 3)]
    );
    let only_g1 = CopyLimits {
        groups: vec![l.groups[0].clone()],
        ..l.clone()
    };
    let r = reserve(f, "b", &only_g1, (4, 3), Enforcement::Enforce).await;
    assert_eq!(r.granted, 0, "g1 has 2 left, below min_copies");
    let r = reserve(f, "b", &only_g1, (4, 1), Enforcement::Enforce).await;
    assert_eq!((r.granted, r.global_holds, r.groups[0].holds), (2, 5, 5));
    let ungrouped = CopyLimits {
        groups: vec![],
        ..l.clone()
    };
    let r = reserve(f, "c", &ungrouped, (4, 1), Enforcement::Enforce).await;
    assert_eq!((r.granted, r.global_holds), (1, 6), "global limit 6");
    let r = reserve(f, "c", &ungrouped, (1, 1), Enforcement::Ignore).await;
    assert_eq!((r.granted, r.global_holds, r.ignored), (1, 7, true));

    let hold = Hold::new("vm", "a", ["g2".to_owned(), "g1".to_owned()]);
    let st = s.release(&hold, 2).await.unwrap();
    assert_eq!((st.domain_holds, st.global_holds), (1, 5));
    assert_eq!(st.groups, [("g1".to_owned(), 3), ("g2".to_owned(), 1)]);
    let r = reserve(f, "a", &l, (9, 1), Enforcement::Enforce).await;
    assert_eq!((r.granted, r.domain_holds), (1, 2), "global 6 again");

    let free = CopyLimits {
        domain_limit: UNBOUNDED,
        global_limit: None,
        groups: vec![],
    };
    let r = s
        .reserve(
            "free/vm",
            "a",
            &free,
            amount(MAX_COUNT, 1),
            Enforcement::Enforce,
        )
        .await
        .unwrap();
    assert_eq!((r.granted, r.domain_limit), (MAX_COUNT, UNBOUNDED));
}

async fn release_beyond_held_is_refused_and_changes_nothing(f: &Fixture) {
    let l = copy_limits();
    let s = &f.store;
    reserve(f, "a", &l, (2, 2), Enforcement::Enforce).await;
    let hold = Hold::new("vm", "a", ["g1".to_owned(), "g2".to_owned()]);
    assert!(matches!(
        s.release(&hold, 3).await,
        Err(StoreError::BadData(_))
    ));
    let other_groups = Hold::new("vm", "a", ["g1".to_owned()]);
    let e = s.release(&other_groups, 1).await;
    // The in-memory store only sees that the counts cover it; both stores
    // refuse what no count covers.
    let st = s.release(&hold, 2).await;
    if e.is_ok() {
        assert!(st.is_err());
    } else {
        assert_eq!(st.unwrap().global_holds, 0);
    }
    let never = Hold::new("vm", "z", []);
    assert!(matches!(
        s.release(&never, 1).await,
        Err(StoreError::BadData(_))
    ));
    let r = reserve(f, "a", &l, (3, 1), Enforcement::Enforce).await;
    assert!(
        r.domain_holds <= 3 && r.global_holds <= 3,
        "no count went negative: {r:?}"
    );
}

async fn transfers_stage_expire_and_seize(f: &Fixture) {
    let l = copy_limits();
    let s = &f.store;
    f.clock.set(1_000);
    reserve(f, "a", &l, (3, 3), Enforcement::Enforce).await;
    let hold = Hold::new("vm", "a", ["g1".to_owned(), "g2".to_owned()]);
    let id = s.transfer(&hold, 2, 100).await.unwrap();
    let short = s.transfer(&hold, 1, 50).await.unwrap();
    assert_ne!(id, short);
    f.clock.set(1_049);
    let r = reserve(f, "a", &l, (1, 1), Enforcement::Enforce).await;
    assert_eq!(
        (r.granted, r.domain_holds),
        (0, 3),
        "staged copies stay counted"
    );
    f.clock.set(1_050);
    assert_eq!(
        s.seize(&short).await.unwrap(),
        None,
        "expired at exactly t + ttl"
    );
    let r = reserve(f, "a", &l, (3, 1), Enforcement::Enforce).await;
    assert_eq!(
        (r.granted, r.domain_holds),
        (1, 3),
        "the expired copy was released"
    );
    assert_eq!(s.staged_copies().await.unwrap(), 2, "for /metrics");
    let staged = s.seize(&id).await.unwrap().unwrap();
    assert_eq!((staged.hold, staged.copies), (hold.clone(), 2));
    assert_eq!(s.staged_copies().await.unwrap(), 0);
    s.ping().await.unwrap();
    assert_eq!(s.seize(&id).await.unwrap(), None, "seized only once");
    assert_eq!(s.seize("nonsense").await.unwrap(), None);
    assert_eq!(
        s.seize(&format!("{}.vm", "0".repeat(32))).await.unwrap(),
        None
    );
    let st = s.release(&hold, 3).await.unwrap();
    assert_eq!((st.domain_holds, st.global_holds), (0, 0));
    // A transfer nobody seizes gives its copies back when its ttl passes.
    reserve(f, "b", &l, (2, 2), Enforcement::Enforce).await;
    let hb = Hold::new("vm", "b", ["g1".to_owned(), "g2".to_owned()]);
    let _ = s.transfer(&hb, 2, 10).await.unwrap();
    f.clock.set(1_060);
    let r = reserve(f, "b", &l, (9, 1), Enforcement::Enforce).await;
    assert_eq!(
        (r.granted, r.global_holds),
        (3, 3),
        "expired on the next access"
    );
}

/// One step's outcome as a line: granted with the counts after, refused at
/// the bound as a client error (naming the count), or anything else as it
/// came.
fn seen<T: std::fmt::Debug>(r: Result<T, StoreError>, counts: impl Fn(&T) -> String) -> String {
    match r {
        Ok(v) => counts(&v),
        // The client class (SPEC §5), whatever the store.
        Err(e @ StoreError::Refused(_)) if e.to_string().contains(BOUND) => format!("refused: {e}"),
        Err(e) => format!("other error: {e:?}"),
    }
}

fn reserved(r: &charon_core::copy::ReserveReply) -> String {
    format!(
        "granted {}, domain {}, global {}",
        r.granted, r.domain_holds, r.global_holds
    )
}

fn hits(r: &RateReply) -> String {
    format!(
        "granted {}, domain {}, global {}",
        r.granted, r.domain_hits_last_second, r.global_hits_last_second
    )
}

/// `n` copies of the same operation: how many were granted, refused at the
/// bound, or anything else (the first other outcome shown).
fn tally(outcomes: &[String]) -> String {
    let granted = outcomes.iter().filter(|o| o.starts_with("granted")).count();
    let refused = outcomes.iter().filter(|o| o.starts_with("refused")).count();
    let other = outcomes.len() - granted - refused;
    let first_other = outcomes
        .iter()
        .find(|o| !o.starts_with("granted") && !o.starts_with("refused"))
        .map_or(String::new(), |o| format!(" (first: {o})"));
    format!("{granted} granted, {refused} refused at the bound, {other} other{first_other}")
}

/// Defect 8: counts up to 2^53 - 1 are valid, and a store must keep every
/// sum exact. Reserves of 2^52 + 1 copies on an unconfigured resource
/// (`allow_unconfigured`): the second would take the domain's and the
/// resource's counts past 2^53 - 1 (Redis' Lua numbers are doubles: the
/// third sum was inexact) and is refused, as is every reserve of 2^53 - 1
/// under `ignore_configured` once the count is there (2100 of them would
/// have passed 2^63, where `HINCRBY` fails, and 2^64, where a u64 wraps).
async fn huge_copy_counts_stop_at_the_bound(f: &Fixture) {
    let free = CopyLimits {
        domain_limit: UNBOUNDED,
        global_limit: None,
        groups: vec![],
    };
    let s = &f.store;
    let big = (1u64 << 52) + 1;
    let rest = MAX_COUNT - big;
    let mut observed = Vec::new();
    for (domain, copies, enforcement) in [
        ("a", big, Enforcement::Enforce),
        ("a", big, Enforcement::Enforce),
        ("a", big, Enforcement::Enforce),
        ("b", rest, Enforcement::Enforce),
        ("b", 1, Enforcement::Ignore),
        ("c", MAX_COUNT, Enforcement::Ignore),
    ] {
        let r = s
            .reserve("free/vm", domain, &free, amount(copies, 1), enforcement)
            .await;
        observed.push(format!(
            "reserve({domain}, {copies}): {}",
            seen(r, reserved)
        ));
    }
    let mut many = Vec::new();
    for _ in 0..2_100 {
        let r = s
            .reserve(
                "free/many",
                "d",
                &free,
                amount(MAX_COUNT, 1),
                Enforcement::Ignore,
            )
            .await;
        many.push(seen(r, reserved));
    }
    observed.push(format!("2100 reserves of 2^53-1: {}", tally(&many)));
    let st = s.release(&Hold::new("free/vm", "a", []), big).await;
    observed.push(format!(
        "release(a, {big}): {}",
        seen(st, |st| format!(
            "domain {}, global {}",
            st.domain_holds, st.global_holds
        ))
    ));

    let refusal =
        |count: &str, held: u64, n: u64| format!("refused: {}", refusal_at_bound(count, held, n));
    // The second and the third reserve of 2^52 + 1 by `a` are refused alike.
    let a_refused = format!(
        "reserve(a, {big}): {}",
        refusal("the copies held by domain \"a\"", big, big)
    );
    let expected = vec![
        format!("reserve(a, {big}): granted {big}, domain {big}, global {big}"),
        a_refused.clone(),
        a_refused,
        format!("reserve(b, {rest}): granted {rest}, domain {rest}, global {MAX_COUNT}"),
        format!(
            "reserve(b, 1): {}",
            refusal("the copies held of the resource", MAX_COUNT, 1)
        ),
        format!(
            "reserve(c, {MAX_COUNT}): {}",
            refusal("the copies held of the resource", MAX_COUNT, MAX_COUNT)
        ),
        "2100 reserves of 2^53-1: 1 granted, 2099 refused at the bound, 0 other".to_owned(),
        format!("release(a, {big}): domain 0, global {rest}"),
    ];
    println!(
        "FAULT huge_copy_counts ({}): injected reserves of 2^52+1 copies x3, up to 2^53-1 in all, then 2^53-1 copies x2100 (past 2^63 and 2^64); expected the first grant exact and every reserve past 2^53-1 refused as a client error naming the bound; observed:\n  {}",
        s.kind(),
        observed.join("\n  ")
    );
    assert_eq!(observed, expected);
}

/// Defect 8 for rate-limited resources: the hits of the last second, per
/// domain and across domains, stay exact up to 2^53 - 1; a request that
/// would take either past it is refused, and 1100 requests of 2^53 - 1
/// from different domains (whose sum would pass 2^63, after which Redis
/// answered every domain with a server error for a second) are all
/// refused. A second later the whole range is usable again.
async fn huge_hit_counts_stop_at_the_bound(f: &Fixture) {
    let permissive = [tier(UNBOUNDED, 1_000, None, 0, false)];
    let l = limits(&permissive);
    let big = (1u64 << 52) + 1;
    let rest = MAX_COUNT - big;
    f.clock.set(10_000);
    let mut observed = Vec::new();
    let ask_huge = |domain: String, copies: u64, enforcement: Enforcement| async move {
        f.store
            .request("free/api", &domain, l, amount(copies, 1), enforcement)
            .await
    };
    for (domain, copies, enforcement) in [
        ("a", big, Enforcement::Enforce),
        ("a", big, Enforcement::Enforce),
        ("b", rest, Enforcement::Ignore),
        ("c", 1, Enforcement::Enforce),
    ] {
        let r = ask_huge(domain.to_owned(), copies, enforcement).await;
        observed.push(format!("request({domain}, {copies}): {}", seen(r, hits)));
    }
    let mut many = Vec::new();
    for i in 0..1_100 {
        let r = ask_huge(format!("m{i}"), MAX_COUNT, Enforcement::Ignore).await;
        many.push(seen(r, hits));
    }
    observed.push(format!("1100 requests of 2^53-1: {}", tally(&many)));
    f.clock.set(11_001);
    let r = ask_huge("e".to_owned(), MAX_COUNT, Enforcement::Enforce).await;
    observed.push(format!(
        "a second later, request(e, {MAX_COUNT}): {}",
        seen(r, hits)
    ));

    let refusal =
        |count: &str, held: u64, n: u64| format!("refused: {}", refusal_at_bound(count, held, n));
    let expected = vec![
        format!("request(a, {big}): granted {big}, domain {big}, global {big}"),
        format!(
            "request(a, {big}): {}",
            refusal("the hits of this domain in the last second", big, big)
        ),
        format!("request(b, {rest}): granted {rest}, domain {rest}, global {MAX_COUNT}"),
        format!(
            "request(c, 1): {}",
            refusal("the hits of all domains in the last second", MAX_COUNT, 1)
        ),
        "1100 requests of 2^53-1: 0 granted, 1100 refused at the bound, 0 other".to_owned(),
        format!(
            "a second later, request(e, {MAX_COUNT}): granted {MAX_COUNT}, domain {MAX_COUNT}, global {MAX_COUNT}"
        ),
    ];
    println!(
        "FAULT huge_hit_counts ({}): injected requests of 2^52+1 hits x2, up to 2^53-1 in all, then 2^53-1 hits from 1100 domains (past 2^63) in one second; expected every request past 2^53-1 refused as a client error naming the bound, the next second normal; observed:\n  {}",
        f.store.kind(),
        observed.join("\n  ")
    );
    assert_eq!(observed, expected);
}

// Buckets, windows and queues (SPEC §7-10): the cookbook of issue 11, the
// same replies from both stores.

fn meter_reply(r: &charon_core::meter::Reply) -> String {
    format!(
        "granted {} remaining {} retry {:?} reset {} delay {:?}{}{}",
        r.granted,
        r.remaining,
        r.retry_after_ms,
        r.reset_after_ms,
        r.delay_ms,
        if r.warning { " warning" } else { "" },
        if r.banned { " banned" } else { "" },
    )
}

async fn meter_at(
    f: &Fixture,
    t: u64,
    domain: &str,
    m: &charon_core::meter::Meter,
    op: charon_core::meter::Op,
) -> String {
    f.clock.set(t);
    match f.store.meter("cookbook", domain, m, op).await {
        Ok(r) => meter_reply(&r),
        Err(StoreError::Refused(e)) => format!("client error: {e}"),
        Err(e) => panic!("store failed: {e}"),
    }
}

async fn meters_cookbook(f: &Fixture) {
    use charon_core::meter::{Ban, Meter, Op, Policy, SoftLimit};
    use charon_core::window::Algorithm;
    use charon_core::{bucket, queue, window};
    let req = |n| Op::request(amount(n, n));
    let t0 = 1_700_000_040_000;

    // Seed 002: burst 20, count 20 per second; the 21st waits 50 ms.
    let b = Meter::Bucket(bucket::Params::new(20, 20, 1_000, Policy::default()).unwrap());
    for i in 0..20 {
        let r = meter_at(f, t0, "ip", &b, req(1)).await;
        assert!(r.starts_with("granted 1 "), "request {i}: {r}");
    }
    assert_eq!(
        meter_at(f, t0, "ip", &b, req(1)).await,
        "granted 0 remaining 0 retry Some(50) reset 1000 delay None"
    );
    assert_eq!(
        meter_at(f, t0 + 50, "ip", &b, req(1)).await,
        "granted 1 remaining 0 retry Some(50) reset 1000 delay None"
    );

    // Seed 004: 100 credits, one a minute; 3 × 20 at 00:10, 2 at 00:20.
    let credits = Meter::Bucket(bucket::Params::new(100, 1, 60_000, Policy::default()).unwrap());
    for _ in 0..3 {
        meter_at(f, t0 + 10 * 60_000, "acct", &credits, req(20)).await;
    }
    let r = meter_at(f, t0 + 20 * 60_000, "acct", &credits, req(2)).await;
    assert!(r.starts_with("granted 2 remaining 48 "), "{r}");

    // Seed 001: sliding counter, 7 a minute, 5 then 3 hits, at 30 %.
    let w = Meter::Window(
        window::Params::new(Algorithm::SlidingCounter, 7, 60_000, Policy::default()).unwrap(),
    );
    let m0 = 28_333_334 * 60_000;
    meter_at(f, m0 + 1_000, "s", &w, req(5)).await;
    // 3 + floor(5 × 50/60) = 7 at 10 s in, then 3 + floor(5 × 0.7) = 6.
    meter_at(f, m0 + 70_000, "s", &w, req(3)).await;
    // Whole again once the minute's 4 hits no longer weigh on the next
    // one: floor(4 × (60000 − e) / 60000) = 0 from e = 45001 on.
    assert_eq!(
        meter_at(f, m0 + 60_000 + 18_000, "s", &w, req(1)).await,
        "granted 1 remaining 0 retry Some(6001) reset 87001 delay None"
    );

    // A queue, 10 per second, 5 places: delays 0..400 ms, then rejected.
    let q = Meter::Queue(queue::Params::new(10, 1_000, 5, Policy::default()).unwrap());
    let mut delays = Vec::new();
    for _ in 0..6 {
        delays.push(meter_at(f, t0, "q", &q, req(1)).await);
    }
    assert_eq!(
        delays,
        [
            "granted 1 remaining 4 retry Some(0) reset 100 delay Some(0)",
            "granted 1 remaining 3 retry Some(0) reset 200 delay Some(100)",
            "granted 1 remaining 2 retry Some(0) reset 300 delay Some(200)",
            "granted 1 remaining 1 retry Some(0) reset 400 delay Some(300)",
            "granted 1 remaining 0 retry Some(100) reset 500 delay Some(400)",
            "granted 0 remaining 0 retry Some(100) reset 500 delay Some(0)",
        ]
    );

    // Seed 001: 2 000 per 1 200 s with a one-hour ban and a soft limit.
    let policy = Policy {
        soft_limit: Some(SoftLimit::percent(90).unwrap()),
        ban: Some(Ban::new(3_600_000).unwrap()),
    };
    let throttle =
        Meter::Window(window::Params::new(Algorithm::Fixed, 2_000, 1_200_000, policy).unwrap());
    let w0 = 1_416_667 * 1_200_000;
    assert!(
        meter_at(f, w0, "bot", &throttle, req(2_000))
            .await
            .ends_with(" warning")
    );
    assert_eq!(
        meter_at(f, w0 + 1, "bot", &throttle, Op::dry_run(amount(1, 1))).await,
        "granted 0 remaining 0 retry Some(3600000) reset 1199999 delay None warning banned"
    );
    assert_eq!(
        meter_at(f, w0 + 1, "bot", &throttle, req(1)).await,
        "granted 0 remaining 0 retry Some(3600000) reset 1199999 delay None warning banned"
    );
    assert_eq!(
        meter_at(f, w0 + 3_600_000, "bot", &throttle, req(1)).await,
        "granted 0 remaining 2000 retry Some(1) reset 0 delay None banned",
        "the ban's last millisecond, three windows on: the window counts nothing"
    );
    assert_eq!(
        meter_at(f, w0 + 3_600_001, "bot", &throttle, req(1)).await,
        "granted 1 remaining 1999 retry Some(0) reset 1199999 delay None"
    );

    // LLM tokens: a dry run, the call, then a charge of what it used.
    let tokens =
        Meter::Bucket(bucket::Params::new(1_000, 1_000, 60_000, Policy::default()).unwrap());
    assert!(
        meter_at(f, t0, "llm", &tokens, Op::dry_run(amount(1, 1)))
            .await
            .starts_with("granted 1 remaining 999 ")
    );
    assert_eq!(
        meter_at(f, t0, "llm", &tokens, Op::Charge(1_500)).await,
        "granted 1500 remaining 0 retry Some(30060) reset 90000 delay None"
    );
    assert!(
        meter_at(f, t0 + 30_059, "llm", &tokens, req(1))
            .await
            .starts_with("granted 0 ")
    );
    assert!(
        meter_at(f, t0 + 30_060, "llm", &tokens, req(1))
            .await
            .starts_with("granted 1 ")
    );

    // Bad input: the client error of core, nothing changed.
    for (m, op) in [
        (&w, Op::Refund(1)),
        (&q, Op::Refund(1)),
        (&b, Op::Charge(0)),
    ] {
        let r = meter_at(f, t0 + 60, "ip", m, op).await;
        assert!(r.starts_with("client error: "), "{r}");
    }
    assert_eq!(
        meter_at(f, t0 + 60, "ip", &b, Op::Refund(0)).await,
        "client error: copies must be at least 1"
    );
    assert_eq!(
        meter_at(f, t0 + 60, "ip", &b, Op::dry_run(amount(1, 1))).await,
        "granted 0 remaining 0 retry Some(40) reset 990 delay None",
        "unchanged by the errors, a refund on a window of another kind included"
    );
}

macro_rules! conformance {
    ($store:ident: $($test:ident),* $(,)?) => {
        mod $store {
            $(
                #[tokio::test]
                async fn $test() {
                    let f = charon_testkit::stores::$store().await;
                    super::$test(&f).await;
                }
            )*
        }
    };
}

macro_rules! suite {
    ($($store:ident),*) => {
        $(
            conformance!($store:
                rate_window_boundaries,
                rate_multi_hit_through_tiers,
                rate_skippable_and_zero_tiers,
                rate_hard_and_global_limits,
                rate_ignored_and_unbounded,
                rate_state_is_forgotten_after_the_dormant_grace,
                rate_a_rejection_can_move_the_forget_time,
                rate_a_client_error_keeps_the_forget_time,
                copies_respect_domain_group_and_global_limits,
                release_beyond_held_is_refused_and_changes_nothing,
                transfers_stage_expire_and_seize,
                huge_copy_counts_stop_at_the_bound,
                huge_hit_counts_stop_at_the_bound,
                meters_cookbook,
            );
        )*
    };
}

suite!(memory, redis);

// The same tests on a private Redis Cluster (three masters, three
// replicas): every script's keys in one slot, copy writes confirmed by a
// replica (`WAIT`). A subset, as each starts six redis-servers; the
// meters batch across resources is cross-slot (see docs/redis.md).
conformance!(redis_cluster:
    rate_window_boundaries,
    rate_hard_and_global_limits,
    copies_respect_domain_group_and_global_limits,
    release_beyond_held_is_refused_and_changes_nothing,
    transfers_stage_expire_and_seize,
);
