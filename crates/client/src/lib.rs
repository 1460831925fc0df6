//! The Charon client library: what services embed to ask Charon before
//! they touch a precious resource.
//!
//! - [`Client::request`] — a rate-limited request (hits over time), with
//!   `copies`/`min_copies` and `max_wait`: rejections are retried with the
//!   back-off of paper §3.2, `min(max_wait − elapsed, jitter(base · 2^i))`
//!   after the i-th rejection, jitter uniform in `[v − v/4, v + v/4)`.
//!   On every rate-like kind (SPEC §2, §7–§10) `.dry_run(true)` asks
//!   without recording, and [`RateGrant::retry_after`] and
//!   [`RateGrant::delay`] (a queue's) say when to come back or proceed;
//!   [`Client::charge`] records a cost after the fact (never rejected) and
//!   [`Client::refund`] gives a bucket's tokens back.
//! - [`Client::reserve`] — copies of a copy-limited resource as a [`Hold`]:
//!   a guard that releases what it still holds when dropped. A hold can
//!   release part of its copies, or [`Hold::transfer`] them to another
//!   process (on any server), which takes them with [`Client::seize`].
//! - [`Client::multi`] — the pseudo-atomic request of several resources of
//!   paper §3.3.
//! - [`Client::lease`] — a capacity lease (SPEC §12, Doorman): a share of a
//!   resource's capacity, refreshed in the background, that the process
//!   spends locally with [`Lease::acquire`]; when no server answers it runs
//!   in the [`LeaseMode`] chosen.
//! - Degraded mode (paper §4.3): when the server cannot be reached or
//!   answers a server error, the client grants `min_copies` itself and marks
//!   the result [`Source::Degraded`]; the kill switch turns rejections into
//!   grants marked [`Source::KillSwitch`]. Both are counted in
//!   [`Client::stats`]. Charon must never be a single point of failure.
//!
//! # One session stream, pipelined
//!
//! A client keeps one `Session` stream open (SPEC §3) and sends every
//! operation on it by default: rate requests, charges and refunds as well
//! as copy operations. Many operations are in flight at once on the one
//! stream, each reply matched to its call by id, so a decision costs one
//! small message each way instead of a unary call's HTTP/2 headers and
//! trailers. [`ClientOptions::rate_transport`] switches rate requests,
//! charges and refunds to unary calls ([`RateTransport::Unary`]); the
//! answers, back-off, degraded mode and kill switch are the same either
//! way.
//!
//! - **Back-pressure**: at most [`ClientOptions::max_in_flight`] operations
//!   (default 256) wait for an answer at once; further callers wait for a
//!   place, within their `request_timeout`.
//! - **Ordering**: the server runs a session's copy operations in the order
//!   they arrive, and rate requests concurrently with everything else, so
//!   two rate requests in flight at once may be decided in either order.
//! - **A broken session**: every operation waiting on it fails as a server
//!   error (degraded mode may then grant, as when a unary call fails), and
//!   the next operation opens a new session. Nothing is sent again by
//!   itself: an operation that was written may have been applied (hits
//!   recorded) even though its reply was lost, and a blind retry would count
//!   it twice; an application that prefers to retry can, knowing that.
//!
//! # A rate-limited request
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), charon_client::Error> {
//! # let server = charon_testkit::InProcessServer::start(
//! #     "resources: [ { name: api/search, kind: rate, tiers: [ { limit: 5, window: 1s } ] } ]").await;
//! # let endpoint = server.endpoint();
//! use charon_client::{Client, ClientOptions};
//!
//! let client = Client::connect(ClientOptions::new(endpoint))?;
//! let grant = client.request("api/search", "tenant-42").copies(3).send().await?;
//! assert_eq!(grant.granted, 3);
//! // Two more fit in this second; a request for three takes what is left.
//! let grant = client.request("api/search", "tenant-42").copies(3).send().await?;
//! assert_eq!(grant.granted, 2);
//! // Now the window is full: rejected (an answer, not an error).
//! let grant = client.request("api/search", "tenant-42").send().await?;
//! assert!(!grant.is_granted());
//! assert_eq!(grant.reply.map(|r| r.tier_hits), Some(5));
//! # Ok(()) }
//! ```
//!
//! # Waiting for a grant
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), charon_client::Error> {
//! # let server = charon_testkit::InProcessServer::start(
//! #     "resources: [ { name: api/search, kind: rate, tiers: [ { limit: 1, window: 200ms } ] } ]").await;
//! use std::time::Duration;
//! use charon_client::{Client, ClientOptions};
//!
//! let mut options = ClientOptions::new(server.endpoint());
//! options.backoff_base = Duration::from_millis(50); // sleeps ~100 ms, ~200 ms, …
//! let client = Client::connect(options)?;
//! assert!(client.request("api/search", "u").send().await?.is_granted());
//! // Rejected at first; granted once the hit leaves the 200 ms window.
//! let grant = client.request("api/search", "u").max_wait(Duration::from_secs(2)).send().await?;
//! assert!(grant.is_granted());
//! assert!(grant.waited >= Duration::from_millis(50));
//! # Ok(()) }
//! ```
//!
//! # Holding copies
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), charon_client::Error> {
//! # let server = charon_testkit::InProcessServer::start(
//! #     "resources: [ { name: sandbox/vm, kind: copy, domain_limit: 4 } ]").await;
//! use charon_client::{Client, ClientOptions};
//!
//! let client = Client::connect(ClientOptions::new(server.endpoint()))?;
//! {
//!     let mut vms = client.reserve("sandbox/vm", "tenant-7").copies(4).send().await?;
//!     assert_eq!(vms.copies(), 4);
//!     vms.release(1).await?; // give one back early
//!     assert_eq!(vms.copies(), 3);
//!     let more = client.reserve("sandbox/vm", "tenant-7").copies(2).send().await?;
//!     assert_eq!(more.copies(), 1, "only one is free");
//! } // both holds dropped: their copies go back, before the next operation
//! let all = client.reserve("sandbox/vm", "tenant-7").copies(4).send().await?;
//! assert_eq!(all.copies(), 4);
//! # Ok(()) }
//! ```
//!
//! # Handing copies to another process
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), charon_client::Error> {
//! # let server = charon_testkit::InProcessServer::start(
//! #     "resources: [ { name: sandbox/vm, kind: copy, domain_limit: 15 } ]").await;
//! use std::time::Duration;
//! use charon_client::{Client, ClientOptions};
//!
//! let process_1 = Client::connect(ClientOptions::new(server.endpoint()))?;
//! let process_2 = Client::connect(ClientOptions::new(server.endpoint()))?;
//! let mut mine = process_1.reserve("sandbox/vm", "d").copies(15).send().await?;
//! let id = mine.transfer(10, Duration::from_secs(30)).await?; // send `id` to process 2
//! assert_eq!(mine.copies(), 5);
//! let theirs = process_2.seize(&id).await?;
//! assert_eq!(theirs.copies(), 10);
//! // A transfer is seized once.
//! assert!(process_2.seize(&id).await.is_err());
//! # Ok(()) }
//! ```
//!
//! # Several resources at once
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), charon_client::Error> {
//! # let server = charon_testkit::InProcessServer::start(r#"
//! # resources:
//! #   - { name: db/conn, kind: copy, domain_limit: 8 }
//! #   - { name: gpu, kind: copy, domain_limit: 3 }
//! #   - { name: api/render, kind: rate, tiers: [ { limit: 2, window: 1s } ] }
//! # "#).await;
//! use charon_client::{Client, ClientOptions};
//!
//! let client = Client::connect(ClientOptions::new(server.endpoint()))?;
//! let grant = client.multi("tenant").copy("db/conn").copy("gpu").rate("api/render").copies(1, 8).send().await?;
//! assert_eq!(grant.copies, 2, "8 connections, then 3 GPUs, then 2 renders: 2 of each");
//! assert!(grant.holds.iter().all(|h| h.copies() == 2));
//! # Ok(()) }
//! ```
//!
//! # When Charon is down
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), charon_client::Error> {
//! use charon_client::{Client, ClientOptions, Source};
//!
//! // Nothing listens on port 9: the client grants min_copies itself.
//! let client = Client::connect(ClientOptions::new("http://127.0.0.1:9"))?;
//! let grant = client.request("api/search", "u").copies(10).min_copies(2).send().await?;
//! assert_eq!((grant.granted, grant.source), (2, Source::Degraded));
//! assert_eq!(client.stats().degraded_grants, 1);
//! # Ok(()) }
//! ```

#![warn(clippy::print_stdout, clippy::print_stderr)]

mod backoff;
mod classify;
mod client;
mod diagnose;
mod error;
mod grant;
mod lease;
mod options;

pub use backoff::{jitter, next_sleep};
/// The wire types, for replies' full context.
pub use charon_proto::v1 as proto;
pub use client::{Bearer, Client, Hold, MultiCall, MultiGrant, RateCall, ReserveCall, Stats};
pub use error::{Class, Error, ErrorKind, code_name};
pub use grant::{RateGrant, Source};
pub use lease::{Lease, LeaseMode, LeaseOptions, LeaseSource, LeaseStatus};
pub use options::{ClientOptions, ClientTls, RateTransport, Token, endpoint};
