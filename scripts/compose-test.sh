#!/usr/bin/env bash
# `make test-compose`: the compose deployment brought up for real and driven as a user would, on a machine
# without a Docker engine (this project's Debian machines, as root): Debian's podman serves the Docker API on
# a unix socket and Debian's docker-compose CLI talks to it, with the repository's own compose files plus
# the overrides for what differs from a Docker host (compose/podman*.yml: the sandbox's /proc; compose/ci.yml:
# this machine's networking, a local repository target, a local Slack endpoint).
#
# Steps (each wait has a timeout; a failure prints the services' logs and takes the stack down):
#   1. podman, runc, docker-compose, debootstrap... from Debian's packages when missing;
#   2. containers.conf (runc, ulimits this sandbox can grant) and `podman system service` on a socket;
#   3. a Debian bookworm base from `debootstrap --variant=minbase` + `podman import`, and stand-ins for the
#      python, postgres, redis and nginx images docker-compose.yml names, built from Debian's packages under those
#      names (cached in podman's storage, rebuilt when compose/ci/ changes);
#   4. a loopback package index serving the CPU torch wheel (found by `pip download`: a wheelhouse on disk or
#      the pip cache), the worker image's TORCH_INDEX_URL; and the stack's own package index (scripts/compose_index.py,
#      served by compose/ci.yml's `index`): the llama-cpp-python release of step 6 and what building it needs;
#   5. the images built once each (api, worker), one after the other; `up -d`;
#   6. scripts/compose_drive.py: a signed push of a good and a bad commit, the runs in the worker's sandbox, a
#      confirmed violation alert, the Slack message, the history through the API and the CLI; then a llama.cpp
#      release (SPECWATCH_COMPOSE_LLAMACPP, default llama-cpp-python==0.3.36) found by the release poller, compiled
#      by the worker's sandboxed install step inside its container from an empty release cache and run with the
#      quick profile (its cold build: most of this tier's time); then `down -v`.
#
# Idempotent: a stack left over by an earlier run is taken down first. Environment: SPECWATCH_COMPOSE_CACHE
# (default /var/cache/specwatch-compose), SPECWATCH_COMPOSE_TIMEOUT_S (the whole run's deadline, default 5400),
# SPECWATCH_COMPOSE_LLAMACPP_S (the llama.cpp release's run: queued to finished, default 3000).
# SPECWATCH_COMPOSE_PYTHON: the interpreter of the driver (needs httpx; `make test-compose` gives the venv's).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CACHE=${SPECWATCH_COMPOSE_CACHE:-/var/cache/specwatch-compose}
PROJECT=specwatch-ci
INDEX_PORT=${SPECWATCH_COMPOSE_INDEX_PORT:-18931}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
START=$(date +%s)
DEADLINE=$((START + ${SPECWATCH_COMPOSE_TIMEOUT_S:-5400}))
LLAMACPP=${SPECWATCH_COMPOSE_LLAMACPP:-llama-cpp-python==0.3.36}
LLAMACPP_S=${SPECWATCH_COMPOSE_LLAMACPP_S:-3000}
mkdir -p "$CACHE"
# One run at a time on a machine: they share the socket, the project name and the ports.
exec 9> "$CACHE/lock"
flock -w 900 9 || { echo "another scripts/compose-test.sh still runs after 900 s" >&2; exit 1; }

