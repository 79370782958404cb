#!/usr/bin/env bash
# What the test suite needs besides .venv, made ready by `make test`, `make test-slow` and `make test-vllm` (so by
# `make test-all` and `.ci/run`); `make test-unit` runs it with `--tools`:
#
#   - PostgreSQL and Redis answering. The local servers (the default test URLs) are started when they are
#     down, as root; a server named by SPECWATCH_TEST_POSTGRES_URL / SPECWATCH_TEST_REDIS_URL is only checked.
#   - The system tools some tests drive (the `tool` lines below). Missing ones are installed from Debian with
#     apt-get when this runs as root on a machine that has it; otherwise it stops.
#
# Every stop is one line on stderr that says what to install or start, and exit status 1.
#   scripts/test-deps.sh             everything
#   scripts/test-deps.sh --dry-run   say what would be started or installed, change nothing
#   scripts/test-deps.sh --tools     only the tools (the unit tests need no services)
set -euo pipefail

# The system tools the tests drive, one line each: tool CHECK PACKAGES WHY. CHECK is a shell command that
# succeeds when the tool is there, PACKAGES the Debian packages that provide it, WHY which tests need it (for
# the reader). One more tool, one more line, e.g. tool "command -v bwrap" "bubblewrap" "the sandbox tests".
TOOL_CHECKS=() TOOL_PACKAGES=()
tool() { TOOL_CHECKS+=("$1"); TOOL_PACKAGES+=("$2"); }
tool "command -v chromium" "chromium chromium-driver" "the dashboard's browser test (headless Chromium)"
tool "command -v bwrap" "bubblewrap" "the sandbox tests (tests/security/test_sandbox_probes.py) and suite runs under bwrap"
tool "docker compose version || command -v docker-compose" "docker-compose" "the deployment tests (a real Compose parser)"
tool "command -v nginx || test -x /usr/sbin/nginx" "nginx" "the reverse proxy's tests (tests/security/test_proxy_slow_clients.py)"

DEFAULT_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL="redis://127.0.0.1:6379"
POSTGRES_URL="${SPECWATCH_TEST_POSTGRES_URL:-$DEFAULT_POSTGRES_URL}"
REDIS_URL="${SPECWATCH_TEST_REDIS_URL:-$DEFAULT_REDIS_URL}"
LIBPQ_URL="${POSTGRES_URL/+psycopg/}"  # SQLAlchemy's driver name out: a libpq connection URI

DRY_RUN=0
SERVICES=1
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY_RUN=1 ;;
        --tools) SERVICES=0 ;;
        *) echo "usage: $0 [--dry-run] [--tools]" >&2; exit 2 ;;
    esac
done

say() { echo "test-deps: $*"; }
stop() { echo "test-deps: $*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }
can_apt() { is_root && command -v apt-get >/dev/null 2>&1; }
# Wait up to 30 s for a check to succeed (a server that was just started).
wait_until() { for _ in $(seq 60); do "$@" && return 0; sleep 0.5; done; return 1; }

postgres_up() { pg_isready -q -d "$LIBPQ_URL" 2>/dev/null; }
redis_up() { redis-cli -u "$REDIS_URL" ping 2>/dev/null | grep -q PONG; }

ensure_postgres() {
    command -v pg_isready >/dev/null 2>&1 || stop "PostgreSQL's client tools are missing: apt-get install postgresql"
    if postgres_up; then return; fi
    if [ "$POSTGRES_URL" != "$DEFAULT_POSTGRES_URL" ]; then
        stop "PostgreSQL is not answering at SPECWATCH_TEST_POSTGRES_URL=$POSTGRES_URL: start that server"
    fi
    command -v pg_ctlcluster >/dev/null 2>&1 || stop "PostgreSQL is not installed: apt-get install postgresql (user postgres, trust on 127.0.0.1)"
    local version
    version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
    [ -n "$version" ] || stop "no PostgreSQL cluster in /etc/postgresql: create one with pg_createcluster"
    is_root || stop "PostgreSQL is not running on 127.0.0.1:5432: start it as root (pg_ctlcluster --skip-systemctl-redirect $version main start)"
    say "starting PostgreSQL $version"
    if [ "$DRY_RUN" -eq 1 ]; then return; fi
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    wait_until postgres_up || stop "PostgreSQL $version did not come up on 127.0.0.1:5432 (see /var/log/postgresql)"
}

ensure_test_database() {
    # The default URL's maintenance database `test`, from which the tests create their scratch databases.
    [ "$POSTGRES_URL" = "$DEFAULT_POSTGRES_URL" ] || return 0
    if [ "$DRY_RUN" -eq 1 ] && ! postgres_up; then return; fi
    local found
    found="$(psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")" \
        || stop "PostgreSQL on 127.0.0.1:5432 refused user postgres: allow it (trust for 127.0.0.1 in pg_hba.conf)"
    if [ "$found" = "1" ]; then return; fi
    say "creating the database test"
    if [ "$DRY_RUN" -eq 1 ]; then return; fi
    createdb -h 127.0.0.1 -U postgres test
}

ensure_redis() {
    command -v redis-cli >/dev/null 2>&1 || stop "Redis is not installed: apt-get install redis-server"
    if redis_up; then return; fi
    if [ "$REDIS_URL" != "$DEFAULT_REDIS_URL" ]; then
        stop "Redis is not answering at SPECWATCH_TEST_REDIS_URL=$REDIS_URL: start that server"
    fi
    command -v redis-server >/dev/null 2>&1 || stop "Redis is not installed: apt-get install redis-server"
    is_root || stop "Redis is not running on 127.0.0.1:6379: start it as root, or start one and set SPECWATCH_TEST_REDIS_URL"
    say "starting Redis"
    if [ "$DRY_RUN" -eq 1 ]; then return; fi
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    wait_until redis_up || stop "Redis did not come up on 127.0.0.1:6379 (see /var/log/redis/ci.log)"
}

# The packages of the tools whose check fails, one line; empty when every tool is there.
missing_packages() {
    local i missing=()
    for i in "${!TOOL_CHECKS[@]}"; do
        bash -c "${TOOL_CHECKS[$i]}" >/dev/null 2>&1 || missing+=("${TOOL_PACKAGES[$i]}")
    done
    echo "${missing[*]}"
}

ensure_tools() {
    local missing
    missing="$(missing_packages)"
    [ -n "$missing" ] || return 0
    can_apt || stop "missing system packages: $missing (as root: apt-get install --no-install-recommends $missing)"
    say "installing $missing (Debian)"
    if [ "$DRY_RUN" -eq 1 ]; then return; fi
    apt-get update -qq
    # shellcheck disable=SC2086 -- one word per package
    DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y -qq --no-install-recommends $missing >/dev/null
    missing="$(missing_packages)"
    [ -z "$missing" ] || stop "installed, yet still missing: $missing"
}

if [ "$SERVICES" -eq 1 ]; then
    ensure_postgres
    ensure_test_database
    ensure_redis
fi
ensure_tools
