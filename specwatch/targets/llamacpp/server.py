"""``llama-server`` driven over its HTTP API: one process per configuration, a request per trial.

A :class:`LlamaServer` runs the tool built from the release's vendored tree on a free loopback port (the server
cannot bind port 0: a port is picked by binding one first) with the tiny target GGUF, one slot, F32 KV caches and
its prompt cache off and flash attention off, and waits for ``/health``. Flash attention is on by default (``auto``)
and on the CPU it moves the logits by up to 4e-3 from a float64 forward of the same weights (about 1e-3 typical,
growing with the position; measured on the tiny target, 32 tokens after an 8-token prompt): tokens within that of
a min-p or top-p boundary then fall outside the exact law's support. With it off the logits equal the reference's
to 1e-5, as llama-cpp-python's (whose ``flash_attn`` defaults to off). What it is started with (:class:`ServerConfig`) selects the path:
no drafting, a draft model (``--spec-type draft-simple``: ``-md`` alone leaves speculation off) or n-gram drafting
(``--spec-type ngram-simple``, the n-gram size and the draft length set small enough for the tiny prompts).

Requests go to the native ``/completion`` endpoint (``tools/server/server-schema.cpp`` of the version read:
llama-cpp-python 0.3.36, llama.cpp 0c1e57098): a token-id prompt, ``n_predict``, a ``seed`` per request, the
sampler settings, ``repeat_penalty`` 1, ``ignore_eos`` (the end-of-generation token's logit set to -inf, as
``llama-speculative --ignore-eos``), ``cache_prompt`` false (every request is processed from its prompt, as a
fresh run) and ``return_tokens`` (the generated ids in ``tokens``). The response's ``timings`` carry ``draft_n``
and ``draft_n_accepted`` (totals of the request, present when something was drafted).

A server is stopped when its owner closes it, and every server a process started is stopped when that process
exits (including a worker of the suite's process pool, whose ``atexit`` handlers do not run: a
``multiprocessing`` finaliser does); started from a main thread on Linux, it also gets SIGTERM when its parent
dies. Standard library HTTP only: the suite's library does not depend on the server extra's ``httpx``.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import multiprocessing.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from specwatch.targets.llamacpp.chain import LlamaChain
from specwatch.targets.llamacpp.paths import IGNORE_EOS, PathError

#: Seconds a server may take to load the tiny models and answer ``/health``.
START_TIMEOUT = 120.0
#: Seconds a request may take (a few dozen tokens of a tiny model: milliseconds, unless the machine is loaded).
REQUEST_TIMEOUT = 120.0
#: Starts tried before giving up (another process can take the picked port before the server binds it).
START_ATTEMPTS = 3
CONTEXT = 256


@dataclass(frozen=True)
class ServerConfig:
    """How the server drafts: ``none``, ``draft`` (the draft model, up to ``gamma`` drafts) or ``ngram``
    (``ngram-simple``: the ``ngram`` tokens ending at the last sampled one looked up in the history, the following
    ``gamma`` tokens drafted)."""

    spec: str = "none"
    gamma: int = 3
    ngram: int = 2

    def __post_init__(self) -> None:
        if self.spec not in ("none", "draft", "ngram"):
            raise ValueError(f"spec must be none, draft or ngram, not {self.spec!r}")

    def args(self, target: Path, draft: Path) -> list[str]:
        """The server's command-line options beyond the host and port."""
        out = ["-m", str(target), "-c", str(CONTEXT), "-b", "64", "-ub", "64", "-np", "1", "-t", "1", "-tb", "1"]
        out += ["-ctk", "f32", "-ctv", "f32", "-fa", "off", "--no-webui", "-cram", "0", "--no-warmup"]
        if self.spec == "draft":
            out += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(self.gamma)]
            out += ["--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-ctkd", "f32", "-ctvd", "f32", "-td", "1"]
        elif self.spec == "ngram":
            out += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.ngram)]
            out += ["--spec-ngram-simple-size-m", str(self.gamma), "--spec-ngram-simple-min-hits", "1"]
        return out


@dataclass(frozen=True)
class Completion:
    """What one ``/completion`` request returned: the generated ids and the request's drafting totals."""

    tokens: list[int]
    draft_n: int
    draft_accepted: int


def request_body(prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seed: int) -> dict[str, Any]:
    """The ``/completion`` request for ``horizon`` tokens after ``prompt`` (ids) under ``chain`` (None: temperature
    0, greedy), with every other sampler at its neutral setting and the end-of-generation token banned."""
    if chain is not None and tuple(chain.banned) != IGNORE_EOS:
        raise ValueError("ignore_eos bans the end-of-generation token: the chain's law must ban it and nothing else")
    sampling: dict[str, Any] = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    if chain is not None:
        sampling = {"temperature": chain.temperature, "top_k": chain.top_k, "top_p": chain.top_p, "min_p": chain.min_p}
    return {
        "prompt": [int(t) for t in prompt],
        "n_predict": int(horizon),
        "seed": int(seed),
        **sampling,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "typical_p": 1.0,
        "xtc_probability": 0.0,
        "top_n_sigma": -1.0,
        "dynatemp_range": 0.0,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": False,
        "response_fields": ["tokens", "timings", "stop_type"],
    }


