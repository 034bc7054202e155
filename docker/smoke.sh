#!/usr/bin/env bash
# Build the image from the unchanged Dockerfile and run it as a user would:
# against a real PostgreSQL, in front of a real upstream, and check what a
# deployment relies on. Exits non-zero on the first failure; prints each
# check as it passes.
#
#   bash docker/smoke.sh              # docker, or podman if there is no docker
#   SMOKE_PG=postgres://postgres@127.0.0.1:5432/postgres bash docker/smoke.sh
#
# Checks: the image builds; it is under 40 MB; `idemgate --version` runs in
# it; the gateway in it becomes ready on its admin port; a keyed POST is
# forwarded and its retry replayed; the process runs as uid 10001, not
# root; the image's HEALTHCHECK passes; SIGTERM drains and exits 0 within
# shutdown_timeout.
#
# Where a base image named in a FROM cannot be pulled (no registry
# reachable), a local stand-in with the same name is built first and this
# says so: for `rust:*`, a Debian minbase root (debootstrap) with
# build-essential, the host's Rust toolchain and the host's CA bundle.
# Stand-ins exist for this check only; they are never what users run
# (`podman rmi` one to have it built again). `FROM scratch` needs none.
#
# Its negative control: `SMOKE_NEGATIVE=root bash docker/smoke.sh` runs the
# gateway as root (`--user 0`), and the run must fail at the uid check.
#
# Needs: docker or podman; curl; psql; for stand-ins debootstrap, the
# Debian mirror apt uses, and a Rust toolchain under ~/.rustup.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tag=${SMOKE_TAG:-idemgate:smoke}
pg_admin=${SMOKE_PG:-postgres://postgres@127.0.0.1:5432/postgres}
limit_mb=40
work=$(mktemp -d)
container=idemgate-smoke-$$
upstream_container=idemgate-smoke-upstream-$$

ok() { printf 'ok   %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*" >&2; exit 1; }
note() { printf '     %s\n' "$*"; }

# --- the engine ---------------------------------------------------------------
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=(docker)
    build_flags=()
    run_flags=()
elif command -v podman >/dev/null 2>&1; then
    # podman on a host with a hybrid cgroup setup: runc and cgroupfs, and no
    # default ulimits it could not apply (see docs/src/operations/docker.md).
    printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
    export CONTAINERS_CONF="$work/containers.conf"
    engine=(podman --runtime /usr/sbin/runc --cgroup-manager=cgroupfs)
    ulimits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
    # The docker format keeps the HEALTHCHECK (OCI images have none).
    build_flags=(--format docker "${ulimits[@]}")
    run_flags=("${ulimits[@]}")
else
    fail "neither docker nor podman is available"
fi
note "engine: ${engine[0]}"

cleanup() {
    "${engine[@]}" rm -f "$container" "$upstream_container" >/dev/null 2>&1 || true
    if [[ -n "${db:-}" ]]; then
        psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# --- base images: pulled, or a stand-in -------------------------------------
mirror() {
    sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1
}

stand_in_rust() {
    local name=$1 rootfs="$work/rust-root" toolchain
    toolchain=$(ls -d "$HOME"/.rustup/toolchains/stable-* 2>/dev/null | head -n1)
    [[ -n "$toolchain" ]] || fail "no Rust toolchain under ~/.rustup for the $name stand-in"
    command -v debootstrap >/dev/null || fail "debootstrap is needed for the $name stand-in"
    note "building a local stand-in for $name: Debian bookworm minbase + build-essential + $(basename "$toolchain") (this check only)"
    debootstrap --variant=minbase --include=build-essential,ca-certificates,pkg-config \
        bookworm "$rootfs" "$(mirror)" >"$work/debootstrap.log" 2>&1 \
        || { tail -n 20 "$work/debootstrap.log" >&2; fail "debootstrap for $name"; }
    mkdir -p "$rootfs/usr/local/rust" "$rootfs/usr/local/cargo/bin"
    # The host's trust store: the registry may be reached through a proxy
    # whose CA only the host knows.
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    cp -a "$toolchain/." "$rootfs/usr/local/rust/"
    for bin in cargo rustc rustdoc; do
        ln -sf "/usr/local/rust/bin/$bin" "$rootfs/usr/local/cargo/bin/$bin"
    done
    tar -C "$rootfs" -c . | "${engine[@]}" import \
        --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV CARGO_HOME=/usr/local/cargo' \
        - "$name" >/dev/null
    rm -rf "$rootfs"
}

while read -r image; do
    [[ "$image" == scratch ]] && continue
    if "${engine[@]}" image exists "$image" 2>/dev/null \
        || "${engine[@]}" image inspect "$image" >/dev/null 2>&1; then
        note "base image $image: present"
    elif "${engine[@]}" pull "$image" >/dev/null 2>&1; then
        note "base image $image: pulled"
    else
        case "$image" in
            rust:* | */rust:*) stand_in_rust "docker.io/library/${image#docker.io/library/}" ;;
            *) fail "base image $image cannot be pulled, and this script has no stand-in for it" ;;
        esac
    fi
done < <(awk 'toupper($1) == "FROM" { print $2 }' Dockerfile | sort -u)

# --- build ----------------------------------------------------------------------
started=$(date +%s)
"${engine[@]}" build "${build_flags[@]}" -t "$tag" . >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; fail "the image does not build"; }
ok "the image builds from the unchanged Dockerfile ($(( $(date +%s) - started )) s)"

