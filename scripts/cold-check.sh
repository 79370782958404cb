#!/usr/bin/env bash
# Each library target's `specwatch check --quick` from an empty release cache, sandboxed (`make test-cold`).
#
# This is the step a user's first run takes on a new machine: the release is installed (or, for llama-cpp-python,
# compiled) by the sandbox's install step, which may write only that release's own cache entry
# (specwatch/sandbox.py: release_entries), then the quick profile runs offline with the cache read-only. The tier
# fails when
#   - the cache is not empty when it starts (a warm cache would hide the install step),
#   - a check does not run sandboxed by bubblewrap (its JSON's isolation.mode),
#   - a check exits non-zero (a new failure, an install or build that failed, a target error), or
#   - a check tested no case.
# Each check's table, its last line and its wall time are printed, and a summary at the end.
#
# Usage: scripts/cold-check.sh CACHE REQUIREMENT...   (CACHE: an empty or missing folder; it is filled and kept,
# so that the tiers after this one reuse what was installed and built)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${SPECWATCH_BIN:-.venv/bin}"
JOBS="${COLD_JOBS:-2}"
cache="${1:?usage: scripts/cold-check.sh CACHE REQUIREMENT...}"
shift
[ "$#" -gt 0 ] || { echo "cold-check: name at least one release (REQUIREMENT...)" >&2; exit 2; }

mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
if [ -n "$(ls -A "$cache")" ]; then
    echo "cold-check: $cache is not empty: a cold check starts from an empty release cache (remove it or name another)" >&2
    exit 2
fi
command -v bwrap >/dev/null 2>&1 || { echo "cold-check: bubblewrap (bwrap) is not installed: the checks must run sandboxed (scripts/test-deps.sh --tools installs it)" >&2; exit 2; }

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
summary=()
failed=0
for requirement in "$@"; do
    echo "=== cold-check: specwatch check --pip $requirement --quick --jobs $JOBS (empty cache entry, sandboxed)"
    json="$out/result.json"
    rm -f "$json"
    started=$(date +%s)
    set +e
    SPECWATCH_CACHE_DIR="$cache" OMP_NUM_THREADS=1 "$BIN/specwatch" check --pip "$requirement" --quick --jobs "$JOBS" --json "$json"
    code=$?
    set -e
    wall=$(( $(date +%s) - started ))
    line="$("$BIN/python" - "$json" "$requirement" "$code" "$wall" <<'EOF'
import json
import sys
from pathlib import Path

path, requirement, code, wall = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
problems = []
if code != 0:
    problems.append(f"exit status {code}")
if not path.is_file():
    problems.append("no JSON result")
    print(f"FAIL {requirement}: {', '.join(problems)}; wall {wall // 60} min {wall % 60} s")
    sys.exit(0)
run = json.loads(path.read_text())
isolation = run.get("isolation", {})
if isolation.get("mode") != "bwrap":
    problems.append(f"not sandboxed ({isolation.get('mode')}: {isolation.get('reason')})")
results = run.get("results", [])
ran = [r for r in results if r.get("verdict") != "skipped"]
if not ran:
    problems.append("no case ran")
failed = [r for r in results if r.get("verdict") in ("fail", "error")]
known = [r for r in failed if r.get("known_finding")]
environment = run.get("environment", {})
name = environment.get("library_distribution") or requirement.split("==")[0]
version = f"{name} {environment.get('library_version', '?')}"
built = environment.get("library_build_seconds")
state = "FAIL" if problems else "ok"
detail = f"{len(ran)} case(s) ran, {len(failed)} failed ({len(known)} known); tested {version}"
if built:
    detail += f"; built in {float(built):.0f} s"
print(f"{state} {requirement}: {detail}; wall {wall // 60} min {wall % 60} s" + (f" [{', '.join(problems)}]" if problems else ""))
EOF
)"
    echo "=== cold-check: $line"
    summary+=("$line")
    case "$line" in FAIL*) failed=1 ;; esac
done
echo "=== cold-check summary (cache $cache):"
printf '  %s\n' "${summary[@]}"
cached=$(du -sh "$cache" | cut -f1)
echo "  release cache after the checks: $cached"
exit "$failed"
