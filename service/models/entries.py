"""What an alert lists (``Alert.cases``, and a bisection's ``BisectionState.cases``): entries of a tagged union.

Every entry names its case (or ``(suite)``, ``(install)``, ``(target)`` for a run-level cause) and its
``reason``, which says what else it carries:

- ``lossless`` / ``conformance``: a case that refuted that layer's exact law, with the figures of the run that
  found it (and, once a rerun confirmed it, what confirmed it);
- ``raised``: the sampler raised on a valid input (a finding about the sampler), with the exception's first line;
- ``drift``: a passing case whose acceptance drifted from its baseline, with the test's figures;
- ``broken`` / ``uninstallable`` / ``configuration``: the run could not test its commit (the suite crashed, the
  release could not be installed, the target's repository cannot be used), with the error.

Entries are stored as JSON; :func:`alert_entries` reads them back checked (an entry written before ``raised``
was named so says ``exception``: read as ``raised``), and the code that writes them builds these types, so mypy
checks every key on both sides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, TypeAdapter, with_config

# pydantic reads TypedDicts from typing_extensions on Python < 3.12.
from typing_extensions import TypedDict

#: An entry's reason for a case whose sampler raised (the suite's ``Failure.RAISED``: one word for one idea).
RAISED: Literal["raised"] = "raised"
#: What ``raised`` entries said before the name was shared with the suite's ``Failure.RAISED``.
_LEGACY_RAISED = "exception"
#: Keys a shape does not name are kept as they were stored (entries of other versions lose nothing when rewritten).
_STRICT = ConfigDict(extra="allow")


@with_config(_STRICT)
class TestedEntry(TypedDict):
    """A case that refuted a layer's law (``reason`` the layer), with the figures of the run that found it (entries
    written by older versions may lack some: readers take them with ``.get``)."""

    case_id: str
    reason: Literal["lossless", "conformance"]
    e_value: NotRequired[float | None]
    log_e_value: NotRequired[float | None]
    threshold: NotRequired[float | None]
    tv_estimate: NotRequired[float | None]
    acceptance_observed: NotRequired[float | None]
    acceptance_expected: NotRequired[float | None]
    n_trials: NotRequired[int | None]
    # What identifies the failure beyond its case (workers.analysis.decisions.Signature), and for a new failure of
    # a case that was already failing, the signature it replaces (its search stays where the case was failing).
    signature: NotRequired[dict[str, Any]]
    supersedes: NotRequired[dict[str, Any]]
    # Set once the case passes again on a later commit (its own fix, whatever the alert's other cases do): the
    # first such commit known, by sha and branch position.
    fixed_sha: NotRequired[str]
    fixed_order: NotRequired[int]
    # Set when the alert's failure of the case ended at ``fixed_sha`` although the case still fails there, another
    # way: ``{"finding": key}`` (a known finding explains the new failure) or ``{"alert": id}`` (another alert
    # carries it, superseding this entry's signature).
    now_fails_as: NotRequired[dict[str, Any]]
    # Set once a rerun with fresh seeds confirmed it: which check (or "certain violation", or "counterexample
    # replayed") and the rerun's figures; ``replay``: the counterexample that came back with the first run's inputs.
    confirmed_by: NotRequired[str]
    confirmation_log_e_value: NotRequired[float | None]
    confirmation_verdict: NotRequired[str]
    replay: NotRequired[str]


@with_config(_STRICT)
class RaisedEntry(TypedDict):
    """A case whose sampler raised on a valid input: the exception's first line."""

    case_id: str
    reason: Literal["raised"]
    error: str
    signature: NotRequired[dict[str, Any]]
    supersedes: NotRequired[dict[str, Any]]
    fixed_sha: NotRequired[str]
    fixed_order: NotRequired[int]
    now_fails_as: NotRequired[dict[str, Any]]
    confirmed_by: NotRequired[str]
    confirmation_log_e_value: NotRequired[float | None]
    confirmation_verdict: NotRequired[str]


@with_config(_STRICT)
class DriftEntry(TypedDict):
    """A passing case whose accepted drafts per trial drifted from its recent passing runs (Hoeffding test)."""

    case_id: str
    reason: Literal["drift"]
    e_value: NotRequired[float | None]
    log_e_value: NotRequired[float | None]
    threshold: NotRequired[float | None]
    tv_estimate: NotRequired[float | None]
    acceptance_observed: NotRequired[float | None]
    acceptance_expected: NotRequired[float | None]
    n_trials: NotRequired[int | None]
    difference: float
    radius: float
    alpha: float
    baseline_mean: float
    baseline_trials: int
    baseline_runs: NotRequired[int]
    baseline_left_out: NotRequired[int]
    # The range [0, B] of one trial's accepted drafts the test used; entries written before it say ``gamma``.
    per_trial_max: NotRequired[int]
    gamma: NotRequired[int]
    fixed_sha: NotRequired[str]
    fixed_order: NotRequired[int]


@with_config(_STRICT)
class BrokenEntry(TypedDict):
    """The suite could not run the commit (``case_id`` is ``(suite)``)."""

    case_id: str
    reason: Literal["broken"]
    error: str


@with_config(_STRICT)
class UninstallableEntry(TypedDict):
    """The release or checkout could not be installed, attempt after attempt (``case_id`` is ``(install)``)."""

    case_id: str
    reason: Literal["uninstallable"]
    requirement: str | None
    error: str


@with_config(_STRICT)
class ConfigurationEntry(TypedDict):
    """The target's repository cannot be used (``case_id`` is ``(target)``)."""

    case_id: str
    reason: Literal["configuration"]
    error: str


#: One entry of an alert, told apart by ``reason``.
AlertEntry = TestedEntry | RaisedEntry | DriftEntry | BrokenEntry | UninstallableEntry | ConfigurationEntry
#: Entries whose case failed a test (what confirmation, bisection and triage look at).
FailureEntry = TestedEntry | RaisedEntry

_ENTRIES: TypeAdapter[list[AlertEntry]] = TypeAdapter(list[Annotated[AlertEntry, Field(discriminator="reason")]])


def _current(entry: Any) -> Any:
    if isinstance(entry, dict) and entry.get("reason") == _LEGACY_RAISED:
        return {**entry, "reason": RAISED}
    return entry


def alert_entries(stored: Iterable[Any] | None) -> list[AlertEntry]:
    """Stored entries (JSON) as :data:`AlertEntry` values, checked: a malformed entry raises pydantic's
    ``ValidationError`` naming it. A ``raised`` entry written as ``exception`` reads as ``raised``."""
    return _ENTRIES.validate_python([_current(e) for e in stored or ()])
