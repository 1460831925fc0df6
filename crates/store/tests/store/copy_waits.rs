//! Many waiters on one resource of the in-memory store (SPEC §14): 10,000
//! callers wait for one copy, the next finds the queue full, a release
//! hands the copy to the first, the rest are rejected when their wait runs
//! out, and afterwards nothing is left: no waiter, no count, no slot.

use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::config::{CopyLimits, Enforcement};
use charon_core::copy::Hold;
use charon_core::request::Amount;
use charon_store::{MemoryStore, Reserved, Store, WaitOptions};

const WAITERS: u64 = 10_000;

fn limits() -> CopyLimits {
    CopyLimits {
        domain_limit: 1,
        global_limit: Some(1),
        groups: Vec::new(),
    }
}

#[tokio::test]
async fn ten_thousand_waiters_on_one_key_are_all_answered_and_nothing_is_left() {
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(clock.clone());
    let one = Amount::new(1, 1).expect("valid");
    let wait = WaitOptions {
        wait_ms: 1_000,
        queue_limit: WAITERS,
    };
    let reserve = |domain: String| {
        let store = &store;
        let limits = limits();
        async move {
            store
                .reserve_or_wait("page", &domain, &limits, one, Enforcement::Enforce, wait)
                .await
                .expect("an answer")
        }
    };
    let Reserved::Now(first) = reserve("holder".into()).await else {
        panic!("the first is answered at once");
    };
    assert_eq!(first.granted, 1);
    let mut tickets = Vec::new();
    for i in 0..WAITERS {
        clock.set(i / 100);
        match reserve(format!("d{i}")).await {
            Reserved::Waiting(t) => tickets.push(t),
            Reserved::Now(r) => panic!("waiter {i} answered at once: {r:?}"),
        }
    }
    let Reserved::Now(full) = reserve("late".into()).await else {
        panic!("the queue is full");
    };
    assert!(full.queue_full && full.granted == 0);
    assert_eq!(
        store.queue_lengths().await.expect("lengths"),
        [("page".to_owned(), WAITERS)]
    );

    // The release hands the copy to the first waiter, and only to it.
    store
        .release(&Hold::new("page", "holder", Vec::new()), 1)
        .await
        .expect("released");
    let got = store
        .wait_outcome(&tickets[0])
        .await
        .expect("an answer")
        .expect("decided");
    assert_eq!((got.granted, got.waited_ms), (1, Some(99)));
    assert_eq!(store.wait_outcome(&tickets[1]).await.expect("ok"), None);

    // Every other waiter is rejected when its wait runs out, in one sweep.
    clock.set(2_000);
    store.sweep();
    for t in &tickets[1..] {
        let r = store
            .wait_outcome(t)
            .await
            .expect("an answer")
            .expect("rejected at its deadline");
        assert_eq!((r.granted, r.queue_full, r.result_ready), (0, false, false));
        assert!(r.waited_ms.expect("waited") >= 1_000);
    }
    assert!(store.queue_lengths().await.expect("lengths").is_empty());
    store
        .release(&Hold::new("page", "d0", Vec::new()), 1)
        .await
        .expect("released");
    let swept = store.sweep();
    assert_eq!(
        swept.resources, 1,
        "the resource's state is gone: {swept:?}"
    );
}
