//! The `charon` package's integration tests, one test binary (issue 28,
//! item 7): each module is a former `tests/*.rs` binary, so they compile
//! and link once instead of thirty times. `cargo test -p charon --test cli
//! MODULE::` runs one of them; the former `cli` binary is `cli::`,
//! `docs::` (the documentation test) and `house::` (the house check).
//!
//! The modules share one process and run in parallel: no test sets the
//! process's environment, its current directory, a global subscriber or
//! any other process-wide state. What a child process needs is given to
//! that child (`Command::env`, `Command::current_dir`), and signals go to
//! child processes by their id.

mod api_tokens;
mod cli;
mod client_sessions;
mod config_audit;
mod config_import;
mod config_remote;
mod config_sync;
mod cookbook;
mod copy_waits;
mod deploy_files;
mod docs;
mod envoy_python;
mod events;
mod extras;
mod faults_config;
mod faults_config_file;
mod faults_counts;
mod faults_envoy;
mod faults_fleet;
mod faults_grpc;
mod faults_http;
mod faults_redis;
mod house;
mod leases;
mod observability;
mod otlp;
mod python_client;
mod redis_cluster;
mod redis_cluster_store;
mod redis_security;
mod server;
mod simulator_e2e;
mod support;
mod tls;
