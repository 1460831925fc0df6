//! Charon's gRPC interface, `charon.v1` (SPEC §6), generated from
//! `proto/charon/v1/limiter.proto`.

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

pub mod codec;

/// Package `charon.v1`.
#[allow(unused_qualifications)] // generated code names paths in full
pub mod v1 {
    tonic::include_proto!("charon.v1");

    /// The encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/charon_descriptor.bin"));
}
