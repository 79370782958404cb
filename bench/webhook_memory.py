"""Memory of the web process under unauthenticated webhook bodies (issue 14): 8 concurrent 24 MB bodies.

A fresh ``uvicorn --factory service.app:create_app`` (one process, as ``specwatch serve`` runs its web side)
on loopback and a migrated SQLite file per scenario; its resident memory (``VmRSS``) is read from /proc after
start-up and its peak (``VmHWM``) after one round of 8 concurrent requests, each a 24 MB body:

- ``unsigned``: no ``X-Hub-Signature-256`` header, ``Content-Length`` set;
- ``forged``: a well-formed but wrong signature, ``Content-Length`` set;
- ``forged-chunked``: a wrong signature and no ``Content-Length`` (chunked): the server learns the size only
  by reading.

One bounded round per scenario, nothing retried. ``--tree`` serves another checkout's code (e.g. an export
of an earlier commit) to compare before and after::

    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_memory.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_memory.py --tree /tmp/specwatch-before
    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_memory.py --limit 26214400   # today's code, the old limit
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BODY_BYTES = 24_000_000
CONCURRENT = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def migrate(tree: Path, url: str) -> None:
    code = (
        "import sys; from alembic import command; from alembic.config import Config; "
        "c = Config('alembic.ini'); c.set_main_option('sqlalchemy.url', sys.argv[1]); "
        "c.attributes['configure_logging'] = False; command.upgrade(c, 'head')"
    )
    subprocess.run([sys.executable, "-c", code, url], cwd=tree, env=_env(tree, {}), check=True, capture_output=True)


def _env(tree: Path, extra: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPECWATCH_")}
    return {**clean, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", **extra}


def _chunks(total: int) -> Iterator[bytes]:
    chunk = b" " * (1 << 20)
    sent = 0
    while sent < total:
        piece = chunk[: min(len(chunk), total - sent)]
        sent += len(piece)
        yield piece


def _post(base: str, scenario: str) -> int:
    headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": f"mem-{scenario}", "Content-Type": "application/json"}
    if scenario != "unsigned":
        headers["X-Hub-Signature-256"] = "sha256=" + "0" * 64
    content: bytes | Iterator[bytes] = _chunks(BODY_BYTES) if scenario == "forged-chunked" else b" " * BODY_BYTES
    try:
        return httpx.post(f"{base}/webhooks/github", content=content, headers=headers, timeout=120).status_code
    except httpx.HTTPError:
        return -1  # the server closed the connection (it answered before reading the body)


def run(tree: Path, scenario: str, limit: int | None) -> tuple[dict[str, int], dict[str, int], Counter[int]]:
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite:///{scratch}/specwatch.db"
        migrate(tree, url)
        port = free_port()
        settings = {"SPECWATCH_ENV": "test", "SPECWATCH_DATABASE_URL": url, "SPECWATCH_WEBHOOK_SECRET": "bench-secret"}
        if limit is not None:
            settings["SPECWATCH_WEBHOOK_MAX_BODY_BYTES"] = str(limit)
        env = _env(tree, settings)
        command = [sys.executable, "-m", "uvicorn", "--factory", "service.app:create_app", "--port", str(port), "--log-level", "warning"]
        proc = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    httpx.get(f"{base}/healthz", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            httpx.get(f"{base}/ui", timeout=10)  # templates and routes loaded before the baseline
            start = memory_kb(proc.pid)
            with ThreadPoolExecutor(CONCURRENT) as pool:
                codes = Counter(pool.map(lambda _: _post(base, scenario), range(CONCURRENT)))
            end = memory_kb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return start, end, codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose service is served (default: this one)")
    parser.add_argument("--scenario", action="append", choices=["unsigned", "forged", "forged-chunked"])
    parser.add_argument("--limit", type=int, default=None, help="SPECWATCH_WEBHOOK_MAX_BODY_BYTES (default: the tree's default)")
    args = parser.parse_args()
    limit = "its default" if args.limit is None else f"{args.limit} bytes"
    print(f"tree {args.tree}, limit {limit}: {CONCURRENT} concurrent bodies of {BODY_BYTES / 1e6:.0f} MB, one round per scenario")
    print(f"{'scenario':<16} {'RSS start MB':>12} {'peak RSS MB':>12} {'RSS end MB':>11}  answers")
    for scenario in args.scenario or ["unsigned", "forged", "forged-chunked"]:
        start, end, codes = run(args.tree.resolve(), scenario, args.limit)
        answers = ", ".join(f"{code}x{count}" for code, count in sorted(codes.items()))
        print(f"{scenario:<16} {start['VmRSS'] / 1024:>12.0f} {end['VmHWM'] / 1024:>12.0f} {end['VmRSS'] / 1024:>11.0f}  {answers}")


if __name__ == "__main__":
    main()
