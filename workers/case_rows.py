"""A suite case result as a database row: the columns the readers query, and the rest in ``details`` as the suite
wrote it (each check's stopped e-value, which confirmation multiplies; the failure, the headline check, coverage, the
early pass, a replayed counterexample)."""

from __future__ import annotations

import json
import math

from service.models import CaseResult, Verdict
from specwatch import protocol as suite

_CASE_DETAIL_FIELDS = (
    "family",
    "description",
    "reason",
    "trial_cap",
    "powered",
    "attempt",
    "checks",
    "schema",
    # schema 2
    "failure",
    "headline",
    "current_log_e_value",
    "current_e_value",
    "certain",
    # speculative end-to-end cases
    "coverage",
    # schema 4: the early pass (its per-check statistic and trials are in ``checks``)
    "early_pass",
    "pass_threshold",
    # schema 5: a counterexample replayed with the earlier run's inputs (a confirmation run's)
    "replay",
    # schema 6: two probes with one seed agreed (None: not checked)
    "reproducible",
    # schema 7: why the case stopped (its checks' planned observations are in ``checks``)
    "stopped_by",
)


def _float(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _layer(verdict: suite.Verdict) -> bool | None:
    return {suite.Verdict.PASS: True, suite.Verdict.FAIL: False}.get(verdict)


def case_result_row(run_id: int, case: suite.CaseResult) -> CaseResult:
    """One suite case result as a row; what has no column goes to ``details`` (as the suite wrote it).

    ``details`` keeps each check's stopped e-value (what confirmation multiplies), the case's ``failure``
    (``raised``: the target raised on a valid input), its ``headline`` check and that check's current e-value.
    """
    tv_low, tv_high = case.tv_ci or (None, None)
    written = case.to_dict()
    return CaseResult(
        run_id=run_id,
        case_id=case.case_id,
        verdict=Verdict(case.verdict.value),
        lossless=_layer(case.lossless),
        conformance=_layer(case.conformance),
        n_trials=case.n_trials,
        e_value=_float(case.e_value),
        log_e_value=_float(case.log_e_value),
        p_value=_float(case.p_value),
        threshold=_float(case.threshold),
        tv_estimate=_float(case.tv_estimate),
        tv_low=_float(tv_low),
        tv_high=_float(tv_high),
        acceptance_observed=_float(case.acceptance.observed),
        acceptance_expected=_float(case.acceptance.expected),
        acceptance_per_trial_max=case.acceptance.per_trial_max,
        counts_digest=case.counts_digest,
        fingerprint=case.fingerprint,
        duration_s=_float(case.duration_s),
        seed=case.seed if 0 <= case.seed < 2**63 else None,
        device=case.device,
        # JSON values, as the suite wrote them and as they read back (lists, strings), not tuples and enums.
        details=json.loads(json.dumps({key: written[key] for key in _CASE_DETAIL_FIELDS})),
    )
