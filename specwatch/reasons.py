"""A case's result in words: the check it reports (:func:`headline`) and why it passed or failed (:func:`case_reason`,
:func:`early_reason`, :func:`pass_scope`: what a pass does not claim), from its evidence (:mod:`specwatch.evidence`)."""

from __future__ import annotations

import math
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specwatch.early_pass import hold_level
from specwatch.protocol import CheckResult, Layer

if TYPE_CHECKING:
    from specwatch.evidence import CaseEvidence
    from specwatch.experiments import CheckSpec


def headline(checks: Sequence[CheckResult], state: CaseEvidence, failed: Layer | None, designed: set[str]) -> CheckResult | None:
    """The check a case reports.

    Failed layer: the check that rejected first (the strongest evidence when none did: certain violations).
    Otherwise the designed checks (reached with probability >= 1e-3): the one with the largest upper TV
    bound, i.e. the least the case can say. Taking the largest running maximum over all checks instead
    would headline a rarely reached check that wandered up (its running maximum is not an e-value).
    """
    if failed is not None:
        pool = [c for c in checks if c.layer == failed.value]
        rejected = [c for c in pool if c.name in state.rejected_at]
        if rejected:
            return min(rejected, key=lambda c: (state.rejected_at[c.name], -(math.inf if c.log_e_value is None else c.log_e_value)))
        return max(pool, key=lambda c: math.inf if c.log_e_value is None else c.log_e_value, default=None)
    pool = [c for c in checks if c.name in designed] or list(checks)
    return max(pool, key=lambda c: (c.tv_ci[1], c.tv_estimate), default=None)


def early_reason(state: CaseEvidence, watched: Sequence[CheckSpec], cap: int, epsilon: float) -> str:
    """Why a case passed before its cap: each designed (``watched``) check is done, by the observations its design
    plans (power 1 - beta at TV epsilon, fixed-n; named) or by its pass statistic (docs/statistics.md §7a)."""
    level = f"1/beta_pass = {math.exp(state.pass_log_threshold or 0.0):.3g} against TV >= {epsilon:g}"
    power = f"power 1 - beta at TV >= {epsilon:g}"
    planned = [c.name for c in watched if c.name in state.planned_at]
    passed = [c.name for c in watched if c.name not in state.planned_at and c.name in state.passed_at]
    head = f"passed early after {state.trials} of {cap} trials: "
    if not planned:
        return head + f"every designed check's pass statistic reached {level}"
    if not passed:
        return head + f"every designed check has its planned observations ({power})"
    return head + (
        f"every designed check is done: {', '.join(planned)} by the observations planned ({power}), "
        f"{', '.join(passed)} by the pass statistic reaching {level}"
    )


def pass_scope(state: CaseEvidence, checks: Sequence[CheckResult], designed: set[str], epsilon: float) -> str:
    """What a pass does not claim: the checks not designed at the case's TV (no power claim at ``epsilon``), and the
    checks that held the case to its cap because their evidence reached the fourth root of the threshold."""
    text = ""
    held = state.holding() if state.pass_log_threshold is not None and state.pass_log else []
    if held:
        evidence = ", ".join(f"{name} (log E {state.max_log_e[name]:.1f})" for name in held)
        level = hold_level(state.log_threshold)
        text += f"; no early pass: {evidence} reached the hold level log E {level:.1f} (a third of the threshold's)"
    undesigned = [c.name for c in checks if c.name not in designed]
    if undesigned:
        text += f"; not designed at TV {epsilon:g} (no power claim): {', '.join(undesigned)}"
    return text


def case_reason(
    state: CaseEvidence,
    checks: Sequence[CheckResult],
    *,
    threshold: float,
    epsilon: float,
    powered: bool,
    designed: set[str],
    claimed: set[str],
) -> str:
    if state.raised is not None and not state.failed(Layer.LOSSLESS):
        error = state.raised.error
        tail = "".join(traceback.format_exception(error))[-2000:]
        return f"the target raised on a valid input after {state.trials} trials: {state.raised}\n{tail}"
    for layer in (Layer.LOSSLESS, Layer.CONFORMANCE):
        if layer in state.violations:
            reason = f"certain {layer.value} violation: {state.violations[layer].message}"
            return reason + _underpowered_lossless(layer, checks, epsilon=epsilon, powered=powered, designed=designed, claimed=claimed)
        rejected = [c for c in checks if c.layer == layer.value and c.rejected]
        if rejected:
            first = min(rejected, key=lambda c: state.rejected_at[c.name])
            reason = (
                f"{layer.value}: {first.name} e-value reached the threshold {threshold:.3g} after "
                f"{state.rejected_at[first.name]} trials (TV estimate {first.tv_estimate:.3f})"
            )
            return reason + _underpowered_lossless(layer, checks, epsilon=epsilon, powered=powered, designed=designed, claimed=claimed)
    if not checks:
        return f"every deterministic check held in {state.trials} trials"
    if not powered:
        worst = max((c.design_epsilon or math.inf for c in checks if c.name in designed and c.layer in claimed), default=math.inf)
        return (
            f"no check reached the threshold in {state.trials} trials; underpowered: the observations the checks got "
            f"detect TV >= {worst:.3g} at the designed power, not {epsilon:g}"
        )
    return f"no check reached the threshold in {state.trials} trials (designed to detect TV >= {epsilon:g})"


def _underpowered_lossless(
    layer: Layer, checks: Sequence[CheckResult], *, epsilon: float, powered: bool, designed: set[str], claimed: set[str]
) -> str:
    """A conformance failure still claims losslessness: say so when that claim is not backed by power."""
    if layer is not Layer.CONFORMANCE or powered:
        return ""
    worst = max((c.design_epsilon or math.inf for c in checks if c.name in designed and c.layer in claimed), default=math.inf)
    return f"; losslessness underpowered: its observations detect TV >= {worst:.3g}, not {epsilon:g}"
