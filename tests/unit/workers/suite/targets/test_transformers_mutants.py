"""Library-level mutants planted in the installed transformers: each lossy one fails its end-to-end case
through the suite's command line, each lossless one passes with lower acceptance; the observer that
records coverage does not change what generate() returns."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="the transformers target needs transformers installed")  # CI installs it

from workers.suite.sampling import Processing
from workers.suite.targets import TargetError, resolve
from workers.suite.targets.transformers import TransformersAdapter
from workers.suite.targets.transformers.experiments import E2E_COVERAGE, GenerateExperiment
from workers.suite.targets.transformers.mutants import LIBRARY_MUTANTS
from workers.suite.targets.transformers.observer import DraftObserver


def _suite(target: str, case: str, seed: int) -> dict:
    command = [sys.executable, "-m", "workers.suite", "run", "--target", target, "--cases", case, "--quick", "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False, timeout=1800)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)["results"][0]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LIBRARY_MUTANTS))
def test_each_library_mutant_gets_its_expected_verdict(name):
    mutant = LIBRARY_MUTANTS[name]
    case = mutant.cases[-1]
    result = _suite(f"transformers+mutant:{name}", case, seed=1)
    if mutant.lossless:
        assert result["verdict"] == "pass", result["reason"]
        clean = _suite("transformers", case, seed=1)
        # Lossless, but fewer drafts accepted per call than the unpatched library.
        assert result["acceptance"]["observed"] < clean["acceptance"]["observed"]
    else:
        assert result["verdict"] == "fail", result["reason"]
        assert result["lossless"] == "fail"


def test_an_unknown_library_mutant_is_a_target_error():
    with pytest.raises(TargetError, match="unknown transformers mutant"):
        resolve("transformers+mutant:no_such_mutant")


def test_the_coverage_observer_changes_nothing_the_library_returns():
    adapter = TransformersAdapter.load()
    experiment = GenerateExperiment(adapter.module, Processing(), {"assistant_model": True}, torch.device("cpu"), coverage=E2E_COVERAGE)
    prompt = experiment.prompt
    kwargs = experiment.generation_kwargs()
    outputs = []
    observer = DraftObserver()
    for watch in (False, True):
        torch.manual_seed(5)
        with observer.watching() if watch else contextlib.nullcontext():
            outputs.append([experiment.target.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs) for _ in range(5)])
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))
    observer.call_done()
    coverage = observer.coverage()
    assert sum(coverage.drafts.values()) == sum(coverage.accepted.values()) > 0
    assert max(coverage.drafts) == 3  # E2E_DRAFTS, constant schedule, no confidence threshold
