"""Security properties checked on the code and on what it does.

- SQL only through bound parameters: no raw SQL string in ``service/`` or ``workers/`` is built by
  formatting (f-strings, ``%``, ``+``, ``.format``); raw SQL (``text()``, ``exec_driver_sql``, DBAPI
  ``execute``) is a constant string whose values come as bound parameters.
- Secrets and tokens are compared in constant time: the webhook signature and API tokens with
  :func:`hmac.compare_digest`, and nothing named like a secret is compared with ``==``/``!=``.
- The webhook secret, the GitHub token and the Slack webhook URL never reach the logs: captured (every logger,
  DEBUG) during a bad signature, a good push, a ping, a settings repr, and Slack and GitHub deliveries that
  succeed, fail (with servers that echo what they got) and cannot connect.

The suite subprocess's environment (no ``SPECWATCH_*``, no service secret; cwd the scratch directory, HOME in
it) is tested on the real subprocess in ``tests/integration/workers/test_tasks.py``
(``test_the_suite_runs_in_a_clean_environment``) and on :func:`specwatch.sandbox.suite_environment` in
``tests/unit/workers/test_worker_config.py``.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.db import session_scope
from service.models import CommitPolicy
from service.settings import Settings
from service.targets import add_target, make_spec
from tests.support.private_servers import free_port
from tests.support.pushes import REPO_URL, push_payload, sha, signed
from workers.senders import Channels, send_github, send_slack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for folder in ("service", "workers") for p in (ROOT / folder).rglob("*.py"))
# The suite (a statistics library without secrets, where "tokens" are a model's) is left out of the name check.
SERVICE_SOURCES = [p for p in SOURCES if not p.is_relative_to(ROOT / "workers" / "suite")]

WEBHOOK_SECRET = "whsec-" + secrets.token_hex(12)
GITHUB_TOKEN = "ghp_" + secrets.token_hex(18)
SLACK_PATH = "/services/T0SECRET/B0SECRET/" + secrets.token_hex(12)


# --- SQL only through bound parameters ------------------------------------------------------------------

_SQL = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|DROP|CREATE|ALTER|TRUNCATE|GRANT)\b.*\b(FROM|INTO|SET|WHERE|TABLE|DATABASE|ON|VALUES)\b", re.S
)
_RAW_SQL_CALLS = {"text", "exec_driver_sql", "execute", "executemany", "literal_column"}


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _constant_string(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _formatted(node: ast.expr) -> bool:
    """A string built at run time: an f-string, ``%``/``+`` on strings, ``.format()``."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return _constant_string(node.left) or _constant_string(node.right) or _formatted(node.left) or _formatted(node.right)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and _constant_string(node.func.value)
    )


def _literal_parts(node: ast.expr) -> str:
    return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def sql_problems(source: str, filename: str) -> list[str]:
    """Where ``source`` builds SQL by string formatting, or hands raw SQL that is not a constant string."""
    problems = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and _called_name(node) in _RAW_SQL_CALLS and node.args:
            first = node.args[0]
            if _formatted(first) or (isinstance(first, ast.Name) and _called_name(node) in {"text", "exec_driver_sql"}):
                problems.append(f"{where}: {_called_name(node)}() of a string built at run time")
            elif _constant_string(first) and _SQL.search(str(first.value)) and re.search(r"'[^']*'", str(first.value)):
                problems.append(f"{where}: a quoted literal in raw SQL (use a bound parameter)")
        elif isinstance(node, ast.expr) and _formatted(node) and _SQL.search(_literal_parts(node)):
            problems.append(f"{where}: SQL built by string formatting")
    return problems


