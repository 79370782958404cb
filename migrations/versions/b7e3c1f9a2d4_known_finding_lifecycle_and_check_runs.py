"""Known findings seen fixed and failing; GitHub check runs per target

A known finding's lifecycle: ``known_findings.fixed_commit_id`` is the commit at which the monitor saw it stop
failing (it no longer applies from there: a failure after it is a regression), ``last_failed_run_id`` the latest
run with a failure it explained. Both NULL on existing rows.

GitHub where maintainers look: ``targets.github_checks`` (opt-in, existing rows false) posts a check run with the
run's report besides the commit status, through the outbox (channel ``github_check``: the CHECK constraint of
``notifications.channel`` gains it); ``runs.result_header`` keeps the suite's run result without its cases, from
which (with the case rows) the report is rebuilt.

Revision ID: b7e3c1f9a2d4
Revises: 7ddeb5ed01b3
Create Date: 2026-12-04 11:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b7e3c1f9a2d4"
down_revision: str | Sequence[str] | None = "7ddeb5ed01b3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_CHANNELS = ("slack", "github")
_NEW_CHANNELS = (*_OLD_CHANNELS, "github_check")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade() -> None:
    with op.batch_alter_table("known_findings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fixed_commit_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("last_failed_run_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_known_findings_fixed_commit_id_commits"), "commits", ["fixed_commit_id"], ["id"], ondelete="SET NULL"
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_known_findings_last_failed_run_id_runs"), "runs", ["last_failed_run_id"], ["id"], ondelete="SET NULL"
        )
    with op.batch_alter_table("targets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("github_checks", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("result_header", sa.JSON(), nullable=True))
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_notifications_notification_channel"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_notifications_notification_channel"), _in("channel", _NEW_CHANNELS))


def downgrade() -> None:
    op.execute("DELETE FROM notifications WHERE channel = 'github_check'")
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_notifications_notification_channel"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_notifications_notification_channel"), _in("channel", _OLD_CHANNELS))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("result_header")
    with op.batch_alter_table("targets", schema=None) as batch_op:
        batch_op.drop_column("github_checks")
    with op.batch_alter_table("known_findings", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_known_findings_last_failed_run_id_runs"), type_="foreignkey")
        batch_op.drop_constraint(batch_op.f("fk_known_findings_fixed_commit_id_commits"), type_="foreignkey")
        batch_op.drop_column("last_failed_run_id")
        batch_op.drop_column("fixed_commit_id")
