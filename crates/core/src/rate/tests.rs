//! One test per rule of SPEC §2, each at its exact boundary.

use super::*;
use crate::limits::{Enforcement, RateLimits, Tier};
use crate::request::Amount;

fn tier(limit: u64, window: u64, active: Option<u64>, cooldown: u64, skippable: bool) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable,
    }
}

/// One domain of a resource, with the resource's global log.
struct Pair {
    tiers: Vec<Tier>,
    hard: Option<u64>,
    global_limit: Option<u64>,
    state: RateState,
    global: HitLog,
}

impl Pair {
    fn new(tiers: Vec<Tier>) -> Self {
        Self {
            tiers,
            hard: None,
            global_limit: None,
            state: RateState::default(),
            global: HitLog::default(),
        }
    }

    fn ask(&mut self, now: u64, copies: u64, min: u64) -> RateReply {
        let limits = RateLimits {
            hard_limit: self.hard,
            global_limit: self.global_limit,
            tiers: &self.tiers,
        };
        decide(
            limits,
            &mut self.state,
            &mut self.global,
            now,
            Amount::new(copies, min).expect("valid amount"),
            Enforcement::Enforce,
        )
        .expect("within the bound")
    }

    fn hit(&mut self, now: u64) -> RateReply {
        self.ask(now, 1, 1)
    }

    fn granted(&mut self, now: u64) -> bool {
        self.hit(now).granted == 1
    }
}

// Rule 1: windows are closed on the left.

#[test]
fn rule1_a_hit_counts_at_t_plus_window_and_falls_out_one_ms_later() {
    let mut p = Pair::new(vec![tier(1, 1_000, None, 0, false)]);
    assert!(p.granted(500));
    assert!(
        !p.granted(1_500),
        "the hit at 500 is still in the window at 1500"
    );
    assert!(p.granted(1_501), "the hit at 500 fell out at 1501");
}

#[test]
fn rule1_hard_limit_counts_the_last_second_closed_on_the_left() {
    let mut p = Pair::new(vec![tier(100, 10, None, 0, false)]);
    p.hard = Some(1);
    assert!(p.granted(0));
    let r = p.hit(1_000);
    assert_eq!(r.granted, 0);
    assert!(r.hard_limited);
    assert_eq!(r.domain_hits_last_second, 1);
    assert!(p.granted(1_001));
}

#[test]
fn rule1_global_limit_counts_the_last_second_closed_on_the_left() {
    let tiers = vec![tier(100, 10, None, 0, false)];
    let mut global = HitLog::default();
    let mut a = RateState::default();
    let mut b = RateState::default();
    let limits = RateLimits {
        hard_limit: None,
        global_limit: Some(2),
        tiers: &tiers,
    };
    let one = Amount::exactly(1).expect("valid");
    let go = |s: &mut RateState, g: &mut HitLog, now| {
        decide(limits, s, g, now, one, Enforcement::Enforce).expect("within the bound")
    };
    assert_eq!(go(&mut a, &mut global, 0).granted, 1);
    assert_eq!(go(&mut b, &mut global, 500).granted, 1);
    let r = go(&mut b, &mut global, 1_000);
    assert_eq!(
        (r.granted, r.global_limited, r.global_hits_last_second),
        (0, true, 2)
    );
    let r = go(&mut a, &mut global, 1_001);
    assert_eq!((r.granted, r.global_hits_last_second), (1, 2));
}

// Rule 2: tier states from the latest entry time.

#[test]
fn rule2_active_until_entry_plus_active_then_cooldown_then_inactive() {
    let tiers = vec![tier(10, 100, Some(300), 200, false)];
    let mut p = Pair::new(tiers.clone());
    assert!(p.granted(1_000)); // enters tier 1 at e = 1000
    assert_eq!(p.state.phase(&tiers, 1, 1_299), Phase::Active);
    assert_eq!(
        p.state.phase(&tiers, 1, 1_300),
        Phase::Cooldown,
        "cooldown at e + Ta"
    );
    assert_eq!(p.state.phase(&tiers, 1, 1_499), Phase::Cooldown);
    assert_eq!(
        p.state.phase(&tiers, 1, 1_500),
        Phase::Inactive,
        "inactive at e + Ta + Tc"
    );
    assert!(p.granted(1_299));
    assert!(!p.granted(1_300), "no hit while tier 1 is in cooldown");
    assert!(!p.granted(1_499));
    let r = p.hit(1_500);
    assert_eq!(
        (r.granted, r.tier, r.burst),
        (1, 1, true),
        "re-entered at e + Ta + Tc"
    );
}

