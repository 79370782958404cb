#!/usr/bin/env bash
# The SGLang target's CUDA checks in one run, for a GPU machine: the Triton chain sampler on CUDA (classic and block
# verification), the CUDA tree kernel (draft trees at the lossless thresholds, and below them where it must fail),
# the verification eagle_sample dispatches on CUDA, and the end-to-end engine cases (plain, STANDALONE, EAGLE chain
# and tree, EAGLE with rejection sampling, NGRAM; processing off and on; greedy equivalence).
#
# Needs an interpreter with a CUDA torch, the full `sglang` release (its engine, sglang-kernel, flashinfer) and this
# checkout's requirements (numpy, scipy, typer, rich, packaging, transformers): SGLANG_PYTHON, default `python3`.
# Nothing is downloaded (device machines may have no network). Results go to $OUT (default ./sglang-device-out):
# the quick check's JSON and table, the full direct/tree/dispatch run's JSON, the real-wheel tests' log.
#
#   SGLANG_PYTHON=/opt/sglang/bin/python scripts/sglang_device_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SGLANG_PYTHON:-python3}
OUT=${OUT:-./sglang-device-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
unset TRITON_INTERPRET
"$PY" - <<'PY' | tee "$OUT/identity.txt"
import importlib.metadata as m, torch
assert torch.cuda.is_available(), "no CUDA device: this script is for a GPU machine"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
print("sglang", m.version("sglang"))
PY
step() { echo "== $1"; shift; local t0=$SECONDS; "$@" || echo "(exit $?)"; echo "   $((SECONDS - t0)) s"; }
# The quick profile (direct, block, tree, dispatch, the quick engine cases) with the installed release.
step "quick check" timeout 1200 "$PY" -c 'import sys; from specwatch.cli import main; sys.argv[0] = "specwatch"; main()' check --target sglang --device cuda --quick \
  --json "$OUT/quick.json" 2>&1 | tee "$OUT/quick.txt"
# Every tree and dispatch case, the direct battery and its block variants, and the engine cases, at their own TV.
step "tree, dispatch, direct, block, e2e" timeout 3000 "$PY" -m specwatch run --target sglang --device cuda \
  --cases 'tree/*' --cases 'engine/*' --cases 'direct/*' --cases 'direct_block/*' --cases 'e2e/*' --json "$OUT/full.json" 2> "$OUT/full.err"
# The real-wheel tests, the GPU one included (tree kernel lossless at 1.0, lossy at threshold_acc 0.5).
step "pytest -m sglang" timeout 1200 "$PY" -m pytest -q -p no:cacheprovider -m sglang \
  tests/unit/specwatch/targets/test_sglang_target.py 2>&1 | tee "$OUT/pytest.txt"
