"""Known findings on the dashboard, over the seeded history (commits 4 and 5 fail ``FAILING_CASE``): the timeline
colours commits whose failures are all known apart from new failures (with a legend), and the run, case, alert
and findings pages link each known failure to its finding."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from service.app import create_app
from service.findings import add_finding
from service.models import Alert, Run
from service.settings import Settings
from tests.support.history import FAILING_CASE, TARGET, Seeded, seed_history

pytestmark = pytest.mark.integration

TITLE = "The toy sampler swaps its residual"
FINDING: dict[str, Any] = {
    "key": "toy-residual",
    "title": TITLE,
    "cases": ["direct/far_apart/*"],
    "link": "https://github.com/octo-org/toy/issues/7",
    "versions": ">=0.1",  # every run of the seeded history recorded library version 0.1
}
FINDING_HREF = f'href="/ui/targets/{TARGET}/findings#finding-toy-residual"'


class NoProducer:
    def send_run(self, run_id: int) -> None:
        raise AssertionError(f"nothing should be enqueued (run {run_id})")


@pytest.fixture
def client(rolled_back_factory: sessionmaker[Session]) -> TestClient:
    settings = Settings(env="test", database_url="postgresql+psycopg://unused", webhook_secret=SecretStr("x"))
    return TestClient(create_app(settings, session_factory=rolled_back_factory, producer=NoProducer()))


def seed(factory: sessionmaker[Session], **finding: Any) -> Seeded:
    with factory() as session:
        made = seed_history(session)
        if finding:
            add_finding(session, TARGET, finding)
        session.commit()
    return made


def rows(html: str) -> dict[str, str]:
    """Each timeline row's opening tag, by sha."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<tr id="([0-9a-f]+)" class="commit[^>]*>', html)}


