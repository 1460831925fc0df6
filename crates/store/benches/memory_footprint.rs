//! Resident memory per domain in the in-memory store: a million domains
//! make one request each; RSS is read before, with their state live, and
//! after the state became idle and was swept.
//!
//! Run: `cargo bench -p charon-store --bench memory_footprint`

use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::config::{Enforcement, RateLimits, Tier};
use charon_core::rate::DORMANT_GRACE;
use charon_core::request::Amount;
use charon_store::{MemoryStore, Store};
use footprint::{allocated, listing, ready, rss_bytes};

mod footprint;

fn main() {
    if listing("memory_footprint") {
        return;
    }
    const DOMAINS: u64 = 1_000_000;
    let tiers = [
        Tier {
            limit: 5,
            window: 1_000,
            active: None,
            cooldown: 0,
            skippable: false,
        },
        Tier {
            limit: 25,
            window: 1_000,
            active: Some(5_000),
            cooldown: 15_000,
            skippable: false,
        },
    ];
    let limits = RateLimits {
        hard_limit: Some(100),
        global_limit: None,
        tiers: &tiers,
    };
    let one = Amount::exactly(1).expect("valid");
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::new(clock.clone());
    let start = rss_bytes();
    println!("{DOMAINS} new domains per round, one request each; idle state swept between rounds");
    for round in 0..3u64 {
        let names: Vec<String> = (0..DOMAINS)
            .map(|i| format!("tenant-{round}-{i:07}"))
            .collect();
        let (before, bytes) = (rss_bytes(), allocated());
        for d in &names {
            let _ = ready(store.request("api/search", d, limits, one, Enforcement::Enforce));
        }
        let (live, live_bytes) = (rss_bytes(), allocated());
        drop(names);
        clock.advance(1_001 + DORMANT_GRACE);
        let swept = store.sweep();
        println!(
            "round {round}: live state {:>4} bytes/domain allocated, {:>4} RSS delta, swept {} pairs, {} left, {} MiB allocated; RSS {:.0} MiB (started at {:.0} MiB)",
            live_bytes.saturating_sub(bytes) / DOMAINS,
            live.saturating_sub(before) / DOMAINS,
            swept.pairs,
            store.pair_count(),
            allocated() >> 20,
            rss_bytes() as f64 / 1_048_576.0,
            start as f64 / 1_048_576.0,
        );
    }
}
