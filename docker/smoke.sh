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
#
# `bash docker/smoke.sh --compose` runs the repository's docker-compose.yml,
# unchanged, as a user would (`docker compose`, or podman-compose where there
# is no docker), as project idemgate-smoke: the stack comes up, PostgreSQL
# and Redis pass their compose healthchecks, idemgate becomes ready
# (127.0.0.1:9090/readyz), a keyed POST through port 8080 is forwarded and
# its retry replayed, the idemgate container is restarted and the retry is
# still replayed (the record is in PostgreSQL), and `down -v` leaves no
# container and no volume of the project. Ports 8080 and 9090 must be free.
# `postgres:*` and `redis:*` images that cannot be pulled get stand-ins
# built from Debian bookworm's packages (PostgreSQL 15, Redis 7.0) with an
# entrypoint honouring what the compose file relies on (POSTGRES_PASSWORD,
# POSTGRES_DB, the data volume, port 5432, pg_isready; redis-server and
# redis-cli, /data), again for this check only.
# Its negative control: `SMOKE_NEGATIVE=nostore bash docker/smoke.sh
# --compose` sets IDEMGATE_STORE=memory://, so the record does not survive
# the restart, and the run must fail at the check after the restart.
set -euo pipefail

mode=image
case "${1:-}" in
    --compose) mode=compose ;;
    "") ;;
    *) printf 'usage: bash docker/smoke.sh [--compose]\n' >&2; exit 2 ;;
esac

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
    if [[ -n "${compose_up:-}" ]]; then
        "${compose[@]}" down -v >/dev/null 2>&1 || true
        "${engine[@]}" network rm "${project}_default" >/dev/null 2>&1 || true
    fi
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

# A Debian bookworm minbase root with PACKAGES installed from the mirror apt
# uses; no service is started while they install (policy-rc.d) and no
# PostgreSQL cluster is made (the stand-in's entrypoint makes one).
debian_root() {
    local rootfs=$1; shift
    command -v debootstrap >/dev/null || fail "debootstrap is needed for stand-ins"
    if [[ ! -d "$work/debian-root" ]]; then
        debootstrap --variant=minbase bookworm "$work/debian-root" "$(mirror)" >"$work/debootstrap.log" 2>&1 \
            || { tail -n 20 "$work/debootstrap.log" >&2; fail "debootstrap"; }
    fi
    cp -a "$work/debian-root" "$rootfs"
    printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
    chmod 755 "$rootfs/usr/sbin/policy-rc.d"
    mkdir -p "$rootfs/etc/postgresql-common"
    echo 'create_main_cluster = false' > "$rootfs/etc/postgresql-common/createcluster.conf"
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    { chroot "$rootfs" apt-get update -q \
        && chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        && chroot "$rootfs" apt-get clean; } >"$work/apt.log" 2>&1 \
        || { tail -n 20 "$work/apt.log" >&2; fail "installing $* in a Debian root"; }
    rm -rf "$rootfs/var/lib/apt/lists/"* "$rootfs/usr/sbin/policy-rc.d"
}

