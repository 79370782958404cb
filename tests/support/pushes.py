"""Push webhooks as GitHub sends them, without a real repository: random commit ids, signed headers.

For the tests that only need the control plane to record pushes (fuzzing, faults, security): a payload of
``n`` new commits on ``main`` of :data:`REPO_URL`, and the headers GitHub sends with it.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import Any

from service.webhooks import signature

FULL_NAME = "octo-org/fuzzed-sampler"
REPO_URL = f"https://github.com/{FULL_NAME}"


def sha() -> str:
    return secrets.token_hex(20)


def push_payload(shas: list[str] | None = None, *, ref: str = "refs/heads/main", message: str = "change") -> dict[str, Any]:
    """A push of ``shas`` (oldest first; one random commit by default) to ``ref`` of :data:`REPO_URL`."""
    shas = shas if shas is not None else [sha()]
    person = {"name": "Ada Lovelace", "email": "ada@example.org", "username": "ada"}
    commits = [
        {
            "id": commit_sha,
            "tree_id": sha(),
            "distinct": True,
            "message": f"{message} {i}",
            "timestamp": datetime(2026, 3, 1, 12, i % 60, tzinfo=UTC).isoformat(),
            "url": f"{REPO_URL}/commit/{commit_sha}",
            "author": person,
            "committer": person,
            "added": [],
            "removed": [],
            "modified": ["sampler.py"],
        }
        for i, commit_sha in enumerate(shas)
    ]
    owner, name = FULL_NAME.split("/")
    return {
        "ref": ref,
        "before": sha(),
        "after": shas[-1] if shas else sha(),
        "created": False,
        "deleted": False,
        "forced": False,
        "base_ref": None,
        "compare": f"{REPO_URL}/compare/a...b",
        "commits": commits,
        "head_commit": commits[-1] if commits else None,
        "repository": {
            "id": 1,
            "name": name,
            "full_name": FULL_NAME,
            "private": False,
            "owner": {"login": owner, "id": 1, "type": "Organization"},
            "html_url": REPO_URL,
            "url": REPO_URL,
            "clone_url": f"{REPO_URL}.git",
            "git_url": f"git://github.com/{FULL_NAME}.git",
            "ssh_url": f"git@github.com:{FULL_NAME}.git",
            "default_branch": "main",
        },
        "pusher": {"name": "ada", "email": "ada@example.org"},
        "sender": {"login": "ada", "id": 2, "type": "User"},
    }


def signed(
    secret: str, payload: dict[str, Any] | bytes, *, event: str = "push", delivery: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and the headers GitHub sends for ``payload`` signed with ``secret``."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/abc1234",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or secrets.token_hex(16),
        "X-GitHub-Hook-ID": "42",
        "X-Hub-Signature-256": signature(secret, body),
    }
    return body, headers
