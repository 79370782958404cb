"""Pure decisions of the analysis: classification, confirmation by optional continuation, acceptance drift,
bisection.

Functions over plain values (no database, no Celery): the analysis modules load rows, call these, and store
what they decide. The statistics behind them are in ``docs/statistics.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from service.models import AlertKind
from service.models.entries import RAISED
from specwatch.protocol import Layer

#: The layers a case can fail in (an alert entry's reason: the suite's :class:`~specwatch.protocol.Layer`), beside
#: ``RAISED``: the target itself raised.
LOSSLESS, CONFORMANCE = Layer.LOSSLESS, Layer.CONFORMANCE
#: What confirmed a certain violation whose counterexample came back with the first run's inputs.
REPLAYED = "counterexample replayed"


@dataclass(frozen=True)
class CheckEvidence:
    """One check of one run: did its running maximum reach the threshold, and its e-value at the stopping time.

    ``stopped_log_e``: the log e-value when the case stopped, a valid e-value by optional stopping (the
    running maximum is not: under the null its mean exceeds 1); None: refuted with certainty; -inf when the
    run did not record it (results of schema 1).
    """

    name: str
    layer: str
    rejected: bool
    stopped_log_e: float | None


@dataclass(frozen=True)
class RunEvidence:
    """One case's evidence from one run, at its own threshold T = m / alpha (what confirmation compares; the
    suite's own :class:`specwatch.evidence.CaseEvidence` is the case's counts and e-processes while it runs)."""

    threshold: float
    checks: tuple[CheckEvidence, ...] = ()
    certain: frozenset[str] = frozenset()  # layers with an observation impossible under the exact law
    raised: bool = False  # the target raised on a valid input
    #: Layers with a certain violation when the case was first replayed with the earlier run's inputs (its seeds).
    replayed: frozenset[str] = frozenset()

    @property
    def log_threshold(self) -> float:
        return math.log(self.threshold)


def confirmation(first: RunEvidence, again: RunEvidence, layer: str) -> str | None:
    """What confirms, in the rerun ``again`` (fresh seeds), that ``layer`` of the case failed in ``first``; None if nothing.

    Only evidence about the same layer counts (a conformance-only violation never confirms a lossless alert):
    - ``layer == RAISED``: the target raised again on the same case (deterministic, no statistics);
    - a certain violation of ``layer`` in the rerun (impossible under the exact law);
    - a check of ``layer`` whose stopped e-values multiply past the product of thresholds: E1 * E2 >= T1 * T2.
      Each stopped value is an e-value (optional stopping of a test martingale at the case's stopping time),
      the runs are independent, so the product is an e-value and Markov bounds the crossing by 1 / (T1 T2);
    - a check of ``layer`` that rejected in both runs (running maxima past T1 and T2): by Ville's inequality
      and independence at most 1 / (T1 T2).
    A certain violation in ``first`` (stopped e-value None) is not an infinite factor: it is confirmed only by
    its counterexample coming back when the rerun replays the case with ``first``'s inputs (``again.replayed``:
    the same seeds, so the same prompts and draws; a certain violation is impossible under the null whatever the
    inputs, so this adds nothing to the bound below), by a certain violation of ``layer`` with the rerun's fresh
    inputs, or by a check of ``layer`` rejecting there on its own (running maximum or stopped e-value past T2); a
    clean rerun confirms nothing.
    Under the null of ``layer`` an alert of a case is thus confirmed with probability at most
    2 m_L / (T1 T2), m_L being the case's checks of that layer; with T = m / alpha (m >= m_L checks in the
    run) at most 2 alpha^2 / m per case. References: Ville 1939; Vovk & Wang 2021 (products of independent
    e-values); Grunwald et al. 2024 (optional continuation).
    """
    if layer == RAISED:
        return "raised again" if again.raised else None
    if layer in first.certain and layer in again.replayed:
        return REPLAYED
    if layer in again.certain:
        return "certain violation"
    return _confirming_check(first, again, layer)


def _confirming_check(first: RunEvidence, again: RunEvidence, layer: str) -> str | None:
    """The check of ``layer`` whose evidence in ``again`` confirms ``first``'s (:func:`confirmation`), if any."""
    before = {c.name: c for c in first.checks if c.layer == layer}
    budget = first.log_threshold + again.log_threshold
    for check in again.checks:
        if check.layer != layer or check.name not in before:
            continue
        earlier = before[check.name]
        if check.stopped_log_e is None or (earlier.rejected and check.rejected):
            return check.name  # refuted with certainty in the rerun, or rejected in both runs
        if earlier.stopped_log_e is None:
            # A certain violation in the first run has no finite e-value to multiply: the rerun must reject on
            # its own (running maximum or stopped e-value past its own threshold); a clean rerun confirms nothing.
            if check.rejected or check.stopped_log_e >= again.log_threshold:
                return check.name
            continue
        if earlier.stopped_log_e + check.stopped_log_e >= budget:
            return check.name
    return None


