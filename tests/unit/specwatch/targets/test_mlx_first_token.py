"""The MLX target's first-token cases (specwatch.targets.mlx.e2e) against a path that samples the exact law, and a
mutant that samples it with the history mlx-lm 0.32.2's drafted path uses (the last prompt token only: the finding
of docs/findings.md). No MLX needed: the paths here draw from the float64 reference's law with numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from specwatch.cases import Case
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.base import refusing_sampler
from specwatch.targets.mlx.e2e import PROCESSOR_SETTINGS, PROMPTS, GenerateExperiment
from specwatch.targets.mlx.law import MlxSampling
from specwatch.targets.mlx.models import next_token_logits
from specwatch.targets.mlx.paths import Trial


@dataclass(frozen=True)
class LawPath:
    """One token a call from the exact law, its penalties over the whole prompt or (``last_only``) its last token."""

    last_only: bool

    def run(
        self, prompt: Sequence[int], sampling: MlxSampling | None, horizon: int, seeds: Sequence[int], *, greedy: bool = False
    ) -> list[Trial]:
        assert sampling is not None
        assert horizon == 1
        history = tuple(prompt[-1:] if self.last_only else prompt)
        probs = sampling.probs(next_token_logits(prompt, []), history)
        return [Trial([int(np.random.default_rng(seed).choice(len(probs), p=probs))]) for seed in seeds]


def _first_token(path: LawPath, setting: str):
    case = Case(
        id=f"e2e/first1/{setting}",
        family="e2e",
        description="first token",
        epsilon=0.1,
        make_experiment=lambda device: GenerateExperiment(
            path, PROCESSOR_SETTINGS[setting], PROMPTS["prompt5"], speculative=False, horizon=1, length=1, designed="first"
        ),
    )
    result = run_suite([case], refusing_sampler("end to end only"), SuiteConfig(quick=True, seed=5))
    return result.results[0]


@pytest.mark.parametrize("setting", ["repetition", "presence"])
def test_a_first_token_drawn_with_the_last_prompt_token_as_history_is_refuted_by_the_first_token_check(setting: str) -> None:
    got = _first_token(LawPath(last_only=True), setting)
    assert (got.verdict, got.headline) == (Verdict.FAIL, "lossless/first1"), got.reason


def test_the_first_token_check_is_designed_at_the_case_tv_and_passes_the_exact_law() -> None:
    got = _first_token(LawPath(last_only=False), "repetition")
    assert got.verdict is Verdict.PASS, got.reason
    assert got.powered
    assert [c.name for c in got.checks if c.designed] == ["lossless/first1"]
