"""Hostile input answered without a 500, logged as one short escaped line, and security headers (issue 14,
"500s and log injection"): each test replays a probe made on ``specwatch serve`` (SQLite) and failed before.
"""

from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

import httpx
import pytest

from service.notifications.outbox import github_repo
from tests.security.conftest import SECRET, WRITE_TOKEN, Embedded, served
from tests.support.pushes import push_payload, signed

pytestmark = pytest.mark.integration

TOO_BIG = "9223372036854775808"  # 2**63: SQLite's INTEGER overflowed (OverflowError, 500) on it


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/runs/{TOO_BIG}"),
        ("GET", f"/alerts/{TOO_BIG}"),
        ("GET", f"/ui/runs/{TOO_BIG}"),
        ("POST", f"/alerts/{TOO_BIG}/acknowledge"),
        ("POST", f"/alerts/{TOO_BIG}/resolve"),
        ("GET", "/runs/2147483648"),
        ("GET", "/runs/0"),
        ("GET", "/runs/-1"),
    ],
)
def test_an_id_out_of_range_is_a_client_error(embedded: Embedded, method: str, path: str) -> None:
    answer = embedded.client.request(method, path, headers={"Authorization": f"Bearer {WRITE_TOKEN}"})
    assert answer.status_code == 422, answer.text


def test_an_id_in_range_but_unknown_is_404(embedded: Embedded) -> None:
    assert embedded.client.get("/runs/2147483647").status_code == 404


def test_a_cursor_of_unicode_digits_is_400(embedded: Embedded) -> None:
    embedded.client.post(
        "/targets",
        json={"name": "t", "repo_url": "https://github.com/o/r", "branches": ["main"], "adapter": "transformers"},
        headers={"Authorization": f"Bearer {WRITE_TOKEN}"},
    )
    # "²".isdigit() is True but int("²") raises: a 500 before.
    assert embedded.client.get("/targets/t/commits", params={"cursor": "²"}).status_code == 400


def test_a_signed_deeply_nested_body_is_400(embedded: Embedded) -> None:
    depth = 100_000
    body = b'{"ref": ' + b"[" * depth + b"]" * depth + b"}"
    content, headers = signed(SECRET, body)
    answer = embedded.client.post("/webhooks/github", content=content, headers=headers)
    assert answer.status_code == 400
    assert "deeper than" in answer.json()["detail"]


def test_a_signed_body_nested_below_the_recursion_limit_but_too_deep_is_400(embedded: Embedded) -> None:
    payload = push_payload()
    nested: object = "leaf"
    for _ in range(500):
        nested = [nested]
    payload["pusher"] = nested
    content, headers = signed(SECRET, payload)
    assert embedded.client.post("/webhooks/github", content=content, headers=headers).status_code == 400


def test_a_ref_with_a_newline_is_refused_and_forges_no_log_line(embedded: Embedded, caplog: pytest.LogCaptureFixture) -> None:
    forged = "refs/heads/main\nwebhook delivery=forged event=push outcome=accepted"
    content, headers = signed(SECRET, push_payload(ref=forged))
    with caplog.at_level(logging.DEBUG):
        answer = embedded.client.post("/webhooks/github", content=content, headers=headers)
    assert answer.status_code == 400
    assert "ref" in answer.json()["detail"]
    assert not [r for r in caplog.records if "\n" in r.getMessage()]


@pytest.mark.parametrize("ref", ["refs/heads/a..b", "refs/heads/x.lock", "refs/heads/a b", "refs/heads/a\x1b[31m", "refs/heads/@{1}"])
def test_refs_breaking_gits_ref_name_rules_are_refused(embedded: Embedded, ref: str) -> None:
    content, headers = signed(SECRET, push_payload(ref=ref))
    assert embedded.client.post("/webhooks/github", content=content, headers=headers).status_code == 400


def test_an_unsigned_megabyte_delivery_header_writes_a_short_log_line(embedded: Embedded, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        answer = embedded.client.post(
            "/webhooks/github",
            content=b"{}",
            headers={"X-GitHub-Delivery": "d" * 1_000_000 + "\nforged line", "X-GitHub-Event": "push"},
        )
    assert answer.status_code == 401
    assert caplog.records
    assert max(len(r.getMessage()) for r in caplog.records) < 1000
    assert not [r for r in caplog.records if "\n" in r.getMessage()]


def test_a_token_in_a_query_string_never_reaches_the_access_log(tmp_path: Path) -> None:
    database = tmp_path / "specwatch.db"
    env = {"SPECWATCH_ENV": "test", "SPECWATCH_DATABASE_URL": f"sqlite:///{database}", "SPECWATCH_API_AUTH_READS": "true"}
    from tests.support.postgres import migrate

    migrate(env["SPECWATCH_DATABASE_URL"])
    token = "tok-" + secrets.token_hex(16)
    log_path = tmp_path / "uvicorn.log"
    with served(env, log_path) as (base, _):
        assert httpx.get(f"{base}/targets", params={"token": token, "access_token": token}).status_code == 401
        assert httpx.get(f"{base}/healthz").status_code == 200  # the access log of the request above is written
    log = log_path.read_text()
    assert "GET /targets?" in log  # the access log is on: the request is there
    assert token not in log
    assert "token=[redacted]" in log


@pytest.mark.parametrize(
    "url", ["https://github.com/../..", "https://github.com/owner/..", "https://github.com/./x", "git@github.com:owner/...git"]
)
def test_dot_and_dot_dot_are_not_github_owners_or_names(url: str) -> None:
    assert github_repo(url) is None


def test_github_repositories_are_still_recognised() -> None:
    assert github_repo("https://github.com/huggingface/transformers.git") == "huggingface/transformers"
    assert github_repo("git@github.com:vllm-project/vllm") == "vllm-project/vllm"
    assert github_repo("https://github.com/o/.hidden-name") == "o/.hidden-name"


def test_the_dashboard_and_the_api_answer_with_security_headers(embedded: Embedded) -> None:
    from service.headers import HTML_CSP  # new in issue 14: the other probes also replay on older code

    page = embedded.client.get("/ui")
    assert page.status_code == 200
    assert page.headers["Content-Security-Policy"] == HTML_CSP
    assert "script-src" not in HTML_CSP  # default-src 'none': no script at all
    assert 'href="/ui/style.css"' in page.text
    assert "<style" not in page.text  # no inline style (the CSP would block it)
    css = embedded.client.get("/ui/style.css")
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
    for answer in (page, css, embedded.client.get("/targets"), embedded.client.get("/runs/1")):
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["Referrer-Policy"] == "no-referrer"
    assert embedded.client.get("/targets").headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_a_json_error_answer_is_json(embedded: Embedded) -> None:
    answer = embedded.client.get(f"/runs/{TOO_BIG}")
    json.loads(answer.text)
