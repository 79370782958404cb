"""Uninstallable runs and alerts: a release or checkout that could not be installed is a kind of its own

A run whose release cannot be installed (a dependency missing from the index, conflicting dependencies, the
index unreachable) is retried after a backoff; ``runs.install_failures`` counts those attempts (they do not
count against ``max_attempts``). When the failure persists the run ends ``uninstallable`` and opens an alert
of kind ``uninstallable``, never ``broken``. The CHECK constraints of ``runs.status`` and ``alerts.kind``
gain the value.

Revision ID: 8b2e1d3f0a42
Revises: 7a1f0c2e9d31
Create Date: 2026-12-03 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8b2e1d3f0a42"
down_revision: str | Sequence[str] | None = "7a1f0c2e9d31"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATUSES = ("queued", "running", "passed", "failed", "error", "cancelled")
_NEW_STATUSES = ("queued", "running", "passed", "failed", "error", "uninstallable", "cancelled")
_OLD_KINDS = ("violation", "performance", "broken", "exception")
_NEW_KINDS = (*_OLD_KINDS, "uninstallable")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("install_failures", sa.Integer(), server_default="0", nullable=False))
        batch_op.drop_constraint(batch_op.f("ck_runs_run_status"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_runs_run_status"), _in("status", _NEW_STATUSES))
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_alerts_alert_kind"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_alerts_alert_kind"), _in("kind", _NEW_KINDS))


def downgrade() -> None:
    op.execute("DELETE FROM alerts WHERE kind = 'uninstallable'")
    op.execute("UPDATE runs SET status = 'error' WHERE status = 'uninstallable'")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_alerts_alert_kind"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_alerts_alert_kind"), _in("kind", _OLD_KINDS))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_runs_run_status"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_runs_run_status"), _in("status", _OLD_STATUSES))
        batch_op.drop_column("install_failures")
