"""``/metrics`` on the embedded default's SQLite (issue 26): the durations are computed in SQLite's dialect too, and
the queue's age, the outbox backlog and the poll errors are read from its database."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.orm import sessionmaker

from service.app import create_app
from service.db import make_engine, session_scope
from service.models import CaseResult, Commit, PollKind, PollState, Run, RunStatus, Target, Verdict
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def test_metrics_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'specwatch.db'}"
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", url)
    config.attributes["configure_logging"] = False
    command.upgrade(config, "head")
    engine = make_engine(url)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    now = datetime.now(UTC)
    with session_scope(factory) as session:
        target = Target(name="toy", repo_url="/srv/toy", adapter="toy:f", branches=["main"])
        done = Run(
            commit=Commit(target=target, sha="a" * 40, branch="main", branch_order=1),
            profile="smoke",
            status=RunStatus.passed,
            started_at=now - timedelta(seconds=250),
            finished_at=now - timedelta(seconds=10),
        )
        waiting = Run(
            commit=Commit(target=target, sha="b" * 40, branch="main", branch_order=2), profile="smoke", queued_at=now - timedelta(minutes=3)
        )
        session.add_all([done, waiting])
        session.flush()
        session.add(CaseResult(run_id=done.id, case_id="c", verdict=Verdict.PASS, duration_s=0.3))
        session.add(PollState(target_id=target.id, kind=PollKind.branch, ref="main", polled_at=now, error="host not found"))
    settings = Settings(env="test", database_url=url, webhook_secret=SecretStr("s"))
    try:
        with TestClient(create_app(settings, session_factory=factory)) as client:
            text = client.get("/metrics").text
    finally:
        engine.dispose()

    def value(series: str) -> float:
        found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
        assert found is not None, series
        return float(found[1])

    assert value('specwatch_run_duration_seconds_bucket{le="120.0",status="passed"}') == 0
    assert value('specwatch_run_duration_seconds_bucket{le="300.0",status="passed"}') == 1
    assert 239 <= value('specwatch_run_duration_seconds_sum{status="passed"}') <= 241
    assert value('specwatch_case_duration_seconds_bucket{le="0.5"}') == 1
    assert 170 <= value('specwatch_queue_oldest_age_seconds{target="toy"}') < 3600
    assert value('specwatch_poll_failing{kind="branch",ref="main",target="toy"}') == 1
    assert value('specwatch_outbox_backlog{channel="github",state="due"}') == 0
