"""Repository URLs a write-token holder may not register (issue 14, "Credentials and internal hosts in
repository URLs"): replayed through ``POST /targets`` with the production policy (compose: no local
repositories, no private hosts, https only), and what is shown afterwards.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.conftest import WRITE_TOKEN, Embedded, embedded_app

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {WRITE_TOKEN}"}


@pytest.fixture
def production(tmp_path: Path) -> Iterator[Embedded]:
    with embedded_app(tmp_path, allow_local_repositories=False, allow_private_hosts=False) as app:
        yield app


def _add(app: Embedded, repo_url: str) -> int:
    target = {"name": "probe", "repo_url": repo_url, "branches": ["main"], "adapter": "transformers"}
    return app.client.post("/targets", json=target, headers=AUTH).status_code


@pytest.mark.parametrize(
    "repo_url",
    [
        "file:///etc",
        "/root",
        "file::/etc",
        "http://127.0.0.1:6379/x",
        "https://127.0.0.1:5432/x",
        "https://localhost/x",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/x",
        "https://2130706433/x",
        "ext::sh -c id",
        "git://example.org/x",
    ],
)
def test_local_paths_transports_and_private_hosts_are_refused(production: Embedded, repo_url: str) -> None:
    assert _add(production, repo_url) == 422
    assert production.client.get("/targets").json() == []


def test_credentials_in_a_url_are_refused_and_never_shown(production: Embedded) -> None:
    answer = production.client.post(
        "/targets",
        json={"name": "probe", "repo_url": "https://ada:hunter2@github.com/o/r", "branches": ["main"], "adapter": "transformers"},
        headers=AUTH,
    )
    assert answer.status_code == 422
    assert "hunter2" not in answer.text
    assert "hunter2" not in production.client.get("/targets").text


def test_a_public_https_repository_is_accepted(production: Embedded) -> None:
    assert _add(production, "https://github.com/huggingface/transformers") == 201


def test_the_dev_default_allows_local_repositories_but_not_credentials_or_transports(tmp_path: Path) -> None:
    """The embedded default on a laptop (SPECWATCH_ENV=dev, the demo registers a local path)."""
    with embedded_app(tmp_path, env="dev") as dev:
        assert _add(dev, "file::/etc") == 422
        assert _add(dev, "https://u:p@github.com/o/r") == 422
        repository = tmp_path / "repository"
        subprocess.run(["git", "init", "--quiet", str(repository)], check=True)  # targets add checks that it is one
        assert _add(dev, str(repository)) == 201
