"""``assert_lossless``: the suite's exact-law check of one sampler, as a test assertion.

It is what ``specwatch check --target module:function`` runs, in the caller's process: the cases are the
built-in catalogue's (``specwatch.cases``), each check's e-process is compared with m / alpha after every
batch (Ville's inequality: the run's family-wise false-alarm rate is at most ``alpha`` whatever the number of
trials), and a case stops at a rejection or at the trials that give every check power 1 - beta at its TV
distance. See docs/statistics.md.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence

from specwatch.cases import CASES, select
from specwatch.protocol import CaseResult, Failure, RunResult, Verdict
from specwatch.reproducible import one_thread
from specwatch.runner import SuiteConfig, run_suite
from specwatch.sampling import Sampler

#: Every case of the built-in catalogue: direct chain steps and deterministic edge checks.
ALL_CASES = ("direct/*", "edge/*")


class LosslessnessError(AssertionError):
    """The sampler failed the suite: its message names every failing case, the check and the TV estimate.

    ``result`` is the whole run (every case's e-values, TV intervals and acceptance).
    """

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


class IrreproducibleSamplerWarning(UserWarning):
    """A sampler drew randomness the suite cannot seed: two probes of a case with one seed gave different outputs.

    The suite seeds the generator it passes and the global ones (``random``, ``np.random``, torch's); a sampler that
    draws elsewhere (``np.random.default_rng()`` without a seed, the clock, a nondeterministic kernel) gives other
    trials on every run, so a failure's ``reproduce:`` line need not reproduce it. Draw from the generator passed in.
    """


class UnderpoweredError(AssertionError):
    """No case failed, but some passed underpowered: they stopped before the trials their design needs (``budget_s``
    ran out) or their path's coverage fell short, so a violation as small as designed could have been missed.

    ``cases`` names them; ``budget_s`` is about the ``budget_s`` a call needs for every case to reach its design
    (from the time each took and the trials it ran of its cap); ``result`` is the whole run.
    ``assert_lossless(..., allow_underpowered=True)`` accepts such a run.
    """

    def __init__(self, message: str, result: RunResult, cases: list[str], budget_s: float | None) -> None:
        super().__init__(message)
        self.result, self.cases, self.budget_s = result, cases, budget_s


def _needed_s(case: CaseResult) -> float | None:
    """About the seconds ``case`` needs to run its trial cap, at the pace it ran (None when it ran no trial)."""
    if case.n_trials <= 0:
        return None
    return case.duration_s * max(case.trial_cap, case.n_trials) / case.n_trials


def _need(case: CaseResult) -> str:
    needed = _needed_s(case)
    return "" if needed is None else f", needs about {needed:.0f} s"


def _name(sampler: Sampler) -> str:
    return str(getattr(sampler, "__qualname__", None) or getattr(sampler, "__name__", None) or type(sampler).__name__)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


#: The check a certain violation names in its reason ("certain lossless violation: lossless/pos3: ...").
_CERTAIN_CHECK = re.compile(r"^certain \w+ violation: (\S+):")


def describe_failure(case: CaseResult) -> str:
    """One failing or errored case in two lines: case, check, layer, trials and TV estimate; then its reason."""
    reason = case.reason.splitlines()[0] if case.reason else ""
    if case.verdict is Verdict.ERROR:
        return f"{case.case_id}: error (the case could not run): {reason}"
    found = _CERTAIN_CHECK.match(reason)
    check = case.headline or (found.group(1) if found else "-")
    if case.failure is Failure.RAISED:
        evidence = "the sampler raised on a valid input"
    elif case.failure is not None and case.failure.value in case.certain:
        evidence = "an observation the exact law rules out (certain)"
    else:
        log_e = "-" if case.log_e_value is None else f"{case.log_e_value:.1f}"
        evidence = f"log E = {log_e} >= log threshold {math.log(case.threshold):.1f}"
    if case.tv_estimate is None:
        tv = "no TV estimate (a deterministic check)"
    else:
        interval = f" [{_fmt(case.tv_ci[0])}, {_fmt(case.tv_ci[1])}]" if case.tv_ci is not None else ""
        tv = f"TV estimate {_fmt(case.tv_estimate)}{interval}"
    layer = case.failure.value if case.failure is not None else "?"
    return f"{case.case_id}: check {check} ({layer}) failed after {case.n_trials} trials: {evidence}; {tv}\n      {reason}"


def check_lossless(
    sampler: Sampler,
    *,
    cases: Sequence[str] = ALL_CASES,
    alpha: float = 1e-4,
    beta: float = 1e-3,
    budget_s: float | None = None,
    quick: bool = False,
    epsilon: float | None = None,
    seed: int = 0,
    device: str = "cpu",
    max_batch: int | None = None,
    tests: int | None = None,
) -> RunResult:
    """Run the suite's ``cases`` (id globs) against ``sampler`` and return the result; raises nothing on a failure.

    ``alpha``: the family-wise false-alarm rate of the call (every check of every case shares it).
    ``budget_s``: about how long the call may take, shared evenly by the cases; a case stopped by it passes
    with ``powered`` false (it could not rule out a TV as small as designed). ``quick``: every case at TV 0.05 at least
    (far fewer trials); ``epsilon``: the TV distance every case is designed to detect instead of its own.
    ``seed``: every case's seed derives from it, and the global generators a sampler may draw from (``random``,
    ``np.random``, torch's) are seeded from it per case, so a failure reproduces exactly, in this process as in
    ``specwatch check --seed`` (torch runs with one thread here as there).
    ``max_batch``: the most trials one call of ``sampler`` gets (default: sized to memory from the case's V and
    gamma, 64 to 65,536; see docs/pytest.md). The same seed and ``max_batch`` give the same trials; another
    ``max_batch`` draws the same laws in another random stream.
    ``tests``: the number of checks the run's ``alpha`` is split over (default: those of the chosen cases); a
    ``reproduce:`` line passes the failed run's, so that the cases it names keep their thresholds.
    """
    if not 0 < alpha < 1 or not 0 < beta < 1:
        raise ValueError("alpha and beta must be in (0, 1)")
    if budget_s is not None and not budget_s > 0:
        raise ValueError("budget_s must be > 0")
    if max_batch is not None and max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    if tests is not None and tests < 1:
        raise ValueError("tests must be >= 1")
    chosen = tuple(c for c in select(list(cases), CASES) if c.quick or not quick)
    if not chosen:
        known = ", ".join(sorted({c.id.rsplit("/", 2)[0] + "/*" for c in CASES}))
        raise ValueError(f"no case matches {list(cases)!r}; case ids look like {known}")
    config = SuiteConfig(
        alpha=alpha,
        beta=beta,
        epsilon=epsilon,
        quick=quick,
        seed=seed,
        device=device,
        time_budget_s=None if budget_s is None else budget_s / len(chosen),
        sampler_max_batch=max_batch,
    )
    with one_thread():
        result = run_suite(chosen, sampler, config, target=f"python:{_name(sampler)}", tests=tests)
    drifting = [c.case_id for c in result.results if c.reproducible is False]
    if drifting:
        listed = ", ".join(drifting[:3]) + (f" and {len(drifting) - 3} more" if len(drifting) > 3 else "")
        warnings.warn(
            IrreproducibleSamplerWarning(
                f"{_name(sampler)} drew randomness the suite cannot seed: two probes with one seed differed on {listed}; "
                "the same seed need not give the same trials (draw from the generator passed in)"
            ),
            stacklevel=2,
        )
    return result


def assert_lossless(
    sampler: Sampler,
    *,
    cases: Sequence[str] = ALL_CASES,
    alpha: float = 1e-4,
    beta: float = 1e-3,
    budget_s: float | None = None,
    quick: bool = False,
    epsilon: float | None = None,
    seed: int = 0,
    device: str = "cpu",
    allow_underpowered: bool = False,
    max_batch: int | None = None,
    tests: int | None = None,
) -> RunResult:
    """Assert that ``sampler`` follows the exact speculative-sampling laws on ``cases``; return the run.

    Raises :class:`LosslessnessError` when a case fails (its emitted tokens or its acceptance behaviour
    refute the exact law at family-wise level ``alpha``, or it raised on a valid input) or errors. Under H0
    (the sampler is exact) it raises with probability at most ``alpha`` (Ville 1939, Bonferroni over checks).
    Else raises :class:`UnderpoweredError` when a case passed underpowered (a ``budget_s`` too short for its
    design), unless ``allow_underpowered``: a pass that could have missed a violation of the designed size is
    not a green test. The other arguments are :func:`check_lossless`'s.
    """
    __tracebackhide__ = True  # pytest shows the assertion, not this frame
    result = check_lossless(
        sampler,
        cases=cases,
        alpha=alpha,
        beta=beta,
        budget_s=budget_s,
        quick=quick,
        epsilon=epsilon,
        seed=seed,
        device=device,
        max_batch=max_batch,
        tests=tests,
    )
    bad = [c for c in result.results if c.verdict in (Verdict.FAIL, Verdict.ERROR)]
    if not bad:
        weak = [c for c in result.results if c.verdict is Verdict.PASS and not c.powered]
        if weak and not allow_underpowered:
            raise _underpowered(sampler, result, weak, budget_s=budget_s, quick=quick, seed=seed)
        return result
    lines = [
        f"{_name(sampler)} is not lossless: {len(bad)} of {len(result.results)} case(s) failed "
        f"(alpha = {alpha:g}, seed = {seed}, specwatch suite {result.suite_version})",
        *(f"  {describe_failure(c)}" for c in bad),
        f"  reproduce: {reproduce_call(sampler, result, bad, quick=quick, epsilon=epsilon, device=device, max_batch=max_batch)}",
    ]
    if any(c.reproducible is False for c in bad):
        lines.append("  (the sampler draws randomness the suite cannot seed: this line may not reproduce the failure)")
    raise LosslessnessError("\n".join(lines), result)


def reproduce_call(
    sampler: Sampler,
    result: RunResult,
    bad: Sequence[CaseResult],
    *,
    quick: bool,
    epsilon: float | None,
    device: str,
    max_batch: int | None,
) -> str:
    """The call that runs the failing cases ``bad`` again exactly: their ids, the run's seed, alpha, beta and its
    number of checks (``tests``: fewer cases would otherwise lower every threshold), and every option that changes
    the trials (``quick``, ``epsilon``, ``device``, ``max_batch``) where it is not the default."""
    options = [f"cases={[c.case_id for c in bad]!r}", f"seed={result.seed}"]
    if result.alpha != 1e-4:
        options.append(f"alpha={result.alpha!r}")
    if result.beta != 1e-3:
        options.append(f"beta={result.beta!r}")
    options.append(f"tests={result.tests}")
    extra = {"quick": quick or None, "epsilon": epsilon, "device": None if device == "cpu" else device, "max_batch": max_batch}
    options += [f"{name}={value!r}" for name, value in extra.items() if value is not None]
    return f"assert_lossless({_name(sampler)}, {', '.join(options)})"


def _underpowered(
    sampler: Sampler, result: RunResult, weak: list[CaseResult], *, budget_s: float | None, quick: bool, seed: int
) -> UnderpoweredError:
    """The error of a run whose cases ``weak`` passed underpowered: each with its trials of its cap and the time it
    needs, and the ``budget_s`` that gives every case of the call its design (the budget is shared evenly)."""
    needs = [n for c in result.results if (n := _needed_s(c)) is not None]
    budget = math.ceil(len(result.results) * max(needs) * 1.1) if needs and budget_s is not None else None
    lines = [
        f"{_name(sampler)} passed, but {len(weak)} of {len(result.results)} case(s) passed underpowered: a violation as small "
        "as designed could have been missed",
        *(
            f"  {c.case_id}: {c.n_trials:,} of {c.trial_cap:,} trials" + (f", needs about {n:.0f} s" if (n := _needed_s(c)) else "")
            for c in weak
        ),
    ]
    if budget is not None:
        lines.append(f"  about budget_s={budget} runs every case to its design{' (quick)' if quick else ''}; seed={seed}")
    lines.append("  allow_underpowered=True accepts the run as it is")
    return UnderpoweredError("\n".join(lines), result, [c.case_id for c in weak], budget)
