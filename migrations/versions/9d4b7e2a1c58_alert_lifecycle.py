"""Alert lifecycle: a resolved alert whose finding comes back is reopened visibly, counted

``alerts.reopened_count`` (existing rows 0) and ``alerts.reopened_at``: an alert named again after it was resolved
is reopened with a notification, never merged quietly into the resolved one; the count also keys its outbox rows
(the second resolution of a reopened alert is a new message).

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


def upgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reopened_count", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("reopened_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_column("reopened_at")
        batch_op.drop_column("reopened_count")
