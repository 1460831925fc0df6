//! The JSON bodies of Charon's configuration API: what the service
//! (`charon-config-service`) answers and its clients
//! (`charon-config-client`, the `charon config` commands) read, in one
//! place so that both ends agree by construction, and so that a client does
//! not build the service (its web framework, database drivers and OpenAPI
//! machinery) to get them.
//!
//! Serde types only by default. With the feature `openapi` they also derive
//! `utoipa::ToSchema`, and [`schema`] holds the document-only types the
//! service's OpenAPI document describes the hand-parsed bodies with.

// The wire bodies' fields are documented by `docs/config-service.md` and the
// OpenAPI document, not yet item by item.
#![allow(missing_docs)]

#[cfg(feature = "openapi")]
pub mod schema;
mod wire;

pub use wire::*;
