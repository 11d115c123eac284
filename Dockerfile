# The control-plane image: the release binary with both store profiles, run
# as a non-root user, the embedded store and its key file under a volume.
# README.md, "Deploy", shows how to build and run it.
#
# Base images are build arguments: the defaults are the usual public ones;
# `cargo xtask container` builds with images made locally instead.
ARG BUILDER_IMAGE=docker.io/library/rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# The stage (or image) that holds /out/control-plane and an empty /out/state:
# the builder below, unless a binary built elsewhere is handed in.
ARG BINARY_FROM=builder

FROM ${BUILDER_IMAGE} AS builder
WORKDIR /src
COPY . .
# The cargo registry and the target directory are cache mounts: a rebuild
# after a source change does not compile the bundled DuckDB again. The
# binary is stripped of its symbols as it is installed (about 18 MB less).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p control-plane \
    && install -D -s -m 0755 target/release/control-plane /out/control-plane \
    && mkdir -p /out/state

FROM ${BINARY_FROM} AS binary

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="control-plane" \
      org.opencontainers.image.description="Durable control-plane store for webhook delivery and leased work (embedded DuckDB or PostgreSQL)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.documentation="README.md, section Deploy"
COPY --from=binary /out/control-plane /usr/local/bin/control-plane
# The volume's directory belongs to the user the process runs as, so a new
# named volume does too.
COPY --from=binary --chown=65532:65532 /out/state /var/lib/control-plane
ENV CONTROLPLANE_LISTEN=0.0.0.0:8080
USER 65532:65532
# The embedded default (./control-plane.duckdb, its .key beside it) and a
# generated admin token land here: no variable that the postgres profile
# would refuse.
WORKDIR /var/lib/control-plane
VOLUME ["/var/lib/control-plane"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/control-plane", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/control-plane"]
CMD ["serve"]
