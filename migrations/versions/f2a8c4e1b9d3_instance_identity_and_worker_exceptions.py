"""The instance's identity, worker exceptions on runs, infrastructure errors, time over every attempt

``instance_identity``: one row with a random id drawn here; with the database's own identity it names the folder
a worker keeps this instance's mirrors and run scratch in (service.instance), so two instances on one machine
never share one. ``runs.worker_exception``: the last exception a worker raised on the run, recorded at once.
``runs.infrastructure_error``: the run could not test its commit for a reason that is not its code (never a
broken commit). ``runs.earlier_attempts_s``: the time of the attempts before the last (run duration metrics).

Revision ID: f2a8c4e1b9d3
Revises: b7f3c1d9e2a4
Create Date: 2026-12-05 06:00:00.000000
"""

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f2a8c4e1b9d3"
down_revision: str | Sequence[str] | None = "b7f3c1d9e2a4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    identity = op.create_table(
        "instance_identity",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_identity")),
    )
    op.bulk_insert(identity, [{"id": 1, "uuid": uuid.uuid4().hex}])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("infrastructure_error", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column("worker_exception", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("earlier_attempts_s", sa.Double(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("earlier_attempts_s")
        batch.drop_column("worker_exception")
        batch.drop_column("infrastructure_error")
    op.drop_table("instance_identity")