# postgres:16-bookworm's contract as docker-compose.yml uses it: an initdb on
# first start only (the data volume keeps it), password auth for the user
# postgres over TCP (POSTGRES_PASSWORD), POSTGRES_DB created, listening on
# every interface, pg_isready on PATH. Debian bookworm ships PostgreSQL 15.
stand_in_postgres() {
    local name=$1 rootfs="$work/postgres-root" version
    note "building a local stand-in for $name: Debian bookworm minbase + postgresql (Debian's PostgreSQL 15, not 16) + an entrypoint for POSTGRES_PASSWORD, POSTGRES_DB and the data volume (this check only)"
    debian_root "$rootfs" postgresql
    version=$(ls "$rootfs/usr/lib/postgresql")
    cat >"$rootfs/usr/local/bin/docker-entrypoint.sh" <<'SH'
#!/bin/bash
# Stand-in entrypoint (idemgate's docker/smoke.sh): the official image's
# contract, as far as docker-compose.yml relies on it.
set -euo pipefail
if [[ "${1:-}" != postgres ]]; then exec "$@"; fi
shift
if [[ "$(id -u)" == 0 ]]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid="$(id -u postgres)" --regid="$(id -g postgres)" --init-groups "$0" postgres "$@"
fi
if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
    pwfile=$(mktemp)
    printf '%s
' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" -U postgres --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    echo 'host all all all scram-sha-256' >> "$PGDATA/pg_hba.conf"
    if [[ -n "${POSTGRES_DB:-}" && "$POSTGRES_DB" != postgres ]]; then
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
        psql -v ON_ERROR_STOP=1 -U postgres -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
        pg_ctl -D "$PGDATA" -m fast -w stop
    fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
SH
    chmod 755 "$rootfs/usr/local/bin/docker-entrypoint.sh"
    tar -C "$rootfs" -c . | "${engine[@]}" import \
        --change "ENV PATH=/usr/lib/postgresql/$version/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change 'ENV PGDATA=/var/lib/postgresql/data' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
        --change 'CMD ["postgres"]' \
        --change 'STOPSIGNAL SIGINT' \
        --change 'EXPOSE 5432' \
        - "$name" >/dev/null 2>"$work/import.log" || { cat "$work/import.log" >&2; fail "importing $name"; }
    rm -rf "$rootfs"
}

# redis:7-bookworm's contract as docker-compose.yml uses it: redis-server and
# redis-cli on PATH, /data the working directory (the appendonly files land
# in the volume), the command given, run as the user redis, and (as the
# official entrypoint does without a config file) --protected-mode no.
stand_in_redis() {
    local name=$1 rootfs="$work/redis-root"
    note "building a local stand-in for $name: Debian bookworm minbase + redis-server (Debian's Redis 7.0) + an entrypoint (this check only)"
    debian_root "$rootfs" redis-server
    mkdir -p "$rootfs/data"
    cat >"$rootfs/usr/local/bin/docker-entrypoint.sh" <<'SH'
#!/bin/bash
# Stand-in entrypoint (idemgate's docker/smoke.sh): the official image's
# contract, as far as docker-compose.yml relies on it.
set -euo pipefail
if [[ "${1:-}" == -* || "${1:-}" == *.conf ]]; then set -- redis-server "$@"; fi
if [[ "${1:-}" == redis-server && "$(id -u)" == 0 ]]; then
    chown -R redis:redis .
    exec setpriv --reuid="$(id -u redis)" --regid="$(id -g redis)" --init-groups "$0" "$@"
fi
if [[ "${1:-}" == redis-server && "${2:-}" != *.conf && " $* " != *" --protected-mode "* ]]; then
    set -- "$@" --protected-mode no
fi
exec "$@"
SH
    chmod 755 "$rootfs/usr/local/bin/docker-entrypoint.sh"
    tar -C "$rootfs" -c . | "${engine[@]}" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'WORKDIR /data' \
        --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
        --change 'CMD ["redis-server"]' \
        --change 'EXPOSE 6379' \
        - "$name" >/dev/null 2>"$work/import.log" || { cat "$work/import.log" >&2; fail "importing $name"; }
    rm -rf "$rootfs"
}

ensure_image() {
    local image=$1 what=${2:-image}
    [[ "$image" == scratch ]] && return 0
    if "${engine[@]}" image exists "$image" 2>/dev/null \
        || "${engine[@]}" image inspect "$image" >/dev/null 2>&1; then
        note "$what $image: present"
    elif "${engine[@]}" pull "$image" >/dev/null 2>&1; then
        note "$what $image: pulled"
    else
        image=${image#docker.io/}
        image=${image#library/}
        case "$image" in
            rust:*) stand_in_rust "docker.io/library/$image" ;;
            postgres:*) stand_in_postgres "docker.io/library/$image" ;;
            redis:*) stand_in_redis "docker.io/library/$image" ;;
            *) fail "$what $image cannot be pulled, and this script has no stand-in for it" ;;
        esac
    fi
}

while read -r image; do
    ensure_image "$image" "base image"
