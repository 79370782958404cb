"""Initial schema: targets, commits, deliveries, runs, case results

Enums are VARCHAR + named CHECK constraints (values frozen here, not imported from service.models);
timestamps are timestamptz on PostgreSQL; ``now()`` defaults render per dialect.

Revision ID: 1b87a2faf5be
Revises:
Create Date: 2026-12-02 11:06:09.196734
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "1b87a2faf5be"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("github_delivery_id", sa.String(length=100), nullable=False),
        sa.Column("event", sa.String(length=50), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("accepted", "ignored", name="delivery_status", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("github_delivery_id", name=op.f("uq_deliveries_github_delivery_id")),
    )
    op.create_table(
        "targets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("repo_url", sa.String(length=500), nullable=False),
        sa.Column("adapter", sa.String(length=100), nullable=False),
        sa.Column(
            "install_mode",
            sa.Enum("source", "pip", name="install_mode", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("branches", sa.JSON(), nullable=False),
        sa.Column("poll_interval_s", sa.Integer(), nullable=True),
        sa.Column(
            "commit_policy",
            sa.Enum("head", "every", name="commit_policy", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_targets")),
        sa.UniqueConstraint("name", name=op.f("uq_targets_name")),
    )
    op.create_table(
        "commits",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("sha", sa.String(length=64), nullable=False),
        sa.Column("parents", sa.JSON(), nullable=False),
        sa.Column("branch", sa.String(length=255), nullable=True),
        sa.Column("branch_order", sa.Integer(), nullable=True),
        sa.Column("author", sa.String(length=255), nullable=True),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_commits_target_id_targets"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_commits")),
        sa.UniqueConstraint("target_id", "sha", name=op.f("uq_commits_target_id_sha")),
    )
    op.create_index(op.f("ix_commits_target_id_branch_branch_order"), "commits", ["target_id", "branch", "branch_order"])

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("commit_id", sa.Integer(), nullable=False),
        sa.Column("profile", sa.String(length=50), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "running",
                "passed",
                "failed",
                "error",
                "cancelled",
                name="run_status",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_host", sa.String(length=255), nullable=True),
        sa.Column("device", sa.String(length=255), nullable=True),
        sa.Column("library_version", sa.String(length=100), nullable=True),
        sa.Column("torch_version", sa.String(length=100), nullable=True),
        sa.Column("python_version", sa.String(length=100), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["commit_id"], ["commits.id"], name=op.f("fk_runs_commit_id_commits"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index(op.f("ix_runs_commit_id_profile"), "runs", ["commit_id", "profile"])
    op.create_index(op.f("ix_runs_status_lease_expires_at"), "runs", ["status", "lease_expires_at"])

    op.create_table(
        "case_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.String(length=200), nullable=False),
        sa.Column(
            "verdict",
            sa.Enum("pass", "fail", "error", "skipped", name="verdict", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("lossless", sa.Boolean(), nullable=True),
        sa.Column("conformance", sa.Boolean(), nullable=True),
        sa.Column("n_trials", sa.Integer(), nullable=True),
        sa.Column("e_value", sa.Double(), nullable=True),
        sa.Column("log_e_value", sa.Double(), nullable=True),
        sa.Column("p_value", sa.Double(), nullable=True),
        sa.Column("threshold", sa.Double(), nullable=True),
        sa.Column("tv_estimate", sa.Double(), nullable=True),
        sa.Column("tv_low", sa.Double(), nullable=True),
        sa.Column("tv_high", sa.Double(), nullable=True),
        sa.Column("acceptance_observed", sa.Double(), nullable=True),
        sa.Column("acceptance_expected", sa.Double(), nullable=True),
        sa.Column("counts_digest", sa.String(length=128), nullable=True),
        sa.Column("fingerprint", sa.String(length=128), nullable=True),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("device", sa.String(length=255), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_case_results_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_case_results")),
        sa.UniqueConstraint("run_id", "case_id", name=op.f("uq_case_results_run_id_case_id")),
    )
    op.create_index(op.f("ix_case_results_case_id_run_id"), "case_results", ["case_id", "run_id"])


def downgrade() -> None:
    op.drop_table("case_results")
    op.drop_table("runs")
    op.drop_table("commits")
    op.drop_table("targets")
    op.drop_table("deliveries")
