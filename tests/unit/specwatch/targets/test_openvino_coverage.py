"""The OpenVINO target's coverage, without OpenVINO: a draft-model pipeline that stops speculating (0 tokens drafted
per call) cannot pass as exact, and the confidence-threshold path is built to see calls accepting all and some drafts.

The pipeline is a stand-in that emits exactly greedy decoding of the float64 reference (what the greedy cases compare
with) and reports the drafted and accepted tokens it is given: the case's verdict then depends only on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from specwatch.cases import Case
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.base import refusing_sampler
from specwatch.targets.openvino.experiments import GreedyExperiment, PathError, PathSpec, greedy_reference, require_speculation
from specwatch.targets.openvino.pipeline import Call


class _Greedy:
    """Emits the reference's greedy tokens; each call reports ``drafted`` tokens drafted and ``accepted`` accepted."""

    def __init__(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        self.reports = list(zip(drafted, accepted, strict=True))
        self.calls = 0

    def config(self, horizon: int, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(max_new_tokens=horizon)

    def generate(self, prompt: Sequence[int], config: SimpleNamespace, *, seed: int | None = None) -> Call:
        tokens, _ = greedy_reference(prompt, config.max_new_tokens, None)
        drafted, accepted = self.reports[self.calls % len(self.reports)]
        self.calls += 1
        return Call(tuple(tokens), drafted, accepted, ())


def _verdict(monkeypatch: pytest.MonkeyPatch, path: PathSpec, pipe: _Greedy) -> Any:
    monkeypatch.setattr(PathSpec, "pipeline", lambda self: pipe)
    experiment = GreedyExperiment(path)
    experiment.prompts = 12
    case = Case(id="test/openvino/greedy", family="e2e", description="greedy", epsilon=0.1, make_experiment=lambda device: experiment)
    run = run_suite([case], refusing_sampler("end to end only"), SuiteConfig(seed=3))
    return run.results[0]


@pytest.mark.parametrize("path", [PathSpec("draft", True, 1), PathSpec("draft", True, 3), PathSpec("draft", True, 0, 0.3)], ids=str)
def test_a_draft_pipeline_that_drafts_nothing_is_an_error_never_a_pass(monkeypatch: pytest.MonkeyPatch, path: PathSpec) -> None:
    result = _verdict(monkeypatch, path, _Greedy([0], [0]))
    assert result.verdict == Verdict.ERROR
    assert "drafted no token" in (result.reason or "")


@pytest.mark.parametrize("path", [PathSpec("draft", True, 3), PathSpec("draft", True, 0, 0.3)], ids=str)
def test_a_designed_draft_pipeline_that_drafts_passes_and_records_its_coverage(monkeypatch: pytest.MonkeyPatch, path: PathSpec) -> None:
    result = _verdict(monkeypatch, path, _Greedy([6, 4, 5], [6, 2, 0]))
    assert result.verdict == Verdict.PASS
    assert result.powered
    assert result.coverage is not None
    assert result.coverage["shortfalls"] == []
    assert result.coverage["full"] > 0
    assert result.coverage["partial"] > 0


def test_a_threshold_pipeline_whose_calls_accept_every_draft_is_short_of_design(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drafting, but never a rejection: the verification's rejecting side is not exercised, so not a plain pass."""
    result = _verdict(monkeypatch, PathSpec("draft", True, 0, 0.3), _Greedy([4], [4]))
    assert result.verdict == Verdict.PASS
    assert not result.powered
    assert "coverage short of design" in (result.reason or "")


def test_speculation_is_required_of_every_speculative_path_but_not_of_plain_generation() -> None:
    idle = [Call((1, 2, 3), 0, 0, (1, 1, 1))]
    for path in (PathSpec("draft", True, 1), PathSpec("draft", False, 0, 0.3), PathSpec("lookup", True, 3)):
        with pytest.raises(PathError, match="did not speculate"):
            require_speculation(path, [Call((1, 2, 3), None if path.kind == "lookup" else 0, 0, (1, 1, 1))])
    require_speculation(PathSpec("plain"), idle)
    require_speculation(PathSpec("draft", True, 1), [*idle, Call((1, 2, 3), 1, 0, (1, 1, 1))])
    require_speculation(PathSpec("lookup", True, 3), [Call((1, 2, 3), None, 1, (1, 2))])


def test_the_threshold_path_is_designed_and_says_which_parameter_it_sets() -> None:
    threshold = PathSpec("draft", False, 0, 0.3)
    assert threshold.designed
    assert not PathSpec("draft", True, 1).designed
    assert "assistant_confidence_threshold=0.3" in threshold.describe()
    assert "num_assistant_tokens" not in threshold.describe()
    assert threshold.fresh() == threshold
