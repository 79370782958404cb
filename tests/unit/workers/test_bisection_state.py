"""The stored state of a first-bad-commit search: typed, versioned, validated on load."""

from __future__ import annotations

from typing import Any

import pytest

from service.models import AlertKind, Run
from workers.analysis.state import BisectionState, BisectionStateError, RunAnalysis, load_analysis, load_bisection, store_bisection

ENTRY = {"case_id": "direct/far_apart/V8/g1", "reason": "lossless", "log_e_value": 12.5}


def _stored(**changes: Any) -> dict[str, Any]:
    return {**BisectionState(kind=AlertKind.violation, cases=(ENTRY,), confirmation_run_id=3, runs=2, next="abc").dump(), **changes}


def test_a_state_round_trips_through_the_runs_analysis() -> None:
    state = BisectionState(kind=AlertKind.performance, cases=(ENTRY,), after_sha="a" * 40, after_order=4, runs=1)
    run = Run(id=7, analysis=None)
    analysis = RunAnalysis(kind=AlertKind.performance)
    store_bisection(run, analysis, state)
    assert run.analysis is not None
    assert run.analysis["version"] == 1
    assert run.analysis["bisection"]["version"] == 1
    assert run.analysis["bisection"]["kind"] == "performance"
    assert load_analysis(run) == analysis
    assert load_bisection(run) == state
    assert load_bisection(run) == state


def test_a_run_without_a_search_has_no_state() -> None:
    assert load_bisection(Run(id=1, analysis=None)) is None
    assert load_bisection(Run(id=1, analysis={"kind": None, "failing": []})) is None


def test_a_state_stored_before_the_version_field_reads_as_version_1() -> None:
    stored = _stored()
    del stored["version"]
    state = load_bisection(Run(id=5, analysis={"bisection": stored}))
    assert state is not None
    assert state.version == 1
    assert state.next == "abc"


@pytest.mark.parametrize(
    ("stored", "says"),
    [
        (_stored(version=2), "version 2"),
        (_stored(kind="meltdown"), "kind"),
        (_stored(runs="many"), "runs"),
        (_stored(cases="direct/far_apart/V8/g1"), "cases"),
        (_stored(first_bad_sha="abc"), "first_bad_sha"),
        ({"done": True}, "kind"),
        (["not", "a", "mapping"], "(state)"),
    ],
)
def test_a_malformed_or_unknown_state_is_refused_naming_the_run(stored: Any, says: str) -> None:
    with pytest.raises(BisectionStateError, match=r"^run 42: its stored bisection state") as refused:
        load_bisection(Run(id=42, analysis={"bisection": stored}))
    assert says in str(refused.value)


def test_a_stored_analysis_of_another_version_is_refused_naming_the_run() -> None:
    with pytest.raises(BisectionStateError, match="run 9: its stored analysis is version 2"):
        load_analysis(Run(id=9, analysis={"version": 2, "kind": None}))
    with pytest.raises(BisectionStateError, match="run 9: its stored analysis is malformed"):
        load_analysis(Run(id=9, analysis={"failing": "not a list"}))
