"""service.after_commit on a SQLite file: callbacks run once after the outermost commit, never after a rollback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from service.after_commit import after_commit, pending
from service.db import session_scope


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'unit.db'}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE rows (name TEXT)"))
    yield engine
    engine.dispose()


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine)


def committed_names(engine: Engine) -> list[str]:
    """What another connection sees: committed rows only."""
    with engine.connect() as connection:
        return list(connection.execute(text("SELECT name FROM rows ORDER BY name")).scalars())


def add(session: Session, name: str) -> None:
    session.execute(text("INSERT INTO rows (name) VALUES (:name)"), {"name": name})


def test_callbacks_run_once_in_order_after_the_commit_and_see_its_rows(engine: Engine, factory: sessionmaker[Session]) -> None:
    seen: list[tuple[str, list[str]]] = []
    with session_scope(factory) as session:
        add(session, "a")
        after_commit(session, lambda: seen.append(("first", committed_names(engine))))
        after_commit(session, lambda label: seen.append((label, committed_names(engine))), "second")
        assert pending(session) == 2
        assert seen == []
    assert seen == [("first", ["a"]), ("second", ["a"])]

    with session_scope(factory) as session:  # the next unit of work on a new session starts empty
        add(session, "b")
    assert len(seen) == 2


def test_a_rolled_back_unit_of_work_runs_none_of_its_callbacks(engine: Engine, factory: sessionmaker[Session]) -> None:
    called: list[str] = []

    def fail_before_commit() -> None:
        with session_scope(factory) as session:
            add(session, "lost")
            after_commit(session, called.append, "sent")
            raise RuntimeError("fails before commit")

    with pytest.raises(RuntimeError, match="fails before commit"):
        fail_before_commit()
    assert called == []
    assert committed_names(engine) == []


def test_callbacks_are_dropped_with_the_rollback_and_do_not_leak_into_the_next_transaction(factory: sessionmaker[Session]) -> None:
    called: list[str] = []
    with factory() as session:
        add(session, "x")
        after_commit(session, called.append, "rolled back")
        session.rollback()
        assert pending(session) == 0
        add(session, "y")
        after_commit(session, called.append, "committed")
        session.commit()
    assert called == ["committed"]


def test_a_session_closed_without_committing_runs_nothing(factory: sessionmaker[Session]) -> None:
    called: list[str] = []
    with factory() as session:
        add(session, "x")
        after_commit(session, called.append, "never")
    assert called == []


def test_a_released_savepoint_is_not_the_commit(engine: Engine, factory: sessionmaker[Session]) -> None:
    called: list[list[str]] = []
    with session_scope(factory) as session:
        with session.begin_nested():
            add(session, "inner")
            after_commit(session, lambda: called.append(committed_names(engine)))
        assert called == []  # released, but the outer transaction may still roll back
    assert called == [["inner"]]


def test_a_session_with_no_transaction_open_begins_one_for_the_callback(factory: sessionmaker[Session]) -> None:
    called: list[str] = []
    with factory() as session:
        after_commit(session, called.append, "after commit")
        assert session.in_transaction()
        session.commit()
    assert called == ["after commit"]


def test_a_failing_callback_is_logged_and_the_others_still_run(factory: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    called: list[str] = []

    def broken() -> None:
        raise ConnectionError("broker down")

    with caplog.at_level(logging.ERROR, logger="service.after_commit"), session_scope(factory) as session:
        add(session, "kept")
        after_commit(session, broken)
        after_commit(session, called.append, "still sent")

    assert called == ["still sent"]
    assert [r.message.split(" ")[0] for r in caplog.records] == ["after_commit_failed"]
    assert "broker down" in caplog.text
