"""Known findings as data: validation, matching, the transformers file shipped from docs/findings.md, and how
``specwatch check`` marks known failures (exit status with and without ``--strict``, table, JSON, Markdown)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from service.cli.check import mark_known, outcome, results_table
from service.cli.exits import OK, VIOLATION
from service.findings import Finding, FindingError, edited, first_match, make_finding, shipped_findings, shipped_matches
from service.models import FindingState
from service.report import markdown_report

FINDINGS_MD = Path(__file__).parents[3] / "docs" / "findings.md"

BASE: dict[str, Any] = {
    "key": "permuted-q",
    "title": "Universal assisted generation reports a permuted q",
    "cases": ["e2e/different_tokenizers/*"],
    "link": "docs/findings.md#universal-assisted-generation-reports-a-permuted-q-transformers-5240",
    "versions": ">=4.52,<=5.24.0",
}


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown`` (lower case, punctuation dropped, spaces to '-')."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


@pytest.mark.unit
def test_a_finding_matches_its_cases_on_affected_versions_only() -> None:
    finding = make_finding(BASE)
    assert finding.cases == ("e2e/different_tokenizers/*",)
    assert first_match([finding], "e2e/different_tokenizers/plain", version="5.24.0") is finding
    assert first_match([finding], "e2e/different_tokenizers/plain", version="4.52.0rc1") is None  # below >=4.52
    assert first_match([finding], "e2e/different_tokenizers/plain", version="5.25.0") is None
    assert first_match([finding], "e2e/different_tokenizers/plain", version=None) is None  # version unknown: not known
    assert first_match([finding], "e2e/different_tokenizers/plain", version="not a version") is None
    assert first_match([finding], "e2e/assistant_model/plain", version="5.24.0") is None
    assert first_match([finding], "E2E/different_tokenizers/plain", version="5.24.0") is None  # case-sensitive globs
    open_ended = make_finding(BASE | {"versions": ">=4.52.4"})
    assert first_match([open_ended], "e2e/different_tokenizers/processed", version="5.26.0.dev0") is open_ended  # main's dev versions


@pytest.mark.unit
def test_a_commit_range_or_nothing_decides_where_it_applies() -> None:
    ranged = make_finding(BASE | {"versions": None, "commit_from": "ABCDEF1", "commit_to": None})
    assert ranged.commit_from == "abcdef1"
    assert first_match([ranged], "e2e/different_tokenizers/plain", version="5.24.0") is None
    assert first_match([ranged], "e2e/different_tokenizers/plain", version="5.24.0", in_range={ranged.key: True}) is ranged
    everywhere = make_finding(BASE | {"versions": None})
    assert first_match([everywhere], "e2e/different_tokenizers/plain", version=None) is everywhere


@pytest.mark.unit
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": "Bad Key"}, "invalid key"),
        ({"title": ""}, "needs a title"),
        ({"title": "two\nlines"}, "one line"),
        ({"cases": []}, "case globs"),
        ({"cases": ["has space/*"]}, "invalid case glob"),
        ({"versions": "4.52+"}, "PEP 440 specifier set"),
        ({"commit_from": "xyz"}, "7 to 64 hex digits"),
        ({"commit_to": "abcdef1"}, "needs its first affected commit"),
        ({"link": "javascript:alert(1)"}, "invalid link"),
        ({"link": "../secrets.md"}, "invalid link"),
        ({"state": "wontfix"}, "open or fixed"),
        ({"fixed_in": "5.26.0"}, "set its state to fixed"),
        ({"colour": "red"}, "unknown finding field"),
    ],
)
def test_invalid_findings_are_refused_with_the_reason(change: dict[str, Any], message: str) -> None:
    with pytest.raises(FindingError, match=re.escape(message)):
        make_finding(BASE | change)


@pytest.mark.unit
def test_editing_validates_the_result_and_keeps_the_key() -> None:
    finding = make_finding(BASE)
    fixed = edited(finding, {"state": "fixed", "fixed_in": "5.26.0", "versions": ">=4.52.4,<5.26"})
    assert (fixed.state, fixed.fixed_in, fixed.versions, fixed.title) == (FindingState.fixed, "5.26.0", ">=4.52.4,<5.26", finding.title)
    assert edited(fixed, {"versions": None}).versions is None
    with pytest.raises(FindingError, match="cannot change"):
        edited(finding, {"key": "other"})
    with pytest.raises(FindingError, match="set its state to fixed"):
        edited(fixed, {"state": "open"})  # fixed_in must be cleared too


@pytest.mark.unit
def test_the_shipped_transformers_findings_are_the_entries_of_docs_findings() -> None:
    """One shipped finding per transformers entry of docs/findings.md, each linking to that entry's anchor."""
    shipped = shipped_findings("transformers")
    text = FINDINGS_MD.read_text()
    entries = {a for a in github_anchors(text) if re.search(r"-transformers-\d+$", a)}
    links = {f.link.removeprefix("docs/findings.md#") for f in shipped}
    assert all(f.link.startswith("docs/findings.md#") for f in shipped)
    assert links == entries
    assert len(shipped) == len(entries) == 9
    assert shipped_findings("module:function") == () == shipped_findings("../etc")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("case_id", "version", "key"),
    [
        ("e2e/different_tokenizers/processed", "5.24.0", "universal-assisted-generation-permuted-q"),
        ("e2e/different_tokenizers/plain", "4.48.3", None),  # passes there: a failure would be new
        ("e2e/gemma4_assistant/plain", "5.24.0", "gemma4-assistant-greedy-draft-softmax-q"),
        ("e2e/greedy/gemma4_assistant", "5.24.0", None),  # passes: not covered
        ("e2e/assistant_model/processed", "4.44.2", "assistant-greedy-draft-softmax-q"),
        ("e2e/assistant_model/processed", "4.48.3", None),  # fixed upstream
        ("e2e/greedy/prompt_lookup", "4.40.2", "assisted-greedy-stale-cache-position"),  # first by key; overshoots too
        ("e2e/greedy/prompt_lookup", "4.45.2", "prompt-lookup-overshoots-max-new-tokens"),
        ("e2e/greedy/prompt_lookup", "5.13.1", "prompt-lookup-overshoots-max-new-tokens"),
        ("e2e/greedy/prompt_lookup", "5.14.1", None),  # the loop crops the output from 5.14.0
        ("e2e/mtp/processed", "5.15.0", "mtp-raw-logits-as-q"),
        ("e2e/mtp/processed", "5.15.1", None),  # fixed there
        ("e2e/greedy/mtp", "5.14.1", "inkling-short-prompt-convolution-raises"),
        ("e2e/greedy/mtp", "5.15.0", None),
        ("edge/all_reject/V8/g3/u_min", "5.24.0", "p-zero-draft-accepted-when-uniform-is-zero"),
        ("edge/all_accept/V8/g3/u_min", "5.24.0", None),  # not one of the four the finding names
        ("edge/transformers_fixture/V10/g3/u_max", "4.40.2", "residual-underflow-raises"),
    ],
)
def test_shipped_findings_cover_the_releases_their_entries_name(case_id: str, version: str, key: str | None) -> None:
    found = first_match(shipped_findings("transformers"), case_id, version=version)
    assert (found.key if found else None) == key


