"""The known findings of each target in the database, read: listed, one by key, and matched against the failures the
readers show (timeline, run, case, alerts). Added, edited, removed and seeded in :mod:`service.findings`.

Matching follows :mod:`specwatch.findings`; what the database adds is the commit range, resolved to branch positions here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Alert, Commit, FindingState, KnownFinding, Run, Target
from service.queries.common import NotFoundError, get_target
from service.releases import release_version
from specwatch.findings import Finding, first_match


@dataclass(frozen=True)
class FindingRow:
    target: str
    key: str
    title: str
    cases: tuple[str, ...]
    versions: str | None
    distributions: tuple[str, ...]
    commit_from: str | None
    commit_to: str | None
    link: str
    state: FindingState
    fixed_in: str | None
    created_at: datetime | None
    updated_at: datetime | None
    # Seen by the monitor: the commit at which it stopped failing, and the latest run with a failure it explained.
    fixed_commit: str | None = None
    last_failed_run_id: int | None = None


@dataclass(frozen=True)
class FindingLink:
    """What a reader shows beside a failure that a known finding explains."""

    key: str
    title: str
    link: str
    state: FindingState
    fixed_in: str | None = None


def finding_of(row: KnownFinding) -> Finding:
    return Finding(
        key=row.key,
        title=row.title,
        cases=tuple(row.cases),
        link=row.link,
        versions=row.versions,
        distributions=tuple(row.distributions or ()),
        commit_from=row.commit_from,
        commit_to=row.commit_to,
        state=row.state,
        fixed_in=row.fixed_in,
    )


def finding_row(target: str, row: KnownFinding, session: Session | None = None) -> FindingRow:
    fixed_commit = None
    if session is not None and row.fixed_commit_id is not None:
        fixed_commit = session.scalar(select(Commit.sha).where(Commit.id == row.fixed_commit_id))
    return FindingRow(
        target=target,
        key=row.key,
        title=row.title,
        cases=tuple(row.cases),
        versions=row.versions,
        distributions=tuple(row.distributions or ()),
        commit_from=row.commit_from,
        commit_to=row.commit_to,
        link=row.link,
        state=row.state,
        fixed_in=row.fixed_in,
        created_at=row.created_at,
        updated_at=row.updated_at,
        fixed_commit=fixed_commit,
        last_failed_run_id=row.last_failed_run_id,
    )


def stored_finding(session: Session, target: Target, key: str) -> KnownFinding:
    row = session.scalar(select(KnownFinding).where(KnownFinding.target_id == target.id, KnownFinding.key == key))
    if row is None:
        raise NotFoundError(f"target {target.name!r} has no known finding {key!r}")
    return row


def list_findings(session: Session, target_name: str) -> list[FindingRow]:
    """A target's known findings, by key."""
    target = get_target(session, target_name)
    rows = session.scalars(select(KnownFinding).where(KnownFinding.target_id == target.id).order_by(KnownFinding.key))
    return [finding_row(target.name, row, session) for row in rows]


def get_finding(session: Session, target_name: str, key: str) -> FindingRow:
    target = get_target(session, target_name)
    return finding_row(target.name, stored_finding(session, target, key), session)


def commit_version(sha: str, library_version: str | None) -> str | None:
    """The library version a commit was tested at: a release's own version, else what its run recorded."""
    return release_version(sha) or library_version


