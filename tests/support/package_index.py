"""A local package index on 127.0.0.1 (stdlib ``http.server`` in a thread) and wheels built by hand.

It speaks the two APIs specwatch uses: PyPI's JSON API (``GET /pypi/<name>/json``, read by the release
poller) and the simple repository API (``GET /simple/<name>/`` and ``/files/<wheel>``, read by ``pip install``
in the suite). Tests publish and yank releases between polls, publish releases whose dependencies are missing,
and make the index fail (``failing_with``); nothing leaves the machine.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def normalize(name: str) -> str:
    """PEP 503 normal form of a project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def build_wheel(dest: Path, name: str, version: str, files: dict[str, str], requires: Sequence[str] = ()) -> Path:
    """A pure-Python wheel of ``name`` ``version`` holding ``files`` (path in the wheel → source), in ``dest``,
    depending on ``requires`` (``Requires-Dist``: pip resolves them from the index)."""
    dest.mkdir(parents=True, exist_ok=True)
    dist = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    path = dest / f"{dist}-py3-none-any.whl"
    contents = dict(files)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents[f"{dist}.dist-info/METADATA"] = metadata
    contents[f"{dist}.dist-info/WHEEL"] = "Wheel-Version: 1.0\nGenerator: specwatch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for member, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    contents[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in contents.items():
            wheel.writestr(member, text)
    return path


@dataclass
class IndexFile:
    filename: str
    content: bytes
    uploaded: str  # ISO 8601
    yanked: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass
class PackageIndex:
    """What the index serves: project (normal form) → version → files. Mutate it between polls."""

    projects: dict[str, dict[str, list[IndexFile]]] = field(default_factory=dict)
    # Answer every request with this status instead (an index having a bad day).
    failing_with: int | None = None
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def publish(
        self, name: str, version: str, *, wheel: Path | None = None, uploaded: str = "2026-01-01T00:00:00Z", yanked: bool = False
    ) -> None:
        """Add a release (a wheel, or a placeholder sdist when only its metadata matters)."""
        file = (
            IndexFile(wheel.name, wheel.read_bytes(), uploaded, yanked)
            if wheel is not None
            else IndexFile(f"{normalize(name)}-{version}.tar.gz", f"{name} {version}".encode(), uploaded, yanked)
        )
        self.projects.setdefault(normalize(name), {}).setdefault(version, []).append(file)

    def release_without_files(self, name: str, version: str) -> None:
        self.projects.setdefault(normalize(name), {})[version] = []

    def json_api(self, project: str) -> dict[str, Any]:
        releases = {
            version: [
                {
                    "filename": f.filename,
                    "url": f"{self.url}/files/{f.filename}",
                    "packagetype": "bdist_wheel" if f.filename.endswith(".whl") else "sdist",
                    "digests": {"sha256": f.sha256},
                    "upload_time_iso_8601": f.uploaded,
                    "yanked": f.yanked,
                    "yanked_reason": "broken" if f.yanked else None,
                }
                for f in files
            ]
            for version, files in self.projects[project].items()
        }
        return {"info": {"name": project}, "releases": releases, "urls": []}

    def simple_page(self, project: str) -> str:
        links = [
            f'<a href="/files/{f.filename}#sha256={f.sha256}"{" data-yanked" if f.yanked else ""}>{f.filename}</a>'
            for files in self.projects[project].values()
            for f in files
        ]
        return "<!DOCTYPE html><html><body>" + "\n".join(links) + "</body></html>"

    def file(self, filename: str) -> bytes | None:
        for versions in self.projects.values():
            for files in versions.values():
                for f in files:
                    if f.filename == filename:
                        return f.content
        return None


def _handler(index: PackageIndex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the tests read ``index.requests``."""

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            index.requests.append(self.path)
            if index.failing_with is not None:
                self._send(index.failing_with, b"index unavailable", "text/plain")
                return
            json_api = re.fullmatch(r"/pypi/([^/]+)/json", self.path)
            simple = re.fullmatch(r"/simple/([^/]+)/?", self.path)
            served = re.fullmatch(r"/files/([^/]+)", self.path)
            if json_api and normalize(json_api[1]) in index.projects:
                self._send(HTTPStatus.OK, json.dumps(index.json_api(normalize(json_api[1]))).encode(), "application/json")
            elif simple and normalize(simple[1]) in index.projects:
                self._send(HTTPStatus.OK, index.simple_page(normalize(simple[1])).encode(), "text/html")
            elif served and (content := index.file(served[1])) is not None:
                self._send(HTTPStatus.OK, content, "application/octet-stream")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")

    return Handler


@contextmanager
def serve(index: PackageIndex) -> Iterator[PackageIndex]:
    """Serve ``index`` on 127.0.0.1 (a free port) for the block; ``index.url`` is its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="package-index", daemon=True)
    thread.start()
    index.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