def _result(case_id: str, verdict: str = "fail") -> dict[str, Any]:
    return {
        "case_id": case_id,
        "verdict": verdict,
        "lossless": verdict,
        "n_trials": 128,
        "log_e_value": None,
        "threshold": 1e4,
        "duration_s": 0.1,
        "reason": "certain lossless violation",
    }


def _run(*results: dict[str, Any], target: str = "transformers", version: str = "5.24.0") -> dict[str, Any]:
    return {
        "target": target,
        "verdict": "fail",
        "environment": {"library_name": target, "library_version": version},
        "results": [dict(r) for r in results],
    }


KNOWN = _result("e2e/different_tokenizers/processed")
ALSO_KNOWN = _result("edge/all_reject/V8/g3/u_min")
NEW = _result("e2e/prompt_lookup/processed")
PASSED = _result("e2e/control/plain", "pass")


@pytest.mark.unit
def test_check_marks_known_failures_in_its_results_and_json() -> None:
    results = [dict(KNOWN), dict(NEW), dict(PASSED)]
    run = _run(*results)
    known = mark_known(run, results)
    assert set(known) == {KNOWN["case_id"]}
    for rows in (results, run["results"]):
        marked = {r["case_id"]: r.get("known_finding") for r in rows}
        assert marked[KNOWN["case_id"]]["title"] == "Universal assisted generation reports a permuted q"
        assert marked[KNOWN["case_id"]]["link"].startswith("docs/findings.md#universal-assisted")
        assert marked[NEW["case_id"]] is None
        assert marked[PASSED["case_id"]] is None
    assert (run["known_failures"], run["new_failures"]) == ([KNOWN["case_id"]], [NEW["case_id"]])
    # Another target, or a version outside the finding's, marks nothing.
    assert mark_known(_run(dict(KNOWN), target="reference"), [dict(KNOWN)]) == {}
    assert mark_known(_run(dict(KNOWN), version="4.48.3"), [dict(KNOWN)]) == {}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("results", "strict", "code", "line"),
    [
        ([KNOWN, ALSO_KNOWN, PASSED], False, OK, "2 of 3 case(s) failed, both known findings; --strict to fail on them"),
        ([KNOWN, ALSO_KNOWN, PASSED], True, VIOLATION, "2 of 3 case(s) failed, both known findings (--strict)"),
        ([KNOWN, PASSED], False, OK, "1 of 2 case(s) failed, a known finding; --strict to fail on it"),
        ([KNOWN, NEW, PASSED], False, VIOLATION, "2 of 3 case(s) failed: 1 new, 1 known finding(s)"),
        ([NEW, PASSED], False, VIOLATION, "1 of 2 case(s) failed"),
    ],
)
def test_check_exits_1_only_for_new_failures_unless_strict(results: list[dict[str, Any]], strict: bool, code: int, line: str) -> None:
    results = [dict(r) for r in results]
    known = mark_known(_run(*results), results)
    assert outcome(results, known, strict=strict, suite_code=VIOLATION) == (code, line)


