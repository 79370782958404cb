"""The adapter kit (specwatch.targets.base): keyword binding as the three adapters bound before they shared it, the
end-to-end checks, draws and PIT counts as their end-to-end experiments computed them inline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from specwatch.cases import select
from specwatch.conditional import PIT_BINS, TokenOrder, conditional_batch
from specwatch.experiments import CoverageDesign
from specwatch.protocol import Layer
from specwatch.sampling import TargetRaised
from specwatch.targets import TargetError
from specwatch.targets.base import (
    AdapterError,
    GreedyEquivalence,
    LibraryExperiment,
    bind_keywords,
    conditional_pit,
    e2e_checks,
    e2e_draws,
    joint_cell,
    library_call,
    pit_check,
    refusing_sampler,
    trial_seeds,
)


def test_core_arguments_must_be_parameters_and_unknown_required_ones_are_refused() -> None:
    def fn(a, b, *args, c=1, **kwargs): ...

    assert bind_keywords(fn, {"a": 1, "b": 2}, label="fn") == {"a": 1, "b": 2}  # c keeps its default; *args, **kwargs skipped
    with pytest.raises(AdapterError, match=r"fn has no parameter\(s\) \['z'\]"):
        bind_keywords(fn, {"a": 1, "b": 2, "z": 3}, label="fn")
    with pytest.raises(AdapterError, match="fn requires unknown argument 'b'"):
        bind_keywords(fn, {"a": 1}, label="fn")


def test_fixed_values_go_where_the_release_has_the_parameter_required_or_not() -> None:
    """transformers 4.40 requires is_done_candidate, 4.37 max_matches: each gets its value, and neither where absent."""

    def v4_40(ids, is_done_candidate): ...

    def v4_37(ids, max_matches=None): ...

    def v5_18(ids): ...

    fixed = {"is_done_candidate": False, "max_matches": 3}
    assert bind_keywords(v4_40, {"ids": 0}, label="s", fixed=fixed) == {"ids": 0, "is_done_candidate": False}
    assert bind_keywords(v4_37, {"ids": 0}, label="s", fixed=fixed) == {"ids": 0, "max_matches": 3}
    assert bind_keywords(v5_18, {"ids": 0}, label="s", fixed=fixed) == {"ids": 0}


def test_required_values_need_the_parameter() -> None:
    def block(x, *, block_verification=False): ...

    def older(x): ...

    assert bind_keywords(block, {"x": 0}, label="k", required={"block_verification": True}) == {"x": 0, "block_verification": True}
    with pytest.raises(AdapterError, match="k has no block_verification: not in this release"):
        bind_keywords(older, {"x": 0}, label="k", required={"block_verification": True})


def test_a_lossless_parameter_not_given_must_default_to_exactly_its_value() -> None:
    def off(x, synthetic_mode=False, weight=None): ...

    def on(x, synthetic_mode=True): ...

    def zero(x, synthetic_mode=0): ...  # equal to False, but not the same value: refused

    def required(x, synthetic_mode): ...

    lossless = {"synthetic_mode": False, "weight": None}
    assert bind_keywords(off, {"x": 0}, label="f", lossless=lossless) == {"x": 0}
    for fn, shown in ((on, "True"), (zero, "0"), (required, "<class 'inspect._empty'>")):
        with pytest.raises(AdapterError, match=f"f's synthetic_mode defaults to {shown}; the lossless path needs False"):
            bind_keywords(fn, {"x": 0}, label="f", lossless=lossless)
    # A fixed value may set it once its default is the lossless one (vLLM's block verification, chosen per case).
    assert bind_keywords(off, {"x": 0}, label="f", lossless=lossless, fixed={"synthetic_mode": True}) == {"x": 0, "synthetic_mode": True}


def test_a_lossless_parameter_given_must_not_default_to_another_value() -> None:
    """SGLang's thresholds are passed at 1.0; a kernel defaulting them below 1.0 is refused, one without a default is not."""

    def lossless(t, threshold=1.0): ...

    def lossy(t, threshold=0.5): ...

    def no_default(t, threshold): ...

    core = {"t": 0, "threshold": 1.0}
    assert bind_keywords(lossless, core, label="k", lossless={"threshold": 1.0}) == core
    assert bind_keywords(no_default, core, label="k", lossless={"threshold": 1.0}) == core
    with pytest.raises(AdapterError, match=r"k's threshold defaults to 0\.5; the lossless path needs 1\.0"):
        bind_keywords(lossy, core, label="k", lossless={"threshold": 1.0})


def test_the_refusing_sampler_raises_the_one_adapter_error_a_target_error() -> None:
    step = select(["direct/far_apart/V8/g1"])[0].step()
    with pytest.raises(AdapterError, match="no kernel here") as raised:
        refusing_sampler("no kernel here")(step, 4, torch.Generator().manual_seed(0))
    assert isinstance(raised.value, TargetError)


def test_an_experiments_defaults() -> None:
    experiment = LibraryExperiment()
    assert experiment.checks == ()
    assert experiment.expected_acceptance is None
    assert experiment.accepted_per_trial_max is None
    assert experiment.fixed_trials is None