#[test]
fn rule2_entering_starts_an_empty_window_and_inactivity_forgets_hits() {
    // Window longer than needed to show that hits are forgotten, not aged out.
    let mut p = Pair::new(vec![tier(2, 100, Some(100), 0, false)]);
    assert!(p.granted(0));
    assert!(p.granted(50));
    assert!(!p.granted(99), "window full");
    // At 100 the tier ended (no cooldown): inactive, its hits forgotten.
    let r = p.hit(100);
    assert_eq!((r.granted, r.tier, r.burst, r.tier_hits), (1, 1, true, 1));
}

#[test]
fn rule2_a_never_ending_tier_stays_active() {
    let tiers = vec![tier(1, 10, None, 5, false)];
    let mut p = Pair::new(tiers.clone());
    assert!(p.granted(0));
    assert_eq!(p.state.phase(&tiers, 1, u64::MAX / 2), Phase::Active);
}

// Rule 3: the current tier.

#[test]
fn rule3_no_active_tier_means_fake_tier_zero() {
    let mut p = Pair::new(vec![tier(0, 10, None, 0, false)]);
    let r = p.hit(0);
    assert_eq!(
        (r.granted, r.tier, r.tier_limit, r.tier_hits, r.burst),
        (0, 0, 0, 0, false)
    );
}

#[test]
fn rule3_current_is_the_highest_active_tier() {
    let tiers = vec![
        tier(1, 1_000, None, 0, false),
        tier(1, 1_000, Some(500), 0, false),
    ];
    let mut p = Pair::new(tiers.clone());
    assert_eq!(p.hit(0).tier, 1);
    assert_eq!(p.hit(1).tier, 2);
    assert_eq!(p.state.current_tier(&tiers, 499), 2);
    assert_eq!(
        p.state.current_tier(&tiers, 501),
        1,
        "fallback when tier 2 ends"
    );
}

// Rule 4: granting and bursting.

#[test]
fn rule4_granted_in_current_tier_while_window_holds_fewer_than_limit() {
    let mut p = Pair::new(vec![tier(3, 1_000, None, 0, false)]);
    for t in 0..3 {
        let r = p.hit(t);
        assert_eq!((r.granted, r.tier, r.tier_hits), (1, 1, t + 1));
    }
    let r = p.hit(3);
    assert_eq!((r.granted, r.tier, r.tier_hits, r.tier_limit), (0, 1, 3, 3));
}

#[test]
fn rule4_tier_zero_always_bursts_into_tier_one() {
    let mut p = Pair::new(vec![tier(1, 1_000, None, 0, false)]);
    let r = p.hit(0);
    assert_eq!((r.granted, r.tier, r.burst), (1, 1, true));
    let r = p.hit(2_000);
    assert_eq!(
        (r.granted, r.tier, r.burst),
        (1, 1, false),
        "already in tier 1"
    );
}

#[test]
fn rule4_no_tier_above_means_rejection() {
    let mut p = Pair::new(vec![tier(1, 1_000, None, 0, false)]);
    assert!(p.granted(0));
    let r = p.hit(1);
    assert_eq!((r.granted, r.burst, r.tier), (0, false, 1));
}

#[test]
fn rule4_burst_into_the_next_tier_shadows_the_lower_one() {
    let tiers = vec![
        tier(2, 10_000, None, 0, false),
        tier(5, 1_000, Some(2_000), 3_000, false),
    ];
    let mut p = Pair::new(tiers);
    assert!(p.granted(0));
    assert!(p.granted(10));
    let r = p.hit(20);
    assert_eq!(
        (r.granted, r.tier, r.burst, r.tier_hits, r.tier_limit),
        (1, 2, true, 1, 5)
    );
    let r = p.hit(900);
    assert_eq!((r.granted, r.tier, r.burst, r.tier_hits), (1, 2, false, 2));
    // Tier 2's hit at 20 left its 1 s window at 1021; tier 1 stays full
    // but shadowed, so hits still go to tier 2.
    let r = p.hit(1_500);
    assert_eq!((r.granted, r.tier, r.burst, r.tier_hits), (1, 2, false, 2));
    assert_eq!(p.state.tier_hits(1), 2, "the shadowed tier kept its hits");
}

