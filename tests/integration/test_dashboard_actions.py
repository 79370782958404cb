"""Signing in to the dashboard and acknowledging or resolving alerts from its pages, over HTTP on real
PostgreSQL: the session cookie's flags, CSRF on every form, clear refusals, sign-out, and the server-side
sessions of issue 28 (revoked at sign-out and with their token, no token digest in the cookie)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.auth import hash_token
from service.dashboard.session import SESSION_COOKIE, token_key
from service.db import session_scope
from service.models import Alert, AlertState, DashboardSession
from service.settings import Settings
from tests.support.history import Seeded, seed_history

pytestmark = pytest.mark.integration

WRITE_TOKEN = "dashboard-write-token"
READ_TOKEN = "dashboard-read-token"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


@pytest.fixture
def seeded(rolled_back_factory: sessionmaker[Session]) -> Seeded:
    with rolled_back_factory() as session:
        made = seed_history(session)
        session.commit()
    return made


@pytest.fixture
def make_client(rolled_back_factory: sessionmaker[Session]) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**changes: object) -> TestClient:
        fields: dict[str, object] = {
            "env": "test",
            "database_url": "postgresql+psycopg://unused",
            "webhook_secret": SecretStr("x"),
            "api_token_hashes": [hash_token(WRITE_TOKEN)],
            "api_read_token_hashes": [hash_token(READ_TOKEN)],
            "session_secret": SecretStr("a-test-session-secret"),
            **changes,
        }
        client = TestClient(create_app(Settings(**fields), session_factory=rolled_back_factory, producer=NoProducer()))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: Callable[..., TestClient], seeded: Seeded) -> TestClient:
    return make_client()


def state_of(factory: sessionmaker[Session], alert_id: int) -> AlertState:
    with factory() as session:
        alert = session.get(Alert, alert_id)
        assert alert is not None
        return alert.state


def sessions(factory: sessionmaker[Session]) -> list[DashboardSession]:
    with factory() as session:
        return list(session.scalars(select(DashboardSession).order_by(DashboardSession.id)))


def sign_in(client: TestClient, token: str = WRITE_TOKEN, next_page: str = "/ui/alerts") -> str:
    """Sign in through the form; the CSRF token of the signed-in pages."""
    form = client.get("/ui/login", params={"next": next_page})
    assert form.status_code == 200
    done = client.post("/ui/login", data={"token": token, "csrf": CSRF.findall(form.text)[0], "next": next_page}, follow_redirects=False)
    assert done.status_code == 303, done.text
    assert done.headers["location"] == next_page
    page = client.get(next_page)
    return CSRF.findall(page.text)[0]


def test_signing_in_sets_a_signed_httponly_samesite_cookie_without_the_token(client: TestClient) -> None:
    form = client.get("/ui/login")
    done = client.post("/ui/login", data={"token": WRITE_TOKEN, "csrf": CSRF.findall(form.text)[0]}, follow_redirects=False)
    cookie = done.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui"} <= flags
    assert "max-age=28800" in flags
    assert WRITE_TOKEN not in cookie
    # Signed: a cookie altered by one character is not a session.
    value = cookie.split(";")[0].split("=", 1)[1]
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, value)
    assert 'id="sign-out"' in client.get("/ui/alerts").text
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, value[:-2] + ("AA" if value[-2:] != "AA" else "BB"))
    assert 'id="sign-out"' not in client.get("/ui/alerts").text


def test_an_anonymous_reader_gets_no_cookie_and_no_buttons(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/ui/alerts")
    assert "set-cookie" not in page.headers
    assert 'class="acknowledge"' not in page.text
    assert 'href="/ui/login?next=/ui/alerts"' in page.text


def test_sign_in_then_acknowledge_and_resolve_from_the_pages(
    client: TestClient, seeded: Seeded, rolled_back_factory: sessionmaker[Session]
) -> None:
    csrf = sign_in(client)
    alerts = client.get("/ui/alerts", params={"state": "open"})
    assert alerts.text.count('class="acknowledge"') == 1  # the one open alert; the resolved one has no buttons
    # Each form sends its CSRF token and returns to the page it is on.
    assert alerts.text.count(f'name="csrf" value="{csrf}"') == 3  # acknowledge, resolve, sign out
    assert alerts.text.count('name="next" value="/ui/alerts?state=open"') == 2
    done = client.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf, "next": "/ui/alerts"}, follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (303, "/ui/alerts")
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.acknowledged
    # From the alert's own page: resolve, back to that page, which shows the new state.
    page = client.get(f"/ui/alerts/{seeded.open_alert}")
    assert 'class="resolve"' in page.text
    assert 'class="acknowledge"' not in page.text  # already acknowledged
    done = client.post(f"/ui/alerts/{seeded.open_alert}/resolve", data={"csrf": csrf, "next": f"/ui/alerts/{seeded.open_alert}"})
    assert done.status_code == 200
    assert '<td class="state" id="alert-state">resolved</td>' in done.text
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.resolved


def test_no_session_no_action(client: TestClient, seeded: Seeded, rolled_back_factory: sessionmaker[Session]) -> None:
    done = client.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": "anything"})
    assert done.status_code == 401
    assert "Sign in with a write token" in done.text
    # A bearer token is the API's way, not the dashboard's: the form still refuses.
    done = client.post(
        f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": "x"}, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}
    )
    assert done.status_code == 401
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.open


@pytest.mark.parametrize("sent", ["", "not-the-session-token"])
def test_a_bad_csrf_token_is_refused_with_a_clear_error(
    client: TestClient, seeded: Seeded, rolled_back_factory: sessionmaker[Session], sent: str
) -> None:
    sign_in(client)
    done = client.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": sent} if sent else {})
    assert done.status_code == 403
    assert "security token (CSRF) does not match your session" in done.text
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.open


def test_a_csrf_token_of_another_session_is_refused(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    other = make_client()
    theirs = sign_in(other)
    mine = make_client()
    sign_in(mine)
    assert mine.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": theirs}).status_code == 403


def test_the_login_form_needs_its_csrf_token(client: TestClient) -> None:
    client.get("/ui/login")
    done = client.post("/ui/login", data={"token": WRITE_TOKEN, "csrf": "forged"}, follow_redirects=False)
    assert done.status_code == 403
    assert "security token (CSRF)" in done.text
    assert "set-cookie" not in done.headers or "sign out" not in client.get("/ui/alerts").text


def test_a_bad_token_is_refused_with_a_clear_error(client: TestClient) -> None:
    form = client.get("/ui/login")
    done = client.post("/ui/login", data={"token": "wrong", "csrf": CSRF.findall(form.text)[0]}, follow_redirects=False)
    assert done.status_code == 401
    assert "That is not a valid API token" in done.text
    assert 'id="sign-out"' not in client.get("/ui/alerts").text


def test_a_read_only_session_may_read_but_not_act(client: TestClient, seeded: Seeded, rolled_back_factory: sessionmaker[Session]) -> None:
    csrf = sign_in(client, READ_TOKEN)
    page = client.get("/ui/alerts")
    assert "signed in (read-only)" in page.text
    assert 'class="acknowledge"' not in page.text
    done = client.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf})
    assert done.status_code == 403
    assert "read-only token" in done.text
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.open


def test_sign_out_clears_the_session(client: TestClient, seeded: Seeded, rolled_back_factory: sessionmaker[Session]) -> None:
    csrf = sign_in(client)
    done = client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert (done.status_code, done.headers["location"]) == (303, "/ui")
    assert "expires=thu, 01 jan 1970" in done.headers["set-cookie"].lower()
    assert 'id="sign-in"' in client.get("/ui/alerts").text
    # The old CSRF token and whatever the browser still sends act no more.
    assert client.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf}).status_code == 401
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.open


def test_a_revoked_token_ends_its_session_for_good(
    make_client: Callable[..., TestClient], seeded: Seeded, rolled_back_factory: sessionmaker[Session]
) -> None:
    before = make_client()
    csrf = sign_in(before)
    # The same cookie against a server whose settings no longer list the token.
    after = make_client(api_token_hashes=[])
    after.cookies = before.cookies
    assert after.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf}).status_code == 401
    assert [(r.revoked_reason, r.revoked_at is not None) for r in sessions(rolled_back_factory)] == [("token revoked", True)]
    # The token configured again does not revive the session: it was revoked on the server.
    again = make_client()
    again.cookies = before.cookies
    assert again.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf}).status_code == 401
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.open


def test_a_cookie_saved_before_sign_out_acts_no_more(
    client: TestClient, seeded: Seeded, rolled_back_factory: sessionmaker[Session]
) -> None:
    """Issue 28's probe: the cookie copied before sign-out, sent again after it."""
    csrf = sign_in(client)
    saved = client.cookies[SESSION_COOKIE]
    assert client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, saved)
    assert 'id="sign-out"' not in client.get("/ui/alerts").text
    done = client.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf})
    assert done.status_code == 401
    assert state_of(rolled_back_factory, seeded.open_alert) is AlertState.open
    assert [r.revoked_reason for r in sessions(rolled_back_factory)] == ["signed out"]


