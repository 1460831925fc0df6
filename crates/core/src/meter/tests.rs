//! The parts every kind shares: soft-limit thresholds, bans, dry runs
//! during a ban, charges during a ban, and the reply's JSON.

use super::*;
use crate::bucket;
use crate::queue;

#[test]
fn the_soft_threshold_is_exact_for_every_limit() {
    for percent in [1, 33, 50, 80, 99, 100] {
        let s = SoftLimit::percent(percent).expect("valid");
        for limit in (1..=1_000).chain([MAX_COUNT - 1, MAX_COUNT]) {
            let exact = (u128::from(percent) * u128::from(limit)).div_ceil(100);
            assert_eq!(
                u128::from(s.threshold(limit)),
                exact,
                "{percent}% of {limit}"
            );
            assert!(s.threshold(limit) >= 1);
        }
    }
    let s = SoftLimit::percent(80).expect("valid");
    assert!(!s.warns(10, 3));
    assert!(s.warns(10, 2));
    assert!(SoftLimit::percent(100).expect("valid").warns(7, 0));
    assert!(!SoftLimit::percent(100).expect("valid").warns(7, 1));
}

#[test]
fn a_ban_holds_until_its_last_millisecond() {
    let ban = Ban::new(10).expect("valid");
    let until = Some(ban.until(100));
    assert_eq!(ban_left(until, 100), Some(10));
    assert_eq!(ban_left(until, 109), Some(1));
    assert_eq!(ban_left(until, 110), None);
    assert_eq!(ban_left(None, 0), None);
    assert_eq!(Ban::new(u64::MAX).expect_err("too long").field, "ban");
}

fn banning_bucket() -> bucket::Params {
    let policy = Policy {
        soft_limit: None,
        ban: Some(Ban::new(1_000).expect("valid")),
    };
    bucket::Params::new(1, 1, 100, policy).expect("valid")
}

#[test]
fn a_dry_run_is_answered_like_the_request_and_bans_nobody() {
    let b = banning_bucket();
    let mut state = bucket::State::default();
    let one = Amount::exactly(1).expect("amount");
    decide(&b, &mut state, 0, Op::request(one)).expect("ok");
    let before = state;
    let dry = decide(&b, &mut state, 10, Op::dry_run(one)).expect("ok");
    assert_eq!(state, before, "nothing recorded");
    let real = decide(&b, &mut state, 10, Op::request(one)).expect("ok");
    assert_eq!(dry, real, "the dry run said what the request got");
    assert!(real.banned);
    assert_eq!(state.banned_until, Some(1_010));
    // During the ban a dry run is rejected too and changes nothing.
    let before = state;
    let dry = decide(&b, &mut state, 500, Op::dry_run(one)).expect("ok");
    assert_eq!(
        (dry.granted, dry.banned, dry.retry_after_ms),
        (0, true, Some(510))
    );
    assert_eq!(state, before);
}

#[test]
fn charges_and_refunds_apply_during_a_ban_which_then_still_ends_on_time() {
    let b = banning_bucket();
    let mut state = bucket::State::default();
    let one = Amount::exactly(1).expect("amount");
    decide(&b, &mut state, 0, Op::request(one)).expect("ok");
    assert!(
        decide(&b, &mut state, 0, Op::request(one))
            .expect("ok")
            .banned
    );
    let r = decide(&b, &mut state, 10, Op::Charge(20)).expect("ok");
    assert_eq!((r.granted, r.banned), (20, true));
    // The debt outlasts the ban: come back when a token is there.
    assert_eq!(r.retry_after_ms, Some(2_090));
    let r = decide(&b, &mut state, 10, Op::Refund(20)).expect("ok");
    assert_eq!((r.banned, r.retry_after_ms), (true, Some(990)));
    let r = decide(&b, &mut state, 1_000, Op::request(one)).expect("ok");
    assert_eq!((r.granted, r.banned), (1, false));
    assert_eq!(state.banned_until, None);
}

