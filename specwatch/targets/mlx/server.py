"""MLX-LM's HTTP server with a draft model (``mlx_lm.server --draft-model``) as a path of the end-to-end cases.

:func:`save_models` writes the tiny target and draft (:mod:`.models`) as model folders the server loads: the weights
(``mlx_lm.utils.save_model``: safetensors), ``config.json`` (``save_config``) and the word-level tokenizer
(``save_pretrained``: ``tokenizer.json`` and its config). :class:`Server` starts ``python -m mlx_lm.server`` on them
on a free port of the loopback (one server a process, stopped at exit) and waits for ``/health``.

:class:`ServerPath` sends one ``/v1/completions`` request a trial: the prompt as text (one character a token), the
request's own ``seed`` (the server calls ``mx.random.seed`` with it before generating, 0.32.2 ``server.py``
``_serve_single``; a request with a seed is served alone, never batched), ``max_tokens``, ``num_draft_tokens``, the
sampler's and the penalties' settings by their request names, and ``logprobs`` so that the response lists the
generated token ids. The response does not say which tokens came from the draft: no round is observed
(:attr:`Trial.rounds` is None) and the server cases have no coverage design. The server keeps its prompt cache (its
default): a request whose prompt an earlier one began with reuses that KV cache and hands ``stream_generate`` only
the rest of the prompt, as a deployed server does.
"""

from __future__ import annotations

import atexit
import importlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch.targets.mlx.law import MlxSampling
from specwatch.targets.mlx.models import VOCAB, mlx_model, text, tokenizer
from specwatch.targets.mlx.paths import PathError, Trial
from specwatch.targets.tiny import FFN, HEADS, HIDDEN, LAYERS, RMS_EPS, ROPE_THETA

#: Seconds the server may take to load the tiny models and answer ``/health``.
START_TIMEOUT_S = 120.0
#: Seconds one request may take.
REQUEST_TIMEOUT_S = 60.0

_servers: dict[bool, Server] = {}


def save_models(folder: Path) -> dict[str, Path]:
    """The tiny ``target`` and ``draft`` saved as model folders under ``folder`` (weights, config, tokenizer)."""
    utils = importlib.import_module("mlx_lm.utils")
    config = {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "rms_norm_eps": RMS_EPS,
        "vocab_size": VOCAB,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
    }
    out = {}
    for name in ("target", "draft"):
        path = folder / name
        utils.save_model(path, mlx_model(name))
        utils.save_config(dict(config), path / "config.json")
        tokenizer().save_pretrained(str(path))
        out[name] = path
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """``mlx_lm.server`` on the tiny target with the tiny draft (``--draft-model``; ``draft=False``: without), on a
    free loopback port."""

    def __init__(self, *, draft: bool = True) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="specwatch-mlx-server-"))
        models = save_models(self.folder)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (self.folder / "server.log").open("w+b")
        command = [sys.executable, "-m", "mlx_lm.server", "--model", str(models["target"])]
        command += ["--draft-model", str(models["draft"])] if draft else []
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "WARNING"]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)  # noqa: S603 - our own interpreter
        atexit.register(self.stop)
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PathError(f"mlx_lm.server exited with {self.process.returncode}: {self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)  # polling for readiness, not timing a result
        output = self.output()
        self.stop()
        raise PathError(f"mlx_lm.server did not answer /health within {START_TIMEOUT_S:g} s: {output}")

    def output(self) -> str:
        """The end of the server's log (its errors, when it failed to start)."""
        if self.log.closed:
            return ""
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One ``/v1/completions`` request; :class:`PathError` with the server's answer when it is not 200."""
        request = urllib.request.Request(  # noqa: S310 - loopback
            f"{self.url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:  # noqa: S310 - loopback
                answer: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise PathError(f"mlx_lm.server answered {exc.code}: {exc.read()[:500]!r}") from exc
        return answer

    def stop(self) -> None:
        """Stop the server, then remove its folder (models and log)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def server(*, draft: bool = True) -> Server:
    """This process's server with the draft model (``draft=False``: without it), started on first use."""
    if draft not in _servers:
        _servers[draft] = Server(draft=draft)
    return _servers[draft]


def request_body(prompt: Sequence[int], sampling: MlxSampling | None, horizon: int, seed: int, num_draft_tokens: int) -> dict[str, Any]:
    """A completion request for ``horizon`` tokens after ``prompt`` (None: temperature 0, no penalty)."""
    body: dict[str, Any] = {
        "prompt": text(prompt),
        "max_tokens": horizon,
        "seed": int(seed),
        "num_draft_tokens": num_draft_tokens,
        "logprobs": True,
        "temperature": 0.0,
    }
    if sampling is not None:
        s = sampling.sampler_kwargs()
        body.update(temperature=s["temp"], top_p=s["top_p"], min_p=s["min_p"], top_k=s["top_k"])
        body.update(xtc_probability=float(s["xtc_probability"]), xtc_threshold=float(s["xtc_threshold"]))
        body.update({name: value for name, value in sampling.processor_kwargs().items() if value is not None})
    return body


@dataclass(frozen=True)
class ServerPath:
    """Completions from :func:`server` with ``num_draft_tokens`` drafts a round (the request's own setting);
    ``draft=False``: from the server without a draft model (the control)."""

    num_draft_tokens: int = 3
    draft: bool = True

    def run(
        self, prompt: Sequence[int], sampling: MlxSampling | None, horizon: int, seeds: Sequence[int], *, greedy: bool = False
    ) -> list[Trial]:
        """``horizon`` tokens per seed; ``greedy``: temperature 0 with the penalties of ``sampling`` (None: none)."""
        if sampling is None and not greedy:
            raise ValueError("a sampling run needs its settings")
        out: list[Trial] = []
        for seed in seeds:
            body = request_body(prompt, sampling, horizon, seed, self.num_draft_tokens)
            if greedy:
                body["temperature"] = 0.0
            answer = server(draft=self.draft).complete(body)
            if answer["usage"]["prompt_tokens"] != len(prompt):
                raise PathError(f"the server read {answer['usage']['prompt_tokens']} prompt tokens for {len(prompt)}")
            content = answer["choices"][0]["logprobs"]["content"]
            out.append(Trial([int(entry["id"]) for entry in content], None))
        return out
