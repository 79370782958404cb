"""service.db and service.models on migrated PostgreSQL and SQLite: unit of work, constraints, types."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine, session_scope
from service.models import CaseResult, Commit, Delivery, DeliveryStatus, Run, RunStatus, Target, Verdict

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(migrated_database_url: str) -> Iterator[Engine]:
    engine = make_engine(migrated_database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


def a_target(name: str = "transformers") -> Target:
    return Target(name=name, repo_url="https://github.com/huggingface/transformers", adapter="transformers", branches=["main"])


def test_session_scope_commits_at_the_boundary(factory: sessionmaker[Session]) -> None:
    with session_scope(factory) as session:
        session.add(a_target())

    with session_scope(factory) as session:
        assert session.scalars(select(Target.name)).all() == ["transformers"]


def add_a_target_then_fail(factory: sessionmaker[Session]) -> None:
    with session_scope(factory) as session:
        session.add(a_target())
        session.flush()
        raise RuntimeError("boom")


def test_session_scope_rolls_back_on_error(factory: sessionmaker[Session]) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        add_a_target_then_fail(factory)

    with session_scope(factory) as session:
        assert session.scalar(select(func.count()).select_from(Target)) == 0


def test_a_redelivery_violates_the_unique_delivery_id(factory: sessionmaker[Session]) -> None:
    with session_scope(factory) as session:
        session.add(Delivery(github_delivery_id="d-1", event="push", status=DeliveryStatus.accepted))

    with pytest.raises(IntegrityError), session_scope(factory) as session:
        session.add(Delivery(github_delivery_id="d-1", event="push", status=DeliveryStatus.accepted))


def test_foreign_keys_are_enforced(factory: sessionmaker[Session]) -> None:
    with pytest.raises(IntegrityError), session_scope(factory) as session:
        session.add(Commit(target_id=12345, sha="a" * 40))


def test_deleting_a_target_deletes_its_history(factory: sessionmaker[Session]) -> None:
    with session_scope(factory) as session:
        target = a_target()
        commit = Commit(target=target, sha="a" * 40, parents=["b" * 40], branch="main", branch_order=1)
        run = Run(commit=commit, profile="quick")
        session.add(CaseResult(run=run, case_id="sampler/basic", verdict=Verdict.PASS, details={"k": [1, 2]}))

    with session_scope(factory) as session:
        session.delete(session.scalars(select(Target)).one())

    with session_scope(factory) as session:
        for model in (Commit, Run, CaseResult):
            assert session.scalar(select(func.count()).select_from(model)) == 0


def test_enums_are_stored_by_value_and_columns_round_trip(factory: sessionmaker[Session], engine: Engine) -> None:
    lease = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    with session_scope(factory) as session:
        commit = Commit(target=a_target(), sha="c" * 40, parents=["a" * 40, "b" * 40])
        run = Run(commit=commit, profile="quick", lease_expires_at=lease, seed=2**62)
        session.add(CaseResult(run=run, case_id="sampler/basic", verdict=Verdict.PASS, e_value=float("inf"), details={"k": [1]}))

    with engine.connect() as connection:
        assert connection.execute(text("SELECT verdict FROM case_results")).scalar_one() == "pass"
        assert connection.execute(text("SELECT status FROM runs")).scalar_one() == "queued"

    with session_scope(factory) as session:
        run = session.scalars(select(Run)).one()
        assert run.status is RunStatus.queued
        assert run.lease_expires_at == lease
        assert run.lease_expires_at is not None
        assert run.lease_expires_at.tzinfo is UTC
        assert run.queued_at.tzinfo is UTC
        assert abs(run.queued_at - datetime.now(UTC)) < timedelta(minutes=5)
        assert run.seed == 2**62
        assert run.commit.parents == ["a" * 40, "b" * 40]
        result = run.case_results[0]
        assert result.verdict is Verdict.PASS
        assert result.e_value == float("inf")
        assert result.details == {"k": [1]}


def test_naive_datetimes_are_refused(factory: sessionmaker[Session]) -> None:
    with pytest.raises(StatementError, match="naive datetime"), session_scope(factory) as session:
        session.add(Run(commit=Commit(target=a_target(), sha="d" * 40), profile="quick", started_at=datetime(2026, 1, 1)))  # noqa: DTZ001


def test_sqlite_connections_enforce_foreign_keys_and_use_wal(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'pragmas.db'}")
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
    finally:
        engine.dispose()
