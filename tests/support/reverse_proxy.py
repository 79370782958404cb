"""nginx with the compose stack's proxy configuration (compose/nginx/specwatch.conf) in front of a local app.

The shipped file is used as it is but for its two addresses: ``server api:8000;`` (the compose service) becomes
the local app's port and ``listen 80;`` a free loopback port. It is included in a minimal ``nginx.conf`` of
our own (pid, logs and request-body buffers in a scratch folder), as the official image's ``nginx.conf``
includes ``conf.d/*.conf``. Debian's ``nginx`` package provides the binary (``scripts/test-deps.sh --tools``);
a missing one fails the test that needs it. Used by tests/security/test_proxy_slow_clients.py and
bench/webhook_hostile.py (``--proxy``).
"""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "compose" / "nginx" / "specwatch.conf"
UPSTREAM, LISTEN = "server api:8000;", "listen 80;"


class ProxyError(RuntimeError):
    pass


def nginx_binary() -> str:
    """Debian's nginx (``/usr/sbin`` is not on every user's PATH); ProxyError when it is not installed."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise ProxyError("nginx is not installed: apt-get install -y nginx (or scripts/test-deps.sh --tools)")
    return found


def local_server_block(upstream_port: int, listen_port: int, shipped: Path = SHIPPED) -> str:
    """The shipped configuration with the local app's port and a loopback listening port (each replaced once)."""
    text = shipped.read_text()
    for old in (UPSTREAM, LISTEN):
        if text.count(old) != 1:
            raise ProxyError(f"{shipped} should say {old!r} exactly once, as docker-compose.yml expects")
    text = text.replace(UPSTREAM, f"server 127.0.0.1:{upstream_port};")
    return text.replace(LISTEN, f"listen 127.0.0.1:{listen_port};")


def main_config(scratch: Path, server_block: Path) -> str:
    """A minimal ``nginx.conf`` with everything in ``scratch``; the workers run as this user."""
    temp = {name: scratch / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for folder in temp.values():
        folder.mkdir()
    paths = "\n".join(f"    {name}_temp_path {folder};" for name, folder in temp.items())
    return (
        f"user {getpass.getuser()};\nworker_processes 1;\npid {scratch / 'nginx.pid'};\n"
        f"error_log {scratch / 'error.log'} warn;\n"
        "events { worker_connections 1024; }\n"
        f"http {{\n    access_log off;\n{paths}\n    include {server_block};\n}}\n"
    )


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def nginx_in_front(upstream_port: int, *, timeout_s: float = 30.0) -> Iterator[int]:
    """nginx with the shipped configuration proxying to ``127.0.0.1:upstream_port``; yields its port."""
    binary = nginx_binary()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="specwatch-nginx-") as folder:
        scratch = Path(folder)
        block = scratch / "specwatch.conf"
        block.write_text(local_server_block(upstream_port, port))
        config = scratch / "nginx.conf"
        config.write_text(main_config(scratch, block))
        command = [binary, "-p", str(scratch), "-e", str(scratch / "error.log"), "-c", str(config)]
        checked = subprocess.run([*command, "-t", "-q"], capture_output=True, text=True, check=False, timeout=30)
        if checked.returncode != 0:
            raise ProxyError(f"nginx -t refused the configuration: {checked.stderr.strip()}")
        proc = subprocess.Popen([*command, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            while not _listening(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ProxyError(f"nginx did not listen on {port}: {(scratch / 'error.log').read_text()[-2000:]}")
                time.sleep(0.05)
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