class FindingMatcher:
    """A target's findings, ready to name the known failures of its commits (one per reader request)."""

    def __init__(
        self,
        findings: Sequence[Finding],
        ranges: dict[str, tuple[str | None, int, int | None]],
        fixed_at: dict[str, tuple[str | None, int]] | None = None,
    ) -> None:
        self._findings = tuple(findings)
        # key -> (branch, first affected order, last affected order or None): commit ranges resolved.
        self._ranges = ranges
        # key -> (branch, order) of the commit at which the monitor saw the finding stop failing.
        self._fixed_at = fixed_at or {}

    def __bool__(self) -> bool:
        return bool(self._findings)

    def _seen_fixed(self, key: str, branch: str | None, branch_order: int | None) -> bool:
        """Whether the monitor saw finding ``key`` fixed at or before this commit of ``branch`` (None: the releases)."""
        fixed = self._fixed_at.get(key)
        return fixed is not None and branch_order is not None and fixed[0] == branch and fixed[1] <= branch_order

    def regression(
        self,
        case_id: str,
        *,
        version: str | None,
        distribution: str | None,
        branch: str | None = None,
        branch_order: int | None = None,
    ) -> FindingLink | None:
        """The fixed finding that a failure of ``case_id`` here brings back: one that covers the case (and the
        distribution), is fixed, and no longer applies here (after the commit it was seen fixed at, or outside its
        versions and commits, but not before them: a version older than the finding's range did not bring it back);
        None when a finding explains the failure or none covers it."""
        if self.match(case_id, version=version, distribution=distribution, branch=branch, branch_order=branch_order) is not None:
            return None
        for finding in self._findings:
            if (
                finding.state is FindingState.fixed
                and finding.covers_case(case_id)
                and finding.covers_distribution(distribution)
                and not finding.predates(version)  # a failure before the finding is not the finding coming back
            ):
                return _link(finding)
        return None

    def match(
        self,
        case_id: str,
        *,
        version: str | None,
        distribution: str | None,
        branch: str | None = None,
        branch_order: int | None = None,
    ) -> FindingLink | None:
        found = self._first(
            self._findings, case_id=case_id, version=version, distribution=distribution, branch=branch, branch_order=branch_order
        )
        return None if found is None else _link(found)

    def applies(
        self,
        key: str,
        case_id: str,
        *,
        version: str | None,
        distribution: str | None,
        branch: str | None = None,
        branch_order: int | None = None,
    ) -> bool:
        """Whether finding ``key`` covers ``case_id`` at this commit, whether or not another one comes first there."""
        mine = [f for f in self._findings if f.key == key]
        return (
            self._first(mine, case_id=case_id, version=version, distribution=distribution, branch=branch, branch_order=branch_order)
            is not None
        )

    def _first(
        self,
        findings: Sequence[Finding],
        *,
        case_id: str,
        version: str | None,
        distribution: str | None,
        branch: str | None,
        branch_order: int | None,
    ) -> Finding | None:
        in_range = {
            key: branch == first_branch and branch_order is not None and start <= branch_order and (end is None or branch_order <= end)
            for key, (first_branch, start, end) in self._ranges.items()
        }
        applying = [f for f in findings if not self._seen_fixed(f.key, branch, branch_order)]
        return first_match(applying, case_id, version=version, distribution=distribution, in_range=in_range)

    def match_all(
        self,
        case_ids: Iterable[str],
        *,
        version: str | None,
        distribution: str | None,
        branch: str | None = None,
        branch_order: int | None = None,
    ) -> dict[str, FindingLink]:
        """The findings of those of ``case_ids`` that one explains, by case id."""
        found = {
            case_id: self.match(case_id, version=version, distribution=distribution, branch=branch, branch_order=branch_order)
            for case_id in case_ids
        }
        return {case_id: link for case_id, link in found.items() if link is not None}


def _link(finding: Finding) -> FindingLink:
    return FindingLink(key=finding.key, title=finding.title, link=finding.link, state=finding.state, fixed_in=finding.fixed_in)


def _position(session: Session, target_id: int, sha: str) -> tuple[str | None, int | None] | None:
    rows = session.execute(
        select(Commit.branch, Commit.branch_order).where(Commit.target_id == target_id, Commit.sha.startswith(sha)).limit(2)
    ).all()
    return (rows[0][0], rows[0][1]) if len(rows) == 1 else None


def finding_matcher(session: Session, target_id: int) -> FindingMatcher:
    """The matcher of a target's findings; a commit range whose commits are not recorded (yet) matches nothing."""
    rows = list(session.scalars(select(KnownFinding).where(KnownFinding.target_id == target_id).order_by(KnownFinding.key)))
    ranges: dict[str, tuple[str | None, int, int | None]] = {}
    for row in rows:
        if row.commit_from is None:
            continue
        start = _position(session, target_id, row.commit_from)
        end = _position(session, target_id, row.commit_to) if row.commit_to else None
        if start is None or start[1] is None or (row.commit_to and (end is None or end[0] != start[0])):
            continue
        ranges[row.key] = (start[0], start[1], end[1] if end else None)
    fixed_at: dict[str, tuple[str | None, int]] = {}
    for row in rows:
        fixed = session.get(Commit, row.fixed_commit_id) if row.fixed_commit_id is not None else None
        if fixed is not None and fixed.branch_order is not None:
            fixed_at[row.key] = (fixed.branch, fixed.branch_order)
    return FindingMatcher([finding_of(row) for row in rows], ranges, fixed_at)


def alert_findings(session: Session, alert: Alert, matcher: FindingMatcher | None = None) -> dict[str, FindingLink]:
    """The known findings that explain an alert's cases, by case id: matched at its first bad commit, with the
    library version (a release's own version) and distribution its detecting run recorded."""
    return _alert_links(session, alert, matcher, regressions=False)


def alert_regressions(session: Session, alert: Alert, matcher: FindingMatcher | None = None) -> dict[str, FindingLink]:
    """The fixed findings an alert's cases bring back, by case id (:meth:`FindingMatcher.regression`)."""
    return _alert_links(session, alert, matcher, regressions=True)


def _alert_links(session: Session, alert: Alert, matcher: FindingMatcher | None, *, regressions: bool) -> dict[str, FindingLink]:
    matcher = matcher if matcher is not None else finding_matcher(session, alert.target_id)
    if not matcher:
        return {}
    commit = session.get_one(Commit, alert.first_bad_commit_id)
    recorded = session.execute(select(Run.library_version, Run.library_distribution).where(Run.id == alert.detected_run_id)).first()
    library_version, distribution = recorded if recorded is not None else (None, None)
    where: dict[str, Any] = {
        "version": commit_version(commit.sha, library_version),
        "distribution": distribution,
        "branch": commit.branch,
        "branch_order": commit.branch_order,
    }
    case_ids = [str(entry["case_id"]) for entry in alert.cases or () if entry.get("case_id")]
    if not regressions:
        return matcher.match_all(case_ids, **where)
    found = {case_id: matcher.regression(case_id, **where) for case_id in case_ids}
    return {case_id: link for case_id, link in found.items() if link is not None}