#[test]
fn rule4_fallback_returns_to_the_lower_tier_with_its_remaining_hits() {
    // Tier 1: 2 per 10 s. Tier 2: 5 per second for 1 s, then 3 s cooldown.
    let tiers = vec![
        tier(2, 10_000, None, 0, false),
        tier(5, 1_000, Some(1_000), 3_000, false),
    ];
    let mut p = Pair::new(tiers);
    assert!(p.granted(0));
    assert!(p.granted(100));
    assert_eq!(p.hit(200).tier, 2);
    // At 1200 tier 2 is in cooldown; tier 1 is current again, still full
    // (its hits at 0 and 100 are inside its 10 s window).
    let r = p.hit(1_200);
    assert_eq!((r.granted, r.tier, r.tier_hits, r.burst), (0, 1, 2, false));
    // Its hit at 0 falls out at 10001.
    let r = p.hit(10_001);
    assert_eq!((r.granted, r.tier, r.tier_hits), (1, 1, 2));
}

#[test]
fn rule4_a_tier_in_cooldown_blocks_the_burst_unless_skippable() {
    let cooling = |skippable| {
        vec![
            tier(1, 10_000, None, 0, false),
            tier(1, 1_000, Some(1_000), 60_000, skippable),
            tier(10, 1_000, Some(1_000), 0, false),
        ]
    };
    // Not skippable: the burst fails at tier 2.
    let mut p = Pair::new(cooling(false));
    assert_eq!(p.hit(0).tier, 1);
    assert_eq!(p.hit(1).tier, 2);
    let r = p.hit(2); // tier 2 full: bursts into tier 3
    assert_eq!((r.granted, r.tier), (1, 3));
    // At 1002 tiers 2 and 3 have ended; 2 cools down until 61001.
    let r = p.hit(1_002);
    assert_eq!(
        (r.granted, r.tier),
        (0, 1),
        "tier 2 in cooldown and not skippable"
    );
    // Skippable: the search goes past tier 2 into tier 3.
    let mut p = Pair::new(cooling(true));
    p.hit(0);
    p.hit(1);
    p.hit(2);
    let r = p.hit(1_002);
    assert_eq!(
        (r.granted, r.tier, r.burst),
        (1, 3, true),
        "cooling tier 2 skipped"
    );
}

#[test]
fn rule4_a_tier_with_limit_zero_is_skipped_only_if_skippable() {
    let mut p = Pair::new(vec![
        tier(1, 1_000, None, 0, false),
        tier(0, 1_000, None, 0, false),
        tier(5, 1_000, None, 0, false),
    ]);
    p.hit(0);
    assert_eq!(p.hit(1).granted, 0);
    let mut p = Pair::new(vec![
        tier(1, 1_000, None, 0, false),
        tier(0, 1_000, None, 0, true),
        tier(5, 1_000, None, 0, false),
    ]);
    p.hit(0);
    let r = p.hit(1);
    assert_eq!((r.granted, r.tier), (1, 3));
}

// Rule 5: multi-hit requests, H and G, rejection changes nothing.

#[test]
fn rule5_grants_the_largest_n_within_min_and_copies() {
    let mut p = Pair::new(vec![tier(5, 1_000, None, 0, false)]);
    assert_eq!(p.ask(0, 3, 1).granted, 3);
    assert_eq!(p.ask(1, 4, 1).granted, 2, "only 2 left in the window");
    assert_eq!(p.ask(2, 4, 1).granted, 0);
}

#[test]
fn rule5_a_rejected_request_changes_nothing() {
    let tiers = vec![
        tier(2, 1_000, None, 0, false),
        tier(3, 1_000, Some(5_000), 5_000, false),
    ];
    let mut p = Pair::new(tiers);
    p.hard = Some(10);
    assert_eq!(p.ask(0, 1, 1).granted, 1);
    let before = (p.state.clone(), p.global.clone());
    // 5 more would fit (1 in tier 1, 3 in tier 2 = 4 < 5): rejected.
    let r = p.ask(1, 5, 5);
    assert_eq!(
        (
            r.granted,
            r.burst,
            r.tier,
            r.tier_hits,
            r.domain_hits_last_second
        ),
        (0, false, 1, 1, 1)
    );
    let mut expected = before.0;
    expected.advance(&p.tiers, 1);
    assert_eq!(p.state, expected, "no burst, no entry, no hit recorded");
    assert_eq!(p.global, before.1);
    // A request that fits afterwards is unaffected.
    assert_eq!(p.ask(2, 4, 4).granted, 4);
}

