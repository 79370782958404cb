"""`specwatch check`: exit codes, the results table and user-supplied samplers, through the real CLI."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()


def _check(*args: str):
    return runner.invoke(app, ["check", *args])


@pytest.mark.slow
def test_reference_passes_every_case():
    result = _check("--target", "reference")
    assert result.exit_code == 0, result.output
    assert "all 32 case(s) passed" in result.output
    assert "direct/transformers_target_distribution/V10/g3" in result.output


def test_a_mutant_is_a_violation(tmp_path):
    out = tmp_path / "run.json"
    result = _check("--target", "mutant:swapped_residual", "--cases", "direct/far_apart/*", "--json", str(out))
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output
    payload = json.loads(out.read_text())
    assert payload["verdict"] == "fail"
    assert {r["lossless"] for r in payload["results"]} == {"fail"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "mutant:nope"], "unknown mutant"),
        (["--target", "nonsense"], "module:function"),
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


def _user_module(tmp_path, body: str) -> None:
    (tmp_path / "my_sampler.py").write_text(textwrap.dedent(body))


def test_module_function_targets_a_user_sampler(tmp_path, monkeypatch):
    _user_module(
        tmp_path,
        """
        from workers.suite.sampling import reference_sampler

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
