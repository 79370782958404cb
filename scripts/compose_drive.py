# A script that talks to its user and runs the compose CLI (pyproject gives scripts/ no per-file ignores yet):
# ruff: noqa: T201, S603, S607
"""Drives a compose deployment brought up by scripts/compose-test.sh as a user would, and checks each step.

    python scripts/compose_drive.py -f docker-compose.yml -f ...    # the compose files of the running stack

Environment: SPECWATCH_COMPOSE_ENV_FILE (the deployment's .env: secrets, ports, SPECWATCH_COMPOSE_REPOS),
SPECWATCH_COMPOSE_PROJECT (the compose project name), SPECWATCH_API_TOKEN (a write token of the deployment).

1. The API answers /healthz through the nginx proxy (the published port); every long-running service is up,
   migrate exited 0.
2. A suite worker refuses to start, with one line, where it cannot isolate the suite (the worker image run
   without the compose file's security options).
3. A local repository of a toy library (`specwatch demo`'s, service/demo: a correct commit, then the swapped-residual bug),
   owned by the workers' uid, registered as a target; a signed push of both commits.
4. Both runs executed by worker-cpu inside its bubblewrap sandbox: the correct commit passes, the buggy one
   fails; a confirmed violation alert on the buggy commit; its message at the local Slack endpoint.
5. The history through the API and through the CLI inside the api container.
Every wait has a timeout; the first failed check exits 1 with what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service import demo  # the demo's repository and webhook helpers (`specwatch demo`)

T = TypeVar("T")
WORKER_UID = 10001  # the images' user `specwatch`: git refuses a repository another uid owns
LONG_RUNNING = ("postgres", "redis", "api", "proxy", "worker", "worker-cpu", "beat", "slack")


class CheckFailedError(Exception):
    pass


def step(message: str) -> None:
    print(f"[drive] {message}", flush=True)


def wait(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 2.0) -> T:
    """``probe()``'s first answer that is not None, polled until ``timeout_s``; else CheckFailedError."""
    deadline = time.monotonic() + timeout_s
    while True:
        last: Exception | None = None
        try:
            answer = probe()
        except (httpx.HTTPError, subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
            answer, last = None, exc
        if answer is not None:
            return answer
        if time.monotonic() > deadline:
            raise CheckFailedError(f"timed out after {timeout_s:g} s waiting for {what}" + (f" (last error: {last})" if last else ""))
        time.sleep(every_s)


def podman_inspect(container: str) -> dict[str, Any]:
    done = subprocess.run(["podman", "inspect", container], capture_output=True, text=True, timeout=60, check=True)
    return dict(json.loads(done.stdout)[0])


def read_env(path: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


class Compose:
    def __init__(self, files: list[str], project: str, env_file: str) -> None:
        self.base = ["docker-compose", "--project-name", project, "--env-file", env_file, *files]

    def run(self, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and done.returncode != 0:
            raise CheckFailedError(f"`docker-compose {' '.join(args)}` exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        return done

    def states(self) -> dict[str, str]:
        """Each service's container state (`podman inspect`: running, exited (0), healthy...)."""
        states = {}
        for service in self.run("ps", "--services", "--all").stdout.split():
            ids = self.run("ps", "--all", "-q", service).stdout.split()
            if not ids:
                continue
            state = podman_inspect(ids[0])["State"]
            health = (state.get("Health") or state.get("Healthcheck") or {}).get("Status")
            exit_code = f" ({state['ExitCode']})" if state["Status"] == "exited" else ""
            states[service] = state["Status"] + exit_code + (f", {health}" if health else "")
        return states


def all_up(states: dict[str, str]) -> dict[str, str] | None:
    """``states`` when migrate exited 0 and every long-running service runs, else None."""
    up = all(states.get(name, "").startswith("running") for name in LONG_RUNNING)
    return states if up and states.get("migrate", "").startswith("exited (0)") else None


def main(files: list[str]) -> int:
    env = read_env(os.environ["SPECWATCH_COMPOSE_ENV_FILE"])
    compose = Compose(files, os.environ["SPECWATCH_COMPOSE_PROJECT"], os.environ["SPECWATCH_COMPOSE_ENV_FILE"])
    token, secret = os.environ["SPECWATCH_API_TOKEN"], env["SPECWATCH_WEBHOOK_SECRET"]
    api_url, slack_url = f"http://127.0.0.1:{env['API_PORT']}", f"http://127.0.0.1:{env['SLACK_PORT']}"
    auth = {"Authorization": f"Bearer {token}"}

    with httpx.Client(base_url=api_url, timeout=30) as client:
        # 1. The stack.
        wait("/healthz", lambda: True if client.get("/healthz").status_code == 200 else None, 300)
        states = wait("every service up and migrate exited 0", lambda: all_up(compose.states()), 300, every_s=5)
        step("services: " + "; ".join(f"{name} {state}" for name, state in sorted(states.items())))

        # 2. No isolation, no worker.
        image = podman_inspect(compose.run("ps", "-q", "worker-cpu").stdout.split()[0])["ImageName"]
        settings = ["-e", "SPECWATCH_ENV=test", "-e", "SPECWATCH_WORKER_SANDBOX=bwrap"]
        worker = ["celery", "-A", "workers.celery_app", "worker", "-Q", "gpu"]
        refused = subprocess.run(
            ["podman", "run", "--rm", *settings, image, *worker], capture_output=True, text=True, timeout=180, check=False
        )
        line = (refused.stderr.strip().splitlines() or ["(nothing)"])[-1]
        if refused.returncode == 0 or "cannot isolate the suite" not in line:
            raise CheckFailedError(
                f"a worker without the sandbox's security options did not refuse to start: exit {refused.returncode}, {line}"
            )
        step(f"without seccomp/unmask options the suite worker refuses to start (exit {refused.returncode}): {line}")

        # 3. A repository, a target, a signed push.
        repos = Path(env["SPECWATCH_COMPOSE_REPOS"])
        workdir = repos / uuid.uuid4().hex[:12]
        repo = workdir / "toy-sampler"
        shas = demo.make_repository(repo)
        payload = demo.push_payload(repo, shas)  # (before the chown: then git refuses this user the repository)
        subprocess.run(["chown", "-R", f"{WORKER_UID}:{WORKER_UID}", str(workdir)], check=True, timeout=60)
        name = f"toy-{workdir.name}"
        created = demo.register_target(client, token, name, repo)
        if created.status_code != 201:
            raise CheckFailedError(f"POST /targets answered {created.status_code}: {created.text}")
        pushed = demo.post_push(client, secret, payload)
        if pushed.status_code != 202:
            raise CheckFailedError(f"the signed push was answered {pushed.status_code}: {pushed.text}")
        step(f"target {name} ({repo}); push of {shas[0][:12]} (correct) and {shas[1][:12]} (swapped residual) accepted: {pushed.json()}")

        # 4. The runs, the alert, Slack.
        runs = demo.wait_for_runs(client, token, name, len(shas), 900, say=step)
        if runs is None:
            raise CheckFailedError("the runs did not finish within 900 s")
        by_sha = {run["sha"]: run for run in runs.values()}
        verdicts = {sha[:12]: by_sha[sha]["status"] for sha in shas}
        if [by_sha[sha]["status"] for sha in shas] != ["passed", "failed"]:
            errors = {run["sha"][:12]: run.get("error") for run in runs.values()}
            raise CheckFailedError(f"expected the correct commit to pass and the buggy one to fail, got {verdicts} (errors: {errors})")
        step(f"runs: {verdicts}")
        logs = compose.run("logs", "--no-color", "worker-cpu").stdout
        if "suite_started" not in logs or "SUITE NOT ISOLATED" in logs:
            raise CheckFailedError("worker-cpu's log does not show the suite started in its sandbox")

        def confirmed_violation() -> dict[str, Any] | None:
            alerts = client.get("/alerts", params={"target": name}, headers=auth).json()
            return next((a for a in alerts if a["kind"] == "violation" and a["confirmed"]), None)

        alert = wait("a confirmed violation alert", confirmed_violation, 300)
        if alert["first_bad_sha"] != shas[1]:
            raise CheckFailedError(f"the alert names {alert['first_bad_sha'][:12]} as the first bad commit, not {shas[1][:12]}")
        step(f"alert {alert['id']}: {alert['kind']}, {alert['state']}, confirmed, first bad {shas[1][:12]}: {alert['summary']}")
        slack = wait(
            "the alert's Slack message",
            lambda: next((m for m in httpx.get(f"{slack_url}/messages", timeout=10).json() if name in json.dumps(m)), None),
            300,
        )
        text = slack["message"].get("text") or json.dumps(slack["message"])[:400]
        step(f"Slack message ({slack['path']}): {text}")

        # 5. The history, through the API and the CLI.
        page = client.get(f"/targets/{name}/commits", headers=auth).json()
        step("history (API): " + ", ".join(f"{c['sha'][:12]} {c['status']}" for c in page["commits"]))
        cli = compose.run("exec", "-T", "api", "specwatch", "history", name, timeout_s=180)
        if shas[1][:12] not in cli.stdout:
            raise CheckFailedError(f"`specwatch history {name}` in the api container does not show {shas[1][:12]}: {cli.stdout}")
        step("history (CLI in the api container):\n" + cli.stdout.rstrip())
        cli_alerts = compose.run("exec", "-T", "api", "specwatch", "alerts", "--target", name, timeout_s=180)
        step("alerts (CLI in the api container):\n" + cli_alerts.stdout.rstrip())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CheckFailedError as failure:
        print(f"[drive] FAILED: {failure}", file=sys.stderr)
        sys.exit(1)
