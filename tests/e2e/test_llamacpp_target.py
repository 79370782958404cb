"""The llama.cpp target against a real build of llama-cpp-python and the tools built from its vendored tree.

Marked ``llamacpp``: ``make test-llamacpp`` builds the release into the suite's cache (once per version) and runs
these with it first on PYTHONPATH; the other tiers leave them out. The law, the GGUF writer and the parsing are
tested without llama.cpp in tests/unit/specwatch/targets/test_llamacpp_chain.py.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from specwatch.cases import select
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.install import cache_root
from specwatch.targets.llamacpp.adapter import LlamaCppAdapter
from specwatch.targets.llamacpp.build import build_info, cuda_device, release_root
from specwatch.targets.llamacpp.checkout import build_checkout
from specwatch.targets.llamacpp.models import FORWARD_TOLERANCE, tokens_of
from specwatch.targets.loader import resolve

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
    assert target.library.distribution == "llama-cpp-python"
    assert target.library.details["llama_cpp_commit"] == "0c1e57098"
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
    version = target.library.version
    repo = cache_root().parent / "llamacpp" / f"test-checkout-{version}"
    if not (repo / ".git").is_dir():
        vendored = release_root(version, cache_root().parent) / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(vendored, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))  # its submodule link
        _git(repo, "init", "-q")
        _git(repo, "add", "--all")
        _git(repo, "commit", "-q", "-m", f"llama.cpp as llama-cpp-python {version} vendors it")
    return repo


def test_a_llama_cpp_checkout_is_built_with_cmake_and_its_tools_tested(checkout):
    """``--source`` a checkout: built into the cache (``llama-speculative`` only here: llama-server's build would add
    as long again the first time; the command line's choice of target and its build step are tested in
    tests/unit/specwatch/targets/test_llamacpp_build.py), the identity names the commit checked out, the tool's cases
    run and llama-cpp-python's are skipped with the reason."""
    python = build_checkout(checkout, cache_root().parent, tools=("llama-speculative",))
    info = build_info([str(python)])
    assert info is not None
    assert info["source"] == str(checkout.resolve())
    assert (info["llama_cpp_commit"], info["dirty"]) == (_git(checkout, "rev-parse", "HEAD"), False)
    assert f"-DGGML_CUDA={'ON' if cuda_device() else 'OFF'}" in info["cmake_options"]
    adapter = LlamaCppAdapter(None, str(info["version"]), info, {"llama-speculative": True})
    library = adapter.describe()
    assert library.distribution == "llama.cpp"
    assert library.git_sha == info["llama_cpp_commit"]
    patterns = ("e2e/greedy/speculative", "e2e/python_control/plain", "e2e/forward/gguf_reference")
    cases = select(list(patterns), adapter.cases())
    result = run_suite(cases, adapter.sampler(), SuiteConfig(quick=True, seed=3), target="llamacpp", library=library)
    verdicts = {r.case_id: (r.verdict, r.reason) for r in result.results}
    assert verdicts["e2e/greedy/speculative"][0] is Verdict.PASS, verdicts
    for case in patterns[1:]:
        assert verdicts[case][0] is Verdict.SKIPPED
        assert "no llama-cpp-python" in verdicts[case][1], verdicts
