"""``specwatch demo`` (service/demo, service/cli/demo.py) against a fake API, and its toy repository.

The demo against a real ``specwatch serve`` is tests/e2e/test_demo.py (and, from an installed wheel,
tests/e2e/test_wheel_install.py).
"""

from __future__ import annotations

import hmac
import subprocess
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from service import demo
from service.cli import app

pytestmark = pytest.mark.unit

ERROR = "the worker cannot isolate the suite: bwrap: Can't mount proc on /newroot/proc"


def _fake_api(statuses: tuple[str, str], seen: list[httpx.Request]):  # type: ignore[no-untyped-def]
    def api(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if request.method == "POST":
            return httpx.Response(201 if path == "/targets" else 202, json={"runs": [1, 2]})
        if path.endswith("/commits"):
            return httpx.Response(200, json={"commits": [{"run_id": 1}, {"run_id": 2}]})
        run_id = int(path.rsplit("/", 1)[1])
        status = statuses[run_id - 1]
        return httpx.Response(
            200, json={"sha": f"{run_id}" * 40, "status": status, "cases": [], "error": ERROR if status == "error" else None}
        )

    return api


@pytest.mark.parametrize(
    ("statuses", "exit_status"),
    [(("passed", "failed"), 0), (("passed", "error"), 1), (("error", "error"), 1), (("passed", "uninstallable"), 1)],
)
def test_the_demo_exits_0_only_when_both_runs_have_a_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, statuses: tuple[str, str], exit_status: int
) -> None:
    seen: list[httpx.Request] = []
    client = httpx.Client
    monkeypatch.setattr(demo.httpx, "Client", lambda **options: client(transport=httpx.MockTransport(_fake_api(statuses, seen)), **options))
    arguments = ["demo", "--secret", "hook-secret", "--token", "write-token", "--workdir", str(tmp_path), "--timeout", "30"]
    done = CliRunner().invoke(app, arguments)
    assert done.exit_code == exit_status, done.output
    if exit_status:
        assert "did not test the commits" in done.output
    if "error" in statuses:
        assert ERROR in done.output
    # The push is signed with the secret and names the repository the demo made.
    push = next(r for r in seen if r.url.path == "/webhooks/github")
    assert push.headers["X-Hub-Signature-256"] == "sha256=" + hmac.new(b"hook-secret", push.content, "sha256").hexdigest()
    assert (tmp_path / "toy-sampler").as_uri().encode() in push.content


def test_the_demo_refuses_to_start_without_the_secret_and_a_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECWATCH_WEBHOOK_SECRET", raising=False)
    monkeypatch.delenv("SPECWATCH_API_TOKEN", raising=False)
    done = CliRunner().invoke(app, ["demo", "--token", "write-token", "--workdir", str(tmp_path)])
    assert done.exit_code == 2
    assert "--secret" in done.output
    assert not (tmp_path / "toy-sampler").exists()


def test_the_toy_repository_has_a_correct_commit_then_the_swapped_residual(tmp_path: Path) -> None:
    """The sampler is package data (the server imports no torch); the second commit changes only the residual."""
    shas = demo.make_repository(tmp_path / "toy")
    assert len(shas) == 2
    diff = subprocess.run(["git", "diff", "-U0", *shas], cwd=tmp_path / "toy", capture_output=True, text=True, check=True).stdout
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-    return (p - q).clamp(min=0)", "+    return (q - p).clamp(min=0)"]
    assert "def speculative_sample(step, n, generator):" in demo.correct_sampler()
