"""Alert kind exception: the sampler raised on a valid input

A case whose target raised on a valid input is a failing case about the sampler (not a broken commit); its
alerts get a kind of their own. The CHECK constraint of ``alerts.kind`` gains the value.

Revision ID: 5d1e0c7a9b21
Revises: 5d2e9b7c41a0
Create Date: 2026-12-03 07:30:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "5d1e0c7a9b21"
down_revision: str | Sequence[str] | None = "5d2e9b7c41a0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("violation", "performance", "broken")
_NEW = (*_OLD, "exception")


def _kinds(values: Sequence[str]) -> str:
    return "kind IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_alerts_alert_kind"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_alerts_alert_kind"), _kinds(_NEW))


def downgrade() -> None:
    op.execute("DELETE FROM alerts WHERE kind = 'exception'")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_alerts_alert_kind"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_alerts_alert_kind"), _kinds(_OLD))