#[test]
fn rule5_a_request_may_pass_through_several_tiers() {
    let tiers = vec![
        tier(2, 1_000, None, 0, false),
        tier(3, 1_000, Some(10_000), 0, false),
        tier(4, 1_000, Some(10_000), 0, false),
    ];
    let mut p = Pair::new(tiers);
    let r = p.ask(0, 9, 9);
    assert_eq!((r.granted, r.tier, r.burst, r.tier_hits), (9, 3, true, 4));
    assert_eq!((p.state.tier_hits(1), p.state.tier_hits(2)), (2, 3));
    let r = p.ask(0, 1, 1);
    assert_eq!(r.granted, 0, "all three tiers full");
}

#[test]
fn rule5_filling_a_tier_exactly_does_not_burst() {
    let mut p = Pair::new(vec![
        tier(3, 1_000, None, 0, false),
        tier(3, 1_000, Some(1_000), 0, false),
    ]);
    let r = p.ask(0, 3, 3);
    assert_eq!((r.tier, r.burst), (1, true), "tier 0 to 1 is a burst");
    let r = p.ask(1_001, 3, 3);
    assert_eq!((r.granted, r.tier, r.burst), (3, 1, false));
}

#[test]
fn rule5_hard_and_global_limits_cap_n() {
    let mut p = Pair::new(vec![tier(100, 1_000, None, 0, false)]);
    p.hard = Some(5);
    p.global_limit = Some(7);
    let r = p.ask(0, 10, 1);
    assert_eq!(
        (r.granted, r.hard_limited, r.global_limited),
        (5, true, false),
        "H binds, G does not"
    );
    p.hard = Some(50);
    let r = p.ask(0, 10, 1);
    assert_eq!(
        (r.granted, r.hard_limited, r.global_limited),
        (2, false, true)
    );
    let r = p.ask(0, 10, 1);
    assert_eq!(
        (r.granted, r.global_limited, r.global_hits_last_second),
        (0, true, 7)
    );
}

#[test]
fn rule5_min_copies_above_hard_limit_always_fails() {
    let mut p = Pair::new(vec![tier(100, 1_000, None, 0, false)]);
    p.hard = Some(3);
    let r = p.ask(0, 4, 4);
    assert_eq!((r.granted, r.hard_limited), (0, true));
    assert_eq!(p.ask(0, 3, 3).granted, 3);
}

#[test]
fn rule5_zero_and_inverted_amounts_are_client_errors() {
    assert!(Amount::new(0, 0).is_err());
    assert!(Amount::new(3, 0).is_err());
    assert!(Amount::new(3, 4).is_err());
}

#[test]
fn rule5_no_tiers_means_inaccessible() {
    let mut p = Pair::new(vec![]);
    let r = p.hit(0);
    assert_eq!((r.granted, r.tier), (0, 0));
}

// Rule 6: the reply.

#[test]
fn rule6_reply_carries_the_full_context_after_the_decision() {
    let mut p = Pair::new(vec![
        tier(2, 1_000, None, 0, false),
        tier(4, 500, Some(1_000), 0, false),
    ]);
    p.hard = Some(10);
    p.global_limit = Some(20);
    p.ask(0, 2, 2);
    let r = p.ask(100, 2, 2);
    assert_eq!(
        r,
        RateReply {
            granted: 2,
            hard_limit: Some(10),
            global_limit: Some(20),
            tier_limit: 4,
            domain_hits_last_second: 4,
            global_hits_last_second: 4,
            tier_hits: 2,
            tier: 2,
            burst: true,
            hard_limited: false,
            global_limited: false,
            ignored: false,
            context: TierContext {
                limit: 4,
                remaining: 2,
                // Whole at 1100: tier 2 inactive again (entered at 100,
                // active 1000 ms), the last second's hits (at 100) at the
                // end of their second, tier 1's (at 0) long before.
                reset_after_ms: Some(1_000),
                retry_after_ms: Some(0),
                warning: false,
                banned: false,
            },
        }
    );
}

