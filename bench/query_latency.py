"""Latency of the read API as history grows: p50/p95 of case history, compare and timeline.

Seeds a scratch PostgreSQL database (created, migrated with Alembic, dropped at the end) with one target,
N commits on ``main`` with one finished run each and 40 case results per run (bulk ``COPY``), then times the
endpoints in process (FastAPI's TestClient: the app, its queries and PostgreSQL, no network).

    .venv/bin/python bench/query_latency.py                 # 10,000 commits
    .venv/bin/python bench/query_latency.py --commits 10000 100000

PostgreSQL: SPECWATCH_BENCH_POSTGRES_URL (default the local server, user postgres, database test).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import secrets
import statistics
import time
from collections.abc import Callable

import psycopg
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import create_engine, make_url, text

from service.app import create_app
from service.schema import upgrade_to_head
from service.settings import Settings

ADMIN_URL = os.environ.get("SPECWATCH_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CASES = [f"direct/case_{i:02d}/V8/g{i % 4 + 1}" for i in range(40)]
REPEAT = 100


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError("the benchmark enqueues nothing")


def seed(url: str, commits: int) -> list[str]:
    """Bulk-load the history; the shas, oldest first."""
    rng = random.Random(0)
    shas = [f"{i:08x}" + secrets.token_hex(16) for i in range(commits)]
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO targets (name, repo_url, adapter, install_mode, branches, commit_policy) "
            "VALUES ('bench', 'https://github.com/o/bench', 'transformers', 'source', '[\"main\"]', 'head') RETURNING id"
        )
        (target_id,) = cur.fetchone()  # type: ignore[misc]
        with cur.copy("COPY commits (id, target_id, sha, parents, branch, branch_order, author) FROM STDIN") as copy:
            for i, sha in enumerate(shas, start=1):
                copy.write_row((i, target_id, sha, "[]", "main", i, "bench"))
        with cur.copy("COPY runs (id, commit_id, profile, status, attempt, max_attempts, purpose) FROM STDIN") as copy:
            for i in range(1, commits + 1):
                copy.write_row((i, i, "default", "failed" if i % 97 == 0 else "passed", 1, 3, "primary"))
        buffer = io.StringIO()
        for run in range(1, commits + 1):
            for case in CASES:
                fail = run % 97 == 0 and case == CASES[0]
                log_e = 12.0 if fail else rng.uniform(-3, 2)
                buffer.write(
                    f"{run}\t{case}\t{'fail' if fail else 'pass'}\t{log_e}\t{10**4.5}\t{rng.uniform(0, 0.02)}\t0\t0.03\t"
                    f"{rng.uniform(0.6, 0.8)}\t0.7\tfp{run % 3}\t{{}}\n"
                )
            if run % 2000 == 0 or run == commits:
                buffer.seek(0)
                with cur.copy(
                    "COPY case_results (run_id, case_id, verdict, log_e_value, threshold, tv_estimate, tv_low, tv_high, "
                    "acceptance_observed, acceptance_expected, fingerprint, details) FROM STDIN"
                ) as copy:
                    copy.write(buffer.getvalue())
                buffer = io.StringIO()
        for table in ("commits", "runs", "case_results"):
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
        conn.commit()
        conn.autocommit = True
        cur.execute("ANALYZE")
    return shas


def timed(call: Callable[[], int]) -> tuple[float, float]:
    samples = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        code = call()
        samples.append((time.perf_counter() - start) * 1000)
        assert code == 200, code
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * len(samples)) - 1]


def bench(commits: int) -> None:
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"specwatch_bench_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_to_head(url)
        start = time.perf_counter()
        shas = seed(url, commits)
        print(f"\n{commits:,} commits x {len(CASES)} cases: seeded in {time.perf_counter() - start:.1f} s")
        settings = Settings(env="test", database_url=url, redis_url="redis://127.0.0.1:1/0", webhook_secret=SecretStr("x"))
        rng = random.Random(1)
        with TestClient(create_app(settings, producer=NoProducer())) as client:
            client.get("/healthz")
            cases: dict[str, Callable[[], int]] = {
                "history (1 case, last 1,000 commits)": lambda: (
                    client.get(f"/targets/bench/cases/{rng.choice(CASES)}/history", params={"limit": 1000}).status_code
                ),
                "history (1 case, last 100 commits)": lambda: (
                    client.get(f"/targets/bench/cases/{rng.choice(CASES)}/history", params={"limit": 100}).status_code
                ),
                "compare (2 random commits, 40 cases)": lambda: (
                    client.get("/compare", params={"target": "bench", "a": rng.choice(shas), "b": rng.choice(shas)}).status_code
                ),
                "timeline (newest page of 50)": lambda: client.get("/targets/bench/commits", params={"limit": 50}).status_code,
                "timeline (page of 50 at a random cursor)": lambda: (
                    client.get("/targets/bench/commits", params={"limit": 50, "cursor": str(rng.randint(51, commits))}).status_code
                ),
            }
            for label, call in cases.items():
                p50, p95 = timed(call)
                print(f"  {label:45s} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, nargs="+", default=[10_000])
    args = parser.parse_args()
    for commits in args.commits:
        bench(commits)


if __name__ == "__main__":
    main()