def test_the_cookie_holds_a_session_id_and_no_token_digest(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    sign_in(client)
    value = client.cookies[SESSION_COOKIE]
    data = value.split(".")[0]
    content = json.loads(base64.b64decode(data + "=" * (-len(data) % 4)))
    assert set(content) == {"sid", "csrf"}
    assert hash_token(WRITE_TOKEN) not in value
    assert hash_token(WRITE_TOKEN) not in json.dumps(content)
    (row,) = sessions(rolled_back_factory)
    # The row names the token by a key under the session secret, not by its SHA-256; the session id by its SHA-256.
    assert row.token_key == token_key("a-test-session-secret", hash_token(WRITE_TOKEN))
    assert row.token_key != hash_token(WRITE_TOKEN)
    assert row.id_digest == hashlib.sha256(content["sid"].encode()).hexdigest()
    assert row.expires_at - row.created_at == timedelta(hours=8)


def test_an_expired_session_counts_for_nothing(client: TestClient, seeded: Seeded, rolled_back_factory: sessionmaker[Session]) -> None:
    csrf = sign_in(client)
    with session_scope(rolled_back_factory) as session:
        (row,) = session.scalars(select(DashboardSession))
        row.expires_at = datetime.now(UTC) - timedelta(seconds=1)
    assert client.post(f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf}).status_code == 401


