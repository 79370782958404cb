"""``specwatch targets add|list|remove`` through the real CLI on a migrated SQLite database."""

from __future__ import annotations

import json
import os
import shlex
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
from service.releases import release_package
from service.targets import get_target, known_adapters

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
    [row] = json.loads(listed.stdout)
    health = {key: row.pop(key) for key in ("configuration_error", "polls", "queued_runs", "running_runs", "queue_age_s", "last_run")}
    assert health == {"configuration_error": None, "polls": [], "queued_runs": 0, "running_runs": 0, "queue_age_s": None, "last_run": None}
    assert [row] == [
        {
            "name": "transformers",
            "repo_url": "https://github.com/huggingface/transformers",
            "branches": ["main", "v4-release"],
            "adapter": "transformers",
            "install_mode": "source",
            "poll_interval_s": 300,
            "commit_policy": "head",
            "github_checks": False,
        }
    ]
    table = specwatch(factory, "targets", "list")
    assert "transformers" in table.stdout
    assert "5m" in table.stdout

    with session_scope(factory) as session:
        target = get_target(session, "transformers")
        session.add(Run(commit=Commit(target=target, sha="a" * 40), profile="default"))
    removed = specwatch(factory, "targets", "remove", "transformers", "--yes")
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
        (["targets", "remove", "nothing", "--yes"], "no target named 'nothing'"),
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


def test_an_unmigrated_database_is_one_line_exit_1_saying_how_to_point_at_one(tmp_path: Path) -> None:
    (tmp_path / "empty.db").touch()
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        result = specwatch(sessionmaker(bind=engine), "targets", "list")
    finally:
        engine.dispose()
    assert result.exit_code == 1, result.output
    assert "the database at sqlite:///" in result.output
    assert "no such table: targets" in result.output
    assert "SPECWATCH_DATABASE_URL" in result.output
    assert "Traceback" not in result.output


def test_a_missing_database_file_is_not_created(tmp_path: Path) -> None:
    """Outside the serve folder the default ./specwatch.db does not exist: say which database was looked for
    and how to point at one, and leave no empty file behind (issue 26)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECWATCH_DATABASE")}
    command_ = [sys.executable, "-c", "from service.cli import main; main()"]
    for args in (["alerts"], ["history", "x"], ["targets", "list"]):
        result = subprocess.run([*command_, *args], env=env, capture_output=True, text=True, cwd=tmp_path, check=False)
        assert result.returncode == 1, result.stderr
        assert f"no specwatch database at {tmp_path / 'specwatch.db'}" in " ".join(result.stderr.split())
        assert "SPECWATCH_DATABASE_URL" in result.stderr
        assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_remove_asks_first_and_keeps_the_target_when_refused(factory: sessionmaker[Session]) -> None:
    assert specwatch(factory, *ADD, "--adapter", "transformers", "--install", "source").exit_code == 0
    refused = runner.invoke(app, ["targets", "remove", "transformers"], obj=factory, input="n\n")
    assert refused.exit_code == 2, refused.output
    assert "remove target 'transformers' and delete its history (0 commit(s), 0 run(s))?" in refused.output
    assert "kept" in refused.output
    assert [t["name"] for t in json.loads(specwatch(factory, "targets", "list", "--json").stdout)] == ["transformers"]
    confirmed = runner.invoke(app, ["targets", "remove", "transformers"], obj=factory, input="y\n")
    assert confirmed.exit_code == 0, confirmed.output
    assert "removed target transformers" in confirmed.output
    assert json.loads(specwatch(factory, "targets", "list", "--json").stdout) == []


def _made_repository(args: list[str], docs: str, tmp_path: Path) -> list[str]:
    """``args`` with a local ``--repo`` that the docs make with an earlier command (``... --out PATH``, e.g.
    scripts/replay_history.py) pointed at such a repository made here: the docs' path exists only where that
    command ran. A local path no documented command makes stays as written (and fails)."""
    at = args.index("--repo") + 1
    path = args[at]
    if not path.startswith("/") or Path(path).exists() or f"--out {path}" not in docs:
        return args
    made = tmp_path / Path(path).name
    made.mkdir()
    subprocess.run(["git", "init", "--quiet", str(made)], check=True)
    return [*args[:at], str(made), *args[at + 1 :]]


def test_the_readme_commands_work_as_written(factory: sessionmaker[Session], tmp_path: Path) -> None:
    """Every ``specwatch targets add`` line of the README and the docs pages parses and adds its target (issue 26:
    the vLLM one lacked ``--branch``, which now defaults to main); a local repository the docs make first is made."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    readme = "\n".join(page.read_text() for page in pages)
    lines = [line.strip() for line in readme.splitlines() if line.strip().startswith("specwatch targets add ")]
    assert any(" vllm " in line for line in lines)
    for line in lines:
        args = _made_repository(shlex.split(line)[1:], readme, tmp_path)
        assert specwatch(factory, *args).exit_code == 0, line
    [vllm] = [t for t in json.loads(specwatch(factory, "targets", "list", "--json").stdout) if t["name"] == "vllm"]
    assert vllm["branches"] == ["main"]


def test_adapter_help_lists_every_known_adapter() -> None:
    result = runner.invoke(app, ["targets", "add", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    for adapter in known_adapters():
        assert f"{adapter} (" in result.output
    assert "module:function" in result.output


def test_an_openvino_release_target_is_watched_from_the_index(factory: sessionmaker[Session]) -> None:
    """``targets add openvino --adapter openvino --install pip``: the registry's openvino adapter, whose releases are
    openvino-genai's (what the release poller asks the index about)."""
    args = ["targets", "add", "openvino", "--repo", "https://github.com/openvinotoolkit/openvino.genai", "--branch", "master"]
    added = specwatch(factory, *args, "--adapter", "openvino", "--install", "pip")
    assert added.exit_code == 0, added.output
    [row] = [t for t in json.loads(specwatch(factory, "targets", "list", "--json").stdout) if t["name"] == "openvino"]
    assert (row["adapter"], row["install_mode"]) == ("openvino", "pip")
    assert release_package(row["name"], row["adapter"], cpu=True) == "openvino-genai"
