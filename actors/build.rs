//! Compiles every `.proto` under `proto/` with protox (a protobuf compiler in Rust), so a build
//! needs no system `protoc`. `proto/clusterd.proto` (ClusterD's `Recover`, whose client and
//! server taskd both are, each for part of it) is compiled on its own, with default stubs: a
//! method a side does not implement answers gRPC `UNIMPLEMENTED`, as a method missing from a
//! service does.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let dir = Path::new("proto");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    let (clusterd, taskd): (Vec<PathBuf>, Vec<PathBuf>) = files
        .into_iter()
        .partition(|p| p.file_name().is_some_and(|n| n == "clusterd.proto"));
    compile(dir, &taskd, false)?;
    compile(dir, &clusterd, true)?;
    Ok(())
}

/// Compiles `files` (clients and servers) into `$OUT_DIR`, one `.rs` per package; with
/// `stubs`, every server method has a default implementation answering `UNIMPLEMENTED`.
fn compile(dir: &Path, files: &[PathBuf], stubs: bool) -> Result<(), Box<dyn std::error::Error>> {
    for f in files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(files, [dir])?;
    tonic_prost_build::configure()
        // prost's codec with small starting buffers (`src/net/codec.rs`).
        .codec_path("crate::net::codec::LeanCodec")
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(stubs)
        .compile_fds(fds)?;
    Ok(())
}
