//! Memory per (resource, domain) pair of buckets, windows and queues in
//! the in-memory store, all in: the table, the entry and its key. For each
//! kind, N domains make one request each on one resource; the bytes
//! allocated (counted by the global allocator) and the RSS are read before
//! and with their state live, then the state becomes idle and is swept.
//! Each measurement runs in a process of its own, so that the RSS of one
//! is not memory another freed.
//!
//! Run: `cargo bench -p charon-store --bench meter_footprint`
//! (`FOOTPRINT_PAIRS=800000` for another N: the tables' load, between 7/16
//! and 7/8, depends on N; a million pairs is near the emptiest point).

use std::sync::Arc;

use charon_core::ManualClock;
use charon_core::meter::{Meter, Op, Policy};
use charon_core::request::Amount;
use charon_core::window::Algorithm;
use charon_core::{bucket, queue, window};
use charon_store::{MemoryStore, Store};
use footprint::{allocated, listing, ready, rss_bytes};

mod footprint;

/// The name of domain number `i`.
type Naming = fn(u64) -> String;

/// A resource name of a typical length (16 bytes).
const RESOURCE: &str = "api/v2/search-eu";

fn main() {
    if listing("meter_footprint") {
        return;
    }
    let pairs: u64 = std::env::var("FOOTPRINT_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
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
    let domains: [(&str, Naming); 2] = [
        ("16-byte domains (customer-0001234)", |i| {
            format!("customer-{i:07}")
        }),
        ("IPv4 domains (10.x.y.z)", |i| {
            format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)
        }),
    ];
    let one = Op::request(Amount::exactly(1).expect("valid"));
    let only: Option<usize> = std::env::var("FOOTPRINT_ONLY")
        .ok()
        .and_then(|n| n.parse().ok());
    let Some(only) = only else {
        println!("{pairs} pairs on one resource ({RESOURCE}), one request each, per kind");
        println!("bytes per pair: allocated (table, entry, key) / RSS delta");
        let exe = std::env::current_exe().expect("own path");
        for (d, (label, _)) in domains.iter().enumerate() {
            println!("{label}:");
            for k in 0..meters.len() {
                let status = std::process::Command::new(&exe)
                    .env("FOOTPRINT_ONLY", (d * meters.len() + k).to_string())
                    .status()
                    .expect("runs");
                assert!(status.success());
            }
        }
        return;
    };
    for (d, (_, name)) in domains.into_iter().enumerate() {
        for (k, (kind, meter)) in meters.iter().enumerate() {
            if d * meters.len() + k != only {
                continue;
            }
            let clock = Arc::new(ManualClock::new(1_700_000_000_000));
            let store = MemoryStore::new(clock.clone());
            let names: Vec<String> = (0..pairs).map(name).collect();
            let (bytes, rss) = (allocated(), rss_bytes());
            for d in &names {
                let _ = ready(store.meter(RESOURCE, d, meter, one));
            }
            let (live_bytes, live_rss) = (allocated(), rss_bytes());
            assert_eq!(store.meter_count() as u64, pairs);
            drop(names);
            clock.advance(3 * 60_000);
            let swept = store.sweep();
            let after = allocated();
            drop(store);
            println!(
                "  {kind:<34} {:6.1} B allocated / {:6.1} B RSS per pair; {} swept when idle, {} KiB left allocated",
                live_bytes.saturating_sub(bytes) as f64 / pairs as f64,
                live_rss.saturating_sub(rss) as f64 / pairs as f64,
                swept.pairs,
                after.saturating_sub(bytes) >> 10,
            );
        }
    }
}
