"""The repository host is pinned to the address that was checked (issue 28, item 7): no DNS rebinding window
between the worker's private-host check and git.

A bare repository is served over git's dumb HTTP protocol on this machine. The host name used is this machine's
own name, which the system resolver maps to a private (loopback) address. A rebinding resolver answers the
worker's check with a public address and git, a moment later, with the private one: simulated by answering the
check in-process (``getaddrinfo`` patched in :mod:`service.addresses`) while git, a separate process, asks the
real resolver. Pinned, git connects to the address that was checked and never reaches the private server.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from service import addresses
from service.repositories import RepoPolicy
from tests.support.toy_target import CORRECT, ToyRepo
from workers.checkout import CheckoutError, check_repository, git, ls_remote

pytestmark = pytest.mark.integration

PUBLIC = "8.8.8.8"  # what the rebinding resolver tells the check
HTTP = RepoPolicy(protocols=frozenset({"http"}))  # the strict policy, over plain http for a local server


class _Served(ThreadingHTTPServer):
    requests = 0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[_Served, str]]:
    """A bare copy of a toy repository served on every interface (dumb HTTP); the server and the repository path."""
    repo = ToyRepo.create(tmp_path / "toy")
    repo.commit(CORRECT, "the correct sampler")
    root = tmp_path / "www"
    root.mkdir()
    subprocess.run(["git", "clone", "--bare", "--quiet", str(repo.path), str(root / "repo.git")], check=True)
    subprocess.run(["git", "update-server-info"], cwd=root / "repo.git", check=True)

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            server.requests += 1

    server = _Served(("0.0.0.0", 0), functools.partial(Handler, directory=str(root)))  # every interface: reached by the machine's own name
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, "repo.git"
    finally:
        server.shutdown()
        server.server_close()


def _own_name() -> str:
    """This machine's name, which the system resolver maps to one of its own (private) addresses."""
    name = socket.gethostname()
    resolved = {ipaddress.ip_address(info[4][0]) for info in socket.getaddrinfo(name, 80, proto=socket.IPPROTO_TCP)}
    assert resolved, f"{name} does not resolve"
    assert all(addresses.is_private_address(a) for a in resolved), resolved
    return name


def test_git_connects_to_the_pinned_address_not_to_what_dns_says(served: tuple[_Served, str]) -> None:
    server, path = served
    port = server.server_address[1]
    # A name that never resolves (.invalid): git reaches the server only through the pin.
    url = f"http://specwatch-pin.invalid:{port}/{path}"
    pin = ["-c", f"http.curloptResolve=specwatch-pin.invalid:{port}:127.0.0.1"]
    assert "refs/heads/" in git("ls-remote", "--", url, policy=HTTP, options=pin)
    with pytest.raises(CheckoutError, match="host not found"):
        git("ls-remote", "--", url, policy=HTTP)


def test_a_rebinding_name_never_reaches_the_private_address(served: tuple[_Served, str], monkeypatch: pytest.MonkeyPatch) -> None:
    server, path = served
    name, port = _own_name(), server.server_address[1]
    url = f"http://{name}:{port}/{path}"
    # Without the pin, git resolves the name itself: the private server answers (the window the check left).
    assert "refs/heads/" in git("ls-remote", "--", url, policy=HTTP)
    reached = server.requests
    assert reached > 0

    def rebinding(host: str, port: object, *args: object, **kwargs: object) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (PUBLIC, port))]

    monkeypatch.setattr(addresses.socket, "getaddrinfo", rebinding)
    assert check_repository(url, HTTP) == ["-c", f"http.curloptResolve={name}:{port}:{PUBLIC}", "-c", "http.followRedirects=false"]
    with pytest.raises(CheckoutError):  # git goes to the checked (public, unreachable here) address
        ls_remote(url, ["main"], timeout=5, policy=HTTP)
    assert server.requests == reached  # and never to the private one


def test_a_name_that_resolves_to_a_private_address_is_refused_before_git_runs(served: tuple[_Served, str]) -> None:
    server, path = served
    url = f"http://{_own_name()}:{server.server_address[1]}/{path}"
    with pytest.raises(CheckoutError, match="resolves to a private or loopback address"):
        ls_remote(url, ["main"], policy=HTTP)
    assert server.requests == 0
