"""The state of a first-bad-commit search, stored with the run that found the failure.

It lives in ``Run.analysis["bisection"]`` of the detected run (JSON), written by every step of the search and
read back by the next one (each bisection run's analysis). It is a versioned pydantic model, validated on load:
a state that does not match (a hand edit, a future version) is refused with :class:`BisectionStateError`
naming the run, never guessed at.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from service.models import AlertKind, Run

#: Bump with a change of the fields below; states of another version are refused on load.
BISECTION_STATE_VERSION = 1


class BisectionStateError(ValueError):
    """A run's stored bisection state is malformed or of an unknown version."""


class BisectionState(BaseModel):
    """One search: what it looks for, what bounds it, how far it got.

    ``cases`` are the alert entries searched for (``Alert.cases``); a commit is bad when one of them fails there
    for its entry's reason. ``after_sha``/``after_order``: a known good commit bounding the search (a drift's
    baseline). ``next``: the commit under test; ``first_bad``/``last_good``: the answer once ``done``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    kind: AlertKind
    cases: tuple[dict[str, Any], ...]
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


def load_bisection(run: Run) -> BisectionState | None:
    """``run``'s stored bisection state, validated; None when the run started no search."""
    stored = (run.analysis or {}).get("bisection")
    if not stored:
        return None
    try:
        return BisectionState.model_validate(stored)
    except ValidationError as exc:
        version = stored.get("version", BISECTION_STATE_VERSION) if isinstance(stored, dict) else None
        if version != BISECTION_STATE_VERSION and isinstance(stored, dict):
            why = f"is version {version!r}, this worker reads version {BISECTION_STATE_VERSION} only"
        else:
            why = "is malformed: " + "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(state)'}: {e['msg']}" for e in exc.errors(include_input=False)[:3]
            )
        raise BisectionStateError(f"run {run.id}: its stored bisection state {why}") from exc


def store_bisection(run: Run, analysis: dict[str, Any], state: BisectionState) -> None:
    """Write ``state`` into ``analysis`` (the run's analysis being built) and onto ``run``."""
    analysis["bisection"] = state.dump()
    run.analysis = dict(analysis)