def test_the_e2e_checks_name_the_first_tokens_law_and_the_pit_per_order_and_one_pair_sizes_the_run() -> None:
    law = np.full(8**3, 1 / 8**3)
    for designed, first, pit in (("first", True, False), ("pit", False, True)):
        checks = e2e_checks(law, length=3, horizon=12, designed=designed)  # type: ignore[arg-type]
        assert [c.name for c in checks] == ["lossless/first3", "lossless/pit_id", "lossless/pit_prob"]
        assert [c.designed for c in checks] == [first, pit, pit]
        assert [c.reach for c in checks] == [1.0, 12.0, 12.0]
        assert {c.layer for c in checks} == {Layer.LOSSLESS}
        assert checks[0].null is law
        assert [len(c.null) for c in checks[1:]] == [PIT_BINS, PIT_BINS]


def test_the_draws_are_the_seeds_then_the_pit_uniforms_from_the_cases_generator() -> None:
    """What the vLLM, SGLang and llama.cpp experiments drew inline, in that order, so recorded seeds replay."""
    seeds, pit_w = e2e_draws(5, 12, torch.Generator().manual_seed(7))
    inline = torch.Generator().manual_seed(7)
    assert seeds == torch.randint(0, 2**31 - 1, (5,), generator=inline).tolist()
    assert np.array_equal(pit_w, torch.rand((5, 12), generator=inline, dtype=torch.float64).numpy())
    assert trial_seeds(5, torch.Generator().manual_seed(7)) == seeds


def test_joint_cell_is_the_base_v_number_of_the_first_tokens() -> None:
    assert joint_cell([3, 1, 4, 1, 5], vocab=8, length=3) == 3 * 64 + 1 * 8 + 4
    assert joint_cell([7, 7], vocab=8, length=2) == 63


def test_conditional_pit_sums_each_trials_counts_and_reports_the_first_impossible_token() -> None:
    rng = np.random.default_rng(3)
    horizon, vocab = 6, 8
    rows = rng.dirichlet(np.ones(vocab), size=(3, horizon))
    rows[2, 4] = np.eye(vocab)[0]  # trial 2, position 4: only token 0 is possible
    outputs = [[int(rng.choice(vocab, p=row)) for row in trial] for trial in rows]
    outputs[2][4] = 5
    keep = np.ones((3, horizon), dtype=bool)
    keep[1, 2] = False
    pit_w = rng.random((3, horizon))
    pit, violations = conditional_pit(zip(outputs, rows, keep, strict=True), pit_w)
    for order in TokenOrder:
        expected = sum(conditional_batch(rows[i], np.asarray(outputs[i]), pit_w[i], keep=keep[i]).counts[order] for i in range(3))
        assert np.array_equal(pit[order], expected)
    assert sum(pit[TokenOrder.ID]) == 3 * horizon - 2  # one position left out, one impossible token not counted
    assert len(violations) == 1
    assert violations[0].layer == Layer.LOSSLESS
    assert violations[0].message.startswith(f"output {outputs[2]}: ")
    assert pit_check(TokenOrder.PROBABILITY) == "lossless/pit_prob"


@dataclass(frozen=True)
class Emitted:
    tokens: list[int]
    rounds: list[tuple[int, int]] | None


class Refused(Exception):
    pass


class Doubling(GreedyEquivalence):
    """A toy greedy check: the reference of a prompt is each token doubled mod 7, with gap 0 when the prompt starts
    with 0 (undecidable); the path answers ``answer(prompt)``."""

    coverage_design = CoverageDesign(min_drafts=2, min_rounds=1)

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def prompt(self, generator: torch.Generator) -> list[int]:
        return torch.randint(0, 7, (3,), generator=generator).tolist()

    def reference(self, prompt: list[int]) -> tuple[list[int], float]:
        return [2 * t % 7 for t in prompt], 0.0 if prompt[0] == 0 else 1.0

    def call(self, prompt: list[int]) -> Emitted:
        return library_call(lambda: self.answer(prompt), Refused)  # type: ignore[operator]


def test_greedy_equivalence_passes_the_reference_and_leaves_undecidable_prompts_out() -> None:
    called: list[list[int]] = []

    def exact(prompt: list[int]) -> Emitted:
        called.append(prompt)
        return Emitted([2 * t % 7 for t in prompt], [(2, 2), (1, 0)])

    observation = Doubling(exact).run(40, torch.Generator().manual_seed(3))
    assert observation.violations == ()
    assert called
    assert all(p[0] != 0 for p in called)
    assert len(called) < 40
    assert observation.coverage is not None
    assert observation.coverage.full == len(called)
    assert np.frombuffer(observation.sample, dtype=np.int64).size == 3 * len(called)


def test_greedy_equivalence_names_the_first_prompt_that_differs() -> None:
    def off_by_one(prompt: list[int]) -> Emitted:
        return Emitted([(2 * t + (t == 3)) % 7 for t in prompt], None)

    observation = Doubling(off_by_one).run(40, torch.Generator().manual_seed(3))
    (violation,) = observation.violations
    assert violation.layer is Layer.LOSSLESS
    assert "!= speculative" in violation.message
    assert violation.message.startswith("prompt [")


def test_a_library_exception_is_a_finding_and_the_paths_refusal_is_not() -> None:
    def crash(prompt: list[int]) -> Emitted:
        raise RuntimeError("boom")

    def refuse(prompt: list[int]) -> Emitted:
        raise Refused("cannot run this request")

    with pytest.raises(TargetRaised):
        Doubling(crash).run(40, torch.Generator().manual_seed(3))
    with pytest.raises(Refused):
        Doubling(refuse).run(40, torch.Generator().manual_seed(3))
