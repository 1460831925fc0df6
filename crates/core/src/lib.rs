//! The pure decision core of Charon.
//!
//! Everything that decides lives here: the configuration model and its
//! normalization ([`config`]), the burst-tier algorithm for rate-limited
//! resources ([`rate`]), the copy-limit algorithm ([`copy`]) and namespace
//! resolution; and the other rate-like kinds, each exact in integers: token buckets ([`bucket`]), fixed and sliding-counter
//! windows ([`window`]) and queues ([`queue`]), with what they share (soft
//! limits, bans, dry runs, charge and refund) in [`meter`]. There is no
//! I/O, no async runtime and no clock reading: stores pass state and `now`
//! in, and swap the new state in atomically however they can (a mutex, a
//! Redis script).
//!
//! The `envoy:` section of the configuration and descriptor matching for
//! Envoy's rate-limit protocol are in [`envoy`], the capacity leases
//! (Doorman's algorithms over a set of leases) in [`lease`], and the server
//! throttler's queue, leaky bucket and cost predictor in [`throttle`].
//!
//! Core also owns how input and output look: [`fields`] is the one checker
//! of JSON/YAML fields every input path uses, and the replies and issues
//! derive `Serialize` in the field names of SPEC §6.

// The fields of the configuration, reply and state types are documented by
// SPEC §2, §3 and §6, not yet item by item.
#![allow(missing_docs)]
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod bound;
pub mod config;
pub mod copy;
pub mod envoy;
pub mod error;
pub mod fields;
pub mod lease;
pub mod limits;
pub mod meter;
pub mod rate;
pub mod request;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod throttle;
pub mod time;
mod wire;

// The rate-like kinds live under `meter`, whose decision driver they
// plug into; their old paths stay.
pub use meter::{bucket, drain, queue, window};

pub use error::ClientError;
pub use time::{Clock, ManualClock, Millis};

/// The largest count (limit, hits, copies) Charon accepts: 2^53 − 1, the
/// largest integer that JSON clients and Redis' Lua numbers hold exactly.
/// Accepting more would let a number change silently on its way through.
pub const MAX_COUNT: u64 = (1 << 53) - 1;

/// The limit of a tier that never rejects (SPEC §4 `allow_unconfigured`).
/// Arithmetic on limits saturates, so this behaves as infinity.
pub const UNBOUNDED: u64 = u64::MAX;
