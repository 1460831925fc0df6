//! Compiles `proto/charon/v1/limiter.proto` and `capacity.proto`, and Envoy's
//! `proto/envoy/service/ratelimit/v3/rls.proto` (vendored with their imports,
//! see `proto/VENDORED.md`) with protox (pure Rust, no system `protoc`), and
//! keeps each descriptor set for server reflection.

use std::path::{Path, PathBuf};

fn compile(
    root: &Path,
    files: &[&str],
    descriptor: &str,
    out: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(files.iter().map(|f| root.join(f)), [root])?;
    std::fs::write(out.join(descriptor), prost::Message::encode_to_vec(&fds))?;
    // Undecodable requests are client errors, not tonic's INTERNAL.
    tonic_prost_build::configure()
        .codec_path("crate::codec::CharonCodec")
        // Only the service's server and client are wanted; the imported
        // files (core, annotations) have no services anyway.
        .compile_fds(fds)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    compile(
        &root,
        // One package, so one generated file: compiled together.
        &["charon/v1/limiter.proto", "charon/v1/capacity.proto"],
        "charon_descriptor.bin",
        &out,
    )?;
    compile(
        &root,
        &["envoy/service/ratelimit/v3/rls.proto"],
        "envoy_rls_descriptor.bin",
        &out,
    )?;
    Ok(())
}
