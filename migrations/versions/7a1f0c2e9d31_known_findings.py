"""Known findings: per target, the failures already understood (case globs, versions or commits, a link)

One row per (target, key): the cases it covers (``fnmatch`` globs, JSON), the affected versions (a PEP 440
specifier set) and/or commit range, a title, a link to the finding or the upstream issue, and its state (open,
or fixed upstream in ``fixed_in``). The state's values are frozen here. Shipped findings are seeded by the
service (``specwatch findings seed``, and when a target is added), never by this migration.

Revision ID: 7a1f0c2e9d31
Revises: 5d1e0c7a9b21
Create Date: 2026-12-03 14:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7a1f0c2e9d31"
down_revision: str | Sequence[str] | None = "5d1e0c7a9b21"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "known_findings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("cases", sa.JSON(), nullable=False),
        sa.Column("versions", sa.String(length=200), nullable=True),
        sa.Column("commit_from", sa.String(length=64), nullable=True),
        sa.Column("commit_to", sa.String(length=64), nullable=True),
        sa.Column("link", sa.String(length=500), nullable=False),
        sa.Column(
            "state", sa.Enum("open", "fixed", name="finding_state", native_enum=False, create_constraint=True, length=32), nullable=False
        ),
        sa.Column("fixed_in", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_known_findings_target_id_targets"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_known_findings")),
        sa.UniqueConstraint("target_id", "key", name=op.f("uq_known_findings_target_id_key")),
    )


def downgrade() -> None:
    op.drop_table("known_findings")
