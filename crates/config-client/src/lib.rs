//! The client side of Charon's configuration service (paper §4.1): how
//! limiting servers and the `charon config` tool talk to it.
//!
//! - [`ConfigClient`]: a small HTTP client of the service's API (deltas,
//!   whole-configuration export and import), for `charon config
//!   apply/export` and for the feed.
//! - [`ConfigFeed`]: a limiting server's view of the configuration, kept in
//!   memory (and in a cache file across restarts), refreshed from the
//!   service periodically and on demand by applying deltas, resynced from
//!   a full snapshot now and then.
//!
//! The JSON bodies both ends exchange are the crate `charon-config-wire`,
//! which the service uses too; this crate does not depend on the service
//! (only its tests run one).
//!
//! See `docs/config-service.md` for the feed's behaviour and choices.

#![warn(clippy::print_stdout, clippy::print_stderr)]

mod client;
mod feed;

pub use client::{ConfigClient, ConfigClientError, ConfigTls};
pub use feed::{ConfigFeed, FeedError, FeedHandle, FeedOptions, FeedStatus};