#[test]
fn ignore_grants_everything_and_records_what_fits() {
    let tiers = vec![tier(2, 1_000, None, 0, false)];
    let mut state = RateState::default();
    let mut global = HitLog::default();
    let limits = RateLimits {
        hard_limit: Some(1),
        global_limit: None,
        tiers: &tiers,
    };
    let r = decide(
        limits,
        &mut state,
        &mut global,
        0,
        Amount::new(3, 3).expect("valid"),
        Enforcement::Ignore,
    )
    .expect("within the bound");
    assert_eq!(
        (r.granted, r.ignored, r.tier_hits, r.domain_hits_last_second),
        (3, true, 2, 3)
    );
    assert!(r.hard_limited);
}

#[test]
fn a_clock_that_steps_back_is_held_at_the_latest_time_seen() {
    let mut p = Pair::new(vec![tier(1, 1_000, None, 0, false)]);
    assert!(p.granted(5_000));
    // 4000 < 5000: treated as 5000, so the hit is still in the window.
    assert!(!p.granted(4_000));
    assert!(p.granted(6_001));
}

// Forgetting idle state.

#[test]
fn forget_at_is_when_state_decides_like_no_state() {
    let tiers = vec![
        tier(5, 1_000, None, 0, false),
        tier(10, 1_000, Some(2_000), 5_000, false),
    ];
    let mut p = Pair::new(tiers.clone());
    p.ask(0, 5, 5);
    assert_eq!(
        p.state.forget_at(&tiers, 0),
        Some(1_001),
        "tier 1 window and last second empty at 1001"
    );
    assert_eq!(
        p.state.forget_at(&tiers, 7),
        Some(1_008),
        "a dormant tier 1 waits out the grace"
    );
    p.ask(10, 1, 1); // bursts into tier 2 at 10
    assert_eq!(
        p.state.forget_at(&tiers, 0),
        Some(7_010),
        "tier 2 inactive at 10 + 2000 + 5000"
    );
    let finite = vec![tier(5, 1_000, Some(3_000), 500, false)];
    let mut p = Pair::new(finite.clone());
    p.ask(0, 1, 1);
    assert_eq!(
        p.state.forget_at(&finite, 99),
        Some(3_500),
        "finite tiers are forgotten exactly"
    );
    let upper_forever = vec![
        tier(1, 1_000, None, 0, false),
        tier(1, 1_000, None, 0, false),
    ];
    let mut p = Pair::new(upper_forever.clone());
    p.ask(0, 2, 2);
    assert_eq!(
        p.state.forget_at(&upper_forever, 0),
        None,
        "an upper tier that never ends"
    );
}

// SPEC §10 for burst tiers: reply context, soft limit, ban, dry run,
// charge, each at its boundary.

mod spec10 {
    use super::*;
    use crate::meter::{Ban, Op, Policy, SoftLimit};

    struct Tiers {
        pair: Pair,
        policy: Policy,
    }

    impl Tiers {
        fn new(tiers: Vec<Tier>) -> Self {
            Self {
                pair: Pair::new(tiers),
                policy: Policy::default(),
            }
        }

        fn op(&mut self, now: u64, op: Op) -> RateReply {
            let p = &mut self.pair;
            let limits = RateLimits {
                hard_limit: p.hard,
                global_limit: p.global_limit,
                tiers: &p.tiers,
            };
            decide_op(
                limits,
                self.policy,
                &mut p.state,
                &mut p.global,
                now,
                op,
                Enforcement::Enforce,
            )
            .expect("valid")
        }

        fn ask(&mut self, now: u64, copies: u64, min: u64) -> RateReply {
            self.op(now, Op::request(Amount::new(copies, min).expect("valid")))
        }

        fn dry(&mut self, now: u64, copies: u64, min: u64) -> RateReply {
            self.op(now, Op::dry_run(Amount::new(copies, min).expect("valid")))
        }
    }

