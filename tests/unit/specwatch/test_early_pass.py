"""The early pass (docs/statistics.md §7a): its statistic against exact references, its miss rate against the
bound beta_pass under laws at TV exactly epsilon (and mutants of it that break the bound), and how early it
passes under the null."""

from __future__ import annotations

import importlib
import itertools
import json
import math
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from scipy import optimize, special, stats
from typer.testing import CliRunner

from service.cli import app
from specwatch import __main__ as suite_main
from specwatch import early_pass
from specwatch.cases import Case
from specwatch.early_pass import log_pass_statistic
from specwatch.experiments import CheckSpec, Observation
from specwatch.protocol import Failure, Layer, RunResult, Verdict
from specwatch.runner import SuiteConfig, run_case
from specwatch.stats import log_e_dirichlet_mixture, plan_test, tv_distance

Statistic = Callable[[NDArray[np.int64], NDArray[np.float64], float], float]


def _kl(x: float, y: float) -> float:
    return float(special.rel_entr(x, y) + special.rel_entr(1 - x, 1 - y))


def _exact_statistic(counts: NDArray[np.int64], p0: NDArray[np.float64], epsilon: float) -> float:
    """By enumerating every set A (small k only): min_A ln M_A(P_hat(A), p0(A)) over the sets with p0(A) + eps <= 1,
    M_A the mixture of the set's likelihood ratios (early_pass.log_set_ratio)."""
    n = counts.sum()
    p_hat = counts / n
    exact = math.inf
    for cells in itertools.product((False, True), repeat=len(p0)):
        a = np.array(cells)
        b, x = p0[a].sum(), p_hat[a].sum()
        if b + epsilon <= 1:
            exact = min(exact, float(early_pass.log_set_ratio(x, b, n, epsilon)))
    return exact


def _set_ratio_by_hand(x: float, b: float, n: int, epsilon: float) -> float:
    """ln of the mean over the shrinks of prod r^y (1 - r)^(1 - y) / (c^y (1 - c)^(1 - y)), from its definition."""
    c = b + epsilon
    ratios = [
        n * (x * math.log((b + s * epsilon) / c) + (1 - x) * math.log((1 - b - s * epsilon) / (1 - c)))
        for s in early_pass.NUMERATOR_SHRINKS
    ]
    return math.log(sum(math.exp(r) for r in ratios) / len(ratios))


class TestLogPassStatistic:
    def test_is_at_most_the_exact_statistic_and_close_to_it(self) -> None:
        """A lower bound (so Ville's inequality carries over, §7a) of the exact statistic over all 2^k sets, on counts
        near the null and away from it, for any ``target``, deciding against a target as the full bound does; the
        relaxation to the Neyman-Pearson curve loses little (median gap under 3 %)."""
        rng = np.random.default_rng(7)
        gaps = []
        for i in range(80):
            k = int(rng.integers(2, 9))
            p0 = rng.dirichlet(np.full(k, 2.0))
            epsilon = float(rng.uniform(0.01, 0.25))
            counts = rng.multinomial(int(rng.integers(50, 20_000)), p0 if i % 2 else rng.dirichlet(np.full(k, 50.0)))
            exact = _exact_statistic(counts, p0, epsilon)
            full = log_pass_statistic(counts, p0, epsilon)
            for target in (None, math.log(1e3), 0.0, 20.0):
                refined = log_pass_statistic(counts, p0, epsilon, target=target)
                assert refined <= exact + 1e-9 * max(1.0, abs(exact))
                if target is not None and abs(full - target) > 1e-3:  # refining only as far as the decision needs
                    assert (refined >= target) == (full >= target)
            if exact > 1:
                gaps.append((exact - full) / exact)
        assert np.median(gaps) < 0.03

    def test_the_set_ratio_is_the_mixture_it_names_and_moves_the_way_the_bound_needs(self) -> None:
        """ln M against its definition; decreasing in the set's frequency x and increasing in its null mass b (the branch
        and bound's piece bound rests on both); at the set's null frequency it grows with n (the null's evidence)."""
        for x, b, n, epsilon in [(0.3, 0.25, 100, 0.1), (0.5, 0.5, 10_000, 0.02), (0.0, 0.1, 50, 0.2), (0.9, 0.8, 1000, 0.05)]:
            assert float(early_pass.log_set_ratio(x, b, n, epsilon)) == pytest.approx(
                _set_ratio_by_hand(x, b, n, epsilon), rel=1e-9, abs=1e-9
            )
        xs, bs = np.linspace(0.0, 1.0, 41), np.linspace(0.0, 0.89, 37)
        grid = early_pass.log_set_ratio(xs[:, None], bs[None, :], 500, 0.1)
        assert (np.diff(grid, axis=0) <= 1e-9).all()
        assert (np.diff(grid, axis=1) >= -1e-9).all()
        at_null = [float(early_pass.log_set_ratio(0.4, 0.4, n, 0.05)) for n in (100, 1000, 10_000)]
        assert all(a < b for a, b in itertools.pairwise(at_null))

    def test_grows_with_epsilon_and_refuses_support_violations(self) -> None:
        p0 = np.array([0.5, 0.3, 0.2, 0.0])
        counts = np.array([5000, 3000, 2000, 0])
        values = [log_pass_statistic(counts, p0, e) for e in (0.02, 0.05, 0.1, 0.2)]
        assert all(a < b for a, b in itertools.pairwise(values))
        assert log_pass_statistic(np.array([5000, 3000, 2000, 1]), p0, 0.1) == -math.inf
        assert log_pass_statistic(np.zeros(4, dtype=np.int64), p0, 0.1) == 0.0


