# syntax=docker/dockerfile:1
#
# docker build -t sluice:0.1.0 .
#
# The builder and the runtime share Debian 12 (bookworm), so the glibc the
# binary links against is the one it runs on.

FROM rust:1.95-bookworm AS builder
WORKDIR /build

# Manifests alone first: this layer (every dependency's source) is reused
# until Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
RUN cargo fetch --locked

COPY . .
# The cache mount keeps compiled dependencies between builds; the binary is
# copied out of it because a cache mount is not part of the image.
RUN --mount=type=cache,target=/build/target,sharing=locked \
    cargo build --release --locked --offline --bin sluice \
 && install -D -m 0755 target/release/sluice /out/sluice

# glibc, libgcc and CA certificates, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot

LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Rate-limiting reverse proxy sidecar" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /out/sluice /usr/local/bin/sluice

# 8080 traffic, 9901 admin (/metrics /healthz /readyz).
EXPOSE 8080 9901

# The distroless "nonroot" user, numeric so that Kubernetes' runAsNonRoot
# can verify it without reading /etc/passwd.
USER 65532:65532

ENTRYPOINT ["sluice"]
CMD ["run", "--config", "/etc/sluice/sluice.yaml"]
