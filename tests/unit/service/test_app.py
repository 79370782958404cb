"""service.app: the factory builds a working app from settings alone; /healthz reports the database."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.app import create_app
from service.settings import Settings


def test_healthz_on_the_embedded_default(tmp_path: Path) -> None:
    settings = Settings(env="test", database_url=f"sqlite:///{tmp_path / 'x.db'}", webhook_secret=SecretStr("s"))
    with TestClient(create_app(settings)) as client:
        answer = client.get("/healthz")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}


def test_healthz_is_503_when_the_database_is_unreachable() -> None:
    settings = Settings(env="test", database_url="postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2")
    with TestClient(create_app(settings)) as client:
        answer = client.get("/healthz")
    assert answer.status_code == 503
    assert answer.json() == {"status": "database unreachable"}


def test_the_routes_are_mounted() -> None:
    paths = create_app(Settings(env="test", database_url="sqlite://")).openapi()["paths"]
    assert set(paths) == {
        "/healthz",
        "/readyz",
        "/metrics",
        "/webhooks/github",
        "/targets",
        "/targets/{name}",
        "/targets/{name}/findings",
        "/targets/{name}/findings/{key}",
        "/targets/{name}/findings/seed",
        "/overview",
        "/targets/{name}/commits",
        "/runs/{run_id}",
        "/runs/{run_id}/log",
        "/targets/{name}/commits/{sha}/rerun",
        "/targets/{name}/cases/{case_id}/history",
        "/compare",
        "/alerts",
        "/alerts/{alert_id}",
        "/alerts/{alert_id}/acknowledge",
        "/alerts/{alert_id}/resolve",
    }
    assert set(paths["/webhooks/github"]) == {"post"}


def test_the_api_docs_load_nothing_from_another_host() -> None:
    """/docs and /redoc work offline (issue 26: Swagger UI came from a CDN, a blank page without internet): every
    script and stylesheet they name is served by the application itself, and Swagger UI's is a 5.x release (it
    renders the OpenAPI 3.1 document FastAPI makes)."""
    with TestClient(create_app(Settings(env="test", database_url="sqlite://"))) as client:
        for page in ("/docs", "/redoc"):
            html = client.get(page)
            assert html.status_code == 200
            assets = re.findall(r'(?:src|href)="([^"]+)"', html.text)
            assert assets, html.text
            assert not [a for a in assets if "//" in a], assets
            for asset in assets:
                answer = client.get(asset)
                assert answer.status_code == 200, asset
                assert len(answer.content) > 1000, asset
        swagger = client.get(next(a for a in re.findall(r'src="([^"]+)"', client.get("/docs").text) if "swagger" in a)).text
        assert "OpenAPI31" in swagger
        assert client.get("/openapi.json").json()["openapi"].startswith("3.1")


def _metrics_status(tmp_path: Path, token: str | None, **settings: object) -> int:
    from service.auth import hash_token

    base = Settings(
        env="test",
        database_url=f"sqlite:///{tmp_path / 'm.db'}",
        api_read_token_hashes=[hash_token("reader")],
        **settings,  # type: ignore[arg-type]
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with TestClient(create_app(base)) as client:
        return client.get("/metrics", headers=headers).status_code


def test_metrics_follow_the_reads_unless_set(tmp_path: Path) -> None:
    """Issue 42: /metrics answered anonymously where reads required a token; now it follows the reads by default,
    and SPECWATCH_METRICS_PUBLIC decides either way."""
    assert _metrics_status(tmp_path, None) == 200  # reads open: metrics open
    assert _metrics_status(tmp_path, None, api_auth_reads=True) == 401
    assert _metrics_status(tmp_path, "wrong", api_auth_reads=True) == 401
    assert _metrics_status(tmp_path, "reader", api_auth_reads=True) == 200
    assert _metrics_status(tmp_path, None, api_auth_reads=True, metrics_public=True) == 200
    assert _metrics_status(tmp_path, None, metrics_public=False) == 401
    assert _metrics_status(tmp_path, "reader", metrics_public=False) == 200
