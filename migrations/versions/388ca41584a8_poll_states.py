"""Poll states: what the branch and release pollers last saw of each target

One row per (target, kind, ref): a watched branch and its last recorded head, or a pip target's package and
its newest recorded release; when it was last polled, and why that failed. The kind's values are frozen here.

Revision ID: 388ca41584a8
Revises: a515aebe4d07
Create Date: 2026-12-02 11:44:30.156068
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "388ca41584a8"
down_revision: str | Sequence[str] | None = "a515aebe4d07"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "poll_states",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column(
            "kind", sa.Enum("branch", "releases", name="poll_kind", native_enum=False, create_constraint=True, length=32), nullable=False
        ),
        sa.Column("ref", sa.String(length=255), nullable=False),
        sa.Column("head", sa.String(length=64), nullable=True),
        sa.Column("polled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("succeeded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_poll_states_target_id_targets"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_poll_states")),
        sa.UniqueConstraint("target_id", "kind", "ref", name=op.f("uq_poll_states_target_id_kind_ref")),
    )


def downgrade() -> None:
    op.drop_table("poll_states")
