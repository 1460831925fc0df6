//! SPEC §7 and §10 for buckets, each rule at its exact boundary, and the
//! cookbook examples of issue 11.

use super::*;
use crate::MAX_COUNT;
use crate::meter::harness::Harness;
use crate::meter::{Ban, SoftLimit};
use crate::meter::{Level, Op, decide};
use crate::request::Amount;

const SECOND: Millis = 1_000;
const MINUTE: Millis = 60_000;

type Bucket = Harness<Params>;

impl Bucket {
    fn new(burst: u64, count: u64, period: Millis) -> Self {
        Self::with(burst, count, period, Policy::default())
    }

    fn with(burst: u64, count: u64, period: Millis, policy: Policy) -> Self {
        Self::of(Params::new(burst, count, period, policy).expect("valid"))
    }
}

#[test]
fn cookbook_weighted_credit_pool() {
    // CRED_MAX 100, one credit a minute.
    let mut b = Bucket::new(100, 1, MINUTE);
    for left in [80, 60, 40] {
        let r = b.ask(10 * MINUTE, 20, 20);
        assert_eq!((r.granted, r.remaining), (20, left));
    }
    let r = b.ask(20 * MINUTE, 2, 2);
    assert_eq!((r.granted, r.remaining, r.limit), (2, 48, 100));
    // 52 credits missing, one a minute.
    assert_eq!(r.reset_after_ms, 52 * MINUTE);
    assert_eq!(r.retry_after_ms, Some(0));
}

#[test]
fn cookbook_new_registrations_per_ip() {
    let mut b = Bucket::new(20, 20, SECOND);
    for i in 0..20 {
        let r = b.one(5_000);
        assert_eq!((r.granted, r.remaining), (1, 19 - i));
    }
    let r = b.one(5_000);
    assert_eq!(r.granted, 0);
    assert_eq!(r.retry_after_ms, Some(50));
    assert_eq!(r.reset_after_ms, 1_000);
    assert_eq!(b.one(5_049).granted, 0, "one millisecond early");
    let r = b.one(5_050);
    assert_eq!((r.granted, r.remaining), (1, 0));
}

#[test]
fn cookbook_an_override_that_doubles_the_rate_keeps_the_burst() {
    let mut b = Bucket::new(20, 40, SECOND);
    assert_eq!(b.ask(0, 25, 1).granted, 20, "the burst is still 20");
    let r = b.one(0);
    assert_eq!(r.retry_after_ms, Some(25), "a token every 25 ms");
    assert_eq!(b.one(24).granted, 0);
    assert_eq!(b.one(25).granted, 1);
}

#[test]
fn count_3_per_second_is_exact_to_the_millisecond_forever() {
    // Empty the bucket, then take each token the millisecond it returns:
    // token k (k ≥ 1) returns at ceil(k × 1000 / 3) ms.
    let mut b = Bucket::new(3, 3, SECOND);
    let start = 1_700_000_000_000;
    assert_eq!(b.ask(start, 3, 3).granted, 3);
    for k in 1..=30_000u64 {
        let at = start + (k * 1_000).div_ceil(3);
        let early = b.one(at - 1);
        assert_eq!(early.granted, 0, "token {k} one ms early");
        assert_eq!(early.retry_after_ms, Some(1), "token {k}");
        assert_eq!(b.one(at).granted, 1, "token {k} on time");
    }
    // 30 000 tokens in exactly 10 000 s: the TAT has not drifted.
    assert_eq!(
        b.state.level,
        Some(Tat {
            ms: start + 10_000_000 + 1_000,
            frac: 0
        })
    );
}

#[test]
fn partial_grants_take_what_is_there_and_rejections_change_nothing() {
    let mut b = Bucket::new(10, 1, SECOND);
    assert_eq!(b.ask(0, 7, 1).granted, 7);
    let r = b.ask(0, 5, 2);
    assert_eq!((r.granted, r.remaining), (3, 0));
    let before = b.state;
    let r = b.ask(500, 2, 2);
    assert_eq!(r.granted, 0);
    assert_eq!(r.retry_after_ms, Some(1_500), "two tokens at 2000");
    assert_eq!(b.state, before, "a rejection changes nothing");
    // min_copies above the burst never fits.
    let r = b.ask(100_000, 11, 11);
    assert_eq!((r.granted, r.retry_after_ms), (0, None));
}

#[test]
fn reset_and_retry_round_up() {
    let mut b = Bucket::new(2, 3, SECOND);
    let r = b.one(0);
    assert_eq!(r.reset_after_ms, 334, "333⅓ ms until full");
    let r = b.one(0);
    assert_eq!((r.remaining, r.reset_after_ms), (0, 667));
    assert_eq!(r.retry_after_ms, Some(334));
    assert_eq!(b.one(333).granted, 0);
    let r = b.one(334);
    assert_eq!(r.granted, 1);
    // TAT = 666⅔ + 333⅓ = 1000: exactly full at 1000.
    assert_eq!(r.reset_after_ms, 666);
    assert_eq!(b.params.forget_at(&b.state.level.expect("state")), 1_000);
    assert!(b.state.is_idle(&b.params, 1_000));
    assert!(!b.state.is_idle(&b.params, 999));
}

