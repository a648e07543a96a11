//! Generates the Envoy rate limit service and rate limit quota service types (`proto/`) with
//! protox, a protobuf compiler written in Rust, so a fresh machine builds without `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(
        [
            "envoy/service/ratelimit/v3/rls.proto",
            "envoy/service/rate_limit_quota/v3/rlqs.proto",
        ],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        // The server side is sluice's own (src/transport/grpc/stream.rs); the client is the
        // bench's and the tests'.
        .build_server(false)
        .build_client(true)
        .compile_fds(files)?;
    Ok(())
}
