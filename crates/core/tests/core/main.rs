//! Core's integration tests, one test binary (issue 28, item 7): each module
//! is a former `tests/*.rs` binary, the naive models and property tests of
//! every kind, so they compile and link once instead of seven times.

mod naive;

mod bucket_model;
mod envoy_model;
mod lease_model;
mod naive_model;
mod queue_model;
mod wait_model;
mod window_model;
