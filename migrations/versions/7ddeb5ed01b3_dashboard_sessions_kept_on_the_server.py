"""Dashboard sessions kept on the server

A dashboard sign-in was a signed cookie holding the SHA-256 of the API token: a cookie saved before sign-out
still worked afterwards, and the digest was open to offline guessing of a weak token (issue 28, item 5). The
cookie now holds a random session id; ``dashboard_sessions`` keeps its SHA-256, which token signed in (a
keyed id, HMAC under the session secret), when the session began and ends, and its revocation (sign-out, or
the token removed from the configuration). Sessions from before this revision carry no id and end at once.

Revision ID: 7ddeb5ed01b3
Revises: 9d4b7e2a1c58
Create Date: 2026-12-04 09:03:01.486566
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7ddeb5ed01b3"
down_revision: str | Sequence[str] | None = "9d4b7e2a1c58"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("id_digest", sa.String(length=64), nullable=False),
        sa.Column("token_key", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_reason", sa.String(length=50), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dashboard_sessions")),
        sa.UniqueConstraint("id_digest", name=op.f("uq_dashboard_sessions_id_digest")),
    )
    with op.batch_alter_table("dashboard_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dashboard_sessions_expires_at"), ["expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_dashboard_sessions_token_key"), ["token_key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("dashboard_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dashboard_sessions_token_key"))
        batch_op.drop_index(batch_op.f("ix_dashboard_sessions_expires_at"))

    op.drop_table("dashboard_sessions")
