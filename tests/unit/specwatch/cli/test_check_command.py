"""`specwatch check`: exit codes, the results table and user-supplied samplers, through the real CLI."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from tests.support.package_index import PackageIndex, build_wheel, serve

runner = CliRunner()


def _check(*args: str):
    return runner.invoke(app, ["check", *args])


@pytest.mark.slow
def test_reference_passes_every_case():
    result = _check("--target", "reference")
    assert result.exit_code == 0, result.output
    assert "all 32 case(s) passed" in result.output
    assert "direct/transformers_target_distribution/V10/g3" in result.output


@pytest.mark.slow
def test_a_mutant_is_a_violation(tmp_path):
    out = tmp_path / "run.json"
    result = _check("--target", "mutant:swapped_residual", "--cases", "direct/far_apart/*", "--json", str(out))
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output
    payload = json.loads(out.read_text())
    assert payload["verdict"] == "fail"
    assert {r["lossless"] for r in payload["results"]} == {"fail"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "mutant:nope"], "unknown mutant"),
        (["--target", "nonsense"], "'transformers', 'transformers+mutant:NAME', 'vllm'"),
        (["--target", "no_such_module_xyz:f"], "cannot import"),
        (["--cases", "nothing/*"], "no case matches"),
        (["--device", "cuda"], "CUDA is not available"),
        (["--alpha", "2"], "alpha"),
    ],
)
def test_usage_and_target_errors_exit_2_with_one_line(args, message):
    result = _check(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "2"], "--alpha"),
        (["--alpha", "0"], "--alpha"),
        (["--epsilon", "0"], "--epsilon"),
        (["--epsilon", "1.5"], "--epsilon"),
        (["--jobs", "0"], "--jobs"),
    ],
)
def test_bad_numbers_exit_2_before_the_suite_starts(args, message, monkeypatch):
    def no_suite(command):
        raise AssertionError(f"the suite was started: {command}")

    monkeypatch.setattr(sys.modules["specwatch.cli.check"], "stream_suite", no_suite)
    result = _check(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_a_release_that_cannot_be_installed_exits_3_naming_the_missing_requirement(tmp_path, monkeypatch):
    """What the release poller met on PyPI: transformers 5.25.0 needs a kernels release the index does not have."""
    files = {"transformers/__init__.py": '__version__ = "5.25.0"\n'}
    wheel = build_wheel(tmp_path / "dist", "transformers", "5.25.0", files, ("kernels>=0.19.1,<0.20",))
    with serve(PackageIndex()) as index:
        index.publish("transformers", "5.25.0", wheel=wheel)
        monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple")
        monkeypatch.setenv("PIP_RETRIES", "0")
        monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
        result = _check("--pip", "transformers==5.25.0", "--quick")
    assert result.exit_code == 3, result.output
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("could not install: kernels<0.20,>=0.19.1 (no distribution on the package index satisfies it")
    assert line.endswith("needed by transformers==5.25.0)")


def _user_module(tmp_path, body: str) -> None:
    (tmp_path / "my_sampler.py").write_text(textwrap.dedent(body))


@pytest.mark.slow
def test_module_function_targets_a_user_sampler(tmp_path, monkeypatch):
    _user_module(
        tmp_path,
        """
        from specwatch.sampling import reference_sampler

        def sample(step, n, generator):
            return reference_sampler(step, n, generator)

        def crash(step, n, generator):
            raise ValueError("my sampler is broken")
        """,
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ok = _check("--target", "my_sampler:sample", "--cases", "direct/far_apart/V8/*", "--quick")
    assert ok.exit_code == 0, ok.output
    crash = _check("--target", "my_sampler:crash", "--cases", "direct/far_apart/V8/g1")
    assert crash.exit_code == 1, crash.output  # raising on a valid input is a finding about the sampler
    assert "the target raised on a valid input after 0 trials: ValueError: my sampler is broken" in crash.output


@pytest.mark.slow
def test_a_release_or_checkout_is_tested_by_its_library_target_not_the_reference():
    """``--source`` (like ``--pip``) without ``--target`` tests the library it names; the summary says what ran."""
    import transformers

    packages = Path(transformers.__file__).parents[1]
    result = runner.invoke(app, ["check", "--source", str(packages), "--cases", "direct/far_apart/V8/g1", "--quick"])
    assert result.exit_code == 0, result.output
    assert f"tested transformers {transformers.__version__}" in " ".join(result.output.split())
    assert "reference" not in result.output.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "reference", "--pip", "transformers==4.44.2"], "tests a built-in sampler, not --pip transformers==4.44.2"),
        (["--target", "mutant:swapped_residual", "--source", "."], "tests a built-in sampler"),
        (["--pip", "numpy==2.0.0"], "no target tests 'numpy'"),
    ],
)
def test_a_built_in_target_beside_a_library_or_an_unknown_library_is_refused(args, message):
    result = runner.invoke(app, ["check", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())  # the console wraps long lines
    assert "installing" not in result.output


@pytest.mark.slow
def test_the_suite_lists_a_library_targets_cases():
    from specwatch.__main__ import main

    built_in, library = io.StringIO(), io.StringIO()
    with redirect_stdout(built_in):
        assert main(["list"]) == 0
    with redirect_stdout(library):
        assert main(["list", "--target", "transformers"]) == 0
    built_in_ids = {case["id"] for case in json.loads(built_in.getvalue())}
    library_cases = json.loads(library.getvalue())
    assert not any(case_id.startswith("e2e/") for case_id in built_in_ids)
    assert any(case["id"].startswith("e2e/assistant") for case in library_cases)
    assert all({"description", "quick", "skip_reason"} <= set(case) for case in library_cases)


@pytest.mark.slow
def test_markdown_report_names_versions_failures_and_the_command_to_reproduce(tmp_path):
    report = tmp_path / "report.md"
    args = ["--target", "mutant:swapped_residual", "--cases", "direct/far_apart/V8/*", "--quick", "--seed", "7"]
    result = _check(*args, "--markdown", str(report), "--json", str(tmp_path / "run.json"))
    assert result.exit_code == 1, result.output
    text = report.read_text()
    payload = json.loads((tmp_path / "run.json").read_text())
    failing = [r for r in payload["results"] if r["verdict"] == "fail"]
    assert failing
    assert f"{len(failing)} of {len(payload['results'])} case(s) fail" in text
    for r in failing:
        assert f"`{r['case_id']}`" in text
        assert f"{r['n_trials']:,}" in text
    assert f"| torch | {payload['environment']['torch']} |" in text
    assert "descriptive" in text
    command = text.split("```")[1].strip()
    assert command.startswith("specwatch check --target mutant:swapped_residual ")
    assert "--seed 7" in command
    assert "--quick" in command
    assert "--json" not in command
    assert "--markdown" not in command


@pytest.mark.slow
def test_known_findings_are_marked_and_fail_the_run_only_with_strict(tmp_path):
    """The installed transformers 5.24.0 fails ``edge/p_zero_draft/V4/g1/u_min`` (docs/findings.md: a draft the target
    forbids is accepted when the uniform is 0), a finding shipped for the transformers target."""
    import transformers

    packages = str(Path(transformers.__file__).parents[1])
    args = ["check", "--source", packages, "--cases", "edge/p_zero_draft/*"]
    result = runner.invoke(app, [*args, "--json", str(tmp_path / "run.json")])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "1 of 2 case(s) failed, a known finding; --strict to fail on it" in output
    # In the table a short marker (the finding's key, so nothing wraps); under it the title and link, once.
    assert "FAIL (lossless, conformance) known" in output
    assert output.count("known finding p-zero-draft-accepted-when-uniform-is-zero (edge/p_zero_draft/V4/g1/u_min): A draft") == 1
    payload = json.loads((tmp_path / "run.json").read_text())
    marked = {r["case_id"]: r.get("known_finding") for r in payload["results"]}
    assert marked["edge/p_zero_draft/V4/g1/u_min"]["key"] == "p-zero-draft-accepted-when-uniform-is-zero"
    assert marked["edge/p_zero_draft/V4/g1/u_max"] is None
    assert (payload["known_failures"], payload["new_failures"]) == (["edge/p_zero_draft/V4/g1/u_min"], [])
    strict = runner.invoke(app, [*args, "--strict"])
    assert strict.exit_code == 1, strict.output
    assert "a known finding (--strict)" in " ".join(strict.output.split())
