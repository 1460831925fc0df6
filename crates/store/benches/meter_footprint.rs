//! Resident memory per (resource, domain) pair of buckets, windows and
//! queues in the in-memory store: a million domains make one request each;
//! RSS is read before and with their state live, then the state becomes
//! idle and is swept.
//!
//! Run: `cargo bench -p charon-store --bench meter_footprint`

use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::meter::{Meter, Op, Policy};
use charon_core::request::Amount;
use charon_core::window::Algorithm;
use charon_core::{bucket, queue, window};
use charon_store::{MemoryStore, Store};
use footprint::{listing, ready, rss_bytes};

mod footprint;

fn main() {
    if listing("meter_footprint") {
        return;
    }
    const DOMAINS: u64 = 1_000_000;
    let p = Policy::default();
    let meters = [
        (
            "bucket (100 per minute)",
            Meter::Bucket(bucket::Params::new(100, 100, 60_000, p).expect("valid")),
        ),
        (
            "fixed window (100 per minute)",
            Meter::Window(window::Params::new(Algorithm::Fixed, 100, 60_000, p).expect("valid")),
        ),
        (
            "sliding counter (100 per minute)",
            Meter::Window(
                window::Params::new(Algorithm::SlidingCounter, 100, 60_000, p).expect("valid"),
            ),
        ),
        (
            "queue (10/s, size 5)",
            Meter::Queue(queue::Params::new(10, 1_000, 5, p).expect("valid")),
        ),
    ];
    let one = Op::request(Amount::exactly(1).expect("valid"));
    println!("{DOMAINS} domains (10.x.y.z), one request each, per kind");
    for (name, meter) in meters {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let store = MemoryStore::new(clock.clone());
        let names: Vec<String> = (0..DOMAINS)
            .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
            .collect();
        let before = rss_bytes();
        for d in &names {
            let _ = ready(store.meter("api/search", d, &meter, one));
        }
        let live = rss_bytes();
        drop(names);
        clock.advance(3 * 60_000);
        let swept = store.sweep();
        let after = rss_bytes();
        println!(
            "{name}: {:.1} bytes per pair live (table, entry and key), {} swept when idle, RSS {} MB -> {} MB -> {} MB",
            (live.saturating_sub(before)) as f64 / DOMAINS as f64,
            swept.pairs,
            before >> 20,
            live >> 20,
            after >> 20,
        );
    }
}
