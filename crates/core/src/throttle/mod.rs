//! The server throttler of SPEC §13 (seed 001, "Server side rate
//! limiter"): the decision rules of a throttler that sits in front of one
//! service and decides for each incoming request whether it starts now,
//! waits in a queue, or is rejected with the time to come back.
//!
//! - [`config`]: the `throttle:` section, read by path.
//! - [`machine`]: the FIFO queue before a leaky bucket over units,
//!   eviction by criticality, expiry and retry times, exact in integers.
//! - [`predictor`]: the cost estimate per request class.
//!
//! No I/O and no clock: `charon-throttle` (the tower layer and
//! `charon sidecar`), `charon simulate` and the browser simulator drive
//! the same [`Throttle`] with the time they choose.

pub mod config;
pub mod machine;
pub mod predictor;

pub use config::{
    ClientKey, ClientLimit, Criticality, Degraded, Discipline, Global, GlobalLease, Reject,
    ThrottleConfig,
};
pub use machine::{Admission, Arrived, Event, Evicted, Nanos, RequestId, Throttle};
pub use predictor::Predictor;

#[cfg(test)]
mod tests;
