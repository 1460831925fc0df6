//! The gRPC interfaces Charon serves: `charon.v1`, generated from
//! `proto/charon/v1/limiter.proto` and `capacity.proto`, and Envoy's
//! `envoy.service.ratelimit.v3` ([`envoy`]).

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

/// Envoy's rate-limit service, `envoy.service.ratelimit.v3`, and the
/// messages it uses, generated from the vendored upstream protos
/// (`proto/VENDORED.md`). The module tree follows the proto packages, as
/// the generated code refers to its imports by relative paths.
#[allow(unused_qualifications, rustdoc::all)]
pub mod envoy {
    /// The encoded file descriptor set of `rls.proto` and its imports,
    /// for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/envoy_rls_descriptor.bin"));

    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}

/// Imports of Envoy's protos (annotations), generated with them.
#[allow(unused_qualifications, rustdoc::all)]
pub mod udpa {
    pub mod annotations {
        tonic::include_proto!("udpa.annotations");
    }
}

/// Imports of Envoy's protos (annotations and context parameters).
#[allow(unused_qualifications, rustdoc::all)]
pub mod xds {
    pub mod annotations {
        pub mod v3 {
            tonic::include_proto!("xds.annotations.v3");
        }
    }
    pub mod core {
        pub mod v3 {
            tonic::include_proto!("xds.core.v3");
        }
    }
}

/// Imports of Envoy's protos (field validation rules).
#[allow(unused_qualifications, rustdoc::all)]
pub mod validate {
    tonic::include_proto!("validate");
}
