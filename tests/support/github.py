"""GitHub as the end-to-end tests see it: push webhooks shaped and signed as GitHub sends them, for commits
of a real local repository, and a git configuration that makes the GitHub URL fetch that repository.

The repository is registered under its GitHub URL (as a user registers ``huggingface/transformers``) and
the payloads carry GitHub's URLs; only the worker's ``git`` is redirected to the local repository
(``url.<local>.insteadOf``, through ``GIT_CONFIG_*`` variables), so the mirror clone and fetch are real.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from pathlib import Path
from typing import Any

import httpx

from service.webhooks import signature
from tests.support.toy_target import git

FULL_NAME = "octo-org/toy-sampler"
REPO_URL = f"https://github.com/{FULL_NAME}"
ZERO_SHA = "0" * 40


def git_redirect(local: Path) -> dict[str, str]:
    """Environment variables that make ``git`` fetch ``REPO_URL`` (with or without ``.git``) from ``local``."""
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"url.{local.as_uri()}.insteadOf",
        "GIT_CONFIG_VALUE_0": REPO_URL,
    }


def _repository() -> dict[str, Any]:
    owner, name = FULL_NAME.split("/")
    return {
        "id": 987654321,
        "node_id": "R_kgDOToySampler",
        "name": name,
        "full_name": FULL_NAME,
        "private": False,
        "owner": {"name": owner, "email": None, "login": owner, "id": 1, "type": "Organization"},
        "html_url": REPO_URL,
        "description": "a toy speculative sampler",
        "fork": False,
        "url": REPO_URL,
        "created_at": 1767225600,
        "pushed_at": 1767225600,
        "git_url": f"git://github.com/{FULL_NAME}.git",
        "ssh_url": f"git@github.com:{FULL_NAME}.git",
        "clone_url": f"{REPO_URL}.git",
        "default_branch": "main",
        "master_branch": "main",
    }


def _commit(repo: Path, sha: str) -> dict[str, Any]:
    """A ``commits[]`` entry for ``sha``, filled from the repository (message, time, author, files)."""
    message, timestamp, name, email = git(repo, "show", "--no-patch", "--format=%B%x00%cI%x00%an%x00%ae", sha).split("\x00")
    files = [line for line in git(repo, "show", "--format=", "--name-only", sha).splitlines() if line]
    person = {"name": name, "email": email, "username": "toy"}
    return {
        "id": sha,
        "tree_id": git(repo, "rev-parse", f"{sha}^{{tree}}"),
        "distinct": True,
        "message": message.strip(),
        "timestamp": timestamp,
        "url": f"{REPO_URL}/commit/{sha}",
        "author": person,
        "committer": person,
        "added": [],
        "removed": [],
        "modified": files,
    }


def push_payload(repo: Path, before: str, after: str, *, branch: str = "main") -> dict[str, Any]:
    """GitHub's ``push`` payload for moving ``branch`` from ``before`` (zeros: a new branch) to ``after``."""
    shas = git(repo, "rev-list", "--reverse", after if before == ZERO_SHA else f"{before}..{after}").splitlines()
    commits = [_commit(repo, sha) for sha in shas]
    return {
        "ref": f"refs/heads/{branch}",
        "before": before,
        "after": after,
        "repository": _repository(),
        "pusher": {"name": "toy", "email": "toy@example.com"},
        "sender": {"login": "toy", "id": 2, "type": "User"},
        "created": before == ZERO_SHA,
        "deleted": False,
        "forced": False,
        "base_ref": None,
        "compare": f"{REPO_URL}/compare/{before[:12]}...{after[:12]}",
        "commits": commits,
        "head_commit": commits[-1] if commits else None,
    }


def post_webhook(client: httpx.Client, secret: str, event: str, payload: dict[str, Any]) -> httpx.Response:
    """POST ``payload`` to ``/webhooks/github`` with the headers GitHub sends, signed with ``secret``."""
    body = json.dumps(payload, indent=2).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/7c3e9a1",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-GitHub-Hook-ID": "424242",
        "X-GitHub-Hook-Installation-Target-Type": "repository",
        "X-GitHub-Hook-Installation-Target-ID": "987654321",
        "X-Hub-Signature": "sha1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest(),
        "X-Hub-Signature-256": signature(secret, body),
    }
    return client.post("/webhooks/github", content=body, headers=headers)


def push_history(client: httpx.Client, secret: str, repo: Path, shas: list[str]) -> list[httpx.Response]:
    """One push per commit of ``shas`` (oldest first), each moving ``main`` from the previous one."""
    answers = []
    before = ZERO_SHA
    for sha in shas:
        answers.append(post_webhook(client, secret, "push", push_payload(repo, before, sha)))
        before = sha
    return answers
