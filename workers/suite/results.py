"""Frozen, JSON-serialisable results of the suite (schema versioned by ``RESULT_SCHEMA``)."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any

#: Bump when a field is added, removed or changes meaning.
RESULT_SCHEMA = 1
#: e-values above this are reported capped (JSON has no infinity); ``log_e_value`` stays exact.
E_VALUE_CAP = 1e300


class Verdict(enum.StrEnum):
    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    ERROR = "error"
    SKIPPED = "skipped"


def capped_e(log_e: float) -> float:
    return E_VALUE_CAP if log_e >= math.log(E_VALUE_CAP) else math.exp(log_e)


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class CheckResult:
    name: str
    layer: str
    observations: int
    log_e_value: float | None  # None: refuted with certainty (support violation)
    e_value: float
    rejected: bool
    support_violations: int
    tv_estimate: float
    tv_ci: tuple[float, float]
    design_epsilon: float | None  # TV detectable with the designed power at the trials run


@dataclass(frozen=True)
class Acceptance:
    observed: float | None
    expected: float | None


@dataclass(frozen=True)
class CaseResult:
    case_id: str
    family: str
    description: str
    verdict: Verdict
    reason: str
    lossless: Verdict
    conformance: Verdict
    n_trials: int
    trial_cap: int
    powered: bool
    e_value: float
    log_e_value: float | None
    p_value: float | None
    threshold: float
    tv_estimate: float | None
    tv_ci: tuple[float, float] | None
    acceptance: Acceptance
    counts_digest: str
    fingerprint: str
    duration_s: float
    seed: int
    attempt: int
    device: str
    checks: tuple[CheckResult, ...] = ()
    #: Speculative end-to-end cases: histograms of drafts per verification, accepted drafts and rounds per
    #: call observed in the library's own calls, the design and its shortfalls (None for other cases).
    coverage: dict[str, Any] | None = None
    schema: int = RESULT_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunResult:
    suite_version: str
    catalogue_version: str
    target: str
    verdict: Verdict
    alpha: float
    beta: float
    tests: int
    seed: int
    device: str
    environment: dict[str, str]
    started_at: str
    duration_s: float
    results: tuple[CaseResult, ...] = field(default=())
    schema: int = RESULT_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_verdict(results: tuple[CaseResult, ...]) -> Verdict:
    """FAIL if any case failed; else ERROR if any errored; else PASS."""
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    if Verdict.ERROR in verdicts:
        return Verdict.ERROR
    return Verdict.PASS
