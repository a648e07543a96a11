//! Generates the Envoy rate limit service types (`proto/`) with protox, a protobuf compiler
//! written in Rust, so a fresh machine builds without `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Malformed requests are INVALID_ARGUMENT, not tonic's INTERNAL.
        .codec_path("crate::transport::grpc::decode::Codec")
        .compile_fds(files)?;
    Ok(())
}