def test_the_scanner_finds_formatted_sql() -> None:
    bad = """
from sqlalchemy import text
def f(session, name, table):
    session.execute(text(f"SELECT * FROM runs WHERE name = '{name}'"))
    session.execute(text("SELECT * FROM runs WHERE name = '%s'" % name))
    query = "DELETE FROM " + table + " WHERE id = 1"
    session.connection().exec_driver_sql(query)
    cursor.execute("UPDATE runs SET status = 'x' WHERE id = {}".format(name))
    session.execute(text("SELECT * FROM runs WHERE name = 'x'"))
"""
    good = """
from sqlalchemy import text
def f(session, run_id):
    session.execute(text("SELECT status FROM runs WHERE id = :id"), {"id": run_id})
    log.info(f"selected from {run_id}")
"""
    assert len(sql_problems(bad, "bad.py")) >= 5
    assert sql_problems(good, "good.py") == []


def test_sql_goes_only_through_bound_parameters() -> None:
    assert SOURCES
    problems = [problem for path in SOURCES for problem in sql_problems(path.read_text(), str(path.relative_to(ROOT)))]
    assert problems == []


# --- constant-time comparisons -----------------------------------------------------------------------------

_SECRET_NAME = re.compile(r"signature|secret|token|digest|password|hmac", re.I)


def _names(node: ast.expr) -> list[str]:
    return [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)]


def _function(path: Path, name: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{path}: no single function {name}"
    return found[0]


def _compare_digest_calls(node: ast.AST) -> int:
    return sum(
        1
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "compare_digest"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id in {"hmac", "secrets"}
    )


@pytest.mark.parametrize(("module", "function"), [("service/webhooks/body.py", "verify_signature"), ("service/auth.py", "_matches")])
def test_signatures_and_tokens_are_compared_in_constant_time(module: str, function: str) -> None:
    node = _function(ROOT / module, function)
    assert _compare_digest_calls(node) == 1
    assert not [
        n for n in ast.walk(node) if isinstance(n, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq | ast.In) for op in n.ops)
    ]