# ------------------------------------------------------------------------------------------ calibration


def _proportional(p0: NDArray[np.float64], epsilon: float) -> NDArray[np.float64]:
    up = np.arange(len(p0)) < len(p0) // 2
    q = p0.copy()
    q[up] *= 1 + epsilon / p0[up].sum()
    q[~up] *= 1 - epsilon / p0[~up].sum()
    return q


def _two_cells(p0: NDArray[np.float64], epsilon: float) -> NDArray[np.float64]:
    q = p0.copy()
    q[0] += epsilon
    q[-1] -= epsilon
    return q


def _heavy_cell(p0: NDArray[np.float64], epsilon: float) -> NDArray[np.float64]:
    q = p0.copy()
    q[0] -= epsilon
    q[1:] += epsilon * p0[1:] / p0[1:].sum()
    return q


def _tempered(p0: NDArray[np.float64], epsilon: float) -> NDArray[np.float64]:
    def law(tau: float) -> NDArray[np.float64]:
        q = p0**tau
        return q / q.sum()

    tau = optimize.brentq(lambda tau: tv_distance(law(tau), p0) - epsilon, 1.0, 50.0, xtol=1e-14)
    return law(tau)


EPSILON = 0.1
#: Laws at TV exactly EPSILON from their null, of several shapes: (name, null, alternative).
SHAPES = [
    ("proportional/k2", np.array([0.5, 0.5]), _proportional),
    ("proportional/k8", np.full(8, 1 / 8), _proportional),
    ("two-cell shift/k8", np.full(8, 1 / 8), _two_cells),
    ("one heavy cell/k6", np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05]), _heavy_cell),
    ("tempered/k3", np.array([0.2, 0.3, 0.5]), _tempered),
]
#: Looks every 10 % more observations, from 8 to 4096: denser than the runner's doubling batches.
LOOKS = np.unique(np.ceil(8 * 1.1 ** np.arange(70)).astype(np.int64))
LOOKS = LOOKS[LOOKS <= 4096]
BETA_PASS = 0.1
RUNS = 300


def _early_pass(counts: NDArray[np.int64], p0: NDArray[np.float64], epsilon: float) -> float:
    """The statistic as the runner computes it: refined until it decides against ln(1 / beta_pass)."""
    return log_pass_statistic(counts, p0, epsilon, target=-math.log(BETA_PASS))


def _passes(statistic: Statistic, law: NDArray[np.float64], p0: NDArray[np.float64], rng: np.random.Generator) -> bool:
    """One run: observations i.i.d. from ``law``, the statistic at every look; True if it ever reached ln(1/beta)."""
    cells = rng.choice(len(p0), size=int(LOOKS[-1]), p=law)
    return any(statistic(np.bincount(cells[:n], minlength=len(p0)), p0, EPSILON) >= -math.log(BETA_PASS) for n in LOOKS)


