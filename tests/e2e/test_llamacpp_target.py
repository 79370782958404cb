"""The llama.cpp target against a real build of llama-cpp-python and the tools built from its vendored tree.

Marked ``llamacpp``: ``make test-llamacpp`` builds the release into the suite's cache (once per version) and runs
these with it first on PYTHONPATH; the other tiers leave them out. The law, the GGUF writer and the parsing are
tested without llama.cpp in tests/unit/specwatch/targets/test_llamacpp_chain.py.
"""

from __future__ import annotations

import importlib.util

import pytest

from specwatch.cases import select
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets import resolve
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
    assert result.verdict is Verdict.PASS, [(c.case_id, c.verdict, c.message) for c in result.cases]
    coverage = result.cases[0].coverage
    assert coverage is not None
    assert coverage["full"] > 0
    assert coverage["partial"] > 0


def test_llama_speculative_greedy_equals_plain_greedy(target):
    result = _run(target, "e2e/greedy/speculative")
    assert result.verdict is Verdict.PASS, [(c.case_id, c.message) for c in result.cases]


def test_llama_speculative_at_temperature_one_is_not_lossless(target):
    # Known finding (docs/findings.md, "llama-speculative drafts the top candidate"): the run must reject.
    result = _run(target, "e2e/speculative/plain")
    assert result.verdict is Verdict.FAIL, [(c.case_id, c.verdict, c.message) for c in result.cases]