@dataclass(frozen=True)
class Signature:
    """What identifies a case's failure beyond the case: how a failure is told from another one in the same case.

    ``reason``: the layer refuted, or ``raised``; ``check``: the headline check (its name carries the layer and
    the position or order it tests: ``lossless/pos3``, ``conformance/K``), or the exception's type; ``checks``: every
    check of the layer that rejected (which one rejects first is chance when a bug moves several); ``evidence``:
    ``certain`` (an observation impossible under the exact law), ``statistical`` (an e-value past its threshold)
    or ``exception``; ``tv``: the headline check's TV interval (None: not measured).
    """

    reason: str
    check: str | None
    evidence: str
    tv: tuple[float, float] | None = None
    checks: frozenset[str] = frozenset()

    def as_dict(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "check": self.check,
            "checks": sorted(self.checks),
            "evidence": self.evidence,
            "tv": list(self.tv) if self.tv else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Signature:
        tv = data.get("tv")
        pair = (float(tv[0]), float(tv[1])) if isinstance(tv, list | tuple) and len(tv) == 2 else None
        check, checks = data.get("check"), data.get("checks")
        named = frozenset(str(c) for c in checks) if isinstance(checks, list | tuple) else frozenset()
        return cls(str(data.get("reason", "")), None if check is None else str(check), str(data.get("evidence", "")), pair, named)

    def failed_checks(self) -> frozenset[str]:
        """The checks this failure names: those that rejected, else its headline."""
        return self.checks or (frozenset({self.check}) if self.check else frozenset())


def signatures_differ(new: Signature, old: Signature) -> bool:
    """Is ``new`` another failure than ``old`` of the same case (a new regression, not the standing one)?

    Yes when the layer differs (or the target raises where it refuted a law, or the reverse), when other checks
    failed (no check in common: another position or order), when the evidence changed kind (certain to statistical
    or back), or when both TV intervals were measured and are disjoint (the same bug's intervals from two runs
    overlap, each holding the true distance with its coverage). An unknown check on either side is not a difference.
    """
    if new.reason != old.reason or new.evidence != old.evidence:
        return True
    now, before = new.failed_checks(), old.failed_checks()
    if now and before and not now & before:
        return True
    if new.tv is not None and old.tv is not None:
        return new.tv[1] < old.tv[0] or old.tv[1] < new.tv[0]
    return False


@dataclass(frozen=True)
class AcceptanceSample:
    """Mean accepted drafts per trial over ``trials`` trials, each in [0, gamma] (gamma: the per-trial range B)."""

    mean: float
    trials: int
    gamma: int


@dataclass(frozen=True)
class Drift:
    difference: float  # current minus baseline mean acceptance
    radius: float  # half-width at which the difference becomes significant
    significant: bool


def acceptance_drift(current: AcceptanceSample, baseline: Sequence[AcceptanceSample], alpha: float) -> Drift | None:
    """Is the current commit's mean acceptance different from the recent passing baseline?

    Two-sided, calibrated by Hoeffding's inequality for bounded variables (each trial's accepted
    count lies in [0, B], B = ``gamma``: a chain step's drafts, or an end-to-end trial's per-trial maximum):
    under "same mean", P(|mean_c - mean_b| >= r) <= alpha with
    r = B * sqrt(ln(4 / alpha) / 2) * sqrt(1/n_c + 1/n_b) (a union of the two one-sample bounds).
    Valid for any trial count, no asymptotics; conservative. None when there is no baseline.
    """
    pool = [b for b in baseline if b.trials > 0 and b.gamma == current.gamma]
    if not pool or current.trials == 0:
        return None
    n_b = sum(b.trials for b in pool)
    mean_b = sum(b.mean * b.trials for b in pool) / n_b
    radius = current.gamma * math.sqrt(math.log(4.0 / alpha) / 2.0) * math.sqrt(1.0 / current.trials + 1.0 / n_b)
    difference = current.mean - mean_b
    return Drift(difference=difference, radius=radius, significant=abs(difference) >= radius)


class CommitOutcome(StrEnum):
    """What a tested commit says about the cases a bisection searches for."""

    GOOD = "good"
    BAD = "bad"
    UNKNOWN = "unknown"  # not tested yet, broken or uninstallable (cannot say)


@dataclass(frozen=True)
class Bisection:
    """The state of a first-bad-commit search over commits in branch order (oldest first)."""

    first_bad: str | None  # known once the last good commit is directly followed by a bad one
    next_to_test: str | None  # the midpoint of the remaining untested range
    last_good: str | None


def bisect(commits: Sequence[str], outcomes: Mapping[str, CommitOutcome]) -> Bisection:
    """Next commit to test between the newest good commit before the newest bad one and the first bad after it.

    ``commits`` is the branch order (oldest first, ancestors before descendants), ending with the commit that
    found the failure; ``outcomes`` the known result per sha. The search belongs to the *newest* streak of
    failures: its last good commit is the newest good one before the newest bad one, so an earlier streak
    (failing, then fixed: a good commit after it) never answers for a later one (issue 26: a bug that came back
    after a revert was named at its first appearance and merged into the resolved alert). Commits whose outcome
    is unknown (untested, or broken so they cannot tell) between the last good and the first bad after it are
    the search range; the midpoint is tested next (git-bisect's rule), so a range of k untested commits needs
    ceil(log2(k + 1)) runs. Broken commits (outcome UNKNOWN) are not retested: if only they separate good from
    bad, the earliest bad one is named. Without any good commit before it, the earliest bad monitored commit
    is named (there is nothing to bisect against).
    """
    last_bad_index = next((i for i in range(len(commits) - 1, -1, -1) if outcomes.get(commits[i]) == CommitOutcome.BAD), None)
    if last_bad_index is None:
        return Bisection(first_bad=None, next_to_test=None, last_good=_last(commits, outcomes, CommitOutcome.GOOD, len(commits)))
    last_good_index = next((i for i in range(last_bad_index - 1, -1, -1) if outcomes.get(commits[i]) == CommitOutcome.GOOD), None)
    start = last_good_index + 1 if last_good_index is not None else 0
    first_bad_index = next(i for i in range(start, last_bad_index + 1) if outcomes.get(commits[i]) == CommitOutcome.BAD)
    if last_good_index is None:  # nothing good was ever seen: the first bad among the monitored commits
        return Bisection(first_bad=commits[first_bad_index], next_to_test=None, last_good=None)
    untested = [i for i in range(last_good_index + 1, first_bad_index) if commits[i] not in outcomes]
    last_good = commits[last_good_index]
    if not untested:
        return Bisection(first_bad=commits[first_bad_index], next_to_test=None, last_good=last_good)
    middle = untested[(len(untested) - 1) // 2]
    return Bisection(first_bad=None, next_to_test=commits[middle], last_good=last_good)


@dataclass(frozen=True)
class FixBisection:
    """The state of a first-good-commit search: where a failing case passes again first."""

    first_good: str | None  # known once the last bad commit is directly followed by a good one
    next_to_test: str | None
    last_bad: str | None


_FLIPPED = {CommitOutcome.GOOD: CommitOutcome.BAD, CommitOutcome.BAD: CommitOutcome.GOOD, CommitOutcome.UNKNOWN: CommitOutcome.UNKNOWN}


def bisect_fix(commits: Sequence[str], outcomes: Mapping[str, CommitOutcome]) -> FixBisection:
    """Next commit to test between the newest bad commit before the newest good one and the first good after it.

    The mirror of :func:`bisect` (a fix is the first commit of a streak of passes, as a regression is the first of a
    streak of failures): ``commits`` in branch order end with the commit where the failure was seen fixed, and the
    same rules hold with good and bad exchanged (midpoints, git-bisect's rule; unknown commits not retested).
    """
    found = bisect(commits, {sha: _FLIPPED[outcome] for sha, outcome in outcomes.items()})
    return FixBisection(first_good=found.first_bad, next_to_test=found.next_to_test, last_bad=found.last_good)


def _last(commits: Sequence[str], outcomes: Mapping[str, CommitOutcome], outcome: CommitOutcome, end: int) -> str | None:
    return next((commits[i] for i in range(end - 1, -1, -1) if outcomes.get(commits[i]) == outcome), None)


@dataclass(frozen=True)
class CaseOutcome:
    """One case of a finished run, as the classification needs it."""

    case_id: str
    verdict: str  # pass | fail | error | skipped
    lossless: bool | None  # None: not measured (error, skipped, raised)
    conformance: bool | None
    raised: bool = False  # the target raised on a valid input (a failing case)


def classify(run_status: str, cases: Sequence[CaseOutcome]) -> tuple[AlertKind | None, list[str]]:
    """What a finished run says about its commit: the alert kind it calls for and the cases behind it.

    The per-case verdicts already carry the run's family-wise control (each case rejects at E >= m/alpha,
    Bonferroni over the run's m tests), so a failing case is a finding of the run. A run in status
    ``error`` (the commit does not import, or crashes the suite) is BROKEN, never a violation; one in status
    ``uninstallable`` (it could not be installed, however often it was retried) is UNINSTALLABLE, which says
    nothing about the commit's code (neither broken nor a violation). A failing
    case whose losslessness layer fails makes a VIOLATION; else failing cases whose target raised on a valid
    input make an EXCEPTION (a finding about the sampler, not a broken commit); else failing cases whose
    losslessness holds but whose conformance fails (the K law or the residual law) make a PERFORMANCE
    regression. A passing run calls for nothing (None, []).

    The cases are every failing case, worst first (lossless, raised, conformance only): the kind is the worst
    one's, and a case that raised (or failed conformance only) beside a lossy one is still named, so that it is
    confirmed, alerted and set aside like the rest instead of going unreported.
    """
    if run_status == "error":
        return AlertKind.broken, []
    if run_status == "uninstallable":
        return AlertKind.uninstallable, []
    failing = [c for c in cases if c.verdict == "fail"]
    if run_status != "failed" or not failing:
        return None, []
    lossy = [c.case_id for c in failing if c.lossless is False]
    raised = [c.case_id for c in failing if c.raised and c.lossless is not False]
    slower = [c.case_id for c in failing if c.case_id not in lossy and c.case_id not in raised]
    kind = AlertKind.violation if lossy else AlertKind.exception if raised else AlertKind.performance
    return kind, [*lossy, *raised, *slower]


_GAMMA = re.compile(r"(?:^|/)g(\d+)(?:/|$)")


def case_gamma(case_id: str) -> int | None:
    """The number of drafts of a case from its id (``direct/far_apart/V8/g3`` → 3); None when it has none.

    The acceptance drift bound needs the range [0, gamma] of a trial's accepted count; the suite reports it
    (``acceptance.per_trial_max``), and the id is read only for rows stored before it did.
    """
    match = _GAMMA.search(case_id)
    return int(match.group(1)) if match else None
