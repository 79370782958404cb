"""A stand-in for Slack's incoming webhooks (compose/ci.yml): POST stores the JSON message and answers ``ok``
as Slack does; ``GET /messages`` returns every message received, as a JSON list."""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MESSAGES: list[dict[str, object]] = []


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 -- http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        MESSAGES.append({"path": self.path, "message": json.loads(body or b"{}")})
        print(f"slack message to {self.path}: {body[:300]!r}", flush=True)
        self._answer(200, b"ok", "text/plain")

    def do_GET(self) -> None:  # noqa: N802
        self._answer(200, json.dumps(MESSAGES).encode(), "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()  # noqa: S104 -- inside its container
