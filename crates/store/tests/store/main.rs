//! The store's integration tests, one test binary (issue 28, item 7): each
//! module is a former `tests/*.rs` binary, so the crate's tests compile and
//! link once instead of fourteen times.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod batched_redis;
mod concurrency;
mod conformance;
mod copy_waits;
mod leases;
mod meters_batch;
mod meters_differential;
mod meters_faults;
mod meters_state;
mod redis_cluster;
mod redis_membership;
mod redis_security;
mod redis_tls_faults;
mod redis_waits;
mod tiers_batch_model;
mod tiers_footprint;
mod tiers_long_logs;
mod waits_differential;
