//! Compiles `proto/charon/v1/limiter.proto` with protox (pure Rust, no
//! system `protoc`), and keeps the descriptor set for server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("charon/v1/limiter.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("charon_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // Undecodable requests are client errors, not tonic's INTERNAL.
    tonic_prost_build::configure()
        .codec_path("crate::codec::CharonCodec")
        .compile_fds(fds)?;
    Ok(())
}
