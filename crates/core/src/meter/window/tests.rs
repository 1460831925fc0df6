//! SPEC §8 and §10 for windows, each rule at its exact boundary, and the
//! cookbook examples of issue 11.

use super::*;
use crate::meter::harness::Harness;
use crate::meter::{Ban, SoftLimit};
use crate::meter::{Op, decide};
use crate::request::Amount;

const MINUTE: Millis = 60_000;

type Win = Harness<Params>;

impl Win {
    fn new(algorithm: Algorithm, limit: u64, window: Millis, policy: Policy) -> Self {
        Self::of(Params::new(algorithm, limit, window, policy).expect("valid"))
    }
}

#[test]
fn fixed_windows_turn_at_the_aligned_millisecond() {
    let mut w = Win::new(Algorithm::Fixed, 3, 1_000, Policy::default());
    let r = w.ask(2_500, 5, 1);
    assert_eq!((r.granted, r.remaining, r.reset_after_ms), (3, 0, 500));
    let r = w.ask(2_999, 1, 1);
    assert_eq!(
        (r.granted, r.retry_after_ms, r.reset_after_ms),
        (0, Some(1), 1)
    );
    let r = w.ask(3_000, 1, 1);
    assert_eq!((r.granted, r.remaining, r.reset_after_ms), (1, 2, 1_000));
    assert_eq!(w.params.forget_at(&w.state.level.expect("kept")), 4_000);
    assert!(w.state.is_idle(&w.params, 4_000));
    // More than the limit never fits.
    let r = w.ask(3_000, 4, 4);
    assert_eq!((r.granted, r.retry_after_ms), (0, None));
}

#[test]
fn cookbook_sliding_counter_seed_example() {
    // Limit 7 a minute; 5 hits in the previous minute, 3 in this one.
    let mut w = Win::new(Algorithm::SlidingCounter, 7, MINUTE, Policy::default());
    assert_eq!(w.ask(MINUTE + 10, 5, 5).granted, 5);
    // At 30 % of the minute: 3 + floor(5 × 0.7) = 6, so one more fits.
    let at = 2 * MINUTE + 18_000;
    assert_eq!(w.ask(at, 3, 3).granted, 3);
    let dry = w.op(at, Op::dry_run(Amount::exactly(2).expect("amount")));
    assert_eq!(dry.granted, 0);
    let r = w.ask(at, 1, 1);
    assert_eq!((r.granted, r.remaining), (1, 0));
    // The 4 hits of this minute weigh on the next one until
    // floor(4 × (60000 − e) / 60000) = 0, from e = 45001 on.
    assert_eq!(r.reset_after_ms, 42_000 + 45_001);
}

#[test]
fn the_sliding_estimate_rounds_down_and_retry_is_the_first_fitting_millisecond() {
    // W = 1000, prev = 3: the weight of prev drops one hit at
    // e = 334 (3 × 666 / 1000 = 1.998 → 1), at e = 667 to 0.
    let mut w = Win::new(Algorithm::SlidingCounter, 3, 1_000, Policy::default());
    assert_eq!(w.ask(500, 3, 3).granted, 3);
    // At 1000: estimate 0 + 3 = 3, full.
    let r = w.ask(1_000, 1, 1);
    assert_eq!((r.granted, r.remaining, r.retry_after_ms), (0, 0, Some(1)));
    // 3 × 999 / 1000 = 2.997 → 2: one fits at 1001.
    let r = w.ask(1_001, 1, 1);
    assert_eq!((r.granted, r.remaining), (1, 0));
    // curr 1, prev 3: the next fits when floor(3 × s / 1000) ≤ 1, s ≤ 666,
    // e ≥ 334.
    let r = w.ask(1_001, 1, 1);
    assert_eq!((r.granted, r.retry_after_ms), (0, Some(333)));
    assert_eq!(w.ask(1_333, 1, 1).granted, 0);
    assert_eq!(w.ask(1_334, 1, 1).granted, 1);
    // Now curr 2: two more never fit in this window (2 + 2 > 3).
    let r = w.ask(1_334, 2, 2);
    assert_eq!((r.granted, r.retry_after_ms), (0, Some(667)));
    // Two need the next window: prev 2 weighs floor(2 × s / 1000) ≤ 1, s ≤ 999.
    assert_eq!(w.ask(2_000, 2, 2).granted, 0);
    assert_eq!(w.ask(2_001, 2, 2).granted, 2);
}

#[test]
fn sliding_retry_can_be_two_windows_away() {
    let mut w = Win::new(Algorithm::SlidingCounter, 4, 100, Policy::default());
    assert_eq!(w.ask(50, 4, 4).granted, 4);
    // Next window: prev 4 needs floor(4 × s / 100) ≤ 0, s ≤ 24, e ≥ 76.
    let r = w.ask(60, 4, 4);
    assert_eq!(r.retry_after_ms, Some(40 + 76));
    assert_eq!(w.ask(175, 4, 4).granted, 0);
    assert_eq!(w.ask(176, 4, 4).granted, 4);
    // Full again; in window 2 prev is 0 once window 3 starts.
    let r = w.ask(199, 4, 4);
    assert_eq!(r.granted, 0);
    // Window 2 (curr 4): in window 3, 4 × s / 100 < 1 needs s ≤ 24 → 276.
    assert_eq!(r.retry_after_ms, Some(276 - 199));
}