    #[test]
    fn retry_after_is_the_millisecond_a_hit_leaves_the_window() {
        let mut t = Tiers::new(vec![tier(2, 1_000, None, 0, false)]);
        t.ask(100, 1, 1);
        let r = t.ask(400, 1, 1);
        assert_eq!(
            (r.context.remaining, r.context.retry_after_ms),
            (0, Some(701))
        );
        // The hit at 100 is inside at 100 + 1000 and gone at 1101.
        assert_eq!(t.ask(1_100, 1, 1).granted, 0);
        let r = t.ask(1_101, 1, 1);
        assert_eq!(r.granted, 1);
        // Two at once wait for the hit at 1101 too: it leaves at 2102
        // (the one at 400 at 1401).
        let r = t.dry(1_101, 2, 2);
        assert_eq!((r.granted, r.context.retry_after_ms), (0, Some(1_001)));
        assert_eq!(t.dry(1_101, 1, 1).context.retry_after_ms, Some(300));
    }

    #[test]
    fn retry_after_waits_for_the_cooldown_end_when_the_burst_is_blocked() {
        // Tier 1 full; tier 2 (active 100, cooldown 200) was used and is
        // cooling down: a hit is possible again when its cooldown ends.
        let mut t = Tiers::new(vec![
            tier(1, 10_000, None, 0, false),
            tier(1, 100, Some(100), 200, false),
        ]);
        t.ask(0, 2, 2); // tier 1, then a burst into tier 2 at 0
        let r = t.ask(100, 1, 1);
        assert_eq!(r.granted, 0, "tier 2 cools down from 100 to 300");
        assert_eq!(r.context.retry_after_ms, Some(200));
        assert_eq!(
            t.ask(299, 1, 1).granted,
            0,
            "the cooldown's last millisecond"
        );
        let r = t.ask(300, 1, 1);
        assert_eq!((r.granted, r.burst, r.tier), (1, true, 2));
    }

    #[test]
    fn retry_after_waits_for_h_s_second() {
        let mut t = Tiers::new(vec![tier(10, 60_000, None, 0, false)]);
        t.pair.hard = Some(2);
        t.ask(0, 1, 1);
        assert_eq!(t.ask(500, 1, 1).granted, 1);
        let r = t.ask(600, 1, 1);
        assert_eq!((r.granted, r.hard_limited), (0, true));
        assert_eq!(
            r.context.retry_after_ms,
            Some(401),
            "the hit at 0 leaves at 1001"
        );
        assert_eq!(t.ask(1_000, 1, 1).granted, 0);
        assert_eq!(t.ask(1_001, 1, 1).granted, 1);
        // More than H is never granted.
        assert_eq!(t.ask(1_001, 3, 3).context.retry_after_ms, None);
    }

    #[test]
    fn retry_after_is_null_when_no_tier_could_ever_hold_it() {
        let mut t = Tiers::new(vec![tier(2, 1_000, None, 0, false)]);
        let r = t.ask(0, 3, 3);
        assert_eq!((r.granted, r.context.retry_after_ms), (0, None));
        assert_eq!(t.ask(0, 3, 2).context.retry_after_ms, Some(1_001));
    }

    #[test]
    fn a_ban_holds_until_its_last_millisecond_and_the_retry_covers_it() {
        let mut t = Tiers::new(vec![tier(1, 1_000, None, 0, false)]);
        t.policy.ban = Some(Ban::new(5_000).expect("valid"));
        assert_eq!(t.ask(0, 1, 1).granted, 1);
        let r = t.ask(10, 1, 1);
        assert_eq!(
            (r.granted, r.context.banned),
            (0, true),
            "the rejection bans"
        );
        assert_eq!(r.context.retry_after_ms, Some(5_000));
        // Whole when the hit at 0 is at the end of its window (and of the
        // last second): the ban is told by retry_after_ms, not here.
        assert_eq!(r.context.reset_after_ms, Some(990));
        let r = t.ask(5_009, 1, 1);
        assert_eq!(
            (r.granted, r.context.banned),
            (0, true),
            "the ban's last millisecond"
        );
        assert_eq!(r.context.retry_after_ms, Some(1));
        assert_eq!(
            t.pair.state.banned_until,
            Some(5_010),
            "a ban does not grow"
        );
        let r = t.ask(5_010, 1, 1);
        assert_eq!((r.granted, r.context.banned), (1, false));
    }

