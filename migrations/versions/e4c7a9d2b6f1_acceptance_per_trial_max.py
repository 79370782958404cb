"""Case results: acceptance_per_trial_max, the range of one trial's accepted drafts

The suite reports, per case, the bound B with every trial's accepted count in [0, B] (gamma for a chain
step; the horizon's bound for an end-to-end trial): the acceptance drift test's Hoeffding radius scales with
it. A column beside ``acceptance_observed`` and ``acceptance_expected`` (not ``details``) because the drift
analysis selects its baseline rows by it in SQL: only runs with the same bound are comparable. Existing rows
keep NULL; the analysis falls back to the ``/gN`` segment of their case id.

Revision ID: e4c7a9d2b6f1
Revises: 8b2e1d3f0a42
Create Date: 2026-12-03 17:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e4c7a9d2b6f1"
down_revision: str | Sequence[str] | None = "8b2e1d3f0a42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("case_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("acceptance_per_trial_max", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("case_results", schema=None) as batch_op:
        batch_op.drop_column("acceptance_per_trial_max")
