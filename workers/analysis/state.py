"""What the analysis stores with a run (``Run.analysis``, JSON): a versioned model, validated on load.

:class:`RunAnalysis` is what the analysis decided about the run (its kind, failing and known cases, its
confirmation run, drift, what its confirmation confirmed); its ``bisection`` is the state of a first-bad-commit
search, stored with the run that found the failure, written by every step of the search and read back by the next
one (each bisection run's analysis). Both are pydantic models checked on load: a stored value that does not match
(a hand edit, a future version) is refused with :class:`BisectionStateError` naming the run, never guessed at.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from service.models import AlertKind, Run
from service.models.entries import AlertEntry

#: Bump with a change of the fields below; states of another version are refused on load.
BISECTION_STATE_VERSION = 1
#: Likewise for :class:`RunAnalysis` (analyses stored before it was versioned read as version 1).
RUN_ANALYSIS_VERSION = 1


class BisectionStateError(ValueError):
    """A run's stored bisection state is malformed or of an unknown version."""


class BisectionState(BaseModel):
    """One search: what it looks for, what bounds it, how far it got.

    ``cases`` are the alert entries searched for (``Alert.cases``, :mod:`service.models.entries`); a commit is bad
    when one of them fails there for its entry's reason. ``after_sha``/``after_order``: a known good commit bounding the search (a drift's
    baseline). ``next``: the commit under test; ``first_bad``/``last_good``: the answer once ``done``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    kind: AlertKind
    cases: tuple[AlertEntry, ...]
    confirmation_run_id: int | None = None
    runs: int = 0
    done: bool = False
    after_sha: str | None = None
    after_order: int | None = None
    next: str | None = None
    first_bad: str | None = None
    last_good: str | None = None

    def dump(self) -> dict[str, Any]:
        """The state as stored (JSON)."""
        return self.model_dump(mode="json")


class FixSearch(BaseModel):
    """A first-good-commit search (:func:`workers.analysis.decisions.bisect_fix`), stored with the run that saw the
    ``cases`` of alert ``alert_id`` fixed: between the newest commit where they failed and that run's commit, runs
    were skipped (a policy other than ``every``). ``first_good``/``last_bad``: the answer once ``done``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alert_id: int
    cases: tuple[str, ...]
    runs: int = 0
    done: bool = False
    next: str | None = None
    first_good: str | None = None
    last_bad: str | None = None


class RunAnalysis(BaseModel):
    """What the analysis decided about one run.

    ``kind``: the alert kind the run called for once known failures were set aside; ``failing`` its new failing
    cases and ``known_failing`` those already known (an open alert names them, or a known finding explains them);
    ``supersedes``: for a new failure of a case already failing with another signature, the signature it replaces;
    ``findings``: the known findings that explain some of its failures (key: the cases); ``findings_fixed``: the
    findings seen fixed at this run (they explained failures of the previous tested run, whose cases pass here);
    ``unchanged_cases``: seeded outputs equal to the
    previous tested run's; ``confirmation_run_id``: the rerun queued to confirm it; ``drift``: passing cases whose
    acceptance drifted. For a confirmation run: ``confirmed``, the parent's cases it confirmed (False: it had no
    parent), and ``confirmed_kind``. ``bisection``: the search this run started, when it found the failure;
    ``fix_searches``: those it started for the cases it saw fixed.
    """

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    kind: AlertKind | None = None
    failing: list[str] = []
    known_failing: list[str] = []
    supersedes: dict[str, dict[str, Any]] = {}
    findings: dict[str, list[str]] = {}
    findings_fixed: list[str] = []
    unchanged_cases: list[str] = []
    confirmation_run_id: int | None = None
    drift: list[str] = []
    confirmed: list[str] | Literal[False] | None = None
    confirmed_kind: AlertKind | None = None
    bisection: BisectionState | None = None
    #: The first-good-commit searches this run started (it saw cases fixed after skipped commits). Added without a
    #: version bump: an analysis stored before it reads as one that started none.
    fix_searches: list[FixSearch] = []

    def dump(self) -> dict[str, Any]:
        """The analysis as stored (JSON)."""
        return self.model_dump(mode="json")


def load_analysis(run: Run) -> RunAnalysis:
    """``run``'s stored analysis, validated (an empty one when the run was not analysed)."""
    stored = run.analysis or {}
    try:
        return RunAnalysis.model_validate(stored)
    except ValidationError as exc:
        raise BisectionStateError(f"run {run.id}: its stored analysis {_why(stored, exc, RUN_ANALYSIS_VERSION)}") from exc


def _why(stored: Any, exc: ValidationError, current: int) -> str:
    version = stored.get("version", current) if isinstance(stored, dict) else None
    if version != current and isinstance(stored, dict):
        return f"is version {version!r}, this worker reads version {current} only"
    return "is malformed: " + "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(state)'}: {e['msg']}" for e in exc.errors(include_input=False)[:3]
    )


def load_bisection(run: Run) -> BisectionState | None:
    """``run``'s stored bisection state, validated; None when the run started no search."""
    stored = (run.analysis or {}).get("bisection")
    if not stored:
        return None
    try:
        return BisectionState.model_validate(stored)
    except ValidationError as exc:
        raise BisectionStateError(f"run {run.id}: its stored bisection state {_why(stored, exc, BISECTION_STATE_VERSION)}") from exc


def store_analysis(run: Run, analysis: RunAnalysis) -> None:
    """Write ``analysis`` onto ``run`` (a new JSON value, so the ORM sees the change)."""
    run.analysis = analysis.dump()


def store_bisection(run: Run, analysis: RunAnalysis, state: BisectionState) -> None:
    """Set ``state`` as ``analysis``'s search (the run's analysis being built) and store it on ``run``."""
    analysis.bisection = state
    store_analysis(run, analysis)
