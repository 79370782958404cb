"""Bounded work before authentication (issue 14, "Memory before authentication"): an unsigned body is not
read, a signed one is hashed while it streams (never joined in memory before the signature is checked), the
bodies read at once are capped, and the default limit is below GitHub's 25 MB. The memory figures (8
concurrent unsigned 24 MB bodies, before and after) come from ``bench/webhook_memory.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.settings import Settings
from service.webhooks import signature
from tests.security.conftest import SECRET, Embedded, embedded_app
from tests.support.pushes import push_payload, signed

pytestmark = pytest.mark.integration

MB = 1_000_000


def _chunks(total: int, consumed: list[int], size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        consumed.append(size)
        sent += size
        yield b" " * size


@pytest.mark.parametrize("header", [None, "", "sha1=abc", "sha256=" + "z" * 64, "sha256=" + "0" * 63])
def test_a_body_without_a_well_formed_signature_is_refused_unread(embedded: Embedded, header: str | None) -> None:
    consumed: list[int] = []
    headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "unsigned"}
    if header is not None:
        headers["X-Hub-Signature-256"] = header
    answer = embedded.client.post("/webhooks/github", content=_chunks(24 * MB, consumed), headers=headers)
    assert answer.status_code == 401
    assert sum(consumed) <= 2 * 64 * 1024  # the transport may pull a chunk ahead; the app read nothing


def test_a_24_mb_body_is_refused_by_its_declared_length_before_it_is_read(embedded: Embedded) -> None:
    body = b" " * (24 * MB)
    headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "big", "X-Hub-Signature-256": "sha256=" + "0" * 64}
    answer = embedded.client.post("/webhooks/github", content=body, headers=headers)
    assert answer.status_code == 413


def test_the_default_limit_is_below_githubs_cap() -> None:
    settings = Settings(env="test")
    assert settings.webhook_max_body_bytes == 10 * 1024 * 1024
    assert settings.webhook_max_body_bytes <= settings.webhook_body_budget_bytes <= 32 * 1024 * 1024


def test_a_budget_below_the_largest_body_is_refused() -> None:
    with pytest.raises(ValueError, match="the largest push would never fit"):
        Settings(env="test", webhook_max_body_bytes=2048, webhook_body_budget_bytes=1024)


def test_a_body_past_the_byte_budget_gets_503_with_retry_after(embedded: Embedded) -> None:
    from service.webhooks import BodyBudget

    content, headers = signed(SECRET, push_payload())
    budget = BodyBudget(len(content) + 10)
    embedded.client.app.state.webhook_body_budget = budget  # type: ignore[attr-defined]
    budget.held = 11  # other bodies hold 11 bytes: this one no longer fits
    busy = embedded.client.post("/webhooks/github", content=content, headers=headers)
    assert busy.status_code == 503
    assert busy.headers["Retry-After"] == "5"
    streamed = iter([content[i : i + 100] for i in range(0, len(content), 100)])  # no declared length
    assert embedded.client.post("/webhooks/github", content=streamed, headers=headers).status_code == 503
    assert budget.held == 11  # what the refused bodies had taken was given back
    budget.held = 10
    assert embedded.client.post("/webhooks/github", content=content, headers=headers).status_code == 202
    assert budget.held == 10  # the bytes taken for that body were given back


def test_the_budget_is_given_back_after_a_refused_body(embedded: Embedded) -> None:
    from service.webhooks import BodyBudget

    budget = BodyBudget(1000)
    embedded.client.app.state.webhook_body_budget = budget  # type: ignore[attr-defined]
    headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "x", "X-Hub-Signature-256": "sha256=" + "0" * 64}
    assert embedded.client.post("/webhooks/github", content=b"{}", headers=headers).status_code == 401
    assert budget.held == 0


def test_a_signed_body_larger_than_the_spool_threshold_is_accepted(tmp_path: Path) -> None:
    """Spooled to disk past 1 KiB, hashed while streaming, read back once verified."""
    payload = push_payload()
    payload["padding"] = "x" * (3 * MB)
    content, headers = signed(SECRET, payload)
    with embedded_app(tmp_path, webhook_spool_bytes=1024) as app:
        answer = app.client.post("/webhooks/github", content=content, headers=headers)
    assert answer.status_code == 202, answer.text


def test_a_streamed_signed_body_is_verified(embedded: Embedded) -> None:
    content, headers = signed(SECRET, push_payload())
    chunks = iter([content[i : i + 100] for i in range(0, len(content), 100)])
    answer = embedded.client.post("/webhooks/github", content=chunks, headers=headers)
    assert answer.status_code == 202
    tampered = iter([content[:-2] + b" }"])
    assert embedded.client.post("/webhooks/github", content=tampered, headers={**headers, "X-GitHub-Delivery": "t"}).status_code == 401
    assert signature(SECRET, content) == headers["X-Hub-Signature-256"]
