use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::config::{CopyLimits, Enforcement, GroupLimit, RateLimits, Tier};
use charon_core::copy::Hold;
use charon_core::request::Amount;

use super::*;

fn one() -> Amount {
    Amount::exactly(1).expect("valid")
}

fn store() -> (Arc<ManualClock>, MemoryStore) {
    let clock = Arc::new(ManualClock::new(0));
    (clock.clone(), MemoryStore::with_sequential_ids(clock))
}

const SIMPLE: &[Tier] = &[Tier {
    limit: 2,
    window: 1_000,
    active: None,
    cooldown: 0,
    skippable: false,
}];

fn simple() -> RateLimits<'static> {
    RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: SIMPLE,
    }
}

#[tokio::test]
async fn pairs_are_independent_and_share_the_global_count() {
    let (_, s) = store();
    let a = s
        .request("r", "a", simple(), one(), Enforcement::Enforce)
        .await
        .expect("ok");
    let b = s
        .request("r", "b", simple(), one(), Enforcement::Enforce)
        .await
        .expect("ok");
    let other = s
        .request("r2", "a", simple(), one(), Enforcement::Enforce)
        .await
        .expect("ok");
    assert_eq!(
        (a.domain_hits_last_second, a.global_hits_last_second),
        (1, 1)
    );
    assert_eq!(
        (b.domain_hits_last_second, b.global_hits_last_second),
        (1, 2)
    );
    assert_eq!(other.global_hits_last_second, 1);
    // "r" + "a" must not collide with "ra" + "" or "r\0a"-like keys.
    let c = s
        .request("ra", "x", simple(), one(), Enforcement::Enforce)
        .await
        .expect("ok");
    assert_eq!(c.domain_hits_last_second, 1);
}

#[tokio::test]
async fn idle_pairs_are_swept_once_they_cannot_matter() {
    let (clock, s) = store();
    for d in 0..100 {
        s.request("r", &format!("d{d}"), simple(), one(), Enforcement::Enforce)
            .await
            .expect("ok");
    }
    assert_eq!(s.pair_count(), 100);
    clock.set(1_000);
    assert_eq!(
        s.sweep().pairs,
        0,
        "hits still in the window and the last second"
    );
    clock.set(1_001 + DORMANT_GRACE - 1);
    let swept = s.sweep();
    assert_eq!(
        (swept.pairs, swept.resources),
        (0, 1),
        "the last second is empty; tier 1 is dormant"
    );
    clock.set(1_001 + DORMANT_GRACE);
    let swept = s.sweep();
    assert_eq!((swept.pairs, swept.resources), (100, 0));
    assert_eq!(s.pair_count(), 0);
}

#[tokio::test]
async fn transfers_stage_and_expire_by_themselves() {
    let (clock, s) = store();
    let limits = CopyLimits {
        domain_limit: 3,
        global_limit: Some(5),
        groups: vec![GroupLimit {
            name: "g".into(),
            limit: 4,
        }],
    };
    let r = s
        .reserve(
            "vm",
            "d",
            &limits,
            Amount::exactly(3).expect("valid"),
            Enforcement::Enforce,
        )
        .await
        .expect("ok");
    assert_eq!(
        (r.granted, r.domain_holds, r.global_holds, r.groups[0].holds),
        (3, 3, 3, 3)
    );
    let hold = Hold::new("vm", "d", ["g".to_owned()]);
    let id = s.transfer(&hold, 2, 100).await.expect("ok");
    assert_eq!(id, "t1");
    assert_eq!(s.staged_copies().await.expect("ok"), 2);
    clock.set(99);
    let r = s
        .reserve("vm", "d", &limits, one(), Enforcement::Enforce)
        .await
        .expect("ok");
    assert_eq!(r.granted, 0, "staged copies stay counted");
    clock.set(100);
    assert_eq!(
        s.seize(&id).await.expect("ok"),
        None,
        "expired at exactly t + ttl"
    );
    let r = s
        .reserve(
            "vm",
            "d",
            &limits,
            Amount::new(3, 1).expect("valid"),
            Enforcement::Enforce,
        )
        .await
        .expect("ok");
    assert_eq!(
        (r.granted, r.domain_holds),
        (2, 3),
        "expired copies were released"
    );
}

