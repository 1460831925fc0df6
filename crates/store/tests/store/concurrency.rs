//! Requests from many threads at once stay exact: with the clock frozen,
//! exactly the configured number of hits or copies is granted, never one
//! more, on one pair and across many.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use charon_core::ManualClock;
use charon_core::config::{CopyLimits, Enforcement, RateLimits, Tier};
use charon_core::copy::Hold;
use charon_core::request::Amount;
use charon_store::{MemoryStore, Store};

const THREADS: usize = 8;

fn run_threads(f: impl Fn(usize) + Sync) {
    std::thread::scope(|s| {
        for i in 0..THREADS {
            let f = &f;
            s.spawn(move || f(i));
        }
    });
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn store() -> MemoryStore {
    MemoryStore::new(Arc::new(ManualClock::new(1_000)))
}

const TIERS: &[Tier] = &[
    Tier {
        limit: 700,
        window: 3_600_000,
        active: None,
        cooldown: 0,
        skippable: false,
    },
    Tier {
        limit: 300,
        window: 3_600_000,
        active: Some(3_600_000),
        cooldown: 0,
        skippable: false,
    },
];

#[test]
fn one_hot_pair_grants_exactly_its_tiers_capacity() {
    let s = store();
    let limits = RateLimits {
        hard_limit: None,
        global_limit: None,
        tiers: TIERS,
    };
    let granted = AtomicU64::new(0);
    let bursts = AtomicU64::new(0);
    run_threads(|i| {
        block_on(async {
            for k in 0..400u64 {
                let copies = 1 + (k + i as u64) % 5;
                let amount = Amount::new(copies, 1).expect("valid");
                let r = s
                    .request("api", "hot", limits, amount, Enforcement::Enforce)
                    .await
                    .expect("ok");
                granted.fetch_add(r.granted, Ordering::Relaxed);
                bursts.fetch_add(u64::from(r.burst), Ordering::Relaxed);
            }
        });
    });
    assert_eq!(
        granted.into_inner(),
        1_000,
        "700 in tier 1 + 300 in tier 2, never more"
    );
    assert_eq!(
        bursts.into_inner(),
        2,
        "into tier 1 once and into tier 2 once"
    );
}

#[test]
fn the_global_limit_holds_across_domains_and_threads() {
    let s = store();
    let limits = RateLimits {
        hard_limit: Some(50),
        global_limit: Some(500),
        tiers: TIERS,
    };
    let granted = AtomicU64::new(0);
    run_threads(|i| {
        block_on(async {
            for k in 0..300 {
                let domain = format!("d{}", (k * THREADS + i) % 64);
                let r = s
                    .request(
                        "api",
                        &domain,
                        limits,
                        Amount::exactly(1).expect("valid"),
                        Enforcement::Enforce,
                    )
                    .await
                    .expect("ok");
                assert!(r.global_hits_last_second <= 500);
                assert!(r.domain_hits_last_second <= 50);
                granted.fetch_add(r.granted, Ordering::Relaxed);
            }
        });
    });
    assert_eq!(granted.into_inner(), 500);
}

#[test]
fn copy_limits_hold_under_concurrent_reserve_and_release() {
    let s = store();
    let limits = CopyLimits {
        domain_limit: 10,
        global_limit: Some(25),
        groups: vec![],
    };
    let peak = AtomicU64::new(0);
    run_threads(|i| {
        block_on(async {
            let domain = format!("d{}", i % 4);
            let hold = Hold::new("vm", domain.clone(), []);
            for _ in 0..500 {
                let r = s
                    .reserve(
                        "vm",
                        &domain,
                        &limits,
                        Amount::new(4, 1).expect("valid"),
                        Enforcement::Enforce,
                    )
                    .await
                    .expect("ok");
                assert!(r.global_holds <= 25 && r.domain_holds <= 10, "{r:?}");
                peak.fetch_max(r.global_holds, Ordering::Relaxed);
                if r.granted > 0 {
                    s.release(&hold, r.granted)
                        .await
                        .expect("release what was granted");
                }
            }
        });
    });
    assert!(peak.into_inner() > 0);
    let r = block_on(s.reserve(
        "vm",
        "late",
        &limits,
        Amount::exactly(10).expect("valid"),
        Enforcement::Enforce,
    ))
    .expect("ok");
    assert_eq!(
        (r.granted, r.global_holds),
        (10, 10),
        "everything was given back"
    );
}