#[test]
fn charge_counts_past_the_limit_and_refund_is_refused() {
    let mut w = Win::new(Algorithm::Fixed, 10, 1_000, Policy::default());
    let r = w.op(0, Op::Charge(25));
    assert_eq!(
        (r.granted, r.remaining, r.retry_after_ms),
        (25, 0, Some(1_000))
    );
    assert_eq!(w.ask(999, 1, 1).granted, 0);
    let before = w.state;
    let e = decide(&w.params, &mut w.state, 999, Op::Refund(1)).expect_err("no refunds");
    assert!(e.to_string().contains("refund"), "{e}");
    assert_eq!(w.state, before);
    assert_eq!(w.ask(1_000, 10, 10).granted, 10);
}

#[test]
fn a_charge_beyond_the_exact_bound_is_refused() {
    let mut w = Win::new(Algorithm::SlidingCounter, 1, 1_000, Policy::default());
    let most = MAX_COUNT / 1_000;
    assert_eq!(w.params.max_count(), most);
    w.op(0, Op::Charge(most - 1));
    let before = w.state;
    assert!(decide(&w.params, &mut w.state, 0, Op::Charge(2)).is_err());
    assert_eq!(w.state, before);
    assert_eq!(w.op(0, Op::Charge(1)).granted, 1);
    // Estimates of the largest counts do not overflow.
    let r = w.ask(1_001, 1, 1);
    assert_eq!((r.granted, r.remaining), (0, 0));
}

#[test]
fn soft_limit_and_ban_on_a_window() {
    let policy = Policy {
        soft_limit: Some(SoftLimit::percent(50).expect("valid")),
        ban: Some(Ban::new(3_600_000).expect("valid")),
    };
    // Seed 001: 2000 requests per 1200 s, ban 1 h.
    let mut w = Win::new(Algorithm::Fixed, 2_000, 1_200_000, policy);
    assert!(!w.ask(0, 999, 999).warning);
    assert!(w.ask(0, 1, 1).warning, "1000 of 2000");
    assert_eq!(w.ask(10, 1_000, 1_000).granted, 1_000);
    let r = w.ask(20, 1, 1);
    assert_eq!(
        (r.granted, r.banned, r.retry_after_ms),
        (0, true, Some(3_600_000))
    );
    let mut last = 3_600_000;
    for t in [21, 1_200_000, 3_600_019] {
        let r = w.ask(t, 1, 1);
        assert_eq!((r.granted, r.banned), (0, true), "{t}");
        let left = r.retry_after_ms.expect("finite");
        assert!(left < last);
        last = left;
    }
    assert_eq!(last, 1, "the ban's last millisecond");
    let r = w.ask(3_600_020, 1, 1);
    assert_eq!((r.granted, r.banned), (1, false));
}

#[test]
fn a_short_ban_tells_the_client_to_come_back_when_the_window_has_room() {
    let policy = Policy {
        soft_limit: None,
        ban: Some(Ban::new(100).expect("valid")),
    };
    let mut w = Win::new(Algorithm::Fixed, 1, 1_000, policy);
    w.ask(0, 1, 1);
    let r = w.ask(10, 1, 1);
    assert!(r.banned);
    assert_eq!(
        r.retry_after_ms,
        Some(990),
        "the window turns after the ban"
    );
}

#[test]
fn bad_parameters_name_their_field() {
    let p = Policy::default();
    let field = |r: Result<Params, FieldError>| r.expect_err("invalid").field;
    assert_eq!(field(Params::new(Algorithm::Fixed, 0, 1, p)), "limit");
    assert_eq!(field(Params::new(Algorithm::Fixed, 1, 0, p)), "window");
    assert_eq!(
        field(Params::new(Algorithm::Fixed, MAX_COUNT + 1, 1, p)),
        "limit"
    );
    assert!(Params::new(Algorithm::Fixed, MAX_COUNT, 1_000, p).is_ok());
    let most = MAX_COUNT / 1_000;
    assert!(Params::new(Algorithm::SlidingCounter, most, 1_000, p).is_ok());
    assert_eq!(
        field(Params::new(Algorithm::SlidingCounter, most + 1, 1_000, p)),
        "limit"
    );
    assert_eq!(SoftLimit::percent(0).expect_err("0%").field, "soft_limit");
    assert_eq!(
        SoftLimit::percent(101).expect_err("101%").field,
        "soft_limit"
    );
    assert_eq!(Ban::new(0).expect_err("0").field, "ban");
}

#[test]
fn seen_reports_what_the_decision_compares_with_the_limit() {
    let p = Params::new(Algorithm::SlidingCounter, 7, MINUTE, Policy::default()).expect("valid");
    let s = Counts {
        index: 1,
        curr: 3,
        prev: 5,
    };
    // 30 % into the minute: 3 + floor(5 × 0.7) = 6, and room for 1.
    let seen = p.seen(Some(&s), 78_000);
    assert_eq!((seen.count, seen.previous, seen.estimate), (3, 5, 6));
    assert_eq!(p.room(Some(&s), 78_000), 7 - seen.estimate);
    // At the next turn the current count becomes the previous one.
    let seen = p.seen(Some(&s), 120_000);
    assert_eq!((seen.count, seen.previous, seen.estimate), (0, 3, 3));
    // A fixed window has no previous count: the estimate is the count.
    let f = Params::new(Algorithm::Fixed, 7, MINUTE, Policy::default()).expect("valid");
    let seen = f.seen(Some(&s), 78_000);
    assert_eq!((seen.count, seen.previous, seen.estimate), (3, 0, 3));
    assert_eq!(f.seen(None, 0).estimate, 0);
}
