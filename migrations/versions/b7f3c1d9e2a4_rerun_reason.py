"""Re-runs asked for by hand: why, and by whom

A commit can be tested again from the CLI, the API or the dashboard (issue 26, Build 4); the run records the
reason given and who asked (the CLI's user, an API token's name, the dashboard's session), shown on the run
page and the timeline. NULL for runs queued by pushes, pollers and the analysis.

Revision ID: b7f3c1d9e2a4
Revises: b7e3c1f9a2d4
Create Date: 2026-12-04 11:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b7f3c1d9e2a4"
down_revision: str | Sequence[str] | None = "b7e3c1f9a2d4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("rerun_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("rerun_by", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("rerun_by")
        batch.drop_column("rerun_reason")