#[test]
fn idle_state_is_forgotten_exactly_when_it_stops_mattering() {
    let b = banning_bucket();
    let mut state = bucket::State::default();
    assert_eq!(state.forget_at(&b), 0);
    let one = Amount::exactly(1).expect("amount");
    decide(&b, &mut state, 0, Op::request(one)).expect("ok");
    assert_eq!(state.forget_at(&b), 100);
    decide(&b, &mut state, 50, Op::request(one)).expect("ok");
    assert_eq!(state.forget_at(&b), 1_050, "the ban outlasts the bucket");
    assert!(!state.is_idle(&b, 1_049));
    assert!(state.is_idle(&b, 1_050));
}

#[test]
fn replies_in_spec_order_with_never_as_null() {
    let r = Reply {
        granted: 1,
        limit: 5,
        remaining: 4,
        reset_after_ms: 100,
        retry_after_ms: None,
        warning: false,
        banned: false,
        delay_ms: None,
    };
    assert_eq!(
        serde_json::to_string(&r).expect("encodes"),
        r#"{"granted":1,"limit":5,"remaining":4,"reset_after_ms":100,"retry_after_ms":null,"warning":false,"banned":false}"#
    );
    let q = queue::Params::new(10, 1_000, 5, Policy::default()).expect("valid");
    let mut state = queue::State::default();
    let one = Amount::exactly(1).expect("amount");
    decide(&q, &mut state, 0, Op::request(one)).expect("ok");
    let r = decide(&q, &mut state, 0, Op::request(one)).expect("ok");
    assert_eq!(
        serde_json::to_string(&r).expect("encodes"),
        r#"{"granted":1,"limit":5,"remaining":3,"reset_after_ms":200,"retry_after_ms":0,"warning":false,"banned":false,"delay_ms":100}"#
    );
}

#[test]
fn a_clock_that_steps_back_or_reaches_the_end_of_time_never_panics_nor_grants_more() {
    use crate::window::{self, Algorithm};
    let p = Policy {
        soft_limit: Some(SoftLimit::percent(50).expect("valid")),
        ban: Some(Ban::new(MAX_SPAN).expect("valid")),
    };
    let b = bucket::Params::new(3, 3, 1_000, p).expect("valid");
    let w = window::Params::new(Algorithm::SlidingCounter, 3, 1, p).expect("valid");
    let f = window::Params::new(Algorithm::Fixed, 3, 1_000, p).expect("valid");
    let q = queue::Params::new(3, 1_000, 3, p).expect("valid");
    let times = [5_000, 0, u64::MAX, u64::MAX - 1, 1 << 51, 4_999, u64::MAX];
    let ops = [
        Op::request(Amount::new(2, 1).expect("amount")),
        Op::Charge(2),
        Op::dry_run(Amount::exactly(1).expect("amount")),
        Op::Refund(1),
    ];
    fn run<L: Level>(kind: &L, times: &[Millis], ops: &[Op]) {
        let mut state = State::default();
        for &t in times {
            for &op in ops {
                let _ = decide(kind, &mut state, t, op);
                let _ = state.forget_at(kind);
            }
        }
    }
    run(&b, &times, &ops);
    run(&w, &times, &ops);
    run(&f, &times, &ops);
    run(&q, &times, &ops);
    // A step back never grants more than the state allows at its time.
    let mut state = bucket::State::default();
    let three = Amount::exactly(3).expect("amount");
    decide(&b, &mut state, 10_000, Op::request(three)).expect("ok");
    let one = Op::request(Amount::exactly(1).expect("amount"));
    assert_eq!(decide(&b, &mut state, 9_000, one).expect("ok").granted, 0);
    let mut state = window::State::default();
    decide(&f, &mut state, 10_000, Op::request(three)).expect("ok");
    assert_eq!(decide(&f, &mut state, 9_000, one).expect("ok").granted, 0);
}

#[test]
fn states_are_compact() {
    use std::mem::size_of;
    // A TAT or F is two integers; a window one index and two counts; each
    // with an optional ban end.
    assert_eq!(size_of::<bucket::State>(), 40);
    assert_eq!(size_of::<queue::State>(), 40);
    assert_eq!(size_of::<window::State>(), 48);
}