@pytest.mark.unit
def test_passing_runs_and_the_table_and_markdown_say_known() -> None:
    assert outcome([dict(PASSED)], {}, strict=True, suite_code=OK) == (OK, "all 1 case(s) passed")
    skipped = {**PASSED, "case_id": "e2e/x", "verdict": "skipped"}
    assert outcome([dict(PASSED), skipped], {}, strict=True, suite_code=OK) == (
        OK,
        "1 case(s) passed, 1 skipped (not reachable or not run: see each reason)",
    )
    results = [dict(KNOWN), dict(NEW)]
    run = _run(*results)
    mark_known(run, results)
    console = Console(width=400, record=True)
    console.print(results_table(results))
    table = console.export_text()
    assert "known: Universal assisted generation reports a permuted q" in table
    assert table.count("known:") == 1
    report = markdown_report(run, ["specwatch", "check", "--target", "transformers"])
    assert "(1 of them known finding)" in report
    (known_row,) = [line for line in report.splitlines() if KNOWN["case_id"] in line]
    assert "known: Universal assisted generation reports a permuted q (`docs/findings.md#universal-assisted" in known_row
    (new_row,) = [line for line in report.splitlines() if NEW["case_id"] in line]
    assert new_row.endswith("| new |")


@pytest.mark.unit
def test_shipped_matches_ignores_passes() -> None:
    assert shipped_matches([dict(PASSED)], target="transformers", version="5.24.0") == {}
    assert isinstance(next(iter(shipped_matches([dict(KNOWN)], target="transformers", version="5.24.0").values())), Finding)
