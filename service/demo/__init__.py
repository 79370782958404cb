"""The laptop demo (``specwatch demo``): a run going through a running specwatch end to end.

It creates a local git repository of a toy speculative-sampling library (a correct sampler, then a commit with
the classic swapped-residual bug), registers it as a target (``POST /targets``, a write token), posts a correctly
signed GitHub ``push`` webhook for the commits, and follows ``GET /runs/{id}`` until the runs finish. It succeeds
when both runs finished with a verdict (the correct commit passed, the buggy one failed), and fails when any ended
without one (``error``, ``uninstallable``, ``cancelled``: see the run's error) or the wait timed out.

The repository is local, so the instance must run on this machine (its worker clones the path) and allow local
repositories (``specwatch serve`` does outside ``SPECWATCH_ENV=prod``). The toy sampler is package data
(``toy_sampler.py.txt``): the server imports no torch, the suite's subprocess runs the committed file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

ADAPTER = "toy_lib.sampler:speculative_sample"
FINISHED = frozenset({"passed", "failed", "error", "uninstallable", "cancelled"})
#: Finished without a verdict: the demo did not show what it is for.
UNTESTED = frozenset({"error", "uninstallable", "cancelled"})


def correct_sampler() -> str:
    """The toy library's correct sampler (the tests' toy target commits the same file)."""
    return resources.files(__package__).joinpath("toy_sampler.py.txt").read_text()


def swapped_residual(correct: str) -> str:
    """The classic bug: the residual (p - q)+ written as (q - p)+."""
    buggy = correct.replace("return (p - q).clamp(min=0)", "return (q - p).clamp(min=0)")
    if buggy == correct:
        raise RuntimeError("the toy sampler no longer computes its residual as the demo expects")
    return buggy


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Demo", "GIT_AUTHOR_EMAIL": "demo@example.com"}
    env |= {"GIT_COMMITTER_NAME": "Demo", "GIT_COMMITTER_EMAIL": "demo@example.com"}
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)  # noqa: S603, S607
    return done.stdout.strip()


def make_repository(path: Path) -> list[str]:
    """A toy library (src layout) with two commits on main: correct, then buggy. Their shas, oldest first."""
    (path / "src" / "toy_lib").mkdir(parents=True)
    git(path, "init", "--quiet", "--initial-branch", "main")
    (path / "src" / "toy_lib" / "__init__.py").write_text('"""A toy speculative-decoding library."""\n')
    correct = correct_sampler()
    shas = []
    for source, message in ((correct, "Add speculative sampling"), (swapped_residual(correct), "Simplify the residual")):
        (path / "src" / "toy_lib" / "sampler.py").write_text(source)
        git(path, "add", "--all")
        git(path, "commit", "--quiet", "-m", message)
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def push_payload(repo: Path, shas: list[str]) -> dict[str, Any]:
    """GitHub's ``push`` payload creating ``main`` at the last of ``shas``, for a repository at a local path."""
    commits = []
    for sha in shas:
        message, timestamp = git(repo, "show", "--no-patch", "--format=%B%x00%cI", sha).split("\x00")
        person = {"name": "Demo", "email": "demo@example.com", "username": "demo"}
        commits.append(
            {"id": sha, "message": message.strip(), "timestamp": timestamp, "author": person, "committer": person, "distinct": True}
        )
    url = repo.as_uri()
    return {
        "ref": "refs/heads/main",
        "before": "0" * 40,
        "after": shas[-1],
        "created": True,
        "deleted": False,
        "forced": False,
        "repository": {"name": repo.name, "full_name": f"local/{repo.name}", "clone_url": url, "html_url": url, "url": url},
        "pusher": {"name": "demo", "email": "demo@example.com"},
        "commits": commits,
        "head_commit": commits[-1],
    }


def post_push(client: httpx.Client, secret: str, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }
    return client.post("/webhooks/github", content=body, headers=headers)


def register_target(client: httpx.Client, token: str, name: str, repo: Path) -> httpx.Response:
    """``POST /targets`` of the toy library at ``repo`` (every commit of ``main``)."""
    target = {"name": name, "repo_url": str(repo), "branches": ["main"], "adapter": ADAPTER, "commit_policy": "every"}
    return client.post("/targets", json=target, headers={"Authorization": f"Bearer {token}"})


def wait_for_runs(
    client: httpx.Client, token: str, name: str, count: int, timeout_s: float, *, say: Callable[[str], None]
) -> dict[int, dict[str, Any]] | None:
    """The latest run of each of the target's commits once ``count`` of them have finished (by run id, as
    ``GET /runs/{id}`` gives them), or None when ``timeout_s`` passes first. Says each change of status."""
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + timeout_s
    seen: dict[int, str] = {}
    while time.monotonic() < deadline:
        # Each commit's latest run: a failing run's confirmation rerun takes its place.
        page = client.get(f"/targets/{name}/commits", headers=headers).json()
        runs = {}
        for run_id in (c["run_id"] for c in page["commits"] if c["run_id"] is not None):
            run = client.get(f"/runs/{run_id}", headers=headers).json()
            if seen.get(run_id) != run["status"]:
                error = f" ({run['error']})" if run.get("error") else ""
                say(f"run {run_id} ({run['sha'][:12]}): {run['status']}, {len(run['cases'])} case result(s){error}")
                seen[run_id] = run["status"]
            runs[run_id] = run
        if len(runs) >= count and all(r["status"] in FINISHED for r in runs.values()):
            return runs
        time.sleep(2)
    return None


@dataclass(frozen=True)
class DemoOptions:
    url: str
    secret: str
    token: str
    name: str
    workdir: Path
    timeout_s: float


def run_demo(options: DemoOptions, say: Callable[[str], None], complain: Callable[[str], None]) -> bool:
    """The demo against the instance at ``options.url``; whether both runs ended with a verdict."""
    repo = options.workdir.resolve() / "toy-sampler"
    shas = make_repository(repo)
    say(f"created {repo} with commits {', '.join(s[:12] for s in shas)} (correct, then a swapped residual)")
    with httpx.Client(base_url=options.url, timeout=30) as client:
        created = register_target(client, options.token, options.name, repo)
        if created.status_code != 201:
            complain(f"registering the target failed: {created.status_code} {created.text}")
            return False
        say(f"registered target {options.name}")
        answer = post_push(client, options.secret, push_payload(repo, shas))
        if answer.status_code != 202:
            complain(f"the push was refused: {answer.status_code} {answer.text}")
            return False
        say(f"push accepted: {answer.json()}")
        runs = wait_for_runs(client, options.token, options.name, len(shas), options.timeout_s, say=say)
    if runs is None:
        complain(f"timed out after {options.timeout_s:g} s waiting for the runs")
        return False
    untested = {run_id: run for run_id, run in runs.items() if run["status"] in UNTESTED}
    for run_id, run in sorted(untested.items()):
        complain(f"run {run_id} ({run['sha'][:12]}) ended {run['status']}: {run.get('error') or 'no error recorded'}")
    if untested:
        complain("the runs did not test the commits (see the errors above)")
        return False
    say(f"done: see {options.url}/ui/targets/{options.name}")
    return True
