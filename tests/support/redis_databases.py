"""Redis databases of this test process's own, claimed on the server, so two checkouts can test at once on one Redis.

The server is ``SPECWATCH_TEST_REDIS_URL`` (default: the local one). A test process claims a database for each
purpose of :data:`PURPOSES` when it first needs one: database ``n`` is its while the key ``specwatch-test:claim:<n>``
in database 0 holds its token, set with ``SET NX`` (atomic: two processes never claim one database) and an expiry
that a background thread renews every third of it; the keys are deleted when the process exits. A run killed outright
leaves its claims only until they expire (:data:`CLAIM_TTL_S`). Database 0 is never claimed (it holds the claims,
and is a developer's own default); the claim of a database is checked again before each renewal (only the holder
renews or releases it).
"""

from __future__ import annotations

import atexit
import os
import secrets
import socket
import threading
import time

import redis

SERVER = os.environ.get("SPECWATCH_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
#: What a test process uses a database for: worker tests, webhook tests, the control plane's route tests, and a
#: second instance beside the worker tests' (two instances on one machine).
PURPOSES = ("workers", "webhooks", "routes", "second-instance")
CLAIM_TTL_S = 120
#: How long a claim waits for a database while other test runs on the server hold them all (up to 15: a process
#: takes one per purpose it uses, so several checkouts testing at once can fill them).
CLAIM_WAIT_S = float(os.environ.get("SPECWATCH_TEST_REDIS_WAIT_S", "900"))
_PREFIX = "specwatch-test:claim:"
# Renew (or release) a claim only while it is still this process's.
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('expire', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"

_lock = threading.Lock()
_token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
_claimed: dict[str, int] = {}
_stop = threading.Event()


class NoFreeRedisDatabaseError(RuntimeError):
    pass


def _client() -> redis.Redis:
    return redis.Redis.from_url(f"{SERVER}/0")


def _database_count(client: redis.Redis) -> int:
    try:
        return int(client.config_get("databases")["databases"])
    except (redis.ResponseError, KeyError, ValueError):  # CONFIG disabled: Redis's default
        return 16


def _claim_one() -> int:
    """Claim a free database (the highest number first), waiting up to :data:`CLAIM_WAIT_S` while other test runs
    hold them all (they release theirs when they end); called under the lock."""
    client = _client()
    deadline = time.monotonic() + CLAIM_WAIT_S
    try:
        while True:
            for number in range(_database_count(client) - 1, 0, -1):
                if client.set(f"{_PREFIX}{number}", _token, nx=True, ex=CLAIM_TTL_S):
                    return number
            if time.monotonic() >= deadline or _stop.wait(0.5):
                break
    finally:
        client.close()
    raise NoFreeRedisDatabaseError(
        f"no free database on {SERVER} after {CLAIM_WAIT_S:.0f} s: other test runs hold the rest (keys {_PREFIX}* in "
        f"database 0; each expires {CLAIM_TTL_S} s after its run stops)"
    )


def _renew() -> None:
    while not _stop.wait(CLAIM_TTL_S / 3):
        with _lock:
            numbers = list(_claimed.values())
        client = _client()
        try:
            for number in numbers:
                client.eval(_RENEW, 1, f"{_PREFIX}{number}", _token, CLAIM_TTL_S)
        except redis.RedisError:
            pass  # the server is away: the tests using it fail on their own; the claims may expire meanwhile
        finally:
            client.close()


def _release() -> None:
    _stop.set()
    client = _client()
    try:
        for number in _claimed.values():
            client.eval(_RELEASE, 1, f"{_PREFIX}{number}", _token)
    except redis.RedisError:
        pass  # they expire on their own
    finally:
        client.close()


def redis_url(purpose: str) -> str:
    """The URL of this process's own database for ``purpose`` (one of :data:`PURPOSES`), claimed on first use."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}; one of {', '.join(PURPOSES)}")
    with _lock:
        if purpose not in _claimed:
            if not _claimed:  # the first claim: keep them all alive while this process runs, release them at its end
                threading.Thread(target=_renew, name="redis-claims", daemon=True).start()
                atexit.register(_release)
            _claimed[purpose] = _claim_one()
        return f"{SERVER}/{_claimed[purpose]}"
