//! Compiles every `.proto` under `proto/` with protox (a protobuf compiler in Rust), so a build
//! needs no system `protoc`. The files of `proto/clusterd/` (ClusterD's service as its clients
//! see it) are compiled apart, into `$OUT_DIR/clusterd/`: they share the empty package with
//! `proto/recover.proto`.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    compile(Path::new("proto"), None)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("clusterd");
    std::fs::create_dir_all(&out)?;
    compile(Path::new("proto/clusterd"), Some(&out))?;
    Ok(())
}

/// Compiles the `.proto` files directly in `dir` (clients and servers) into `out` (default:
/// `$OUT_DIR`).
fn compile(dir: &Path, out: Option<&Path>) -> Result<(), Box<dyn std::error::Error>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [dir])?;
    let mut build = tonic_prost_build::configure()
        // prost's codec with small starting buffers (`src/net/codec.rs`).
        .codec_path("crate::net::codec::LeanCodec")
        .build_client(true)
        .build_server(true);
    if let Some(out) = out {
        build = build.out_dir(out);
    }
    build.compile_fds(fds)?;
    Ok(())
}
