"""Local HTTP servers on 127.0.0.1 standing in for Slack's incoming webhooks and GitHub's statuses and check-runs APIs.

Each answers from a script of (status, headers) responses (the last one repeats) and records every request
(path, headers, JSON body), so tests can check payloads and count deliveries.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any
    status: int


@dataclass
class FakeServer:
    script: list[tuple[int, dict[str, str]]]
    requests: list[Recorded] = field(default_factory=list)
    url: str = ""

    def next_response(self) -> tuple[int, dict[str, str]]:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def block_kit_problems(payload: dict[str, Any]) -> list[str]:
    """What breaks Slack's Block Kit limits in a webhook payload (empty: none)."""
    problems: list[str] = []
    blocks = payload.get("blocks") or []
    if not isinstance(payload.get("text"), str) or not payload["text"]:
        problems.append("no text fallback")
    if len(blocks) > 50:
        problems.append(f"{len(blocks)} blocks > 50")
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "header":
            text = block["text"]
            if text["type"] != "plain_text" or len(text["text"]) > 150:
                problems.append(f"block {i}: header must be plain_text of <= 150 characters")
        elif kind == "section":
            if "text" in block and len(block["text"]["text"]) > 3000:
                problems.append(f"block {i}: section text {len(block['text']['text'])} > 3000")
            if "fields" in block and (len(block["fields"]) > 10 or any(len(f["text"]) > 2000 for f in block["fields"])):
                problems.append(f"block {i}: fields over limits")
            if "text" not in block and "fields" not in block:
                problems.append(f"block {i}: empty section")
        elif kind == "context":
            if not 1 <= len(block["elements"]) <= 10:
                problems.append(f"block {i}: context needs 1-10 elements")
        else:
            problems.append(f"block {i}: unexpected type {kind!r}")
    return problems


#: GitHub's check-run conclusions and the most characters of ``output.summary`` and ``output.text``
#: (https://docs.github.com/en/rest/checks/runs#create-a-check-run).
CHECK_CONCLUSIONS = {"action_required", "cancelled", "failure", "neutral", "success", "skipped", "stale", "timed_out"}
CHECK_OUTPUT_MAX = 65535


def check_run_problems(body: Any) -> list[str]:
    """What GitHub would refuse (422) in a ``POST /repos/{owner}/{repo}/check-runs`` body (empty: none)."""
    if not isinstance(body, dict):
        return ["not an object"]
    problems = [f"no {key}" for key in ("name", "head_sha") if not isinstance(body.get(key), str) or not body[key]]
    if body.get("status") == "completed" and body.get("conclusion") not in CHECK_CONCLUSIONS:
        problems.append(f"conclusion {body.get('conclusion')!r}")
    output = body.get("output")
    if output is not None:
        if not isinstance(output.get("title"), str) or not isinstance(output.get("summary"), str):
            problems.append("output needs a title and a summary")
        long = [key for key in ("summary", "text") if len(output.get(key) or "") > CHECK_OUTPUT_MAX]
        problems.extend(f"output.{key}: {len(output[key])} characters > {CHECK_OUTPUT_MAX}" for key in long)
    return problems


@contextmanager
def fake_server(
    script: Sequence[tuple[int, dict[str, str]]], *, check_block_kit: bool = False, check_github_checks: bool = False
) -> Iterator[FakeServer]:
    """A server answering each POST from ``script``; with ``check_block_kit`` a payload over Slack's limits gets 400,
    with ``check_github_checks`` a check run GitHub would refuse gets 422."""
    fake = FakeServer(list(script))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            body = json.loads(raw or b"null")
            with lock:
                status, headers = fake.next_response()
                if check_block_kit and block_kit_problems(body):
                    status, headers = 400, {}
                if check_github_checks and self.path.endswith("/check-runs") and check_run_problems(body):
                    status, headers = 422, {}
                fake.requests.append(Recorded(self.path, dict(self.headers.items()), body, status))
            payload = b"ok" if status < 300 else b"invalid_blocks" if status == 400 else b"error"
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
