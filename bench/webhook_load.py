"""Webhook load on loopback against the production shape: how many signed pushes per second the service holds.

uvicorn serves ``service.app:create_app`` on 127.0.0.1 (one process, as ``specwatch serve`` runs it), on a
scratch PostgreSQL database (created, migrated with Alembic, dropped at the end) and the real Redis on a
database number no test uses (9, flushed before and after). The load generator (asyncio + httpx, a bounded
connection pool) sends signed push deliveries, one new commit each, at rising rates; each step is bounded in
count and in time, so the run stops by itself. It prints, per step, the offered rate, the achieved throughput,
the p50/p99 latency of the answers and the machine's load average, then the saturation rate (the highest
achieved throughput of any step), and verifies that every accepted delivery is stored exactly once and every
run enqueued exactly once (rows in PostgreSQL, messages in Redis).

With ``--targets N`` the deliveries are spread round-robin over N registered targets (one repository each),
so consecutive pushes rarely wait for the same target's row lock; with one target (the default) every push
serialises on it.

Run::

    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_load.py --quick     # 2,000 deliveries
    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_load.py             # 20,000 deliveries
    # p50/p99 at 50/s spread over 20 targets, and the single-target saturation rate:
    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_load.py --targets 20 --rates 50 --deliveries 1500
    OMP_NUM_THREADS=1 .venv/bin/python bench/webhook_load.py --rates 50,100,200 --deliveries 3000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, func, make_url, select, text
from sqlalchemy.orm import sessionmaker

from service.db import make_engine, session_scope
from service.models import Commit, CommitPolicy, Delivery, DeliveryStatus, Run
from service.targets import add_target, make_spec

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-webhook-secret"
REPO_URL = "https://github.com/octo-org/loaded-sampler"
QUEUE = "gpu"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def repo_url(target: int) -> str:
    """The repository of target number ``target`` (one repository per target)."""
    return f"{REPO_URL}-{target}"


def push_body(delivery: int, targets: int = 1) -> bytes:
    """A push of one new commit, to the repository of target ``delivery % targets``."""
    url = repo_url(delivery % targets)
    commit_sha = hashlib.sha1(f"bench-{delivery}-{secrets.token_hex(4)}".encode()).hexdigest()
    commit = {
        "id": commit_sha,
        "message": f"change {delivery}",
        "timestamp": "2026-03-01T12:00:00+00:00",
        "author": {"name": "Ada", "email": "ada@example.org"},
    }
    payload = {
        "ref": "refs/heads/main",
        "before": secrets.token_hex(20),
        "after": commit_sha,
        "commits": [commit],
        "head_commit": commit,
        "repository": {"full_name": url.removeprefix("https://github.com/"), "html_url": url, "clone_url": f"{url}.git"},
    }
    return json.dumps(payload).encode()


def headers_for(body: bytes, delivery: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest(),
    }


@dataclass
class Step:
    rate: float
    count: int
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0
    unsent: int = 0
    accepted: list[str] = field(default_factory=list)
    load: float = 0.0


async def run_step(client: httpx.AsyncClient, step: Step, first: int, concurrency: int, max_seconds: float, targets: int) -> None:
    """Offer ``step.count`` deliveries at ``step.rate``/s (open loop, at most ``concurrency`` in flight), for at
    most ``max_seconds``: deliveries not sent by then are counted as unsent."""
    bodies = [(f"bench-{first + i}", push_body(first + i, targets)) for i in range(step.count)]
    gate = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    deadline = start + max_seconds

    async def one(delivery: str, body: bytes) -> None:
        async with gate:
            if time.perf_counter() > deadline:
                step.unsent += 1
                return
            sent = time.perf_counter()
            try:
                answer = await client.post("/webhooks/github", content=body, headers=headers_for(body, delivery))
            except httpx.HTTPError as exc:
                step.statuses[type(exc).__name__] += 1
                return
            step.latencies.append(time.perf_counter() - sent)
            step.statuses[str(answer.status_code)] += 1
            if answer.status_code == 202:
                step.accepted.append(delivery)

    tasks = []
    for i, (delivery, body) in enumerate(bodies):
        due = start + i / step.rate
        if due > deadline:
            step.unsent += len(bodies) - i
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(delivery, body)))
    await asyncio.gather(*tasks)
    step.elapsed = time.perf_counter() - start
    step.load = os.getloadavg()[0]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def migrate(url: str) -> None:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    command.upgrade(config, "head")


def wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"uvicorn exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("uvicorn did not become healthy")


def queued_run_ids(client: redis.Redis) -> list[int]:
    ids = []
    for raw in client.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        ids.append(int(message["headers"]["argsrepr"].strip("[]()").split(",")[0]))
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2,000 deliveries instead of 20,000")
    parser.add_argument("--deliveries", type=int, default=None)
    parser.add_argument("--rates", default="100,200,400,800,1600", help="offered rates per second, one step each")
    parser.add_argument("--concurrency", type=int, default=16, help="connections and requests in flight at most")
    parser.add_argument("--targets", type=int, default=1, help="spread the deliveries round-robin over this many targets")
    parser.add_argument("--step-seconds", type=float, default=60.0, help="each step stops after this long")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("SPECWATCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9", help="a Redis database of its own (flushed)")
    args = parser.parse_args(argv)
    total = args.deliveries or (2_000 if args.quick else 20_000)
    rates = [float(r) for r in args.rates.split(",")]
    per_step = [total // len(rates) + (1 if i < total % len(rates) else 0) for i in range(len(rates))]

    admin = create_engine(args.postgres_url, isolation_level="AUTOCOMMIT")
    name = f"specwatch_bench_{secrets.token_hex(4)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))  # a generated identifier, not input
    database_url = make_url(args.postgres_url).set(database=name).render_as_string(hide_password=False)
    broker = redis.Redis.from_url(args.redis_url)
    broker.flushdb()
    proc: subprocess.Popen[bytes] | None = None
    log_file = tempfile.NamedTemporaryFile(prefix="webhook-load-", suffix=".log", delete=False)  # noqa: SIM115
    try:
        migrate(database_url)
        engine = make_engine(database_url)
        factory = sessionmaker(bind=engine, expire_on_commit=False)
        with session_scope(factory) as session:
            for target in range(args.targets):
                url = repo_url(target)
                add_target(
                    session,
                    make_spec(name=f"loaded-{target}", repo_url=url, branches=["main"], adapter="toy:f", commit_policy=CommitPolicy.head),
                )
        port = free_port()
        env = {n: v for n, v in os.environ.items() if not n.startswith("SPECWATCH_")} | {
            "SPECWATCH_ENV": "test",
            "SPECWATCH_DATABASE_URL": database_url,
            "SPECWATCH_REDIS_URL": args.redis_url,
            "SPECWATCH_WEBHOOK_SECRET": SECRET,
        }
        command_line = [sys.executable, "-m", "uvicorn", "--factory", "service.app:create_app", "--host", "127.0.0.1", "--port", str(port)]
        proc = subprocess.Popen(
            [*command_line, "--log-level", "warning", "--no-access-log"], cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, proc)
        print(
            f"uvicorn (1 process) on {base}; PostgreSQL {name}; Redis {args.redis_url}; {total} deliveries over {args.targets} "
            f"target(s); concurrency {args.concurrency}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before"
        )
        print(
            f"{'offered/s':>10} {'sent':>6} {'unsent':>6} {'achieved/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'load':>5}  answers"
        )

        async def drive() -> list[Step]:
            limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
            steps = []
            async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
                first = 0
                for rate, count in zip(rates, per_step, strict=True):
                    step = Step(rate, count)
                    await run_step(client, step, first, args.concurrency, args.step_seconds, args.targets)
                    first += count
                    steps.append(step)
                    done = len(step.latencies)
                    p50, p99 = (1e3 * percentile(step.latencies, q) for q in (0.5, 0.99))
                    worst = 1e3 * max(step.latencies, default=float("nan"))
                    achieved = done / step.elapsed
                    figures = f"{achieved:>10.1f} {p50:>8.1f} {p99:>8.1f} {worst:>8.1f} {step.load:>5.2f}"
                    print(f"{rate:>10.0f} {done:>6} {step.unsent:>6} {figures} ", dict(step.statuses), flush=True)
            return steps

        steps = asyncio.run(drive())
        best = max(steps, key=lambda s: len(s.latencies) / s.elapsed)
        print(
            f"saturation: {len(best.latencies) / best.elapsed:.1f}/s achieved at most (offered {best.rate:.0f}/s, "
            f"p50 {1e3 * percentile(best.latencies, 0.5):.1f} ms) over {args.targets} target(s)"
        )
        accepted = [d for s in steps for d in s.accepted]
        time.sleep(2)  # the last background enqueues
        with session_scope(factory) as session:
            deliveries = Counter(session.scalars(select(Delivery.github_delivery_id)))
            statuses = Counter(session.scalars(select(Delivery.status)))
            commits = session.scalar(select(func.count()).select_from(Commit)) or 0
            run_ids = list(session.scalars(select(Run.id)))
        queued = Counter(queued_run_ids(broker))
        engine.dispose()
        checks = {
            "every accepted delivery stored once": sorted(deliveries) == sorted(accepted) and set(deliveries.values()) <= {1},
            "deliveries accepted": statuses == Counter({DeliveryStatus.accepted: len(accepted)}),
            "one commit and one run per delivery": commits == len(accepted) == len(run_ids),
            "every run enqueued exactly once": sorted(queued) == sorted(run_ids) and set(queued.values()) <= {1},
        }
        print(f"stored: {len(deliveries)} deliveries, {commits} commits, {len(run_ids)} runs; Redis: {sum(queued.values())} messages")
        for check, ok in checks.items():
            print(f"  {'OK  ' if ok else 'FAIL'} {check}")
        return 0 if all(checks.values()) else 1
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        broker.flushdb()
        broker.close()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        log_file.close()
        print(f"uvicorn log: {log_file.name}")


if __name__ == "__main__":
    raise SystemExit(main())
