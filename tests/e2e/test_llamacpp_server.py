"""llama-server built from llama-cpp-python's vendored tree, driven over HTTP: draft-model and n-gram speculative
decoding against the exact laws, greedy equivalence and the seeded token-for-token promise.

Marked ``llamacpp`` (``make test-llamacpp``: the release built into the suite's cache first on PYTHONPATH). The
request, the parsing, the round reconstruction and the process handling are tested without llama.cpp in
tests/unit/specwatch/targets/test_llamacpp_server_driver.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specwatch.cases import select
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.loader import resolve

pytestmark = [pytest.mark.llamacpp, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def target():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the llama.cpp target needs llama-cpp-python first on PYTHONPATH (make test-llamacpp)")
    yield resolve("llamacpp")
    from specwatch.targets.llamacpp import server

    started = [s._process.pid for s in server._running if s._process is not None]
    server.stop_all()
    for pid in started:  # no server outlives the tests
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _run(target, pattern: str):
    cases = select([pattern], target.cases)
    assert cases, pattern
    return run_suite(cases, target.sampler, SuiteConfig(quick=True, seed=5), target=target.spec, library=target.library)


def _verdicts(result):
    return [(c.case_id, c.verdict, c.reason) for c in result.results]


def test_the_server_cases_run_with_the_built_tool(target):
    ids = {c.id: c for c in target.cases}
    for case_id in ("e2e/server_draft/plain", "e2e/server_ngram/processed", "e2e/seeded/server_draft"):
        assert ids[case_id].skip_reason is None


@pytest.mark.parametrize("spec", ["draft", "ngram"])
def test_the_shared_path_is_lossless_with_processing_on(target, spec):
    result = _run(target, f"e2e/server_{spec}/processed")
    assert result.verdict is Verdict.PASS, _verdicts(result)
    coverage = result.results[0].coverage
    assert coverage is not None, _verdicts(result)
    assert coverage["full"] > 0
    assert coverage["partial"] > 0
    assert max(int(k) for k in coverage["drafts"]) >= 2


def test_draft_model_speculation_is_lossless_with_processing_off(target):
    result = _run(target, "e2e/server_draft/plain")
    assert result.verdict is Verdict.PASS, _verdicts(result)


@pytest.mark.parametrize("spec", ["draft", "ngram"])
def test_greedy_equals_plain_greedy(target, spec):
    result = _run(target, f"e2e/greedy/server_{spec}")
    assert result.verdict is Verdict.PASS, _verdicts(result)


@pytest.mark.parametrize("spec", ["draft", "ngram"])
def test_a_seeded_speculative_request_reproduces_the_plain_one(target, spec):
    result = _run(target, f"e2e/seeded/server_{spec}")
    assert result.verdict is Verdict.PASS, _verdicts(result)