def parse_completion(body: Any, horizon: int) -> Completion:
    """The generated ids and drafting totals of a ``/completion`` response; :class:`PathError` when it is an error,
    lacks the ids, or holds another number of tokens than requested (``ignore_eos``: generation stops at
    ``n_predict`` only)."""
    if not isinstance(body, dict):
        raise PathError(f"llama-server answered {str(body)[:200]!r}, not a JSON object")
    if "error" in body:
        raise PathError(f"llama-server refused the request: {json.dumps(body['error'])[:300]}")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise PathError(f"llama-server's response has no token ids (return_tokens): keys {sorted(body)}")
    if len(tokens) != horizon:
        raise PathError(f"llama-server generated {len(tokens)} tokens for n_predict {horizon} (stop_type {body.get('stop_type')!r})")
    timings = body.get("timings") or {}
    if not isinstance(timings, dict):
        raise PathError(f"llama-server's timings are {timings!r}")
    drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
    if not 0 <= accepted <= drafted:
        raise PathError(f"llama-server reports {accepted} accepted of {drafted} drafts")
    return Completion(list(tokens), drafted, accepted)


def free_port() -> int:
    """A loopback port no one listens on now (the server binds it a moment later; a lost race is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LlamaServer:
    """One ``llama-server`` process: started on construction (:class:`PathError` when it does not come up), stopped
    by :meth:`close` (or leaving its ``with`` block, or the process's exit)."""

    def __init__(self, binary: Path, args: Sequence[str], *, start_timeout: float = START_TIMEOUT) -> None:
        self.binary, self.args = binary, list(args)
        self._log: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - lives as long as the server
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        self._connection: http.client.HTTPConnection | None = None
        self.port = 0
        _running.add(self)
        try:
            self._start(start_timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, timeout: float) -> None:
        for attempt in range(START_ATTEMPTS):
            self.port = free_port()
            cmd = [str(self.binary), "--host", "127.0.0.1", "--port", str(self.port), *self.args]
            linux_main = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
            self._process = subprocess.Popen(  # noqa: S603 - the suite's own build of the tool
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if linux_main else None,  # noqa: PLW1509 - prctl only, no locks taken
            )
            if self._wait_healthy(timeout):
                return
            code = self._process.poll()
            self._terminate()
            if code is None or attempt == START_ATTEMPTS - 1 or "bind" not in self.log_tail().lower():
                what = f"exited {code}" if code is not None else f"did not answer /health within {timeout:g} s"
                raise PathError(f"llama-server {what}: {self.log_tail()}")

    def _wait_healthy(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                try:
                    connection.request("GET", "/health")
                    if connection.getresponse().status == 200:  # 503 while the model loads
                        return True
                finally:
                    connection.close()
            time.sleep(delay)  # polling a starting process: no event to wait on
            delay = min(0.2, delay * 2)
        return False

    def log_tail(self, chars: int = 600) -> str:
        self._log.flush()
        self._log.seek(0)
        text = " | ".join(line.strip() for line in self._log.read().splitlines() if line.strip())
        self._log.seek(0, os.SEEK_END)
        return text[-chars:]

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` as JSON and return the decoded answer (an error status's JSON body too); a persistent
        connection, opened again once if the server closed it."""
        payload = json.dumps(body).encode()
        for attempt in range(2):
            if self._connection is None:
                self._connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT)
            try:
                self._connection.request("POST", path, payload, {"Content-Type": "application/json"})
                raw = self._connection.getresponse().read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._connection.close()
                self._connection = None
                if attempt == 1 or self._process is None or self._process.poll() is not None:
                    raise PathError(f"llama-server request failed ({type(exc).__name__}: {exc}): {self.log_tail()}") from exc
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise PathError(f"llama-server answered {raw[:200]!r}, not JSON") from exc

    def complete(self, prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seed: int) -> Completion:
        return parse_completion(self.post("/completion", request_body(prompt, chain, horizon, seed)), horizon)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def close(self) -> None:
        """Stop the server (idempotent; only in the process that started it)."""
        _running.discard(self)
        if os.getpid() != self._owner:
            return
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._terminate()
        self._log.close()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_running: set[LlamaServer] = set()
_shared: dict[tuple[str, ServerConfig], LlamaServer] = {}


def shared_server(binary: Path, config: ServerConfig) -> LlamaServer:
    """The process's server for ``config`` (started on first use, restarted if it died; stopped at exit)."""
    from specwatch.targets.llamacpp.models import tiny_models  # noqa: PLC0415 - the models need transformers and gguf

    key = (str(binary), config)
    server = _shared.get(key)
    if server is None or not server.running:
        if server is not None:
            server.close()
        models = tiny_models()
        server = _shared[key] = LlamaServer(binary, config.args(models.target, models.draft))
    return server


def stop_all() -> None:
    """Stop every server this process started (run at exit)."""
    _shared.clear()
    for server in list(_running):
        server.close()


# multiprocessing runs its finalisers at the exit of the main process (from atexit) and of its children (where
# atexit handlers do not run): the pool's workers stop their servers too.
multiprocessing.util.Finalize(None, stop_all, exitpriority=100)