done < <(awk 'toupper($1) == "FROM" { print $2 }' Dockerfile | sort -u)


# --- --compose: the repository's docker-compose.yml, unchanged -------------------
if [[ "$mode" == compose ]]; then
    project=idemgate-smoke
    if [[ "${engine[0]}" == docker ]] && docker compose version >/dev/null 2>&1; then
        compose=(docker compose -p "$project" -f docker-compose.yml)
        compose_tool="docker compose"
    elif [[ "${engine[0]}" == podman ]] && command -v podman-compose >/dev/null 2>&1; then
        # podman-compose calls `podman`: give it one with this host's flags.
        printf '#!/bin/sh\nexec podman --runtime /usr/sbin/runc --cgroup-manager=cgroupfs "$@"\n' > "$work/podman"
        chmod 755 "$work/podman"
        compose=(podman-compose -p "$project" -f docker-compose.yml --podman-path "$work/podman"
            --podman-run-args "${ulimits[*]}" --podman-build-args "${build_flags[*]}")
        compose_tool="podman-compose $(podman-compose version 2>/dev/null | sed -n 's/^podman-compos[a-z]* version *//p')"
    else
        fail "--compose needs \`docker compose\` or podman-compose"
    fi
    note "compose: $compose_tool, project $project"
    for port in 8080 9090; do
        if ss -ltnH "sport = :$port" 2>/dev/null | grep -q .; then fail "port $port is in use on this host"; fi
    done
    # The compose file's images that are pulled, not built.
    for image in $(awk '$1 == "image:" { print $2 }' docker-compose.yml | grep -v '^idemgate:' | sort -u); do
        ensure_image "$image"
    done

    # What the user's shell could add: the check runs the file's defaults.
    unset IDEMGATE_STORE IDEMGATE_ADMIN_TOKEN
    if [[ "${SMOKE_NEGATIVE:-}" == nostore ]]; then
        note "negative control: IDEMGATE_STORE=memory://; the record must not survive the restart"
        export IDEMGATE_STORE=memory://
    fi

    cid() {
        "${engine[@]}" ps -aq --filter "label=com.docker.compose.project=$project" \
            --filter "label=com.docker.compose.service=$1" | head -n1
    }
    healthy() {
        local id
        id=$(cid "$1")
        [[ -n "$id" ]] || return 1
        if [[ "${engine[0]}" == podman ]]; then
            # podman 4 runs healthchecks from systemd timers; without systemd
            # this runs the container's healthcheck itself.
            "${engine[@]}" healthcheck run "$id" >/dev/null 2>&1
        else
            [[ "$(docker inspect --format '{{.State.Health.Status}}' "$id")" == healthy ]]
        fi
    }
    wait_healthy() {
        for _ in $(seq 1 60); do healthy "$1" && return 0; sleep 1; done
        "${engine[@]}" logs "$(cid "$1")" >&2 || true
        fail "$1 did not become healthy within 60 s"
    }
    wait_ready() {
        for _ in $(seq 1 120); do
            curl -fsS http://127.0.0.1:9090/readyz >/dev/null 2>&1 && return 0
            sleep 0.5
        done
        "${engine[@]}" logs "$(cid idemgate)" >&2 || true
        fail "idemgate never became ready on 127.0.0.1:9090/readyz"
    }
    # The request docker-compose.yml's comment gives.
    post() {
        curl -sS -D "$work/headers" -o "$work/body" -w '%{http_code}' -X POST \
            localhost:8080/v1/payments -H 'Idempotency-Key: k1' -d '{"amount": 1200}'
    }
    replayed() {
        local code
        code=$(post) || return 1
        [[ "$code" == "$first" ]] && grep -qi '^idempotent-replayed: true' "$work/headers" \
            && [[ "$(cat "$work/body")" == "$first_body" ]]
    }

    started=$(date +%s)
    # (podman-compose 1.0.3 exits 0 when a build fails: it prints the status.)
    if ! "${compose[@]}" build >"$work/build.log" 2>&1 || grep -q '^exit code: [1-9]' "$work/build.log"; then
        tail -n 40 "$work/build.log" >&2
        fail "\`${compose_tool%% *} build\` fails"
    fi
    ok "the stack's image builds from the unchanged Dockerfile ($compose_tool build, $(( $(date +%s) - started )) s)"

    started=$(date +%s)
    compose_up=yes
    if [[ "${engine[0]}" == podman ]]; then
        # podman-compose starts services in depends_on order but does not
        # wait for `condition: service_healthy`: start the dependencies,
        # wait for their healthchecks, then the rest (what docker compose does).
        "${compose[@]}" up -d postgres redis upstream >"$work/up.log" 2>&1 \
            || { tail -n 40 "$work/up.log" >&2; fail "\`up -d\` of the dependencies fails"; }
        wait_healthy postgres
        wait_healthy redis
        "${compose[@]}" up -d >>"$work/up.log" 2>&1 \
            || { tail -n 40 "$work/up.log" >&2; fail "\`up -d\` fails"; }
    else
        "${compose[@]}" up -d >"$work/up.log" 2>&1 \
            || { tail -n 40 "$work/up.log" >&2; fail "\`up -d\` fails"; }
    fi
    wait_healthy postgres
    ok "postgres is healthy (the compose healthcheck: pg_isready -U postgres -d idemgate)"
    wait_healthy redis
    ok "redis is healthy (the compose healthcheck: redis-cli ping)"
    wait_ready
    ok "idemgate is ready: 127.0.0.1:9090/readyz ($(( $(date +%s) - started )) s after up)"
    wait_healthy idemgate
    ok "idemgate's image HEALTHCHECK passes (idemgate health)"

    first=$(post) || fail "the keyed POST through localhost:8080 fails"
    [[ "$first" == 2?? ]] || fail "the keyed POST got $first: $(cat "$work/body")"
    first_body=$(cat "$work/body")
    ok "a keyed POST through localhost:8080 is forwarded: $first $first_body"
    replayed || fail "the retry was not replayed: $(cat "$work/headers")"
    ok "its retry is replayed (Idempotent-Replayed: true, the same body)"

    "${compose[@]}" restart idemgate >"$work/restart.log" 2>&1 \
        || { cat "$work/restart.log" >&2; fail "\`restart idemgate\` fails"; }
    wait_ready
    replayed || fail "after \`restart idemgate\` the retry was not replayed: $(head -n1 "$work/headers" | tr -d '\r') $(cat "$work/body")"
    ok "after \`restart idemgate\` the retry is still replayed (the record survived the restart)"
    rows=$("${engine[@]}" exec "$(cid postgres)" psql -U postgres -d idemgate -Atc \
        "SELECT route || ' ' || key || ' ' || state FROM idemgate_records WHERE key = 'k1'" 2>&1) \
        || fail "cannot read idemgate_records in the compose PostgreSQL: $rows"
    [[ "$rows" == "payments k1 completed" ]] || fail "the compose PostgreSQL holds no completed record for k1: $rows"
    ok "the record is in the compose PostgreSQL (idemgate_records: $rows)"

    "${compose[@]}" down -v >"$work/down.log" 2>&1 || { cat "$work/down.log" >&2; fail "\`down -v\` fails"; }
    compose_up=""
    left=$("${engine[@]}" ps -aq --filter "label=com.docker.compose.project=$project")
    [[ -z "$left" ]] || fail "containers left after \`down -v\`: $left"
    left=$("${engine[@]}" volume ls -q | grep "^${project}_" || true)
    [[ -z "$left" ]] || fail "volumes left after \`down -v\`: $left"
    ok "\`down -v\` leaves no container and no volume of the project"
    network=$("${engine[@]}" network ls -q --filter "name=^${project}_" || true)
    if [[ -n "$network" ]]; then
        note "podman-compose leaves its network ($network); removed"
        "${engine[@]}" network rm $network >/dev/null
    fi

    echo "all compose checks passed: docker-compose.yml, $compose_tool, ${engine[0]}"
    exit 0
fi

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
