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
6. A llama.cpp release (SPECWATCH_COMPOSE_LLAMACPP, e.g. llama-cpp-python==0.3.36) watched as a user would: the target
   registered (its known findings seeded), the release found by the release poller on the stack's package index
   (compose/ci.yml's ``index``: the containers have no other), its run of the ``quick`` profile (the housekeeping
   worker's, which queues release runs) on worker-cpu: the source distribution downloaded and llama.cpp compiled by the
   sandbox's install step inside the container, from an empty release cache, then the suite. It must test cases
   (not all skipped), fail only where a known finding explains it, and open no alert; the build's identity (its
   seconds, CMake options, tools) is read from the worker's release volume and printed with the run's wall time.
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
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service import demo  # the demo's repository and webhook helpers (`specwatch demo`)

T = TypeVar("T")
WORKER_UID = 10001  # the images' user `specwatch`: git refuses a repository another uid owns
LONG_RUNNING = ("postgres", "redis", "api", "proxy", "worker", "worker-cpu", "beat", "slack", "index")
#: Where the worker image keeps built llama-cpp-python releases (Dockerfile: SPECWATCH_WORKER_RELEASE_CACHE_DIR).
RELEASES = "/var/lib/specwatch/releases"
LLAMACPP_REPO = "https://github.com/abetlen/llama-cpp-python"


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

        # 6. A llama.cpp release, built inside the worker's container.
        llamacpp_release(client, compose, token, env["SPECWATCH_COMPOSE_LLAMACPP"], float(env.get("SPECWATCH_COMPOSE_LLAMACPP_S", "3000")))
    return 0


def llamacpp_release(client: httpx.Client, compose: Compose, token: str, requirement: str, timeout_s: float) -> None:
    """Step 6 (module docstring): register the target, wait for the poller's run of the release, check it."""
    auth = {"Authorization": f"Bearer {token}"}
    version = requirement.split("==", 1)[1]
    target = {"name": "llamacpp", "repo_url": LLAMACPP_REPO, "branches": ["main"], "adapter": "llamacpp", "install_mode": "pip"}
    created = client.post("/targets", json={**target, "poll": "1m"}, headers=auth)
    if created.status_code != 201:
        raise CheckFailedError(f"POST /targets (llamacpp) answered {created.status_code}: {created.text}")
    findings = [f["key"] for f in client.get("/targets/llamacpp/findings", headers=auth).json()]
    step(f"target llamacpp (pip, {requirement} on the stack's index); known findings seeded: {findings}")
    started = time.monotonic()
    seen: list[str] = []

    def finished() -> dict[str, Any] | None:
        # A release is on no branch (the commits pages list a branch's): the target's queue and its last run.
        target = next(t for t in client.get("/targets", headers=auth).json() if t["name"] == "llamacpp")
        state = f"{target['queued_runs']} queued, {target['running_runs']} running"
        if not seen or seen[-1] != state:
            seen.append(state)
            step(f"llamacpp: {state} after {time.monotonic() - started:.0f} s")
        last = target["last_run"]
        if last is None:
            return None
        run: dict[str, Any] = client.get(f"/runs/{last['id']}", headers=auth).json()
        if run.get("install_failures") or run["status"] not in ("passed", "failed"):  # fail now, with why
            log = client.get(f"/runs/{run['id']}/log", headers=auth).text
            raise CheckFailedError(f"the release's run ended {run['status']} in the worker's container:\n{log[-3000:]}")
        return run

    run = wait("the llama.cpp release's run", finished, timeout_s, every_s=5)
    cases = run["cases"]
    verdicts = {c["case_id"]: c["verdict"] for c in cases}
    tested = [case for case, verdict in verdicts.items() if verdict != "skipped"]
    unexplained = [c["case_id"] for c in cases if c["verdict"] in ("fail", "error") and not c.get("finding")]
    wall = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
    summary = f"run {run['id']} of {run['sha']} ({run['profile']}): {run['status']}, {len(tested)} of {len(cases)} case(s) tested"
    if run["sha"] != f"release:{version}" or run["status"] not in ("passed", "failed") or not tested or unexplained:
        log = client.get(f"/runs/{run['id']}/log", headers=auth).text
        raise CheckFailedError(f"{summary}, failures no known finding explains: {unexplained}; {verdicts}\n{log[-3000:]}")
    if run["library_distribution"] != "llama-cpp-python" or run["library_version"] != version:
        raise CheckFailedError(f"{summary}, but it tested {run['library_distribution']} {run['library_version']}")
    step(f"{summary} in {wall:.0f} s (queued to finished: {time.monotonic() - started:.0f} s)")
    for case in cases:
        known = f" (known: {case['finding']['key']})" if case.get("finding") else ""
        step(f"  {case['case_id']}: {case['verdict']}, {case['n_trials']} trials{known}")
    alerts = client.get("/alerts", params={"target": "llamacpp"}, headers=auth).json()
    if alerts:
        raise CheckFailedError(f"a run failing only by known findings opened alerts: {[(a['kind'], a['summary']) for a in alerts]}")
    identity = f"{RELEASES}/llamacpp/{version}/python/specwatch-llamacpp-build.json"
    info = json.loads(compose.run("exec", "-T", "worker-cpu", "cat", identity).stdout)
    tools = {tool: "built" if "path" in entry else entry.get("error") for tool, entry in info["tools"].items()}
    # Ninja's log of the build (each object's start and end), kept beside the env file: where the build's time goes.
    ninja = compose.run("exec", "-T", "worker-cpu", "cat", f"{RELEASES}/llamacpp/{version}/build/.ninja_log", check=False)
    (Path(os.environ["SPECWATCH_COMPOSE_ENV_FILE"]).parent / "llamacpp-ninja.log").write_text(ninja.stdout)
    step(
        f"built in the worker's container from an empty release cache: llama.cpp {info['llama_cpp_commit']} in "
        f"{info['build_seconds']:.0f} s ({' '.join(info['cmake_options'])}); tools: {tools}; no alert opened"
    )


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CheckFailedError as failure:
        print(f"[drive] FAILED: {failure}", file=sys.stderr)
        sys.exit(1)
