"""llama-server's driver without llama.cpp: the request it sends, the parsing of what it answers, the reconstruction
of its verification rounds (checked against the totals the server reports), and the process handling on a stand-in
server (a Python HTTP server answering as llama-server does)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from specwatch.targets.llamacpp.chain import LlamaChain
from specwatch.targets.llamacpp.models import EOS
from specwatch.targets.llamacpp.paths import PathError
from specwatch.targets.llamacpp.server import Completion, LlamaServer, ServerConfig, parse_completion, request_body
from specwatch.targets.llamacpp.server_cases import along_output, ngram_simple_draft, observed_rounds, server_rounds


def test_request_sets_the_chain_and_neutralises_every_other_sampler():
    body = request_body([0, 1, 2], LlamaChain(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05, banned=(EOS,)), 12, 7)
    assert body["prompt"] == [0, 1, 2]
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (0.8, 6, 0.9, 0.05)
    assert (body["n_predict"], body["seed"], body["repeat_penalty"]) == (12, 7, 1.0)
    assert body["ignore_eos"] is True
    assert body["cache_prompt"] is False
    assert body["return_tokens"] is True
    greedy = request_body([0], None, 4, 0)
    assert (greedy["temperature"], greedy["top_k"], greedy["top_p"], greedy["min_p"]) == (0.0, 0, 1.0, 0.0)


def test_request_refuses_a_law_that_does_not_ban_what_ignore_eos_bans():
    with pytest.raises(ValueError, match="ignore_eos"):
        request_body([0], LlamaChain(), 4, 0)


def test_parse_reads_the_tokens_and_the_drafting_totals():
    body = {"content": "abc", "tokens": [0, 1, 2], "timings": {"predicted_n": 3, "draft_n": 4, "draft_n_accepted": 2}}
    assert parse_completion(body, 3) == Completion([0, 1, 2], 4, 2)
    assert parse_completion({"tokens": [5], "timings": {"predicted_n": 1}}, 1) == Completion([5], 0, 0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"error": {"code": 400, "message": "bad"}}, "refused"),
        ({"content": "abc"}, "no token ids"),
        ({"tokens": [0, 1]}, "2 tokens for n_predict 3"),
        ({"tokens": [0, True, 1]}, "no token ids"),
        ({"tokens": [0, 1, 2], "timings": {"draft_n": 1, "draft_n_accepted": 2}}, "2 accepted of 1"),
        ([1, 2, 3], "not a JSON object"),
    ],
)
def test_parse_refuses_what_is_not_a_full_answer(body, message):
    with pytest.raises(PathError, match=message):
        parse_completion(body, 3)


def test_config_selects_the_speculative_type():
    target, draft = Path("t.gguf"), Path("d.gguf")
    assert "--spec-type" not in ServerConfig("none").args(target, draft)
    draft_args = ServerConfig("draft", 3).args(target, draft)
    assert draft_args[draft_args.index("--spec-type") + 1] == "draft-simple"
    assert draft_args[draft_args.index("-md") + 1] == "d.gguf"
    assert draft_args[draft_args.index("--spec-draft-n-max") + 1] == "3"
    ngram_args = ServerConfig("ngram", 3, 2).args(target, draft)
    assert ngram_args[ngram_args.index("--spec-type") + 1] == "ngram-simple"
    assert ngram_args[ngram_args.index("--spec-ngram-simple-size-n") + 1] == "2"
    for args in (draft_args, ngram_args):
        assert args[args.index("-ctk") + 1] == args[args.index("-ctv") + 1] == "f32"
        assert args[args.index("-fa") + 1] == "off"  # on the CPU, flash attention moves the logits by ~1e-3
    with pytest.raises(ValueError, match="spec"):
        ServerConfig("eagle")


def test_ngram_simple_draft_follows_the_last_match():
    history = [0, 1, 2, 0, 1, 2, 3, 0]
    # pattern [0, 1] (history's last token, then the sampled 1): the latest earlier match is at 3, drafts follow it
    assert ngram_simple_draft(history, 1, 2, 3) == [2, 3, 0]
    assert ngram_simple_draft(history, 4, 2, 3) == []  # [0, 4] never occurred
    assert ngram_simple_draft([0, 1, 0, 1], 0, 2, 3) == []  # too short: needs more than n + m + 1 tokens
    # the pattern [7, 6] occurs at position 0 only, never a match (llama.cpp's search stops at 1); at 1 it is
    assert ngram_simple_draft([7, 6, 1, 2, 3, 4, 7], 6, 2, 3) == []
    assert ngram_simple_draft([0, 7, 6, 1, 2, 3, 7], 6, 2, 3) == [1, 2, 3]


def test_server_rounds_follow_the_output_and_leave_room_for_the_last_token():
    def drafter(context: list[int], n_max: int) -> list[int]:
        return [context[-1] + 1, context[-1] + 2, context[-1] + 3]

    tokens = [0, 1, 2, 3, 9, 5, 6, 7, 8]
    rounds = server_rounds(tokens, drafter, 3)
    # The first token comes from the prompt. From 1: drafts [1, 2, 3] all accepted, then the target's 9 -> 5; from 5:
    # drafts [10, 11, 12], none accepted -> 6; from 6: room for 2 drafts before the 9th token, [6, 7] accepted -> 9.
    assert rounds == [(3, 3), (3, 0), (2, 2)]


def test_drafts_along_the_output_give_the_rounds_of_autoregressive_drafting():
    # A deterministic toy draft model: the next token is a function of the whole context. draft-simple drafts
    # autoregressively from its own drafts; the reconstruction reads the draft's argmax along the output only.
    def next_of(context: list[int]) -> int:
        return (sum(context) * 7 + len(context) * 3) % 4

    def autoregressive(context: list[int], n_max: int) -> list[int]:
        drafts: list[int] = []
        for _ in range(n_max):
            drafts.append(next_of([*context, *drafts]))
        return drafts

    rng = np.random.default_rng(0)
    for _ in range(200):
        tokens = [int(t) for t in rng.integers(0, 4, 20)]
        for i in range(1, 20):  # an output that often follows the draft, so that rounds accept several drafts
            if rng.random() < 0.7:
                tokens[i] = next_of(tokens[:i])
        argmax = [next_of(tokens[:t]) for t in range(len(tokens))]
        assert server_rounds(tokens, along_output(argmax), 3) == server_rounds(tokens, autoregressive, 3)


def test_observed_rounds_keep_only_rounds_that_match_the_servers_totals():
    rounds = [(3, 3), (3, 0), (2, 2)]
    assert observed_rounds(Completion([], 8, 5), rounds) == rounds
    assert observed_rounds(Completion([], 8, 4), rounds) is None


STAND_IN = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    if "--fail" in args:
        print("error: failed to load model", flush=True)
        sys.exit(3)
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send(200, {"status": "ok"})
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = req["n_predict"]
            self._send(200, {"tokens": [req["seed"] % 7] * n, "timings": {"draft_n": 2, "draft_n_accepted": 1}})
        def log_message(self, *a):
            pass
    HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
    """
)


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n{STAND_IN}")
    script.chmod(0o755)
    return script


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pid: int, seconds: float = 20.0) -> bool:
    """Whether ``pid`` stops running within ``seconds`` (a signal's delivery is asynchronous: polled)."""
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_server_answers_requests_and_stops_when_closed(stand_in):
    with LlamaServer(stand_in, []) as server:
        process = server._process
        assert process is not None
        got = server.complete([0, 1], LlamaChain(banned=(EOS,)), 4, 9)
        assert got == Completion([2, 2, 2, 2], 2, 1)
        assert server.complete([0, 1], None, 3, 10).tokens == [3, 3, 3]  # the connection is reused
    assert process.poll() is not None
    assert not _alive(process.pid)


