"""The known findings of each target, written: added, edited, removed, and seeded from those shipped for its adapter
(:mod:`specwatch.findings`). Writes flush, never commit (the API request or the CLI command commits); reading them is
:mod:`service.queries.findings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import FindingState, KnownFinding, Target
from service.queries.common import get_target
from service.queries.findings import FindingRow, finding_of, finding_row, stored_finding
from specwatch.findings import Finding, FindingExistsError, edited, make_finding, shipped_findings


@dataclass(frozen=True)
class Seeded:
    target: str
    added: tuple[str, ...]
    kept: tuple[str, ...]


def _assign(row: KnownFinding, finding: Finding) -> None:
    for name, value in finding.as_dict().items():  # distributions: a list, as the JSON column stores it
        setattr(row, name, FindingState(value) if name == "state" else value)


def _insert(session: Session, target: Target, finding: Finding) -> KnownFinding:
    row = KnownFinding(target_id=target.id)
    _assign(row, finding)
    session.add(row)
    session.flush()
    return row


def add_finding(session: Session, target_name: str, fields: dict[str, Any]) -> FindingRow:
    """Validate and store a new finding; :class:`FindingExistsError` when the key is taken (flushed, not committed)."""
    target = get_target(session, target_name)
    finding = make_finding(fields)
    exists = session.scalar(select(KnownFinding.id).where(KnownFinding.target_id == target.id, KnownFinding.key == finding.key))
    if exists is not None:
        raise FindingExistsError(f"target {target.name!r} has a known finding {finding.key!r} already (edit it instead)")
    return finding_row(target.name, _insert(session, target, finding))


def edit_finding(session: Session, target_name: str, key: str, changes: dict[str, Any], *, now: datetime) -> FindingRow:
    """Apply ``changes`` (``None`` clears an optional field) and validate the result (flushed, not committed)."""
    target = get_target(session, target_name)
    row = stored_finding(session, target, key)
    _assign(row, edited(finding_of(row), changes))
    if row.state is FindingState.open:  # set open again: the fix the monitor saw no longer stands
        row.fixed_commit_id = None
    row.updated_at = now
    session.flush()
    return finding_row(target.name, row, session)


def remove_finding(session: Session, target_name: str, key: str) -> None:
    target = get_target(session, target_name)
    session.delete(stored_finding(session, target, key))
    session.flush()


def seed_findings(session: Session, target: Target) -> Seeded:
    """Add the findings shipped for the target's adapter whose keys it lacks; a finding it has (perhaps edited)
    is kept as it is. Idempotent: seeding again adds nothing (flushed, not committed)."""
    have = set(session.scalars(select(KnownFinding.key).where(KnownFinding.target_id == target.id)))
    added, kept = [], []
    for finding in shipped_findings(target.adapter):
        if finding.key in have:
            kept.append(finding.key)
            continue
        _insert(session, target, finding)
        added.append(finding.key)
    return Seeded(target=target.name, added=tuple(added), kept=tuple(kept))


def seed_target_findings(session: Session, target_name: str) -> Seeded:
    return seed_findings(session, get_target(session, target_name))
