//! SPEC §9 and §10 for queues, each rule at its exact boundary, and the
//! cookbook example of issue 11.

use super::*;
use crate::meter::harness::Harness;
use crate::meter::{Ban, SoftLimit};
use crate::meter::{Op, decide};
use crate::request::Amount;

type Queue = Harness<Params>;

impl Queue {
    fn new(rate: u64, period: Millis, size: u64, policy: Policy) -> Self {
        Self::of(Params::new(rate, period, size, policy).expect("valid"))
    }
}

#[test]
fn cookbook_six_at_once_into_a_queue_of_five() {
    let mut q = Queue::new(10, 1_000, 5, Policy::default());
    for (i, delay) in [0, 100, 200, 300, 400].into_iter().enumerate() {
        let r = q.ask(7_000, 1, 1);
        assert_eq!((r.granted, r.delay_ms), (1, Some(delay)), "request {i}");
        assert_eq!(r.remaining, 4 - i as u64);
    }
    let r = q.ask(7_000, 1, 1);
    assert_eq!((r.granted, r.delay_ms, r.remaining), (0, Some(0), 0));
    assert_eq!((r.reset_after_ms, r.retry_after_ms), (500, Some(100)));
    // Exactly full until one unit has left.
    assert_eq!(q.ask(7_099, 1, 1).granted, 0);
    let r = q.ask(7_100, 1, 1);
    assert_eq!((r.granted, r.delay_ms), (1, Some(400)));
    assert!(q.state.is_idle(&q.params, 7_600));
    assert!(!q.state.is_idle(&q.params, 7_599));
}

#[test]
fn delays_are_exact_and_rounded_up() {
    // Three a second: 333⅓ ms apart.
    let mut q = Queue::new(3, 1_000, 10, Policy::default());
    let delays: Vec<_> = (0..4).map(|_| q.ask(0, 1, 1).delay_ms).collect();
    assert_eq!(delays, [Some(0), Some(334), Some(667), Some(1_000)]);
    // Multi-unit requests wait for the units ahead of them only.
    let r = q.ask(0, 3, 1);
    assert_eq!((r.granted, r.delay_ms, r.remaining), (3, Some(1_334), 3));
    let r = q.ask(0, 5, 4);
    assert_eq!(r.granted, 0, "only 3 fit");
    assert_eq!(r.retry_after_ms, Some(334));
    let r = q.op(0, Op::dry_run(Amount::new(5, 3).expect("amount")));
    assert_eq!((r.granted, r.remaining, r.delay_ms), (3, 0, Some(2_334)));
}

#[test]
fn charge_moves_f_and_refund_is_refused() {
    let mut q = Queue::new(1, 10, 2, Policy::default());
    let r = q.op(0, Op::Charge(5));
    assert_eq!((r.granted, r.remaining, r.reset_after_ms), (5, 0, 50));
    assert_eq!(r.retry_after_ms, Some(40));
    let before = q.state;
    assert!(decide(&q.params, &mut q.state, 0, Op::Refund(1)).is_err());
    assert!(decide(&q.params, &mut q.state, 0, Op::Charge(0)).is_err());
    assert_eq!(q.state, before);
    let r = q.ask(40, 1, 1);
    assert_eq!((r.granted, r.delay_ms), (1, Some(10)));
}

#[test]
fn soft_limit_and_ban_on_a_queue() {
    let policy = Policy {
        soft_limit: Some(SoftLimit::percent(60).expect("valid")),
        ban: Some(Ban::new(1_000).expect("valid")),
    };
    let mut q = Queue::new(10, 1_000, 5, policy);
    assert!(!q.ask(0, 2, 2).warning, "backlog 2 of 5");
    assert!(q.ask(0, 1, 1).warning, "backlog 3 of 5");
    // 50 ms later the backlog is 2.5; with one more 3.5, rounded up to 4.
    assert!(
        q.op(50, Op::dry_run(Amount::exactly(1).expect("a")))
            .warning
    );
    q.ask(50, 2, 2);
    let r = q.ask(50, 1, 1);
    assert_eq!(
        (r.granted, r.banned, r.retry_after_ms),
        (0, true, Some(1_000))
    );
    assert!(q.ask(1_049, 1, 1).banned);
    let r = q.ask(1_050, 1, 1);
    assert_eq!((r.granted, r.banned, r.delay_ms), (1, false, Some(0)));
}

#[test]
fn bad_parameters_name_their_field() {
    let p = Policy::default();
    let field = |r: Result<Params, FieldError>| r.expect_err("invalid").field;
    assert_eq!(field(Params::new(0, 1_000, 5, p)), "rate");
    assert_eq!(field(Params::new(1, 0, 5, p)), "period");
    assert_eq!(field(Params::new(1, 1_000, 0, p)), "size");
    assert_eq!(field(Params::new(1, 1_000, crate::MAX_COUNT, p)), "size");
    let most = meter::MAX_SPAN / 1_000;
    assert!(Params::new(1, 1_000, most, p).is_ok());
    assert_eq!(field(Params::new(1, 1_000, most + 1, p)), "size");
    assert!(Params::new(1_000_000, 1_000, crate::MAX_COUNT, p).is_ok());
}
