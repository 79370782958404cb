"""Alerts, the notification outbox, and run purposes

alerts: one per (target, branch, first bad commit, kind) with its failing cases (JSON) and its state.
notifications: the outbox of Slack messages and GitHub commit statuses, with status, tries and the next try.
runs: why a run exists (primary, confirmation, bisection), the failing run it serves, the suite's seed
attempt, and when and how it was analysed. Existing runs become primary runs with seed attempt 0.

Revision ID: c006d431f28e
Revises: 388ca41584a8
Create Date: 2026-12-02 12:25:17.698866
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c006d431f28e"
down_revision: str | Sequence[str] | None = "388ca41584a8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("branch", sa.String(length=255), nullable=False),
        sa.Column("first_bad_commit_id", sa.Integer(), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("violation", "performance", "broken", name="alert_kind", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column(
            "state",
            sa.Enum("open", "acknowledged", "resolved", name="alert_state", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("detected_run_id", sa.Integer(), nullable=True),
        sa.Column("confirmation_run_id", sa.Integer(), nullable=True),
        sa.Column("last_good_commit_id", sa.Integer(), nullable=True),
        sa.Column("confirmed", sa.Boolean(), nullable=False),
        sa.Column("bisection_runs", sa.Integer(), nullable=False),
        sa.Column("cases", sa.JSON(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_by_commit_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["confirmation_run_id"], ["runs.id"], name=op.f("fk_alerts_confirmation_run_id_runs"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["detected_run_id"], ["runs.id"], name=op.f("fk_alerts_detected_run_id_runs"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(
            ["first_bad_commit_id"], ["commits.id"], name=op.f("fk_alerts_first_bad_commit_id_commits"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["last_good_commit_id"], ["commits.id"], name=op.f("fk_alerts_last_good_commit_id_commits"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["resolved_by_commit_id"], ["commits.id"], name=op.f("fk_alerts_resolved_by_commit_id_commits"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_alerts_target_id_targets"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint(
            "target_id", "branch", "first_bad_commit_id", "kind", name=op.f("uq_alerts_target_id_branch_first_bad_commit_id_kind")
        ),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alerts_target_id_branch_state"), ["target_id", "branch", "state"], unique=False)

    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dedup_key", sa.String(length=200), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=True),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column(
            "channel",
            sa.Enum("slack", "github", name="notification_channel", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("event", sa.String(length=50), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("pending", "sent", "failed", name="notification_status", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.id"], name=op.f("fk_notifications_alert_id_alerts"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_notifications_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_notifications_dedup_key")),
    )
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_notifications_status_next_attempt_at"), ["status", "next_attempt_at"], unique=False)

    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "purpose",
                sa.Enum("primary", "confirmation", "bisection", name="run_purpose", native_enum=False, create_constraint=True, length=32),
                server_default="primary",
                nullable=False,
            )
        )
        batch_op.add_column(sa.Column("parent_run_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("seed_attempt", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("analysed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("analysis", sa.JSON(), nullable=True))
        batch_op.create_unique_constraint(batch_op.f("uq_runs_parent_run_id_commit_id"), ["parent_run_id", "commit_id"])
        batch_op.create_foreign_key(batch_op.f("fk_runs_parent_run_id_runs"), "runs", ["parent_run_id"], ["id"], ondelete="SET NULL")


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_runs_parent_run_id_runs"), type_="foreignkey")
        batch_op.drop_constraint(batch_op.f("uq_runs_parent_run_id_commit_id"), type_="unique")
        # The CHECK of the purpose enum goes first: SQLite's batch copy would otherwise keep it without its column.
        batch_op.drop_constraint(batch_op.f("ck_runs_run_purpose"), type_="check")
        batch_op.drop_column("analysis")
        batch_op.drop_column("analysed_at")
        batch_op.drop_column("seed_attempt")
        batch_op.drop_column("parent_run_id")
        batch_op.drop_column("purpose")

    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_notifications_status_next_attempt_at"))

    op.drop_table("notifications")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alerts_target_id_branch_state"))

    op.drop_table("alerts")
