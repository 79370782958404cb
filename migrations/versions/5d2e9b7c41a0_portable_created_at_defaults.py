"""Portable created_at defaults on alerts and notifications

The migration that created ``alerts`` and ``notifications`` gave their ``created_at`` the server default
``now()`` as raw SQL. PostgreSQL has that function; SQLite (the embedded default of ``specwatch serve``)
accepts the table but fails every insert with "unknown function: now()", so no alert was ever recorded
or posted there. This rewrites the default as ``sa.func.now()``, which each dialect renders its own way
(``CURRENT_TIMESTAMP`` on SQLite). On SQLite the two tables are recreated with their rows (batch mode,
foreign keys off while migrating); PostgreSQL already has a working default and is left alone.

Revision ID: 5d2e9b7c41a0
Revises: c006d431f28e
Create Date: 2026-12-03 07:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5d2e9b7c41a0"
down_revision: str | Sequence[str] | None = "c006d431f28e"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("alerts", "notifications")


def _set_default(default: sa.TextClause | sa.sql.functions.Function[object]) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always") as batch_op:
            batch_op.alter_column("created_at", existing_type=sa.DateTime(timezone=True), existing_nullable=False, server_default=default)


def upgrade() -> None:
    _set_default(sa.func.now())


def downgrade() -> None:
    _set_default(sa.text("now()"))
