"""Deliveries record what a push moved: ref, before and after heads, forced

A forced push rewrites a branch's history; keeping (ref, before, after, forced) per delivery lets history
queries and bisection see where the branch was rewritten. All nullable: other events have none of them.

Revision ID: a515aebe4d07
Revises: 1b87a2faf5be
Create Date: 2026-12-02 11:18:37.582057
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a515aebe4d07"
down_revision: str | Sequence[str] | None = "1b87a2faf5be"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ref", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("before_sha", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("after_sha", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("forced", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deliveries", schema=None) as batch_op:
        batch_op.drop_column("forced")
        batch_op.drop_column("after_sha")
        batch_op.drop_column("before_sha")
        batch_op.drop_column("ref")
