//! Compiles the protos with protox (pure Rust), so no system `protoc` is needed.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/envoy/service/ratelimit/v3/rls.proto",
        "proto/envoy/service/rate_limit_quota/v3/rlqs.proto",
        "proto/tollgate/ratelimit/v1/ratelimit.proto",
        "proto/tollgate/regionsync/v1/regionsync.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(files, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptors.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