def test_without_findings_failures_are_new(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    seeded = seed(rolled_back_factory)
    page = client.get(f"/ui/targets/{TARGET}").text
    assert 'id="legend"' in page
    assert "known-only" not in "".join(rows(page).values())
    assert "first-failing" in rows(page)[seeded.shas[4]]
    assert FINDING_HREF not in page


def test_known_only_commits_are_coloured_apart_and_linked(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    seeded = seed(rolled_back_factory, **FINDING)
    page = client.get(f"/ui/targets/{TARGET}")
    assert page.status_code == 200
    tags = rows(page.text)
    known = [order for order, sha in seeded.shas.items() if 'data-known-only="true"' in tags[sha]]
    assert known == [4, 5]
    assert {re.search(r'class="([^"]*)"', tags[seeded.shas[o]]).group(1) for o in known} == {"commit known-only"}  # no red
    assert page.text.count('<td class="known">failed (known)</td>') == 2
    assert "data-first-failing" not in "".join(tags.values())  # still the known bug: no streak of new failures starts
    assert '<span class="known">failed (known)</span>' in page.text  # the legend
    assert page.text.count(f'<a class="finding" {FINDING_HREF}>{TITLE}</a>') == 2  # one per known-only commit
    assert "known finding" in page.text  # the legend explains the colour


def test_a_commit_range_makes_only_its_commits_known(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    history = seed(rolled_back_factory)
    with rolled_back_factory() as session:
        commits = {"commit_from": history.shas[3], "commit_to": history.shas[4]}
        add_finding(session, TARGET, FINDING | {"key": "toy-range", "versions": None} | commits)
        session.commit()
    tags = rows(client.get(f"/ui/targets/{TARGET}").text)
    assert 'data-known-only="true"' in tags[history.shas[4]]
    assert "known-only" not in tags[history.shas[5]]  # past the range: a new failure
    # A streak of new failures starts at 5: the known-only failure before it does not count as one.
    assert [o for o, sha in history.shas.items() if 'data-first-failing="true"' in tags[sha]] == [5]


def test_run_case_alert_and_findings_pages_link_the_finding(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    seeded = seed(rolled_back_factory, **FINDING)
    run = client.get(f"/ui/runs/{seeded.runs[4]}").text
    assert run.count(FINDING_HREF) == 1  # the failing case only
    assert f'(known: <a class="finding" {FINDING_HREF}>{TITLE}</a>)' in run
    passing = client.get(f"/ui/runs/{seeded.runs[3]}").text
    assert FINDING_HREF not in passing

    case = client.get(f"/ui/targets/{TARGET}/cases/{FAILING_CASE}").text
    assert case.count(FINDING_HREF) == 2  # commits 4 and 5

    alert = client.get(f"/ui/alerts/{seeded.open_alert}").text
    (cases,) = re.findall(r'<ul id="alert-cases">(.*?)</ul>', alert)
    assert FAILING_CASE in cases
    assert FINDING_HREF in cases

    findings = client.get(f"/ui/targets/{TARGET}/findings")
    assert findings.status_code == 200
    assert 'id="finding-toy-residual"' in findings.text
    assert f'<a href="{FINDING["link"]}" rel="noreferrer">' in findings.text
    assert "&gt;=0.1" in findings.text
    assert client.get("/ui/targets/nope/findings").status_code == 404


def test_a_finding_of_one_distribution_makes_only_its_runs_known(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    seeded = seed(rolled_back_factory, **(FINDING | {"distributions": ["toy-cpu"]}))
    assert "known-only" not in "".join(rows(client.get(f"/ui/targets/{TARGET}").text).values())  # no run recorded one
    with rolled_back_factory() as session:
        for order, distribution in ((4, "toy-cpu"), (5, "toy")):
            run = session.get_one(Run, seeded.runs[order])
            run.library_distribution = distribution
        session.commit()
    tags = rows(client.get(f"/ui/targets/{TARGET}").text)
    assert [o for o, sha in seeded.shas.items() if 'data-known-only="true"' in tags[sha]] == [4]  # 5 is another build
    run = client.get(f"/ui/runs/{seeded.runs[4]}").text
    assert "library 0.1 (toy-cpu)" in run
    assert FINDING_HREF in run
    assert FINDING_HREF not in client.get(f"/ui/runs/{seeded.runs[5]}").text
    assert FINDING_HREF in client.get(f"/ui/alerts/{seeded.open_alert}").text  # detected by run 4
    assert client.get(f"/ui/targets/{TARGET}/cases/{FAILING_CASE}").text.count(FINDING_HREF) == 1
    findings = client.get(f"/ui/targets/{TARGET}/findings").text
    assert "<code>toy-cpu</code>" in findings


def test_a_document_link_is_shown_not_followed(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    seed(rolled_back_factory, **(FINDING | {"link": "docs/findings.md#toy"}))
    page = client.get(f"/ui/targets/{TARGET}/findings").text
    assert "<code>docs/findings.md#toy</code>" in page
    assert 'href="docs/findings.md' not in page


def test_an_alerts_case_that_now_fails_as_a_finding_says_so(client: TestClient, rolled_back_factory: sessionmaker[Session]) -> None:
    """A case whose alert's failure ended while it fails as a known finding: "fixed at", then the finding linked."""
    seeded = seed(rolled_back_factory, **FINDING)
    with rolled_back_factory() as session:
        alert = session.get_one(Alert, seeded.open_alert)
        alert.cases = [dict(e, fixed_sha=seeded.shas[5], fixed_order=5, now_fails_as={"finding": "toy-residual"}) for e in alert.cases]
        session.commit()
    page = client.get(f"/ui/alerts/{seeded.open_alert}").text
    (cases,) = re.findall(r'<ul id="alert-cases">(.*?)</ul>', page)
    assert f'fixed at <span class="sha">{seeded.shas[5][:12]}</span></span>; it now fails as known finding' in cases
    assert f'<a class="finding" {FINDING_HREF}>toy-residual</a>' in cases
