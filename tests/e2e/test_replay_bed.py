"""Issue 37's replay bed, all real: a library's releases laid out as its git history by scripts/replay_history.py, watched
by ``specwatch serve`` in source mode (policy ``every``, one signed push per release), alerts and fixes checked against
what each release is known to do.

The library is our toy sampler, released four times on a local package index as source distributions: 1.0 correct,
1.1 the swapped residual (a statistical violation of losslessness), 1.2 another bug in the same cases (every emitted
token past the vocabulary: a certain violation), 1.3 correct again. What the monitor must say: an alert at 1.1; a new
alert at 1.2 for cases already failing, because they fail otherwise (its search stays where they were failing, so it
names 1.2, not 1.1), which ends the first alert's failure there (its cases fixed at 1.2, now failing as the second
alert; the first alert resolved at 1.2); the second alert's cases fixed at 1.3, and it resolved there.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.models import Alert, AlertKind, AlertState, Commit, Run, RunPurpose
from tests.e2e.conftest import wait_for
from tests.e2e.test_serve import API_TOKEN, FINISHED, SECRET, Served, sqlite_factory, sqlite_url, start_serve
from tests.support.github import REPO_URL, ZERO_SHA, post_webhook, push_payload
from tests.support.package_index import PackageIndex, serve
from tests.support.toy_target import ADAPTER, CORRECT, SWAPPED_RESIDUAL, ToyRepo
from tests.unit.test_replay_history import sdist

# Four releases, six suite runs (four commits, two confirmations) under serve: about a minute.
pytestmark = pytest.mark.slow

__all__ = ["sqlite_factory", "sqlite_url", "start_serve"]  # the fixtures of test_serve.py, used here

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "replay_history.py"

# Every emitted token one past the vocabulary: impossible under any law (a certain violation), in every trial.
PAST_THE_VOCABULARY = CORRECT.replace(
    "    return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=n_accepted)\n",
    "    tokens[torch.arange(n, device=device), n_accepted] = p.shape[1]\n"
    "    return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=n_accepted)\n",
    1,
)
assert PAST_THE_VOCABULARY != CORRECT
RELEASES = {"1.0": CORRECT, "1.1": SWAPPED_RESIDUAL, "1.2": PAST_THE_VOCABULARY, "1.3": CORRECT}


@pytest.fixture
def toy_repo(tmp_path: Path) -> ToyRepo:
    """The replay bed: the toy library's releases, published as source distributions on a local index, laid out as its
    history by the real script (one commit per release, tagged). ``start_serve`` fetches ``REPO_URL`` from it."""
    repo = tmp_path / "history"
    with serve(PackageIndex()) as index:
        for version, sampler in RELEASES.items():
            files = {"src/toy_lib/__init__.py": '"""A toy speculative-decoding library."""\n', "src/toy_lib/sampler.py": sampler}
            index.publish("toy-lib", version, wheel=sdist(tmp_path / "dist", version, files))
        cmd = [sys.executable, str(SCRIPT), "toy-lib", *RELEASES, "--out", str(repo), "--index-url", f"{index.url}/simple"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return ToyRepo(repo)


def _commits(repo: ToyRepo) -> dict[str, str]:
    log = subprocess.run(
        ["git", "-C", str(repo.path), "log", "--reverse", "--format=%H %s", "main"], capture_output=True, text=True, check=True
    )
    return {line.split()[-1]: line.split()[0] for line in log.stdout.splitlines()}  # version -> sha


def _settled(factory: sessionmaker[Session], primaries: int) -> bool:
    """``primaries`` primary runs, and every run finished and analysed (nothing left to queue)."""
    with factory() as session:
        runs = session.scalars(select(Run)).all()
    return sum(r.purpose is RunPurpose.primary for r in runs) >= primaries and all(r.status in FINISHED and r.analysed_at for r in runs)


def test_a_replayed_history_alerts_each_regression_at_its_release_and_reports_each_fix(
    start_serve: Callable[..., Served], sqlite_factory: sessionmaker[Session], toy_repo: ToyRepo
) -> None:
    versions = _commits(toy_repo)
    assert list(versions) == list(RELEASES)
    served = start_serve(SPECWATCH_WORKER_SOURCE_DEPENDENCIES="false")  # the toy library needs nothing installed
    started = time.monotonic()
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    with httpx.Client(base_url=served.url, timeout=30) as client:
        target = {"name": "toy-lib", "repo_url": REPO_URL, "branches": ["main"], "adapter": ADAPTER, "commit_policy": "every"}
        assert client.post("/targets", json=target, headers=auth).status_code == 201
        before = ZERO_SHA
        for count, version in enumerate(RELEASES, start=1):  # one signed push per release, at a human pace
            answer = post_webhook(client, SECRET, "push", push_payload(toy_repo.path, before, versions[version]))
            assert answer.status_code == 202, answer.text
            before = versions[version]
            wait_for(
                lambda n=count: _settled(sqlite_factory, n) or served.proc.poll() is not None,
                timeout=240,
                what=f"{version}'s runs",
                logs=served.output,
            )
            assert served.proc.poll() is None, served.output()
        api = client.get("/alerts", params={"state": "resolved"}, headers=auth).json()
    elapsed = time.monotonic() - started

    with sqlite_factory() as session:
        ids = {row.sha: row.id for row in session.execute(select(Commit.sha, Commit.id))}
        first, second = session.scalars(select(Alert).order_by(Alert.id)).all()
        runs = session.scalars(select(Run).order_by(Run.id)).all()
        by_commit = {sha: [(r.purpose.value, r.status.value) for r in runs if r.commit_id == ids[sha]] for sha in versions.values()}
    report = {v: by_commit[sha] for v, sha in versions.items()}
    assert report == {
        "1.0": [("primary", "passed")],
        "1.1": [("primary", "failed"), ("confirmation", "failed")],
        "1.2": [("primary", "failed"), ("confirmation", "failed")],
        "1.3": [("primary", "passed")],
    }, report
    # 1.1: the swapped residual, statistical; alerted at its own release, the last good one before it.
    assert (first.kind, first.confirmed, first.first_bad_commit_id, first.last_good_commit_id) == (
        AlertKind.violation,
        True,
        ids[versions["1.1"]],
        ids[versions["1.0"]],
    )
    assert {e["signature"]["evidence"] for e in first.cases} == {"statistical"}
    # 1.2: the same cases, failing otherwise (certain): a new alert at 1.2, confirmed by replaying the counterexample.
    assert (second.kind, second.confirmed, second.first_bad_commit_id) == (AlertKind.violation, True, ids[versions["1.2"]])
    assert {e["case_id"] for e in second.cases} == {e["case_id"] for e in first.cases}
    assert {(e["signature"]["evidence"], e["supersedes"]["evidence"], e["confirmed_by"]) for e in second.cases} == {
        ("certain", "statistical", "counterexample replayed")
    }
    # The 1.1 failure ended at 1.2, where its cases began failing otherwise: each of them fixed there, "now failing" as
    # the second alert, and the first alert resolved there. 1.3 fixes the second: its cases fixed, it resolves there.
    assert (first.state, first.resolved_by_commit_id) == (AlertState.resolved, ids[versions["1.2"]])
    assert {(e["fixed_sha"], e["now_fails_as"]["alert"]) for e in first.cases} == {(versions["1.2"], second.id)}
    assert (second.state, second.resolved_by_commit_id) == (AlertState.resolved, ids[versions["1.3"]])
    assert {e["fixed_sha"] for e in second.cases} == {versions["1.3"]}
    assert all("now_fails_as" not in e for e in second.cases)
    assert sorted((a["id"], a["resolved_sha"], sorted({c["fixed_sha"] for c in a["cases"]})) for a in api) == [
        (first.id, versions["1.2"], [versions["1.2"]]),
        (second.id, versions["1.3"], [versions["1.3"]]),
    ]
    for alert in (first, second):
        signatures = sorted({(e["signature"]["evidence"], e["signature"]["check"], str(e["signature"]["tv"])) for e in alert.cases})
        print(
            f"alert {alert.id}: {[e['case_id'] for e in alert.cases]} {signatures} confirmed by {[e['confirmed_by'] for e in alert.cases]}"
        )
    print(f"replay bed: 4 releases, runs {report}, alerts at 1.1 (resolved at 1.2) and 1.2 (resolved at 1.3), {elapsed:.0f} s under serve")