#[tokio::test]
async fn a_seized_transfer_cannot_be_seized_twice_and_release_never_goes_negative() {
    let (_, s) = store();
    let limits = CopyLimits {
        domain_limit: 3,
        global_limit: None,
        groups: vec![],
    };
    s.reserve("vm", "d", &limits, one(), Enforcement::Enforce)
        .await
        .expect("ok");
    let hold = Hold::new("vm", "d", []);
    let id = s.transfer(&hold, 1, 1_000).await.expect("ok");
    let staged = s.seize(&id).await.expect("ok").expect("staged");
    assert_eq!((staged.hold, staged.copies), (hold.clone(), 1));
    assert_eq!(s.seize(&id).await.expect("ok"), None);
    assert_eq!(s.seize("nonsense").await.expect("ok"), None);
    s.release(&hold, 1).await.expect("ok");
    assert!(matches!(
        s.release(&hold, 1).await,
        Err(StoreError::BadData(_))
    ));
}

#[tokio::test]
async fn a_banned_pair_is_kept_until_its_ban_ends_then_swept() {
    use charon_core::meter::{Ban, Op, Policy};
    const SHORT: &[Tier] = &[Tier {
        limit: 1,
        window: 100,
        active: Some(100),
        cooldown: 0,
        skippable: false,
    }];
    let limits = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: SHORT,
    };
    let policy = Policy {
        soft_limit: None,
        ban: Some(Ban::new(10_000).expect("valid")),
    };
    let (clock, s) = store();
    let ask = |dry_run| Op::Request {
        amount: one(),
        dry_run,
    };
    let r = s
        .tiers("r", "d", limits, policy, ask(false), Enforcement::Enforce)
        .await
        .expect("decided");
    assert_eq!(r.granted, 1);
    clock.set(1);
    let r = s
        .tiers("r", "d", limits, policy, ask(false), Enforcement::Enforce)
        .await
        .expect("decided");
    assert_eq!((r.granted, r.context.banned), (0, true));
    // Without the ban the pair would be idle from 1001 on.
    clock.set(10_000);
    s.sweep();
    assert_eq!(s.pair_count(), 1, "the ban's last millisecond");
    let r = s
        .tiers("r", "d", limits, policy, ask(true), Enforcement::Enforce)
        .await
        .expect("decided");
    assert_eq!((r.granted, r.context.retry_after_ms), (0, Some(1)));
    clock.set(10_001);
    s.sweep();
    assert_eq!(s.pair_count(), 0, "ended, idle and swept");
}

/// Whether the pair's state is spilled (kept unencoded), and its
/// encoding's length.
fn stored(s: &MemoryStore, resource: &str, domain: &str) -> Option<(bool, usize)> {
    s.rates
        .update(&s.rates.pair(resource, domain), |found, _, _| {
            let seen = found.map(|b| (rate_bytes::spilled_slot(b).is_some(), b.len()));
            (table::Write::Keep, seen)
        })
}

#[tokio::test]
async fn a_busy_pair_is_spilled_and_packed_again_once_quiet() {
    let (clock, s) = store();
    let tiers = [Tier {
        limit: 1_000,
        window: 1_000,
        active: None,
        cooldown: 0,
        skippable: false,
    }];
    let limits = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: &tiers,
    };
    let ask = |s: &MemoryStore| {
        let r = s.request("r", "busy", limits, one(), Enforcement::Enforce);
        futures_ready(r).expect("a reply")
    };
    for _ in 0..3 {
        clock.advance(1);
        assert_eq!(ask(&s).granted, 1);
    }
    assert_eq!(stored(&s, "r", "busy").map(|x| x.0), Some(false));
    // 30 more: each in the tier's log and the last second, 66 entries.
    for _ in 0..30 {
        clock.advance(1);
        assert_eq!(ask(&s).granted, 1);
    }
    assert_eq!(stored(&s, "r", "busy").map(|x| x.0), Some(true), "spilled");
    // A second later every hit has left: packed again at the next one.
    clock.advance(1_001);
    assert_eq!(ask(&s).granted, 1);
    assert_eq!(stored(&s, "r", "busy").map(|x| x.0), Some(false), "packed");
    // The spilled slot was given back: a sweep after all is idle leaves
    // nothing.
    clock.advance(DORMANT_GRACE + 2_000);
    assert_eq!(s.sweep().pairs, 1);
    assert_eq!(stored(&s, "r", "busy"), None);
}

/// The in-memory store never waits: its futures are ready at once.
fn futures_ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("the memory store does not wait"),
    }
}
