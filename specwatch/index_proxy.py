"""The install step's only way out: a proxy to the package index, reached over a Unix socket (issue 28, item 7).

A release is installed by pip inside the sandbox (:mod:`specwatch.sandbox`); a source package's build runs code
there. The step gets no network of its own (bubblewrap's empty network namespace): inside, :data:`FORWARDER`
listens on the sandbox's own loopback and passes each connection through a Unix socket in the step's scratch
folder, and pip is pointed at it (``HTTP_PROXY``/``HTTPS_PROXY``). Outside, :func:`serving` answers on that socket:
an HTTP proxy that connects only to the package index's hosts and ports (:func:`index_hosts`: pip's
``index-url``, ``extra-index-url`` and ``find-links`` where they are http(s) URLs, PyPI and its file host by
default), ``CONNECT`` for https and absolute-form requests for http; anything else gets ``403``. So the build
reaches the index and nothing else: not the database on loopback, not the service's API, not another host.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import socketserver
import subprocess
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from urllib.parse import urlsplit

#: Run inside the sandbox in front of the install command: argv the socket's path, then the command.
FORWARDER = r"""
import os, socket, subprocess, sys, threading
path, command = sys.argv[1], sys.argv[2:]
listener = socket.create_server(("127.0.0.1", 0))
def pipe(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve():
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
proxy = "http://127.0.0.1:%d" % listener.getsockname()[1]
names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
env = dict(os.environ, **{name: proxy for name in names}, NO_PROXY="", no_proxy="")
sys.exit(subprocess.call(command, env=env))
"""
PYPI = (("pypi.org", 443), ("files.pythonhosted.org", 443))
_HEAD_LIMIT = 64 * 1024
_URL_KEYS = re.compile(r"^(?:[\w-]+\.)?(index-url|extra-index-url|find-links)='?(.*?)'?$")


def forwarded(command: list[str], python: str, socket_path: Path) -> list[str]:
    """``command`` run behind :data:`FORWARDER` (under ``python``, inside the sandbox), its proxy on ``socket_path``."""
    return [python, "-c", FORWARDER, str(socket_path), *command]


def _hosts_of(urls: Iterable[str]) -> set[tuple[str, int]]:
    found = set()
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            found.add((parts.hostname.lower(), parts.port or (443 if parts.scheme == "https" else 80)))
    return found


def index_hosts(env: Mapping[str, str], python: str) -> set[tuple[str, int]]:
    """The (host, port) pairs pip may fetch from with ``env``: its index URLs and http(s) find-links from ``env``
    and from pip's configuration (``pip config list``); PyPI's (:data:`PYPI`) when no index URL is set or it is PyPI."""
    urls = {"index-url": [env.get("PIP_INDEX_URL", "")], "extra-index-url": env.get("PIP_EXTRA_INDEX_URL", "").split()}
    urls["find-links"] = env.get("PIP_FIND_LINKS", "").split()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = subprocess.run(  # noqa: S603 -- our interpreter, a fixed command
            [python, "-m", "pip", "config", "list"], env=dict(env), capture_output=True, text=True, timeout=60, check=False
        ).stdout
        for line in listed.splitlines():
            if found := _URL_KEYS.match(line.strip()):
                urls[found[1]] += found[2].split()
    hosts = _hosts_of(u for values in urls.values() for u in values)
    if not any(u for u in urls["index-url"]) or ("pypi.org", 443) in hosts:
        hosts |= set(PYPI)
    return hosts


def _splice(a: socket.socket, b: socket.socket) -> None:
    def pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=pipe, args=(b, a), daemon=True)
    other.start()
    pipe(a, b)
    other.join()


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        client: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        end = head.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = head[:end].decode("latin-1").split("\r\n")
        method, target, version = [*lines[0].split(" "), "", "", ""][:3]
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            where, forward = (host.strip("[]").lower(), int(port) if port.isdigit() else 443), b""
        else:
            parts = urlsplit(target)
            where = ((parts.hostname or "").lower(), parts.port or 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            headers = [h for h in lines[1:] if not h.lower().startswith(("connection:", "proxy-connection:", "proxy-authorization:"))]
            forward = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close", "", ""]).encode("latin-1")
            forward += head[end + 4 :]
        if where not in self.server.allowed or (method != "CONNECT" and urlsplit(target).scheme != "http"):
            self.server.refused.append(f"{where[0]}:{where[1]}")
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        try:
            upstream = socket.create_connection(where, timeout=60)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        with upstream:
            upstream.settimeout(None)
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                upstream.sendall(head[end + 4 :])
            else:
                upstream.sendall(forward)
            _splice(client, upstream)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allowed: frozenset[tuple[str, int]] = frozenset()
    refused: list[str]


@contextlib.contextmanager
def serving(socket_path: Path, allowed: Iterable[tuple[str, int]]) -> Iterator[list[str]]:
    """The proxy on ``socket_path`` for the duration of the block, to the ``allowed`` (host, port) pairs only; yields
    the list of the ``host:port`` it refused (filled as it runs)."""
    server = _Server(str(socket_path), _Handler)
    server.allowed = frozenset(allowed)
    server.refused = []
    os.chmod(socket_path, 0o777)  # noqa: S103 -- the sandbox's uid connects to it; only the sandbox sees the folder
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.refused
    finally:
        server.shutdown()
        server.server_close()
        with contextlib.suppress(OSError):
            socket_path.unlink()
