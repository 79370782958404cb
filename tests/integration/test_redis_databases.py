"""Each test process claims Redis databases of its own (tests/support/redis_databases.py), so two checkouts can test
at once on one Redis server (issue 42, item 9): before, every checkout's first test process used database 12."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from tests.support.redis_databases import PURPOSES, SERVER, redis_url

ROOT = Path(__file__).resolve().parents[2]
# A test process of another checkout: claims its databases, says which, holds them until its stdin closes.
HOLDER = """
import json, sys
from tests.support.redis_databases import PURPOSES, redis_url
print(json.dumps([redis_url(p) for p in PURPOSES]), flush=True)
sys.stdin.read()
"""


def claims() -> set[str]:
    client = redis.Redis.from_url(f"{SERVER}/0")
    try:
        return {key.decode() for key in client.scan_iter("specwatch-test:claim:*")}
    finally:
        client.close()


def test_processes_testing_at_once_get_disjoint_databases_released_when_they_end() -> None:
    ours = {redis_url(purpose) for purpose in PURPOSES}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holders = [
        subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        theirs = [set(json.loads(holder.stdout.readline())) for holder in holders if holder.stdout is not None]
        assert len(theirs) == 2
        assert all(len(urls) == len(PURPOSES) for urls in [ours, *theirs])
        assert len(ours | theirs[0] | theirs[1]) == 3 * len(PURPOSES)  # disjoint
        held = claims()
    finally:
        for holder in holders:
            holder.communicate("")
    assert [holder.returncode for holder in holders] == [0, 0]
    released = {f"specwatch-test:claim:{url.rsplit('/', 1)[1]}" for urls in theirs for url in urls}
    assert released <= held
    assert not (released & claims())  # each holder released its own at exit
    assert {f"specwatch-test:claim:{url.rsplit('/', 1)[1]}" for url in ours} <= claims()  # ours are still ours