def _limit() -> int:
    """Passes in RUNS runs that a rate of BETA_PASS exceeds with probability 1e-3 only."""
    return int(stats.binom.ppf(1 - 1e-3, RUNS, BETA_PASS))


def _ascending(p_hat: NDArray[np.float64], p0: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Mutant: the cells sorted the wrong way, the lowest curve instead of the Neyman-Pearson one (an upper bound of
    the minimum over sets, not a lower one)."""
    ratio = p_hat / p0
    order = np.argsort(ratio, kind="stable")
    return ratio[order], p0[order]


def _plug_in(counts: NDArray[np.int64], p0: NDArray[np.float64], epsilon: float) -> float:
    """Mutant: pass when the empirical TV is below epsilon (the point estimate taken for the truth)."""
    return math.inf if tv_distance(counts / counts.sum(), p0) < epsilon else -math.inf


@pytest.mark.parametrize(("name", "p0", "shape"), SHAPES, ids=[s[0] for s in SHAPES])
def test_a_law_at_tv_epsilon_passes_early_at_most_beta_pass_of_the_time(
    name: str, p0: NDArray[np.float64], shape: Callable[[NDArray[np.float64], float], NDArray[np.float64]]
) -> None:
    """The bound of §7a made observable: beta_pass = 0.1, 300 runs of 4096 observations looked at 70 times each
    (the guarantee holds at every look, so looking more often than the runner does only makes the test harder)."""
    law = shape(p0, EPSILON)
    assert tv_distance(law, p0) == pytest.approx(EPSILON, abs=1e-12)
    assert (law >= 0).all()
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    passed = sum(_passes(_early_pass, law, p0, rng) for _ in range(RUNS))
    assert passed <= _limit(), f"{name}: {passed} early passes in {RUNS} runs"


@pytest.mark.parametrize("mutant", ["ascending", "plug_in"])
def test_a_mutant_of_the_statistic_passes_laws_at_tv_epsilon_too_often(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration test has teeth: a statistic built on the wrong curve, or the plug-in TV, exceeds the
    bound on some shape."""
    statistic: Statistic = _early_pass
    if mutant == "ascending":
        monkeypatch.setattr(early_pass, "_neyman_pearson", _ascending)
        monkeypatch.setattr(early_pass, "_cannot_reach", lambda *args: False)  # the shortcut would hide some of it
    else:
        statistic = _plug_in
    rng = np.random.default_rng(11)
    worst = 0
    for _name, p0, shape in SHAPES:
        law = shape(p0, EPSILON)
        passed = 0
        for _ in range(RUNS):
            passed += _passes(statistic, law, p0, rng)
            if passed > _limit():
                return
        worst = max(worst, passed)
    pytest.fail(f"{mutant}: at most {worst} early passes in {RUNS} runs, within the bound {_limit()}")


@pytest.mark.parametrize(("support", "by", "fraction"), [(8, 0.5, 0.9), (16, 0.75, 0.9)])
def test_under_the_null_it_passes_well_before_the_cap(support: int, by: float, fraction: float) -> None:
    """A correct sampler at the runner's doubling looks, beta_pass = 1e-3, epsilon 0.1, a check's level 1e-6: at
    least ``fraction`` of 100 runs pass by ``by`` x the planned observations (the cap is 1 x)."""
    p0 = np.full(support, 1 / support)
    needed = plan_test(support, 1.0, EPSILON, 1e-6, 1e-3).needed
    rng = np.random.default_rng(support)
    early = 0
    for _ in range(100):
        counts = np.zeros(support, dtype=np.int64)
        seen = 0
        for look in [64 * 2**i for i in range(20)]:
            n = min(look, int(by * needed))
            counts += rng.multinomial(n - seen, p0)
            seen = n
            if log_pass_statistic(counts, p0, EPSILON, target=math.log(1e3)) >= math.log(1e3):
                early += 1
                break
            if n >= by * needed:
                break
    assert early >= fraction * 100, f"{early} of 100 null runs passed by {by} x {needed} observations"


# ------------------------------------------------------------------------------------------------ runner


class _LawExperiment:
    """Checks whose observations are i.i.d. from given laws (one per trial each): ``designed`` and ``extra`` are
    (null, law) pairs of designed and undesigned checks."""

    expected_acceptance = None
    accepted_per_trial_max = None
    fixed_trials = None

    def __init__(self, designed: list[tuple[np.ndarray, np.ndarray]], extra: list[tuple[np.ndarray, np.ndarray]] = ()) -> None:
        self.laws = {f"lossless/d{i}": law for i, (_, law) in enumerate(designed)} | {
            f"lossless/u{i}": law for i, (_, law) in enumerate(extra)
        }
        self.checks = tuple(CheckSpec(f"lossless/d{i}", Layer.LOSSLESS, null, 1.0) for i, (null, _) in enumerate(designed)) + tuple(
            CheckSpec(f"lossless/u{i}", Layer.LOSSLESS, null, 1.0, designed=False) for i, (null, _) in enumerate(extra)
        )

    def run(self, n: int, generator: torch.Generator) -> Observation:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        return Observation({name: rng.multinomial(n, law) for name, law in self.laws.items()}, (), 0, b"")


def _case(experiment: _LawExperiment) -> Case:
    return Case(id="test/laws", family="test", description="", epsilon=EPSILON, make_experiment=lambda device: experiment)


UNIFORM8 = np.full(8, 1 / 8)


def test_a_clean_case_stops_early_and_says_so() -> None:
    """Two clean designed checks and a clean undesigned one: the case stops when both designed checks passed, well
    before its cap, powered, and records each pass; without the early pass it runs to the cap."""
    experiment = _LawExperiment([(UNIFORM8, UNIFORM8), (np.full(4, 0.25), np.full(4, 0.25))], [(UNIFORM8, UNIFORM8)])
    result = run_case(_case(experiment), experiment, SuiteConfig(), 100)
    assert (result.verdict, result.powered, result.early_pass) == (Verdict.PASS, True, True)
    assert result.n_trials < 0.75 * result.trial_cap
    assert result.pass_threshold == pytest.approx(1e3)
    assert result.reason.startswith(f"passed early after {result.n_trials} of {result.trial_cap} trials")
    designed = [c for c in result.checks if c.designed]
    assert len(designed) == 2
    assert max(c.passed_at or math.inf for c in designed) == result.n_trials
    assert all(c.pass_log_statistic is not None and c.pass_log_statistic >= math.log(1e3) for c in designed)
    undesigned = next(c for c in result.checks if not c.designed)
    assert (undesigned.passed_at, undesigned.pass_log_statistic) == (None, None)
    full = run_case(_case(experiment), experiment, SuiteConfig(early_pass=False), 100)
    assert (full.verdict, full.powered, full.early_pass, full.pass_threshold) == (Verdict.PASS, True, False, None)
    assert full.n_trials == full.trial_cap
    assert all(c.passed_at is None and c.pass_log_statistic is None for c in full.checks)


def test_a_bug_of_twice_epsilon_in_one_designed_check_still_fails() -> None:
    """One designed check clean, the other at TV 2 epsilon: every one of 20 seeds fails (it cannot pass early:
    that needs every designed check), and the clean check's early pass is recorded."""
    buggy = _proportional(UNIFORM8, 2 * EPSILON)
    experiment = _LawExperiment([(UNIFORM8, UNIFORM8), (UNIFORM8, buggy)])
    for seed in range(20):
        result = run_case(_case(experiment), experiment, SuiteConfig(seed=seed), 100)
        assert (result.verdict, result.failure, result.early_pass) == (Verdict.FAIL, Failure.LOSSLESS, False), seed


def test_an_undesigned_check_rejects_while_the_designed_ones_have_not_all_passed() -> None:
    """The undesigned checks run their e-processes until the stop: a large bug there fails the case."""
    experiment = _LawExperiment([(UNIFORM8, UNIFORM8)], [(UNIFORM8, _proportional(UNIFORM8, 0.45))])
    result = run_case(_case(experiment), experiment, SuiteConfig(), 100)
    assert (result.verdict, result.early_pass) == (Verdict.FAIL, False)
    assert result.headline == "lossless/u0"


# ------------------------------------------------------------------------------------ held by evidence

LOG_T = math.log(1e6)  # ln T of a run of 100 checks at alpha = 1e-4
HOLD = LOG_T / 4  # the hold level: a quarter of it, 3.45 (written out, so that the test pins HOLD_FRACTION)

#: Synthetic batch-end paths of a case: per check (name, pass flags or None when not watched, ln E path), and the
#: first batch end at which the case may stop early (None: it runs to its cap).
PATHS = [
    (
        "clean: stops when the last designed check passes",
        [("d0", [0, 1, 1, 1], [0.1, -0.5, 0.2, 0.0]), ("d1", [0, 0, 1, 1], [0.3, 0.0, -1.0, 0.4])],
        2,
    ),
    ("an undesigned check below T^(1/4) does not hold", [("d0", [0, 0, 1, 1], [0.0] * 4), ("u0", None, [1.0, 3.0, 3.45, 3.0])], 2),
    ("an undesigned check at T^(1/4) holds", [("d0", [0, 0, 1, 1], [0.0] * 4), ("u0", None, [1.0, 3.0, 3.46, 3.0])], None),
    (
        "an undesigned check past T^(1/4) before the pass holds to the cap",
        [("d0", [0, 1, 1, 1], [0.0] * 4), ("u0", None, [7.0, 9.0, 10.6, 11.0])],
        None,
    ),
    (
        "the hold is sticky: evidence that falls back still holds",
        [("d0", [0, 0, 1, 1], [0.0] * 4), ("u0", None, [5.0, 2.0, 1.0, 0.0])],
        None,
    ),
    ("a designed check that passed but holds evidence holds", [("d0", [0, 1, 1, 1], [0.0, 5.0, 0.0, 0.0])], None),
    (
        "the hold reads the evidence at the same look as the pass",
        [("d0", [0, 1, 1, 1], [0.0] * 4), ("u0", None, [0.0, 4.7, 0.0, 0.0])],
        None,
    ),
    ("a designed check that never passes", [("d0", [0, 0, 0, 0], [0.0] * 4), ("d1", [1, 1, 1, 1], [0.0] * 4)], None),
    ("no watched check: no early pass", [("u0", None, [0.0] * 4)], None),
]


def _first_stop(checks: list[tuple[str, list[int] | None, list[float]]]) -> int | None:
    """The first batch end at which :func:`early_pass.may_stop_early` lets the case stop, fed the running maxima."""
    for look in range(len(checks[0][2])):
        passed = [bool(flags[look]) for _, flags, _ in checks if flags is not None]
        running = [max(path[: look + 1]) for _, _, path in checks]
        if early_pass.may_stop_early(passed, running, LOG_T):
            return look
    return None


@pytest.mark.parametrize(("name", "checks", "stop"), PATHS, ids=[p[0] for p in PATHS])
def test_the_stopping_rule_on_synthetic_paths(name: str, checks: list[tuple[str, list[int] | None, list[float]]], stop: int | None) -> None:
    """Stop at the first batch end where every watched check passed and no check's e-process has ever reached
    T^(1/4)."""
    assert _first_stop(checks) == stop


def test_the_hold_is_at_the_fourth_root_of_the_threshold() -> None:
    assert early_pass.holds_evidence(HOLD, LOG_T)
    assert not early_pass.holds_evidence(HOLD - 1e-9, LOG_T)
    assert not early_pass.may_stop_early([], [], LOG_T)
    assert early_pass.may_stop_early([True], [HOLD - 1e-9], LOG_T)


def test_a_clean_check_rarely_holds() -> None:
    """Under the null the e-process reaches T^(1/4) with probability at most T^(-1/4) (Ville): at T = 1e4 (hold at
    E >= 10), 400 null paths of 8 cells watched at 32 looks hold at most 0.1 of the time (with binomial slack)."""
    rng = np.random.default_rng(7)
    p0 = np.full(8, 1 / 8)
    log_t = math.log(1e4)
    held = 0
    for _ in range(400):
        counts = np.zeros(8, dtype=np.int64)
        running = -math.inf
        for _ in range(32):
            counts += rng.multinomial(64, p0)
            running = max(running, log_e_dirichlet_mixture(counts, p0))
        held += early_pass.holds_evidence(running, log_t)
    assert held <= stats.binom.ppf(1 - 1e-4, 400, 0.1)


def test_a_case_does_not_pass_early_while_an_undesigned_check_holds_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean designed check of 8 cells and an undesigned 64-cell check at TV 0.165 (above the case's epsilon, below
    what it always rejects by the time the designed check passes): with the hold every one of 20 seeds fails, the case
    running on until the undesigned check rejects; without it (the hold turned off), some pass early."""
    uniform64 = np.full(64, 1 / 64)
    experiment = _LawExperiment([(UNIFORM8, UNIFORM8)], [(uniform64, _proportional(uniform64, 0.165))])
    held = [run_case(_case(experiment), experiment, SuiteConfig(seed=seed), 100) for seed in range(20)]
    assert all((r.verdict, r.headline, r.early_pass) == (Verdict.FAIL, "lossless/u0", False) for r in held)
    monkeypatch.setattr(early_pass, "HOLD_FRACTION", math.inf)
    free = [run_case(_case(experiment), experiment, SuiteConfig(seed=seed), 100) for seed in range(20)]
    assert sum(r.early_pass for r in free) >= 3
    assert all("not designed at TV 0.1 (no power claim): lossless/u0" in r.reason for r in free if r.verdict == Verdict.PASS)


class _Phased(_LawExperiment):
    """A clean designed check of 8 cells and an undesigned Bernoulli(1/2) check whose law is off by ``shift`` for the
    first ``until`` trials, then exact: its evidence rises, then falls back."""

    def __init__(self, shift: float, until: int) -> None:
        half = np.array([0.5, 0.5])
        super().__init__([(UNIFORM8, UNIFORM8)], [(half, half)])
        self.bug, self.until, self.seen = np.array([0.5 + shift, 0.5 - shift]), until, 0

    def run(self, n: int, generator: torch.Generator) -> Observation:
        obs = super().run(n, generator)
        if self.seen < self.until:
            rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
            obs.counts["lossless/u0"] = rng.multinomial(n, self.bug)
        self.seen += n
        return obs


def test_a_pass_at_the_cap_names_the_check_that_held_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The undesigned check's e-process passed T^(1/4) during its bad phase, then fell back below it: the hold is
    sticky, so the case runs to its cap, passes there and names the check; without the hold it passes early."""
    result = run_case(_case(_Phased(0.12, 480)), _Phased(0.12, 480), SuiteConfig(seed=0), 100)
    assert (result.verdict, result.early_pass, result.n_trials) == (Verdict.PASS, False, result.trial_cap)
    held = next(c for c in result.checks if c.name == "lossless/u0")
    assert held.log_e_value is not None
    assert held.log_e_value >= HOLD
    assert held.stopped_log_e_value is not None
    assert held.stopped_log_e_value < HOLD
    assert f"; no early pass: lossless/u0 (log E {held.log_e_value:.1f}) reached the hold level log E 3.5" in result.reason
    assert result.reason.endswith("; not designed at TV 0.1 (no power claim): lossless/u0")
    monkeypatch.setattr(early_pass, "HOLD_FRACTION", math.inf)
    free = run_case(_case(_Phased(0.12, 480)), _Phased(0.12, 480), SuiteConfig(seed=0), 100)
    assert (free.verdict, free.early_pass) == (Verdict.PASS, True)
    assert "no early pass" not in free.reason


def test_no_early_pass_reaches_the_suite_and_check_passes_it_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run.json"
    assert suite_main.main(["run", "--cases", "direct/far_apart/V8/g1", "--no-early-pass", "--json", str(out)]) == 0
    run = RunResult.from_json(json.loads(out.read_text()))
    assert run.early_pass_beta is None
    assert [(r.early_pass, r.n_trials == r.trial_cap) for r in run.results] == [(False, True)]
    assert suite_main.main(["run", "--cases", "direct/far_apart/V8/g1", "--json", str(out)]) == 0
    run = RunResult.from_json(json.loads(out.read_text()))
    assert run.early_pass_beta == 1e-3
    assert [(r.early_pass, r.n_trials < r.trial_cap) for r in run.results] == [(True, True)]

    forwarded: list[list[str]] = []

    def record(args: list[str], **kwargs: object) -> None:
        forwarded.append(args)
        raise RuntimeError("recorded")

    monkeypatch.setattr(importlib.import_module("specwatch.cli.check"), "_run", record)
    CliRunner().invoke(app, ["check", "--target", "reference", "--no-early-pass"])
    CliRunner().invoke(app, ["check", "--target", "reference"])
    assert ["--no-early-pass" in args for args in forwarded] == [True, False]
