"""Hostile webhook probes of issue 28 against a served web process: slow bodies, and large signed fields.

A fresh ``uvicorn --factory service.app:create_app`` (one process) on loopback and a migrated SQLite file per
probe, with the tree's default settings but the secret:

- ``slow`` (item 1; issue 42 with ``--drippers 16 --drip 4``): ``--drippers`` connections (8) each declare a
  100 KB body under a well-formed but false
  ``X-Hub-Signature-256`` and send one byte every ``--drip`` seconds (0.5 s by default) for ``--hold``
  seconds (40 s); meanwhile one signed push per second. Printed: the answers to the signed pushes, how long
  they were refused, and what the slow clients got. With ``--proxy`` the clients and pushes go to nginx with the
  compose stack's configuration (compose/nginx/specwatch.conf, tests/support/reverse_proxy.py) in front of it.
- ``large`` (item 6): a target watching the pushes' repository is registered, then 8 concurrent signed pings
  with a 9 MB ``zen`` and 8 concurrent signed pushes each of one commit with a 5 MB message (``--repeat``
  rounds of them). Printed: resident
  memory (``VmRSS``) after start-up and warm-up, its peak (``VmHWM``) and after the deliveries (and 5 s later),
  the largest answer, what the database holds (longest stored message, author, delivery reason) and the size of
  the branch's timeline page.

``--tree`` serves another checkout's code (e.g. ``git worktree add /tmp/before main``) to compare::

    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_hostile.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_hostile.py --tree /tmp/before --probe large
    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_hostile.py --probe slow --drippers 16 --drip 4 --proxy
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import secrets
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from webhook_memory import _env, free_port, memory_kb, migrate  # the sibling bench's helpers

from tests.support.reverse_proxy import nginx_in_front  # nginx with the compose stack's configuration

ROOT = Path(__file__).resolve().parents[1]

SECRET = "bench-secret"
TOKEN = "bench-write-token"
REPO = "octo-org/hostile-sampler"


def _signed(payload: dict[str, object], event: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": event, "X-GitHub-Delivery": secrets.token_hex(16)}
    return body, {**headers, "X-Hub-Signature-256": signature}


def _push(message: str = "change") -> tuple[bytes, dict[str, str]]:
    sha = secrets.token_hex(20)
    author = {"name": "Ada", "email": "ada@example.org", "username": "ada"}
    commit = {"id": sha, "message": message, "timestamp": "2026-03-01T12:00:00+00:00", "author": author, "distinct": True}
    url = f"https://github.com/{REPO}"
    repository = {"full_name": REPO, "html_url": url, "clone_url": url + ".git"}
    payload = {"ref": "refs/heads/main", "before": secrets.token_hex(20), "after": sha, "commits": [commit], "head_commit": commit}
    return _signed({**payload, "repository": repository}, "push")


class Served:
    def __init__(self, tree: Path, scratch: str) -> None:
        import subprocess

        self.url = f"sqlite:///{scratch}/specwatch.db"
        self.database = f"{scratch}/specwatch.db"
        migrate(tree, self.url)
        self.port = free_port()
        settings = {
            "SPECWATCH_ENV": "test",
            "SPECWATCH_DATABASE_URL": self.url,
            "SPECWATCH_WEBHOOK_SECRET": SECRET,
            "SPECWATCH_REDIS_URL": "redis://127.0.0.1:1/0",
            "SPECWATCH_API_TOKEN_HASHES": hashlib.sha256(TOKEN.encode()).hexdigest(),
        }
        command = [sys.executable, "-m", "uvicorn", "--factory", "service.app:create_app", "--port", str(self.port)]
        command += ["--log-level", "critical"]
        self.proc = subprocess.Popen(command, cwd=tree, env=_env(tree, settings), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(300):
            try:
                httpx.get(f"{self.base}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _dripper(port: int, drip_s: float, stop: threading.Event, answers: list[str]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        head = (
            "POST /webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n"
            f"X-GitHub-Event: push\r\nX-GitHub-Delivery: slow\r\nX-Hub-Signature-256: sha256={'0' * 64}\r\n\r\n"
        )
        sock.sendall(head.encode())
        started = time.monotonic()
        while not stop.wait(drip_s):
            sock.settimeout(0.001)
            try:
                data = sock.recv(4096)
            except TimeoutError:
                sock.sendall(b" ")
                continue
            answers.append(f"{data.split(b' ')[1].decode() if data else 'closed'} after {time.monotonic() - started:.1f} s")
            return
        answers.append("still held at the end")


def slow(tree: Path, drip_s: float, hold_s: float, drippers: int, proxy: bool) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        served = Served(tree, scratch)
        try:
            with nginx_in_front(served.port) if proxy else nullcontext(served.port) as port:
                base = f"http://127.0.0.1:{port}"
                stop, answers = threading.Event(), []
                threads = [threading.Thread(target=_dripper, args=(port, drip_s, stop, answers)) for _ in range(drippers)]
                for thread in threads:
                    thread.start()
                time.sleep(1)
                pushes: list[tuple[float, int]] = []
                start = time.monotonic()
                while time.monotonic() - start < hold_s:
                    content, headers = _push()
                    code = httpx.post(f"{base}/webhooks/github", content=content, headers=headers, timeout=30).status_code
                    pushes.append((time.monotonic() - start, code))
                    time.sleep(1)
                stop.set()
                for thread in threads:
                    thread.join()
        finally:
            served.close()
    refused = [t for t, code in pushes if code != 202]
    front = "nginx (compose/nginx/specwatch.conf) in front of the app" if proxy else "the app alone"
    print(f"slow: tree {tree}, {front}, {drippers} drippers (a byte every {drip_s} s) for {hold_s:.0f} s, a signed push per second")
    answered, last = dict(Counter(code for _, code in pushes)), max(refused, default=0)
    print(f"  signed pushes: {answered}; refused {len(refused)} of {len(pushes)}, for {last:.1f} s")
    print(f"  slow clients: {dict(Counter(a.split(' after ')[0] for a in answers))}; {sorted(answers)[:1]}")


def _rss_mb(pid: int) -> tuple[float, float]:
    fields = memory_kb(pid)
    return fields["VmRSS"] / 1024, fields["VmHWM"] / 1024


def large(tree: Path, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        served = Served(tree, scratch)
        try:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            target = {"name": "hostile", "repo_url": f"https://github.com/{REPO}", "branches": ["main"], "adapter": "transformers"}
            assert httpx.post(f"{served.base}/targets", json=target, headers=auth, timeout=30).status_code == 201
            for _ in range(3):  # warm-up: a push, a ping and the pages
                content, headers = _push()
                httpx.post(f"{served.base}/webhooks/github", content=content, headers=headers, timeout=30)
                content, headers = _signed({"zen": "Keep it logically awesome.", "hook_id": 1}, "ping")
                httpx.post(f"{served.base}/webhooks/github", content=content, headers=headers, timeout=30)
                httpx.get(f"{served.base}/ui/targets/hostile", timeout=30)
            baseline, _ = _rss_mb(served.proc.pid)

            def deliver(kind: str) -> tuple[int, int]:
                if kind == "ping":
                    content, headers = _signed({"zen": "z" * 9_000_000, "hook_id": 1}, "ping")
                else:
                    content, headers = _push("m" * 5_000_000)
                answer = httpx.post(f"{served.base}/webhooks/github", content=content, headers=headers, timeout=120)
                return answer.status_code, len(answer.content)

            rounds: list[float] = []
            for _ in range(repeat):
                with ThreadPoolExecutor(8) as pool:
                    pings = list(pool.map(deliver, ["ping"] * 8))
                    pushes = list(pool.map(deliver, ["push"] * 8))
                rounds.append(_rss_mb(served.proc.pid)[0])
            peak = _rss_mb(served.proc.pid)[1]
            page = httpx.get(f"{served.base}/ui/targets/hostile", timeout=60)
            time.sleep(5)
            later, _ = _rss_mb(served.proc.pid)
            with sqlite3.connect(served.database) as db:
                message, author = db.execute("select max(length(message)), max(length(author)) from commits").fetchone()
                (reason,) = db.execute("select max(length(reason)) from deliveries").fetchone()
        finally:
            served.close()
    print(f"large: tree {tree}, 8 pings with a 9 MB zen, then 8 pushes of a 5 MB commit message")
    print(f"  answers: pings {dict(Counter(c for c, _ in pings))}, pushes {dict(Counter(c for c, _ in pushes))}")
    largest = max(n for _, n in pings + pushes) / 1e6
    print(f"  largest answer {largest:.3f} MB; timeline page {page.status_code}, {len(page.content) / 1e6:.3f} MB")
    print(f"  stored: longest message {message} chars, author {author}, delivery reason {reason}")
    print(f"  RSS MB: start {baseline:.0f}, peak {peak:.0f}, after each round {[round(r) for r in rounds]}, 5 s later {later:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose service is served (default: this one)")
    parser.add_argument("--probe", action="append", choices=["slow", "large"])
    parser.add_argument("--drip", type=float, default=0.5, help="seconds between a slow client's bytes")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the large deliveries")
    parser.add_argument("--drippers", type=int, default=8, help="slow connections")
    parser.add_argument("--hold", type=float, default=40, help="seconds the slow clients drip")
    parser.add_argument("--proxy", action="store_true", help="slow: through nginx with the compose stack's configuration")
    args = parser.parse_args()
    for probe in args.probe or ["slow", "large"]:
        if probe == "slow":
            slow(args.tree.resolve(), args.drip, args.hold, args.drippers, args.proxy)
        else:
            large(args.tree.resolve(), args.repeat)


if __name__ == "__main__":
    main()