#[test]
fn charge_goes_into_debt_and_later_requests_pay_it() {
    // LLM tokens: 1000 tokens a minute, burst 1000.
    let mut b = Bucket::new(1_000, 1_000, MINUTE);
    let dry = b.op(0, Op::dry_run(Amount::exactly(800).expect("amount")));
    assert_eq!((dry.granted, dry.remaining), (800, 200));
    assert_eq!(b.state, State::default(), "a dry run records nothing");
    // The call used 1500 tokens.
    let r = b.op(0, Op::Charge(1_500));
    assert_eq!((r.granted, r.remaining), (1_500, 0));
    assert_eq!(r.reset_after_ms, 90_000, "1500 tokens at 60 ms each");
    assert_eq!(r.retry_after_ms, Some(30_060), "500 of debt and one token");
    assert_eq!(b.one(30_059).granted, 0);
    let r = b.one(30_060);
    assert_eq!((r.granted, r.remaining), (1, 0));
}

#[test]
fn refund_gives_tokens_back_but_never_beyond_full() {
    let mut b = Bucket::new(10, 1, SECOND);
    b.ask(0, 10, 10);
    let r = b.op(0, Op::Refund(4));
    assert_eq!((r.granted, r.remaining), (4, 4));
    let r = b.op(0, Op::Refund(100));
    assert_eq!((r.granted, r.remaining, r.reset_after_ms), (100, 10, 0));
    assert_eq!(b.state, State::default(), "a full bucket is not kept");
    // Refund pays debt back first.
    b.op(0, Op::Charge(15));
    let r = b.op(0, Op::Refund(5));
    assert_eq!((r.remaining, r.reset_after_ms), (0, 10_000));
}

#[test]
fn soft_limit_warns_at_its_share_of_the_burst() {
    let policy = Policy {
        soft_limit: Some(SoftLimit::percent(80).expect("valid")),
        ban: None,
    };
    let mut b = Bucket::with(10, 1, SECOND, policy);
    assert!(!b.ask(0, 7, 7).warning, "7 of 10 used");
    assert!(b.one(0).warning, "8 of 10 used");
    // 999 ms later 0.999 tokens are back: 8.001 used, 9 rounded up once a
    // dry run takes one more.
    let one = Amount::exactly(1).expect("amount");
    let r = b.op(999, Op::dry_run(one));
    assert_eq!((r.remaining, r.warning), (1, true));
    let r = b.op(2_000, Op::dry_run(one));
    assert_eq!((r.remaining, r.warning), (3, false), "7 used");
}

#[test]
fn a_ban_starts_at_the_rejection_and_ends_after_its_last_millisecond() {
    let policy = Policy {
        soft_limit: None,
        ban: Some(Ban::new(10_000).expect("valid")),
    };
    let mut b = Bucket::with(2, 1, SECOND, policy);
    b.ask(0, 2, 2);
    let r = b.one(100);
    assert_eq!((r.granted, r.banned), (0, true));
    assert_eq!(r.retry_after_ms, Some(10_000));
    let r = b.one(10_099);
    assert_eq!((r.granted, r.banned), (0, true));
    assert_eq!(r.retry_after_ms, Some(1), "the ban's last millisecond");
    let r = b.one(10_100);
    assert_eq!((r.granted, r.banned, r.remaining), (1, false, 1));
    assert_eq!(b.state.banned_until, None, "an ended ban is not kept");
}

#[test]
fn bad_parameters_name_their_field() {
    let p = Policy::default();
    let field = |r: Result<Params, FieldError>| r.expect_err("invalid").field;
    assert_eq!(field(Params::new(0, 1, 1, p)), "burst");
    assert_eq!(field(Params::new(1, 0, 1, p)), "count");
    assert_eq!(field(Params::new(1, 1, 0, p)), "period");
    assert_eq!(field(Params::new(MAX_COUNT + 1, 1, 1, p)), "burst");
    assert_eq!(field(Params::new(1, MAX_COUNT + 1, 1, p)), "count");
    assert_eq!(field(Params::new(1, 1, meter::MAX_SPAN + 1, p)), "period");
    assert_eq!(field(Params::new(MAX_COUNT, 1, 2, p)), "burst");
    assert!(Params::new(1, MAX_COUNT, meter::MAX_SPAN, p).is_ok());
    assert!(Params::new(MAX_COUNT, MAX_COUNT, 1, p).is_ok());
    // One a millisecond: a full bucket may take at most 2^50 ms to refill.
    assert!(Params::new(meter::MAX_SPAN, 1_000, 1_000, p).is_ok());
    assert_eq!(
        field(Params::new(meter::MAX_SPAN + 1, 1_000, 1_000, p)),
        "burst"
    );
    assert_eq!(
        Params::new(1, 1, 0, p).expect_err("invalid").to_string(),
        "period must be positive (at least 1ms)"
    );
}

#[test]
fn bad_operations_are_client_errors_that_change_nothing() {
    // A thousand a millisecond: 2^53 − 1 ticks of 1/1000 ms bind.
    let mut b = Bucket::new(10, 1_000, 1);
    b.ask(0, 3, 3);
    let before = b.state;
    for op in [Op::Charge(0), Op::Refund(0), Op::Charge(MAX_COUNT + 1)] {
        let e = decide(&b.params, &mut b.state, 0, op).expect_err("client error");
        assert!(e.to_string().starts_with("copies "), "{e}");
        assert_eq!(b.state, before);
    }
    // A charge whose debt could not be kept exactly.
    let e = decide(&b.params, &mut b.state, 0, Op::Charge(MAX_COUNT)).expect_err("too much");
    assert!(e.to_string().starts_with("copies "), "{e}");
    assert_eq!(b.state, before);
    // The largest debt that fits is kept.
    let r = b.op(0, Op::Charge(MAX_COUNT - 3));
    let wait = (MAX_COUNT - 9).div_ceil(1_000);
    assert_eq!((r.remaining, r.retry_after_ms), (0, Some(wait)));
}
