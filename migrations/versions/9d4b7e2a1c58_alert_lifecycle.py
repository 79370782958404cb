"""Alert lifecycle: reopened alerts counted, configuration errors alerted per target

An alert named again after it was resolved is reopened with a notification, never merged quietly into the
resolved one: ``alerts.reopened_count`` (existing rows 0) and ``alerts.reopened_at``; the count also keys its
outbox rows (the second resolution of a reopened alert is a new message).

A run whose checkout failed because of the repository itself (missing, refused, unreachable) is an error of the
target's configuration, not of its commit: ``runs.configuration_error`` (existing rows false) marks it, and the
target gets one alert of the new kind ``configuration`` (the CHECK constraint of ``alerts.kind`` gains it)
instead of one ``broken`` alert per commit.

Revision ID: 9d4b7e2a1c58
Revises: 3c8f2a6d9e17
Create Date: 2026-12-04 09:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9d4b7e2a1c58"
down_revision: str | Sequence[str] | None = "3c8f2a6d9e17"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KINDS = ("violation", "performance", "broken", "exception", "uninstallable")
_NEW_KINDS = (*_OLD_KINDS, "configuration")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reopened_count", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("reopened_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.drop_constraint(batch_op.f("ck_alerts_alert_kind"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_alerts_alert_kind"), _in("kind", _NEW_KINDS))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("configuration_error", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    op.execute("DELETE FROM alerts WHERE kind = 'configuration'")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("configuration_error")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_alerts_alert_kind"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_alerts_alert_kind"), _in("kind", _OLD_KINDS))
        batch_op.drop_column("reopened_at")
        batch_op.drop_column("reopened_count")