def _orm_column(node: ast.expr) -> bool:
    """``Model.column``: a mapped class (a capitalised name) and one of its attributes, in a SQL expression."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id[:1].isupper()


def test_nothing_named_like_a_secret_is_compared_with_equality() -> None:
    problems = []
    for path in SERVICE_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare) or not any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                continue
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value is None for o in operands):
                continue
            if _orm_column(node.left):
                # A database lookup by a stored digest (``Model.id_digest == sha256(id)``): an index lookup of the hash
                # of a random 256-bit value, whose bytes a client cannot steer; not a comparison of a secret in Python.
                continue
            if any(_SECRET_NAME.search(name) for o in operands for name in _names(o)):
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert problems == []


# --- secrets never in logs ---------------------------------------------------------------------------------


def _secrets_in(text: str) -> list[str]:
    return [
        name
        for name, value in (("webhook secret", WEBHOOK_SECRET), ("GitHub token", GITHUB_TOKEN), ("Slack URL", SLACK_PATH))
        if value in text
    ]


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    """Everything logged: formatted messages, raw arguments and exception texts."""
    return "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''} {r.exc_info!r}" for r in caplog.records)


def _settings() -> Settings:
    return Settings(
        env="test",
        database_url="postgresql+psycopg://unused",
        redis_url="redis://127.0.0.1:1/0",
        webhook_secret=SecretStr(WEBHOOK_SECRET),
        github_token=SecretStr(GITHUB_TOKEN),
        slack_webhook_url=SecretStr(f"https://hooks.slack.com{SLACK_PATH}"),
    )


@dataclass
class Recording:
    sent: list[int] = field(default_factory=list)

    def send_run(self, run_id: int) -> None:
        self.sent.append(run_id)


def test_settings_never_show_their_secrets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    settings = _settings()
    logging.getLogger("specwatch.test").info("settings %s %r", settings, settings)
    shown = f"{settings!r} {settings!s} {settings.model_dump()!r} {settings.model_dump_json()}"
    assert _secrets_in(shown) == []
    assert _secrets_in(_logged(caplog)) == []


def test_webhooks_never_log_the_secret(rolled_back_factory: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with session_scope(rolled_back_factory) as session:
        add_target(session, make_spec(name="sec", repo_url=REPO_URL, branches=["main"], adapter="toy:f", commit_policy=CommitPolicy.every))
    producer = Recording()
    with TestClient(
        create_app(_settings(), session_factory=rolled_back_factory, producer=producer), raise_server_exceptions=False
    ) as client:
        body, headers = signed("not-" + WEBHOOK_SECRET, push_payload([sha()]))
        assert client.post("/webhooks/github", content=body, headers=headers).status_code == 401
        body, headers = signed(WEBHOOK_SECRET, push_payload([sha(), sha()]))
        answer = client.post("/webhooks/github", content=body, headers=headers)
        assert answer.status_code == 202
        assert len(answer.json()["runs"]) == 2
        body, headers = signed(WEBHOOK_SECRET, {"zen": "Keep it logically awesome.", "hook_id": 1}, event="ping")
        assert client.post("/webhooks/github", content=body, headers=headers).status_code == 200
        body, headers = signed(WEBHOOK_SECRET, b"{not json")
        assert client.post("/webhooks/github", content=body, headers=headers).status_code == 400
    assert producer.sent == answer.json()["runs"]
    assert caplog.records
    assert _secrets_in(_logged(caplog)) == []


class _Echo(BaseHTTPRequestHandler):
    """Answers every POST with ``status`` and echoes back its headers and body (and its path if ``echo_path``)."""

    status = 500
    echo_path = False

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        echoed = ({"path": self.path} if self.echo_path else {}) | {"headers": dict(self.headers), "body": self.rfile.read(length).decode()}
        echoed_bytes = json.dumps(echoed).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(echoed_bytes)))
        self.end_headers()
        self.wfile.write(echoed_bytes)

    def log_message(self, format: str, *args: object) -> None:
        """Silent: this stand-in for Slack and GitHub sees the secrets (its own logs are not ours)."""


@pytest.fixture
def echo() -> Iterator[tuple[str, type[_Echo]]]:
    handler = type("Echo", (_Echo,), {"status": 500, "echo_path": False})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [200, 400, 429, 500])
def test_slack_and_github_deliveries_never_log_their_secrets(
    echo: tuple[str, type[_Echo]], status: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base, handler = echo
    handler.status = status
    channels = Channels(slack_webhook_url=f"{base}{SLACK_PATH}", github_token=GITHUB_TOKEN, github_api_url=base, timeout_s=5)
    slack = send_slack({"text": "a violation", "blocks": []}, channels)
    github = send_github(
        {"repo": "octo/lib", "sha": "a" * 40, "state": "failure", "target_url": None, "description": "x", "context": "specwatch"}, channels
    )

    assert slack.ok is github.ok is (status == 200)
    assert _secrets_in(f"{slack!r} {github!r}") == []
    assert _secrets_in(_logged(caplog)) == []


def test_a_slack_error_echoing_the_webhook_path_does_not_keep_it(echo: tuple[str, type[_Echo]]) -> None:
    base, handler = echo
    handler.echo_path = True
    slack = send_slack({"text": "a violation"}, Channels(slack_webhook_url=f"{base}{SLACK_PATH}", github_token=None, timeout_s=5))
    assert not slack.ok
    assert _secrets_in(repr(slack)) == []


def test_unreachable_slack_and_github_never_log_their_secrets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    base = f"http://127.0.0.1:{free_port()}"
    channels = Channels(slack_webhook_url=f"{base}{SLACK_PATH}", github_token=GITHUB_TOKEN, github_api_url=base, timeout_s=2)
    slack = send_slack({"text": "a violation"}, channels)
    github = send_github(
        {"repo": "octo/lib", "sha": "a" * 40, "state": "error", "target_url": None, "description": "x", "context": "specwatch"}, channels
    )

    assert not slack.ok
    assert not github.ok
    assert _secrets_in(f"{slack!r} {github!r}") == []
    assert _secrets_in(_logged(caplog)) == []
