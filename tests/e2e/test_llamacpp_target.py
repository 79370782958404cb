"""The llama.cpp target against a real build of llama-cpp-python and the tools built from its vendored tree.

Marked ``llamacpp``: ``make test-llamacpp`` builds the release into the suite's cache (once per version) and runs
these with it first on PYTHONPATH; the other tiers leave them out. The law, the GGUF writer and the parsing are
tested without llama.cpp in tests/unit/specwatch/targets/test_llamacpp_chain.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.cases import select
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets import resolve
from specwatch.targets.install import cache_root
from specwatch.targets.llamacpp.build import BUILD_INFO, cuda_device, release_root
from specwatch.targets.llamacpp.checkout import checkout_root
from specwatch.targets.llamacpp.models import FORWARD_TOLERANCE, tokens_of

pytestmark = [pytest.mark.llamacpp, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def target():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the llama.cpp target needs llama-cpp-python first on PYTHONPATH (make test-llamacpp)")
    return resolve("llamacpp")


def _run(target, pattern: str, **config):
    cases = select([pattern], target.cases)
    assert cases, pattern
    return run_suite(cases, target.sampler, SuiteConfig(quick=True, seed=3, **config), target=target.spec, library=target.library)


def test_the_build_identity_names_the_vendored_llama_cpp_commit(target):
    assert target.library["distribution"] == "llama-cpp-python"
    assert target.library["llama_cpp_commit"] == "0c1e57098"
    ids = {c.id: c for c in target.cases}
    assert ids["e2e/speculative/plain"].skip_reason is None  # llama-speculative was built with the release


def test_llama_cpp_computes_the_reference_forward_within_float32_noise(target):
    from specwatch.targets.llamacpp.paths import forward_difference

    assert forward_difference(tokens_of("abcabcabhgfedcbaaaab")) < FORWARD_TOLERANCE


def test_generate_with_prompt_lookup_is_lossless(target):
    result = _run(target, "e2e/python_prompt_lookup/*")
    assert result.verdict is Verdict.PASS, [(c.case_id, c.verdict, c.reason) for c in result.results]
    coverage = result.results[0].coverage
    assert coverage is not None
    assert coverage["full"] > 0
    assert coverage["partial"] > 0


def test_llama_speculative_greedy_equals_plain_greedy(target):
    result = _run(target, "e2e/greedy/speculative")
    assert result.verdict is Verdict.PASS, [(c.case_id, c.reason) for c in result.results]


def test_llama_speculative_at_temperature_one_is_not_lossless(target):
    # Known finding (docs/findings.md, "llama-speculative drafts the top candidate"): the run must reject.
    result = _run(target, "e2e/speculative/plain")
    assert result.verdict is Verdict.FAIL, [(c.case_id, c.verdict, c.reason) for c in result.results]


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=specwatch", "-c", "user.email=specwatch@localhost", "-C", str(repo), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def checkout(target) -> Path:
    """A git repository of the llama.cpp tree the cached release vendors, made once beside the release in the suite's
    cache (the copy keeps the files' times, and the checkout's build folder is kept by path: later runs rebuild
    nothing)."""
    version = target.library["version"]
    repo = cache_root().parent / "llamacpp" / f"test-checkout-{version}"
    if not (repo / ".git").is_dir():
        vendored = release_root(version, cache_root().parent) / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(vendored, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))  # its submodule link
        _git(repo, "init", "-q")
        _git(repo, "add", "--all")
        _git(repo, "commit", "-q", "-m", f"llama.cpp as llama-cpp-python {version} vendors it")
    return repo


def test_a_llama_cpp_checkout_is_built_with_cmake_and_its_tools_tested(checkout, tmp_path):
    """``--source`` a checkout: built into the cache, the identity names the commit checked out, the tools' cases run
    and llama-cpp-python's are skipped with the reason."""
    out = tmp_path / "run.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cases = ("e2e/greedy/speculative", "e2e/python_control/plain", "e2e/forward/gguf_reference")
    cmd = [sys.executable, "-m", "specwatch", "run", "--source", str(checkout), "--quick", "--json", str(out)]
    done = subprocess.run([*cmd, *(a for c in cases for a in ("--cases", c))], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads(out.read_text())
    environment = run["environment"]
    assert environment["library_distribution"] == "llama.cpp"
    assert environment["library_llama_cpp_commit"] == _git(checkout, "rev-parse", "HEAD")
    assert environment["library_dirty"] == "false"
    assert environment["library_cuda"] == ("on" if cuda_device() else "off")
    info = json.loads((checkout_root(checkout, cache_root().parent) / "python" / BUILD_INFO).read_text())
    assert info["source"] == str(checkout.resolve())
    verdicts = {r["case_id"]: (r["verdict"], r["reason"]) for r in run["results"]}
    assert verdicts["e2e/greedy/speculative"][0] == "pass", verdicts
    for case in cases[1:]:
        assert verdicts[case][0] == "skipped"
        assert "no llama-cpp-python" in verdicts[case][1], verdicts