size=$("${engine[@]}" image inspect --format '{{.Size}}' "$tag")
size_mb=$(( size / 1000000 ))
(( size < limit_mb * 1000000 )) || fail "the image is $size_mb MB, over $limit_mb MB"
ok "the image is $size_mb MB ($size bytes), under $limit_mb MB"

version=$("${engine[@]}" run --rm "${run_flags[@]}" "$tag" --version)
[[ "$version" == idemgate\ * ]] || fail "\`idemgate --version\` printed: $version"
ok "\`idemgate --version\` in the image: $version"

# --- run against PostgreSQL, in front of an upstream ------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
proxy_port=$(free_port); admin_port=$(free_port); upstream_port=$(free_port)
db=idemgate_smoke_$$
psql "$pg_admin" -qc "CREATE DATABASE $db" >/dev/null || fail "cannot create a database at $pg_admin"
store_url="${pg_admin%/*}/$db"

"${engine[@]}" run -d --name "$upstream_container" --network host "${run_flags[@]}" \
    --entrypoint /usr/local/bin/demo_upstream "$tag" --listen "127.0.0.1:$upstream_port" >/dev/null

cat >"$work/gateway.toml" <<EOF
listen = "127.0.0.1:$proxy_port"
admin_listen = "127.0.0.1:$admin_port"
shutdown_timeout = "10s"
log_format = "json"
[store]
url = "$store_url"
migrate = true
[[routes]]
name = "payments"
match = "/v1/payments/*"
upstream = "http://127.0.0.1:$upstream_port"
EOF
chmod 644 "$work/gateway.toml"
chmod 755 "$work"

negative=()
if [[ "${SMOKE_NEGATIVE:-}" == root ]]; then
    note "negative control: the gateway runs as root; the uid check must fail"
    negative=(--user 0:0)
fi
"${engine[@]}" run -d --name "$container" --network host "${run_flags[@]}" "${negative[@]}" \
    -v "$work/gateway.toml:/etc/idemgate/gateway.toml:ro" "$tag" >/dev/null

ready=""
for _ in $(seq 1 120); do
    if curl -fsS "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1; then ready=yes; break; fi
    sleep 0.5
done
[[ -n "$ready" ]] || { "${engine[@]}" logs "$container" >&2 || true; fail "the gateway never became ready on its admin port"; }
ok "the gateway in the image is ready (/readyz on the admin port, store $store_url)"

post() {
    curl -sS -D "$work/headers" -o "$work/body" -w '%{http_code}' -X POST \
        "http://127.0.0.1:$proxy_port/v1/payments" -H 'Idempotency-Key: smoke-1' \
        -H 'Content-Type: application/json' -d '{"amount": 1200}'
}
first=$(post)
[[ "$first" == 201 ]] || fail "the keyed POST got $first: $(cat "$work/body")"
first_body=$(cat "$work/body")
ok "a keyed POST is forwarded: 201 $first_body"
second=$(post)
[[ "$second" == 201 ]] && grep -qi '^idempotent-replayed: true' "$work/headers" \
    && [[ "$(cat "$work/body")" == "$first_body" ]] \
    || fail "the retry was not replayed: $second $(cat "$work/headers")"
ok "its retry is replayed (Idempotent-Replayed: true, the same body)"

pid=$("${engine[@]}" inspect --format '{{.State.Pid}}' "$container")
uid=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
[[ "$uid" == 10001 ]] || fail "the gateway runs as uid $uid, not 10001"
ok "the gateway runs as uid 10001, not root"

if [[ "${engine[0]}" == podman ]]; then
    healthy=""
    for _ in $(seq 1 20); do
        if "${engine[@]}" healthcheck run "$container" >/dev/null 2>&1; then healthy=yes; break; fi
        sleep 1
    done
else
    healthy=""
    for _ in $(seq 1 60); do
        [[ "$(docker inspect --format '{{.State.Health.Status}}' "$container")" == healthy ]] && { healthy=yes; break; }
        sleep 1
    done
fi
[[ -n "$healthy" ]] || fail "the image's HEALTHCHECK does not pass"
ok "the image's HEALTHCHECK passes (idemgate health, no shell)"

"${engine[@]}" kill --signal TERM "$container" >/dev/null
stopped=""
for _ in $(seq 1 30); do
    if [[ "$("${engine[@]}" inspect --format '{{.State.Running}}' "$container")" == false ]]; then stopped=yes; break; fi
    sleep 0.5
done
[[ -n "$stopped" ]] || fail "the gateway did not stop within 15 s of SIGTERM (shutdown_timeout 10s)"
code=$("${engine[@]}" inspect --format '{{.State.ExitCode}}' "$container")
[[ "$code" == 0 ]] || { "${engine[@]}" logs "$container" >&2 || true; fail "SIGTERM: exit status $code"; }
"${engine[@]}" logs "$container" 2>&1 | grep -q 'idemgate stopped' || fail "no 'idemgate stopped' line after SIGTERM"
ok "SIGTERM drains and exits 0 within shutdown_timeout"

echo "all checks passed: $tag, $size_mb MB, ${engine[0]}"
