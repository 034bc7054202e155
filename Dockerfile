# idemgate container image: a base-less runtime (FROM scratch) under 40 MB.
# docker/smoke.sh builds and runs it (docker or podman) and checks it.
#
#   docker build -t idemgate .
#   docker run --rm -p 8080:8080 -p 127.0.0.1:9090:9090 \
#     -e DATABASE_URL=postgres://user:pass@db:5432/idemgate \
#     -v "$PWD/my-gateway.toml:/etc/idemgate/gateway.toml:ro" idemgate
#
# The baked-in /etc/idemgate/gateway.toml is the README demo config: its
# upstream is 127.0.0.1:9000 and its admin listener 127.0.0.1:9090, which is
# the container's own loopback. Mount your own config, with
# admin_listen = "0.0.0.0:9090" if the admin port should be reachable.
# POST /keys (key administration) is refused unless admin_token is set
# (IDEMGATE_ADMIN_TOKEN in the shipped configs).

# ---- build ------------------------------------------------------------------
FROM rust:1-bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src

# Dependency layer: build the gateway's dependencies against stub sources,
# so a source change does not rebuild them (the model checker's are never
# built here). The workspace's manifests,
# crates/store/build.rs and migrations/ are real (it watches migrations/, and
# sqlx::migrate! embeds it when the store crate compiles).
COPY Cargo.toml Cargo.lock ./
COPY crates/core/Cargo.toml crates/core/
COPY crates/store/Cargo.toml crates/store/build.rs crates/store/
COPY crates/model/Cargo.toml crates/model/
COPY migrations ./migrations
RUN mkdir -p src crates/core/src crates/store/src crates/model/src \
 && echo 'fn main() {}' > src/main.rs \
 && for crate in src crates/core/src crates/store/src crates/model/src; do echo '//! stub' > "$crate/lib.rs"; done \
 && cargo build --profile dist --locked -p idemgate \
 && rm -rf src crates/core/src crates/store/src crates/model/src

# The real sources. COPY keeps the files' own mtimes, which may be older than
# the stub build: touch the crate roots so cargo rebuilds the workspace's crates.
COPY . .
# The two binaries only (no example, test or bench target): those would
# bring the dev-dependencies' features, the test-only failpoints among them.
RUN touch src/main.rs src/lib.rs src/bin/demo_upstream.rs crates/core/src/lib.rs crates/store/src/lib.rs \
 && cargo build --profile dist --locked -p idemgate --bin idemgate --bin demo_upstream \
 && ./target/dist/idemgate --version | grep -q "^idemgate "

# The runtime's files, gathered for a base-less image: the shared libraries
# the two binaries load (found by ldd: glibc, libm, libgcc_s, the loader),
# the CA roots (https:// upstreams, rediss://, PostgreSQL over TLS verify
# against them) and an account for uid 10001.
RUN mkdir -p /rootfs/etc/ssl/certs \
 && ldd target/dist/idemgate target/dist/demo_upstream \
      | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u \
      | xargs -I{} cp --parents -L {} /rootfs/ \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && echo 'idemgate:x:10001:10001:idemgate:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd \
 && echo 'idemgate:x:10001:' > /rootfs/etc/group

# ---- runtime ----------------------------------------------------------------
# No base image, no shell, no package manager: the binaries, their libraries,
# the CA roots and a passwd entry (under 40 MB).
FROM scratch
COPY --from=build /rootfs/ /
COPY --from=build /src/target/dist/idemgate /usr/local/bin/idemgate
# The README's demo upstream, for docker-compose.yml (entrypoint demo_upstream).
COPY --from=build /src/target/dist/demo_upstream /usr/local/bin/demo_upstream
COPY gateway.toml /etc/idemgate/gateway.toml
# The image runs on PostgreSQL, named explicitly: the shipped config's
# sqlite:// fallback would put records on the container's own disk. Override
# with -e DATABASE_URL=postgres://… (or sqlite:///data/idemgate.db with a
# volume at /data, for one container beside the API it protects).
ENV IDEMGATE_CONFIG=/etc/idemgate/gateway.toml \
    IDEMGATE_LOG_FORMAT=json \
    DATABASE_URL=postgres://postgres@postgres:5432/postgres \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001:10001
# 8080: the proxy (listen); 9090: /healthz and /readyz (admin_listen).
EXPOSE 8080 9090
# The binary probes its own admin listener (admin_listen from the config; an
# unspecified IP such as 0.0.0.0 is probed on loopback): no shell or curl needed.
# (podman keeps a HEALTHCHECK only in the docker format: --format docker.)
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/idemgate", "health"]
ENTRYPOINT ["/usr/local/bin/idemgate"]
CMD ["serve"]
