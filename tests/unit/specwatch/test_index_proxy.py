"""The install step reaches the package index and nothing else (issue 28, item 7).

Before, the install step shared the host's network: a source package's build could reach PostgreSQL, Redis and the
API on loopback. Now it runs in bubblewrap's empty network namespace behind :data:`FORWARDER`, whose proxy (outside,
on a Unix socket) connects only to the index. Checked by running code in the real sandbox: the index answers through
the proxy (plain requests and a CONNECT tunnel), another loopback service is refused by the proxy, and a direct
connection reaches only the sandbox's own empty loopback.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from specwatch.index_proxy import PYPI, forwarded, index_hosts, serving
from specwatch.sandbox import bubblewrap
from tests.support.package_index import PackageIndex, build_wheel, serve

pytestmark = pytest.mark.unit

INSIDE = """
import json, os, socket, sys, urllib.error, urllib.request
index, other = sys.argv[1], int(sys.argv[2])
seen = {}
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as response:  # HTTP_PROXY from the forwarder
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__
seen["index"] = get(index + "/simple/toy/")
seen["other_via_proxy"] = get(f"http://127.0.0.1:{other}/")
try:
    socket.create_connection(("127.0.0.1", other), timeout=5).close()
    seen["other_direct"] = "connected"
except OSError as exc:
    seen["other_direct"] = type(exc).__name__
proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
host_port = index.split("//", 1)[1]
tunnel = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=20)
tunnel.sendall(f"CONNECT {host_port} HTTP/1.1\\r\\nHost: {host_port}\\r\\n\\r\\n".encode())
established = tunnel.recv(4096).split(b"\\r\\n")[0].decode()
tunnel.sendall(f"GET /simple/toy/ HTTP/1.1\\r\\nHost: {host_port}\\r\\nConnection: close\\r\\n\\r\\n".encode())
answer = b""
while chunk := tunnel.recv(65536):
    answer += chunk
seen["connect"] = [established, answer.split(b"\\r\\n")[0].decode()]
print(json.dumps(seen))
"""


@pytest.fixture
def other_service() -> Iterator[int]:
    """A loopback service the install step must not reach (PostgreSQL, Redis, the API in the probe)."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_the_install_step_reaches_the_index_and_nothing_else(tmp_path: Path, other_service: int) -> None:
    sandbox = bubblewrap(sys.executable)
    assert sandbox.mode == "bwrap", sandbox.reason
    wheel = build_wheel(tmp_path / "dist", "toy", "1.0", {"toy/__init__.py": ""})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sock = scratch / "index.sock"
    with serve(PackageIndex()) as index:
        index.publish("toy", "1.0", wheel=wheel)
        host, port = index.url.split("//")[1].split(":")
        script = [sys.executable, "-c", textwrap.dedent(INSIDE), index.url, str(other_service)]
        argv = sandbox.argv(forwarded(script, sys.executable, sock), cwd=scratch, writable=[scratch])
        assert "--share-net" not in argv
        with serving(sock, {(host, int(port))}) as refused:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["index"] == 200
    assert seen["other_via_proxy"] == 403
    assert seen["other_direct"] == "ConnectionRefusedError"  # the sandbox's own loopback: nothing listens there
    assert seen["connect"] == ["HTTP/1.1 200 Connection established", "HTTP/1.0 200 OK"]
    assert refused == [f"127.0.0.1:{other_service}"]


def test_the_index_hosts_are_pips_index_urls_and_pypi_by_default() -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PIP_CONFIG_FILE": "/dev/null"}
    custom = index_hosts(
        env | {"PIP_INDEX_URL": "https://mirror.example/simple", "PIP_EXTRA_INDEX_URL": "http://extra.example:8080/simple file:///x"},
        sys.executable,
    )
    assert {("mirror.example", 443), ("extra.example", 8080)} <= custom
    assert not set(PYPI) & custom
    assert set(PYPI) <= index_hosts(env | {"PIP_INDEX_URL": "https://pypi.org/simple"}, sys.executable)
