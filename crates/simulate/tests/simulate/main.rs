//! The simulator's integration tests, one test binary (issue 28, item 7):
//! each module is a former `tests/*.rs` binary, so they compile and link
//! once instead of five times; `both` runs a replay in both stores.

mod both;

mod kinds;
mod leases;
mod simulation_input;
mod throttle_model;
mod waits;