def test_resolving_a_resolved_alert_is_a_no_op_and_acknowledging_it_a_conflict(client: TestClient, seeded: Seeded) -> None:
    csrf = sign_in(client)
    done = client.post(f"/ui/alerts/{seeded.resolved_alert}/acknowledge", data={"csrf": csrf})
    assert done.status_code == 409
    assert "only an open alert can be acknowledged" in done.text
    assert client.post("/ui/alerts/999999/resolve", data={"csrf": csrf}).status_code == 404


def test_next_never_leaves_the_dashboard(client: TestClient, seeded: Seeded) -> None:
    csrf = sign_in(client)
    done = client.post(
        f"/ui/alerts/{seeded.open_alert}/acknowledge", data={"csrf": csrf, "next": "https://evil.example/"}, follow_redirects=False
    )
    assert done.headers["location"] == "/ui"


def test_with_read_auth_a_browser_is_sent_to_sign_in_and_a_session_reads(make_client: Callable[..., TestClient], seeded: Seeded) -> None:
    client = make_client(api_auth_reads=True)
    first = client.get("/ui/alerts?state=open", follow_redirects=False)
    assert (first.status_code, first.headers["location"]) == (303, "/ui/login?next=%2Fui%2Falerts%3Fstate%3Dopen")
    assert client.get("/ui/style.css").status_code == 200
    sign_in(client, READ_TOKEN, next_page="/ui/alerts?state=open")
    assert client.get("/ui/alerts").status_code == 200
    assert client.get("/ui/alerts", headers={"Authorization": "Bearer wrong"}).status_code == 200  # the session suffices
    assert make_client(api_auth_reads=True).get("/ui/alerts", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_without_a_session_secret_outside_dev_sign_in_is_off(make_client: Callable[..., TestClient]) -> None:
    client = make_client(env="prod", session_secret=SecretStr(""))
    form = client.get("/ui/login")
    assert "Sign-in is off on this server" in form.text
    done = client.post("/ui/login", data={"token": WRITE_TOKEN, "csrf": CSRF.findall(form.text)[0] if CSRF.findall(form.text) else ""})
    assert done.status_code in (403, 503)
