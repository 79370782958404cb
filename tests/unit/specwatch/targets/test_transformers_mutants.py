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

from specwatch.sampling import Processing
from specwatch.targets import TargetError
from specwatch.targets.loader import resolve
from specwatch.targets.transformers.adapter import TransformersAdapter
from specwatch.targets.transformers.experiments import E2E_COVERAGE, GenerateExperiment, accepted_in_call
from specwatch.targets.transformers.mutants import LIBRARY_MUTANTS
from specwatch.targets.transformers.observer import DraftObserver


def _suite(target: str, case: str, seed: int, *, quick: bool = True) -> dict:
    profile = ["--quick"] if quick else []
    command = [sys.executable, "-m", "specwatch", "run", "--target", target, "--cases", case, *profile, "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False, timeout=1800)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)["results"][0]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LIBRARY_MUTANTS))
def test_each_library_mutant_gets_its_expected_verdict(name):
    """Under the profile designed to catch it: ``--quick`` (TV 0.1), or the default profile (TV 0.03) for a small effect."""
    mutant = LIBRARY_MUTANTS[name]
    case = mutant.cases[-1]
    result = _suite(f"transformers+mutant:{name}", case, seed=1, quick=mutant.quick)
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


@pytest.mark.parametrize(
    "options", [{"assistant_model": True}, {"prompt_lookup_num_tokens": 3}, {"assistant_early_exit": 1}], ids=lambda o: next(iter(o))
)
def test_a_call_accepts_horizon_minus_its_rounds_drafts_so_at_most_horizon_minus_one(options):
    """The per-trial range the drift test uses (``accepted_per_trial_max`` = horizon - 1) rests on each round
    appending its accepted drafts and one token of the target's: checked call by call on the installed release."""
    adapter = TransformersAdapter.load()
    experiment = GenerateExperiment(adapter.module, Processing(), options, torch.device("cpu"), coverage=E2E_COVERAGE)
    assert experiment.accepted_per_trial_max == experiment.horizon - 1
    prompt, kwargs = experiment.prompt, experiment.generation_kwargs()
    torch.manual_seed(11)
    accepted = []
    for _ in range(6):
        observer = DraftObserver()
        with observer.watching():
            experiment.target.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
        observer.call_done()
        ((rounds, calls),) = observer.coverage().rounds.items()
        assert calls == 1
        assert observer.call_accepted[0] + rounds == experiment.horizon
        accepted += observer.call_accepted
    assert 0 < max(accepted) <= experiment.horizon - 1
    plain = GenerateExperiment(adapter.module, Processing(), {}, torch.device("cpu"))
    assert plain.accepted_per_trial_max is None


def test_a_trial_counts_the_reported_accepted_drafts_up_to_the_bound():
    assert [accepted_in_call(a, 10) for a in (0, 7, 9, 12)] == [0, 7, 9, 9]