say() { printf '[compose-test %4ds] %s\n' "$(($(date +%s) - START))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }
left() { local n=$((DEADLINE - $(date +%s))); [ "$n" -gt 0 ] || fail "out of time"; echo "$n"; }
# `bounded SECONDS CMD...`: CMD with a timeout that never passes the whole run's deadline.
bounded() { local s=$1; shift; local l; l=$(left); [ "$s" -lt "$l" ] || s=$l; timeout --kill-after=30 "$s" "$@"; }

[ "$(id -u)" = 0 ] || fail "run as root (rootful podman)"

# ------------------------------------------------------------------------------------------ 1. tools
need=()
for tool in podman:podman runc:runc newuidmap:uidmap slirp4netns:slirp4netns pasta:passt fuse-overlayfs:fuse-overlayfs \
            catatonit:catatonit debootstrap:debootstrap docker-compose:docker-compose; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/libexec/podman/${tool%%:*}" ] || need+=("${tool#*:}")
done
# The services find each other by name: podman's CNI networks need the dnsname plugin (only recommended by podman).
[ -x /usr/lib/cni/dnsname ] || need+=(golang-github-containernetworking-plugin-dnsname)
if [ "${#need[@]}" -gt 0 ]; then
    say "installing ${need[*]}"
    bounded 600 apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive bounded 900 apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# ------------------------------------------------------------------------- 2. podman's Docker API
# runc: crun is not in bookworm's podman dependencies. The ulimits: podman's defaults (nofile 1048576) are
# above what this sandbox grants, and a container whose limits cannot be set does not start; nproc above
# 32768 is refused here even below the hard limit `ulimit -Hu` shows.
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ] && nofile=65536
[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
cat > "$CACHE/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$CACHE/containers.conf
SOCKET=$CACHE/podman.sock
export DOCKER_HOST=unix://$SOCKET DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0
SERVICE_PID=
start_service() {
    rm -f "$SOCKET"
    podman system service --time=0 "unix://$SOCKET" > "$CACHE/podman-service.log" 2>&1 &
    SERVICE_PID=$!
    for _ in $(seq 60); do [ -S "$SOCKET" ] && curl -sf --unix-socket "$SOCKET" http://d/_ping >/dev/null && return 0; sleep 1; done
    cat "$CACHE/podman-service.log"; fail "podman's API service did not answer on $SOCKET within 60 s"
}
stop_service() { if [ -n "$SERVICE_PID" ]; then kill "$SERVICE_PID" 2>/dev/null || true; wait "$SERVICE_PID" 2>/dev/null || true; SERVICE_PID=; fi; }
INDEX_PID=
HEALTH_PID=
COMPOSE_FILES=(-f docker-compose.yml -f docker-compose.cpu.yml -f compose/podman.yml -f compose/podman-cpu.yml -f compose/ci.yml)
compose() { bounded "${COMPOSE_STEP_S:-600}" docker-compose --project-name "$PROJECT" --env-file "$CACHE/ci.env" "${COMPOSE_FILES[@]}" "$@"; }
# `down -v`, and whatever of this project it leaves (a stack whose env file is gone cannot be brought down).
remove_project() {
    COMPOSE_STEP_S=180 compose down -v --remove-orphans >/dev/null 2>&1 || true
    local label="label=com.docker.compose.project=$PROJECT" ids
    ids=$(podman ps -aq --filter "$label" 2>/dev/null) && [ -z "$ids" ] || podman rm -f $ids >/dev/null 2>&1 || true
    ids=$(podman volume ls -q --filter "$label" 2>/dev/null) && [ -z "$ids" ] || podman volume rm -f $ids >/dev/null 2>&1 || true
    podman network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true
}
UP=0
cleanup() {
    local rc=$?
    [ -n "$HEALTH_PID" ] && kill "$HEALTH_PID" 2>/dev/null
    if [ "$UP" = 1 ]; then
        if [ "$rc" != 0 ]; then
            say "services' states and logs:"
            compose ps -a || true
            compose logs --no-color --tail 80 || true
        fi
        say "down -v"
        remove_project
    fi
    [ -n "$INDEX_PID" ] && kill "$INDEX_PID" 2>/dev/null
    stop_service
    say "exit $rc after $(($(date +%s) - START)) s"
}
trap cleanup EXIT
start_service

# A stack left by an interrupted run.
touch "$CACHE/ci.env"
remove_project

# ------------------------------------------------------------------ 3. base image and stand-ins
if ! podman image exists localhost/specwatch-ci/bookworm:latest; then
    say "debootstrap --variant=minbase bookworm (a few minutes, once)"
    rm -rf "$CACHE/rootfs"
    bounded 1200 debootstrap --variant=minbase bookworm "$CACHE/rootfs" http://deb.debian.org/debian > "$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log"; fail "debootstrap"; }
    # The image's apt sees the same mirror; its caches go.
    rm -rf "$CACHE/rootfs/var/cache/apt/archives/"*.deb "$CACHE/rootfs/var/lib/apt/lists/"*
    tar -C "$CACHE/rootfs" -c . | bounded 600 podman import --change 'CMD ["/bin/bash"]' - localhost/specwatch-ci/bookworm:latest >/dev/null
    rm -rf "$CACHE/rootfs"
fi
# Each stand-in is labelled with the digest of its own files (compose/ci/NAME.Containerfile and NAME-*): a change
# to one rebuilds that one only.
for standin in python:python:3.11-slim-bookworm postgres:postgres:17-bookworm redis:redis:7-bookworm nginx:nginx:1.27-bookworm; do
    file=${standin%%:*}; tag=docker.io/library/${standin#*:}
    STANDINS=$(find compose/ci -name "$file.Containerfile" -o -name "$file-*" | sort | xargs cat | sha256sum | cut -c1-16)
    if [ "$(podman image inspect --format '{{ index .Labels "specwatch.standin" }}' "$tag" 2>/dev/null)" != "$STANDINS" ]; then
        say "building the stand-in $tag from Debian's packages"
        bounded 900 podman build --network host --label "specwatch.standin=$STANDINS" -f "compose/ci/$file.Containerfile" -t "$tag" compose/ci \
            > "$CACHE/standin-$file.log" 2>&1 || { tail -30 "$CACHE/standin-$file.log"; fail "stand-in $tag"; }
    fi
done

# ------------------------------------------------------------------- 4. the loopback package index
WHEELS=$CACHE/index/wheels
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/torch-*.whl >/dev/null 2>&1; then
    say "pip download $TORCH_SPEC (CPU build)"
    # +cpu: only the CPU build. From a wheelhouse or index pip is configured with, else the PyTorch index.
    bounded 1200 python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --dest "$WHEELS" \
        --extra-index-url https://download.pytorch.org/whl/cpu "$TORCH_SPEC+cpu" || fail "cannot download $TORCH_SPEC+cpu"
fi
rm -rf "$CACHE/index/simple" && mkdir -p "$CACHE/index/simple/torch"
for wheel in "$WHEELS"/torch-*.whl; do
    name=$(basename "$wheel")
    printf '<a href="../../wheels/%s#sha256=%s">%s</a>\n' "$name" "$(sha256sum "$wheel" | cut -d' ' -f1)" "$name"
done > "$CACHE/index/simple/torch/index.html"
python3 -m http.server --bind 127.0.0.1 --directory "$CACHE/index" "$INDEX_PORT" > "$CACHE/index.log" 2>&1 &
INDEX_PID=$!
# The stack's: downloaded once (kept in the cache), its pages written each run.
say "the stack's package index: $LLAMACPP and what building it needs"
bounded 1200 "${SPECWATCH_COMPOSE_PYTHON:-python3}" scripts/compose_index.py "$CACHE/stack-index" "$LLAMACPP" || fail "the stack's package index"

# ------------------------------------------------------------------------ 5. images, then up
# The shell's variables win over the env file in compose: the host's own pip settings (a wheelhouse path of
# this machine, say) must not reach the builds.
# Nor this shell's SPECWATCH_* settings the containers (settings are passed by name, from the env file or the shell).
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_TRUSTED_HOST TORCH_VARIANT TORCH_INDEX_URL COMPOSE_FILE COMPOSE_PROFILES
for name in $(compgen -e | grep '^SPECWATCH_' | grep -v '^SPECWATCH_COMPOSE_'); do unset "$name"; done
# The deployment's secrets (random per run) and the CI overrides' settings: compose reads them for ${...}.
API_TOKEN=$(openssl rand -hex 24)
cat > "$CACHE/ci.env" <<EOF
POSTGRES_PASSWORD=$(openssl rand -hex 16)
REDIS_PASSWORD=$(openssl rand -hex 16)
SPECWATCH_WEBHOOK_SECRET=$(openssl rand -hex 16)
SPECWATCH_API_TOKEN_HASHES=$(printf %s "$API_TOKEN" | sha256sum | cut -d' ' -f1)
TORCH_VARIANT=cpu
TORCH_INDEX_URL=http://127.0.0.1:$INDEX_PORT/simple
PIP_TRUSTED_HOST=127.0.0.1
API_PORT=${SPECWATCH_COMPOSE_API_PORT:-18930}
SLACK_PORT=${SPECWATCH_COMPOSE_SLACK_PORT:-18932}
SPECWATCH_COMPOSE_REPOS=$CACHE/repos
SPECWATCH_COMPOSE_INDEX=$CACHE/stack-index
SPECWATCH_COMPOSE_LLAMACPP=$LLAMACPP
SPECWATCH_COMPOSE_LLAMACPP_S=$LLAMACPP_S
EOF
# This machine's TLS-intercepting proxy (if any): pip inside the build trusts what the host trusts.
for bundle in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
    if [ -n "$bundle" ] && [ -f "$bundle" ]; then cp "$bundle" compose/pip/ca-bundle.crt; break; fi
done
# podman's API service can panic when a build client goes away: one image at a time, the service restarted
# and the build tried once more on a failure.
for service in api worker; do
    say "building the $service image"
    if ! COMPOSE_STEP_S=2400 compose build "$service" > "$CACHE/build-$service.log" 2>&1; then
        tail -5 "$CACHE/build-$service.log"; say "retrying the $service build after restarting podman's API service"
        stop_service; start_service
        COMPOSE_STEP_S=2400 compose build "$service" > "$CACHE/build-$service.log" 2>&1 || { tail -40 "$CACHE/build-$service.log"; fail "building $service"; }
    fi
done
mkdir -p "$CACHE/repos"
UP=1
# podman runs no healthchecks without systemd: run them while the stack lives, for `depends_on` and `ps`.
(
    while sleep 3; do
        for c in $(podman ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}'); do
            podman healthcheck run "$c" >/dev/null 2>&1 || true
        done
    done
) &
HEALTH_PID=$!
say "up -d"
COMPOSE_STEP_S=600 compose up -d --no-build || fail "up"
compose ps -a

# ---------------------------------------------------------------------------------- 6. the drive
say "driving the stack"
SPECWATCH_COMPOSE_PROJECT=$PROJECT SPECWATCH_API_TOKEN=$API_TOKEN SPECWATCH_COMPOSE_ENV_FILE=$CACHE/ci.env \
    bounded $((LLAMACPP_S + 1800)) "${SPECWATCH_COMPOSE_PYTHON:-python3}" scripts/compose_drive.py "${COMPOSE_FILES[@]}" || fail "the drive"
say "services after the drive:"
compose ps -a
say "PASSED"
