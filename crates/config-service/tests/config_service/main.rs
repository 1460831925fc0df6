//! The configuration service's integration tests, one test binary (issue 28,
//! item 7): each module is a former `tests/*.rs` binary, so they compile and
//! link once instead of five times. `support` (also used by the config
//! client's tests, by path) sets up a service on a private database.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod support;

mod api;
mod audit;
mod durability;
mod envoy;
mod schemathesis;
