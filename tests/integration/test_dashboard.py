"""The dashboard's pages rendered from a seeded history on real PostgreSQL: the timeline marks the first
failing commit, the case page's SVG charts have points, the run and alerts pages list what they should."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.dashboard.charts import Chart, Series, render
from service.models import RELEASES_BRANCH, Alert, AlertKind, Commit, InstallMode, Run, RunStatus, Target
from service.settings import Settings
from tests.support.history import CASES, FAILING_CASE, TARGET, Seeded, seed_history

pytestmark = pytest.mark.integration

POINT = re.compile(r"-?\d+(?:\.\d+)?,-?\d+(?:\.\d+)?")


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


@pytest.fixture
def client(rolled_back_factory: sessionmaker[Session]) -> TestClient:
    settings = Settings(env="test", database_url="postgresql+psycopg://unused", webhook_secret=SecretStr("x"))
    return TestClient(create_app(settings, session_factory=rolled_back_factory, producer=NoProducer()))


@pytest.fixture
def seeded(rolled_back_factory: sessionmaker[Session]) -> Seeded:
    with rolled_back_factory() as session:
        made = seed_history(session)
        session.commit()
    return made


def series_points(html: str) -> list[int]:
    """The number of points of each ``<path class="series">`` in ``html``."""
    return [len(POINT.findall(d)) for d in re.findall(r'<path class="series" d="([^"]*)"', html)]


def test_overview_lists_the_target(client: TestClient, seeded: Seeded) -> None:
    page = client.get("/ui")
    assert page.status_code == 200
    assert f'href="/ui/targets/{TARGET}"' in page.text
    assert seeded.shas[8][:12] in page.text


def test_timeline_marks_the_first_failing_commit(client: TestClient, seeded: Seeded) -> None:
    page = client.get(f"/ui/targets/{TARGET}")
    assert page.status_code == 200
    marked = re.findall(r'data-sha="([0-9a-f]+)"[^>]*data-first-failing="true"', page.text)
    assert marked == [seeded.shas[4]]
    assert page.text.count('data-status="failed"') == 2
    assert all(f"/cases/{case}" in page.text for case in CASES)
    assert f"alert {seeded.open_alert}: violation (open)" in page.text


def test_case_page_draws_three_non_empty_charts(client: TestClient, seeded: Seeded) -> None:
    page = client.get(f"/ui/targets/{TARGET}/cases/{FAILING_CASE}")
    assert page.status_code == 200
    assert page.text.count("<svg") == 3
    # log E relative to the threshold, TV, acceptance observed and expected: one point per commit with results (6).
    assert series_points(page.text) == [6, 6, 6, 6]
    assert page.text.count('<line class="rule"') == 1  # the threshold
    assert page.text.count('class="fail-mark"') == 3 * 2
    assert 'class="band"' in page.text


def test_run_and_alerts_pages(client: TestClient, seeded: Seeded) -> None:
    run = client.get(f"/ui/runs/{seeded.runs[4]}")
    assert run.status_code == 200
    assert all(case in run.text for case in CASES)
    # Against commit 3: the failing case's output changed, the others did not.
    assert f'vs <a href="/ui/runs/{seeded.runs[3]}">' in run.text
    assert run.text.count('<td class="behaviour"') == len(CASES)
    assert (run.text.count(">changed</td>"), run.text.count(">unchanged</td>")) == (1, len(CASES) - 1)
    alerts = client.get("/ui/alerts", params={"state": "open"})
    assert alerts.status_code == 200
    assert alerts.text.count('<tr class="alert open"') == 1


def test_alerts_page_shows_unresolved_alerts_by_default_with_a_target_filter(client: TestClient, seeded: Seeded) -> None:
    """Issue 26: the alerts page lists the alerts not resolved by default (a resolved one only on asking), and
    filters by target."""
    default = client.get("/ui/alerts").text
    assert f'id="alert-{seeded.open_alert}"' in default
    assert f'id="alert-{seeded.resolved_alert}"' not in default
    assert "not resolved (open or acknowledged)" in default
    assert f'<option value="{TARGET}">{TARGET}</option>' in default
    every = client.get("/ui/alerts", params={"state": "all"}).text
    assert f'id="alert-{seeded.resolved_alert}"' in every
    assert f'id="alert-{seeded.open_alert}"' in every
    resolved = client.get("/ui/alerts", params={"state": "resolved", "target": TARGET}).text
    assert (f'id="alert-{seeded.resolved_alert}"' in resolved, f'id="alert-{seeded.open_alert}"' in resolved) == (True, False)
    assert f'<option value="{TARGET}" selected>' in resolved
    assert client.get("/ui/alerts", params={"target": "nope"}).status_code == 404
    assert client.get("/ui/alerts", params={"state": "closed"}).status_code == 400
    assert f'id="alert-{seeded.open_alert}"' in client.get("/ui/alerts", params={"target": ""}).text


def test_dashboard_404s(client: TestClient, seeded: Seeded) -> None:
    assert client.get("/ui/targets/nope").status_code == 404
    assert client.get("/ui/runs/999999999").status_code == 404
    assert client.get(f"/ui/targets/{TARGET}/cases/no/such").status_code == 404
    assert client.get(f"/ui/targets/{TARGET}", params={"cursor": "x"}).status_code == 400


def test_empty_chart_says_no_data() -> None:
    svg = render(Chart(title="t <x>", labels=[], series=[Series("s", [], "#000")]))
    assert "no data" in svg
    assert "t &lt;x&gt;" in svg


def test_a_release_that_could_not_be_installed_shows_as_its_own_kind(
    client: TestClient, rolled_back_factory: sessionmaker[Session]
) -> None:
    """The API and the dashboard say "could not install" and name the requirement, never "broken"."""
    error = (
        "could not install: kernels<0.20,>=0.19.1 (no distribution on the package index satisfies it, needed by "
        "transformers==5.25.0); gave up after 7 attempts since 2026-01-01 00:00 UTC"
    )
    with rolled_back_factory() as session:
        target = Target(name="tf", repo_url="https://github.com/huggingface/transformers", adapter="transformers", branches=[])
        target.install_mode = InstallMode.pip
        commit = Commit(target=target, sha="release:5.25.0", branch=None, branch_order=1)
        run = Run(commit=commit, profile="smoke", status=RunStatus.uninstallable, attempt=7, install_failures=7, error=error)
        session.add(run)
        session.flush()
        entry = {"case_id": "(install)", "reason": "uninstallable", "requirement": "kernels<0.20,>=0.19.1", "error": error}
        alert = Alert(
            target=target,
            branch=RELEASES_BRANCH,
            first_bad_commit=commit,
            kind=AlertKind.uninstallable,
            detected_run_id=run.id,
            cases=[entry],
            summary="could not install tf release:5.25.0: kernels<0.20,>=0.19.1",
        )
        session.add(alert)
        session.commit()
        run_id, alert_id = run.id, alert.id

    api_run = client.get(f"/runs/{run_id}").json()
    assert (api_run["status"], api_run["install_failures"]) == ("uninstallable", 7)
    (api_alert,) = client.get("/alerts", params={"kind": "uninstallable"}).json()
    assert (api_alert["id"], api_alert["kind"]) == (alert_id, "uninstallable")
    assert api_alert["cases"][0]["requirement"] == "kernels<0.20,>=0.19.1"
    alerts = client.get("/ui/alerts").text
    assert re.search(rf'id="alert-{alert_id}">.*?<td class="kind">could not install</td>', alerts, re.S)
    assert "kernels&lt;0.20,&gt;=0.19.1" in alerts
    page = client.get(f"/ui/alerts/{alert_id}").text
    assert '<td id="not-installed"><code>kernels&lt;0.20,&gt;=0.19.1</code>' in page
    run_page = client.get(f"/ui/runs/{run_id}").text
    assert '<span class="uninstallable">uninstallable</span>' in run_page
    assert "7 attempt(s): gave up (not a test result: nothing was tested)" in run_page
