# syntax=docker/dockerfile:1
# The sluice daemon image: built with the Rust toolchain, run from distroless (glibc, CA bundle,
# no shell, no package manager) as the non-root user 65532, on a read-only root file system.
# Build, try and push (docs/kubernetes.md: "Kubernetes in 5 minutes"):
#   docker build -t ghcr.io/sluice-rs/sluice:0.1.0 .
#   docker run --rm --read-only --tmpfs /tmp -e SLUICE_LISTEN__HTTP=0.0.0.0:7070 -p 7070:7070 \
#     ghcr.io/sluice-rs/sluice:0.1.0
# Both stages are Debian 12 (bookworm), so the binary links against the glibc it runs with.
# tests/deploy/image.rs builds the build stage's inputs (every COPY below, in an empty directory)
# and runs this file's final stage offline (podman), so keep both stages' lines simple:
# `COPY <src>... <dest>`, `ENV KEY=value`, `USER`, `ENTRYPOINT` and `CMD` in JSON form.

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY config ./config
# The OpenAPI document served on the admin listener (built in with include_str!).
COPY docs/openapi.json ./docs/openapi.json
# Cache the registry and the target dir between builds (BuildKit). The release profile keeps
# debug info for profiling (`sluice bench`); the image does not ship it (76 MB -> ~9 MB). The
# image's binary leaves out `sluice bench` (feature `bench`): the injector Deployment runs this
# image too, so `k8s` (inject, injector) stays.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo build --release --locked --bin sluice --no-default-features --features k8s \
    && cp target/release/sluice /sluice

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /sluice /usr/local/bin/sluice
# The example policies; in Kubernetes a ConfigMap replaces them (SLUICE_POLICIES: a file, or a
# directory of *.yaml files such as a mounted ConfigMap).
COPY config/policies.yaml /etc/sluice/policies.yaml
ENV SLUICE_POLICIES=/etc/sluice/policies.yaml
# The admin listener (probes, metrics) must bind beyond loopback for the kubelet and Prometheus;
# the check API stays on 127.0.0.1 (the pod) and the Unix socket unless overridden.
ENV SLUICE_LISTEN__ADMIN=0.0.0.0:7071
# Trust for Redis TLS: the system bundle (distroless ships Debian's ca-certificates).
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
EXPOSE 7070 7071
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]
