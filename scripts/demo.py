# A script that talks to its user and runs git (pyproject gives scripts/ no per-file ignores yet):
# ruff: noqa: T201, S603, S607
"""A newcomer's demo: a run going through a RUNNING specwatch end to end.

It creates a local git repository of a toy speculative-sampling library (a correct sampler, then a commit
with the classic swapped-residual bug), registers it as a target (``POST /targets``, a write token), posts a
correctly signed GitHub ``push`` webhook for the commits, and polls ``GET /runs/{id}`` until the runs finish.
It exits 0 when both runs finished with a verdict (the correct commit passed, the buggy one failed), 1 when
any ended without one (``error``, ``uninstallable``, ``cancelled``: see the run's error) or the wait timed out.

    specwatch serve &                                   # SPECWATCH_WEBHOOK_SECRET and _API_TOKEN_HASHES set
    python scripts/demo.py --url http://127.0.0.1:8000 --secret "$SECRET" --token "$TOKEN"

The repository is local, so the instance must run on this machine (its worker clones the path).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ADAPTER = "toy_lib.sampler:speculative_sample"
FINISHED = {"passed", "failed", "error", "uninstallable", "cancelled"}
# Finished without a verdict: the demo did not show what it is for.
UNTESTED = {"error", "uninstallable", "cancelled"}

# The toy library's correct sampler (the tests' toy target commits the same file).
CORRECT = (Path(__file__).resolve().parent / "toy_sampler.py").read_text()
# The classic bug: the residual (p - q)+ written as (q - p)+.
SWAPPED_RESIDUAL = CORRECT.replace("return (p - q).clamp(min=0)", "return (q - p).clamp(min=0)")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Demo", "GIT_AUTHOR_EMAIL": "demo@example.com"}
    env |= {"GIT_COMMITTER_NAME": "Demo", "GIT_COMMITTER_EMAIL": "demo@example.com"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()


def make_repository(path: Path) -> list[str]:
    """A toy library (src layout) with two commits on main: correct, then buggy. Their shas, oldest first."""
    (path / "src" / "toy_lib").mkdir(parents=True)
    git(path, "init", "--quiet", "--initial-branch", "main")
    (path / "src" / "toy_lib" / "__init__.py").write_text('"""A toy speculative-decoding library."""\n')
    shas = []
    for source, message in ((CORRECT, "Add speculative sampling"), (SWAPPED_RESIDUAL, "Simplify the residual")):
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


def wait_for_runs(client: httpx.Client, token: str, name: str, count: int, timeout_s: float) -> dict[int, dict[str, Any]] | None:
    """The latest run of each of the target's commits once ``count`` of them have finished (by run id, as
    ``GET /runs/{id}`` gives them), or None when ``timeout_s`` passes first. Prints each change of status."""
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
                print(f"run {run_id} ({run['sha'][:12]}): {run['status']}, {len(run['cases'])} case result(s){error}")
                seen[run_id] = run["status"]
            runs[run_id] = run
        if len(runs) >= count and all(r["status"] in FINISHED for r in runs.values()):
            return runs
        time.sleep(2)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SPECWATCH_DEMO_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--secret", default=os.environ.get("SPECWATCH_WEBHOOK_SECRET", ""), help="the instance's webhook secret")
    parser.add_argument("--token", default=os.environ.get("SPECWATCH_API_TOKEN", ""), help="an API write token (registers the target)")
    parser.add_argument("--name", default="toy-demo", help="the demo target's name")
    parser.add_argument("--workdir", type=Path, default=None, help="where to create the repository (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the runs")
    args = parser.parse_args()

    repo = (args.workdir or Path(tempfile.mkdtemp(prefix="specwatch-demo-"))).resolve() / "toy-sampler"
    shas = make_repository(repo)
    print(f"created {repo} with commits {', '.join(s[:12] for s in shas)} (correct, then a swapped residual)")
    with httpx.Client(base_url=args.url, timeout=30) as client:
        created = register_target(client, args.token, args.name, repo)
        if created.status_code != 201:
            print(f"registering the target failed: {created.status_code} {created.text}", file=sys.stderr)
            return 1
        print(f"registered target {args.name}")
        answer = post_push(client, args.secret, push_payload(repo, shas))
        if answer.status_code != 202:
            print(f"the push was refused: {answer.status_code} {answer.text}", file=sys.stderr)
            return 1
        print(f"push accepted: {answer.json()}")
        runs = wait_for_runs(client, args.token, args.name, len(shas), args.timeout)
    if runs is None:
        print("timed out waiting for the runs", file=sys.stderr)
        return 1
    untested = {run_id: run for run_id, run in runs.items() if run["status"] in UNTESTED}
    if untested:
        for run_id, run in sorted(untested.items()):
            print(f"run {run_id} ({run['sha'][:12]}) ended {run['status']}: {run.get('error') or 'no error recorded'}", file=sys.stderr)
        print("the runs did not test the commits (see the errors above)", file=sys.stderr)
        return 1
    print(f"done: see {args.url}/ui/targets/{args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
