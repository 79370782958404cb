"""``specwatch targets add|list|remove`` through the real CLI on a migrated SQLite database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from click.testing import Result
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from service.cli import app
from service.db import make_engine, session_scope
from service.models import Commit, Run
from service.targets import get_target

ROOT = Path(__file__).resolve().parents[3]
runner = CliRunner()
ADD = ["targets", "add", "transformers", "--repo", "https://github.com/huggingface/transformers", "--branch", "main"]


def migrated_sqlite(path: Path) -> str:
    url = f"sqlite:///{path}"
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", url)
    config.attributes["configure_logging"] = False
    command.upgrade(config, "head")
    return url


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(migrated_sqlite(tmp_path / "specwatch.db"))
    yield engine
    engine.dispose()


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


def specwatch(factory: sessionmaker[Session], *args: str) -> Result:
    return runner.invoke(app, list(args), obj=factory)


def test_add_list_remove(factory: sessionmaker[Session]) -> None:
    added = specwatch(factory, *ADD, "--branch", "v4-release", "--adapter", "transformers", "--install", "source", "--poll", "5m")
    assert added.exit_code == 0, added.output
    assert "added target transformers" in added.output
    assert "polled every 5m" in added.output

    listed = specwatch(factory, "targets", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == [
        {
            "name": "transformers",
            "repo_url": "https://github.com/huggingface/transformers",
            "branches": ["main", "v4-release"],
            "adapter": "transformers",
            "install_mode": "source",
            "poll_interval_s": 300,
            "commit_policy": "head",
        }
    ]
    table = specwatch(factory, "targets", "list")
    assert "transformers" in table.stdout
    assert "5m" in table.stdout

    with session_scope(factory) as session:
        target = get_target(session, "transformers")
        session.add(Run(commit=Commit(target=target, sha="a" * 40), profile="default"))
    removed = specwatch(factory, "targets", "remove", "transformers")
    assert removed.exit_code == 0, removed.output
    assert "removed target transformers (1 commit(s), 1 run(s))" in removed.output
    assert json.loads(specwatch(factory, "targets", "list", "--json").stdout) == []


def test_policy_every_and_a_module_function_adapter(factory: sessionmaker[Session]) -> None:
    added = specwatch(factory, *ADD, "--adapter", "toy_lib.sampler:sample", "--install", "source", "--policy", "every")
    assert added.exit_code == 0, added.output
    assert "webhooks only" in added.output
    [row] = json.loads(specwatch(factory, "targets", "list", "--json").stdout)
    assert (row["adapter"], row["commit_policy"], row["poll_interval_s"]) == ("toy_lib.sampler:sample", "every", None)


def test_an_empty_list_says_how_to_add_one(factory: sessionmaker[Session]) -> None:
    listed = specwatch(factory, "targets", "list")
    assert listed.exit_code == 0
    assert "specwatch targets add" in listed.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--adapter", "tensorrt_llm", "--install", "source"], "unknown adapter 'tensorrt_llm'"),
        (["--adapter", "transformers", "--install", "conda"], "conda"),
        (["--adapter", "transformers", "--install", "source", "--policy", "some"], "some"),
        (["--adapter", "transformers", "--install", "source", "--poll", "5 minutes"], "invalid poll interval"),
        (["--adapter", "transformers", "--install", "source", "--poll", "5s"], "too short"),
        (["--adapter", "transformers", "--install", "source", "--branch", "a..b"], "invalid branch name 'a..b'"),
        (["--adapter", "transformers"], "--install"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(factory: sessionmaker[Session], args: list[str], message: str) -> None:
    result = specwatch(factory, *ADD, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert json.loads(specwatch(factory, "targets", "list", "--json").stdout) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["targets", "add", "bad name", "--repo", "/srv/x", "--branch", "main", "--adapter", "transformers", "--install", "pip"],
            "invalid target name",
        ),
        (
            ["targets", "add", "x", "--repo", "nope", "--branch", "main", "--adapter", "transformers", "--install", "pip"],
            "invalid repository 'nope'",
        ),
        (["targets", "remove", "nothing"], "no target named 'nothing'"),
    ],
)
def test_more_bad_input(factory: sessionmaker[Session], args: list[str], message: str) -> None:
    result = specwatch(factory, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_duplicate_name_exits_2_and_keeps_the_first(factory: sessionmaker[Session]) -> None:
    assert specwatch(factory, *ADD, "--adapter", "transformers", "--install", "source").exit_code == 0
    again = specwatch(factory, *ADD, "--adapter", "toy:f", "--install", "pip")
    assert again.exit_code == 2
    assert "target 'transformers' exists already" in again.output
    [row] = json.loads(specwatch(factory, "targets", "list", "--json").stdout)
    assert row["adapter"] == "transformers"


def test_the_installed_command_uses_the_configured_database(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path / "cli.db")
    env = {**os.environ, "SPECWATCH_DATABASE_URL": url}
    command_ = [sys.executable, "-c", "from service.cli import main; main()"]
    added = subprocess.run(
        [*command_, *ADD, "--adapter", "transformers", "--install", "source"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert added.returncode == 0, added.stderr
    listed = subprocess.run([*command_, "targets", "list", "--json"], env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    assert [t["name"] for t in json.loads(listed.stdout)] == ["transformers"]


def test_an_unmigrated_or_unreachable_database_is_one_line_exit_1(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        result = specwatch(sessionmaker(bind=engine), "targets", "list")
    finally:
        engine.dispose()
    assert result.exit_code == 1, result.output
    assert "database error at sqlite:///" in result.output
    assert "no such table: targets" in result.output
    assert "Traceback" not in result.output