    #[test]
    fn during_a_ban_the_retry_is_the_first_grant_after_its_end() {
        // The tier's window outlasts the ban: the retry is the later one.
        let mut t = Tiers::new(vec![tier(1, 10_000, None, 0, false)]);
        t.policy.ban = Some(Ban::new(1_000).expect("valid"));
        t.ask(0, 1, 1);
        let r = t.ask(1, 1, 1);
        assert_eq!(
            (r.context.banned, r.context.retry_after_ms),
            (true, Some(10_000))
        );
    }

    #[test]
    fn a_dry_run_records_nothing_and_answers_as_the_request_would() {
        let mut t = Tiers::new(vec![tier(1, 1_000, None, 0, false)]);
        t.policy.ban = Some(Ban::new(5_000).expect("valid"));
        let dry = t.dry(0, 1, 1);
        let before = t.pair.state.clone();
        assert_eq!(before, RateState::default());
        let real = t.ask(0, 1, 1);
        assert_eq!(dry, real);
        // A dry run that would be rejected says it would ban, and does not.
        let dry = t.dry(1, 1, 1);
        assert_eq!((dry.granted, dry.context.banned), (0, true));
        assert_eq!(dry.context.retry_after_ms, Some(5_000));
        assert_eq!(t.pair.state.banned_until, None);
        // During a ban a dry run is rejected as the request is.
        t.ask(2, 1, 1);
        let dry = t.dry(1_002, 1, 1);
        assert_eq!((dry.granted, dry.context.banned), (0, true));
    }

    #[test]
    fn a_charge_is_never_rejected_and_lands_in_the_current_tier_only() {
        let mut t = Tiers::new(vec![tier(2, 1_000, None, 0, false)]);
        t.pair.hard = Some(3);
        t.policy.ban = Some(Ban::new(5_000).expect("valid"));
        // Tier 0: only H's and G's logs.
        let r = t.op(0, Op::Charge(2));
        assert_eq!(
            (r.granted, r.tier, r.tier_hits, r.domain_hits_last_second),
            (2, 0, 0, 2)
        );
        assert_eq!((r.context.limit, r.context.remaining), (0, 1));
        let r = t.ask(1, 1, 1);
        assert_eq!((r.granted, r.tier, r.tier_hits), (1, 1, 1));
        // Past the tier's limit and H: recorded, no burst, no ban.
        let r = t.op(2, Op::Charge(5));
        assert_eq!((r.granted, r.tier, r.tier_hits, r.burst), (5, 1, 6, false));
        assert_eq!((r.context.remaining, r.context.banned), (0, false));
        // A request then waits until the window and H's second are free of
        // the charge: both at 2 + 1000 + 1.
        assert_eq!(r.context.retry_after_ms, Some(1_001));
    }

    #[test]
    fn charges_and_refunds_of_bad_sizes_are_client_errors() {
        let mut t = Tiers::new(vec![tier(2, 1_000, None, 0, false)]);
        let p = &mut t.pair;
        let limits = RateLimits {
            hard_limit: None,
            global_limit: None,
            tiers: &p.tiers,
        };
        for op in [Op::Charge(0), Op::Refund(1)] {
            let e = decide_op(
                limits,
                Policy::default(),
                &mut p.state,
                &mut p.global,
                0,
                op,
                Enforcement::Enforce,
            );
            assert!(e.is_err(), "{op:?}");
        }
        assert_eq!(p.state, RateState::default());
    }

    #[test]
    fn the_soft_limit_warns_at_its_share_of_the_current_tier() {
        let mut t = Tiers::new(vec![tier(5, 1_000, None, 0, false)]);
        t.policy.soft_limit = Some(SoftLimit::percent(60).expect("valid"));
        assert!(!t.ask(0, 2, 2).context.warning, "2 of 5");
        assert!(t.ask(0, 1, 1).context.warning, "3 of 5 is 60 %");
        // Tier 0 never warns.
        let mut z = Tiers::new(vec![tier(0, 1_000, None, 0, false)]);
        z.policy.soft_limit = Some(SoftLimit::percent(1).expect("valid"));
        assert!(!z.ask(0, 1, 1).context.warning);
    }

    #[test]
    fn reset_after_is_null_for_an_upper_tier_that_never_ends() {
        let mut t = Tiers::new(vec![
            tier(1, 1_000, None, 0, false),
            tier(1, 1_000, None, 0, false),
        ]);
        let r = t.ask(0, 2, 2);
        assert_eq!((r.tier, r.context.reset_after_ms), (2, None));
    }
}