def test_a_server_that_exits_at_start_is_a_path_error_with_its_log(stand_in):
    with pytest.raises(PathError, match="exited 3: error: failed to load model"):
        LlamaServer(stand_in, ["--fail"])


def test_a_server_that_never_answers_is_a_path_error_and_is_stopped(tmp_path):
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    script.chmod(0o755)
    with pytest.raises(PathError, match="did not answer /health"):
        LlamaServer(script, [], start_timeout=0.5)
    running = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(script).encode() in cmdline.read_bytes() and _alive(int(cmdline.parent.name)):
                running.append(cmdline.parent.name)
        except OSError:
            continue  # exited while listed
    assert not running


WORKER = textwrap.dedent(
    """
    from pathlib import Path
    from specwatch.targets.llamacpp.server import LlamaServer
    _servers = []
    def start(binary):
        _servers.append(LlamaServer(Path(binary), []))
        return _servers[-1]._process.pid
    """
)


def test_a_pool_workers_servers_stop_when_the_worker_exits(stand_in, tmp_path, monkeypatch):
    # The suite's process pool runs cases in spawned workers, whose atexit handlers do not run.
    (tmp_path / "server_worker.py").write_text(WORKER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import server_worker

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pid = pool.submit(server_worker.start, str(stand_in)).result()
        assert _alive(pid)
    assert _gone(pid)


def test_a_server_dies_with_a_killed_parent(stand_in):
    code = "import sys; from pathlib import Path; from specwatch.targets.llamacpp.server import LlamaServer; "
    code += f"s = LlamaServer(Path({str(stand_in)!r}), []); print(s._process.pid, flush=True); sys.stdin.read()"
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    try:
        assert _alive(pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert _gone(pid)
    finally:
        parent.stdin.close()  # type: ignore[union-attr]
        parent.stdout.close()
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
