# A script that talks to its user (pyproject gives scripts/ no per-file ignores yet):
# ruff: noqa: T201
"""The dashboard's screenshots in docs/screenshots/, made again from nothing with one command.

    .venv/bin/python scripts/screenshots.py --out docs/screenshots

What it needs: a PostgreSQL server it may create a database on (``--postgres``, default
``$SPECWATCH_TEST_POSTGRES_URL`` or ``postgresql+psycopg://postgres@127.0.0.1:5432/test``, the test suite's
server), and headless Chromium with its chromedriver (Debian's ``chromium`` and ``chromium-driver``;
``scripts/test-deps.sh --tools`` installs them). No Redis, no network: nothing is enqueued.

It creates a scratch database (``specwatch_screens_<random>``, dropped at the end), migrates it to head and
seeds an illustrative history through the project's own code paths, the way a worker would have written it:
targets added with their shipped known findings (:func:`service.targets.add_target`), commits and runs
recorded (:mod:`service.ingest`), each run claimed and its results stored (:mod:`workers.runs`) and analysed
(:func:`workers.analysis.run.analyse`: confirmation runs, alerts). Only the case results are made up here:
figures shaped like the suite's output (thresholds, e-values, TV intervals, acceptance), drawn from a fixed seed,
so every run of this script draws the same pictures. The story is illustrative, not a record of transformers:

- ``transformers-main``, branch ``main``, 12 commits at 5.26.0.dev0, a subset of the catalogue's cases.
  Commits 1-3 pass. Commit 4 adds the Gemma 4 assistant with its known bug (shipped finding
  ``gemma4-assistant-greedy-draft-softmax-q``): the first run opens a violation alert, confirmed, that links the
  finding, and a maintainer acknowledges it; commits 4-8 fail only on that finding ("failed (known)").
  Commit 9 applies top-p to the target twice: a new violation (open alert, confirmed); 10-11 still fail; 12 is
  queued.
- ``transformers`` (releases, pip): 5.25.0 cannot be installed (a dependency missing from the index), attempt
  after attempt: an uninstallable alert, not a broken release.
- ``transformers-nightly`` (``scripts/screenshots_ops.py``): its last poll failed (host not found), a commit breaks
  the suite (a broken-commit alert with the error, the run and its log), a run waits in the queue.

Then it serves the dashboard (uvicorn in a thread), signs in through the login form with a write token and saves
seven PNGs, 1400 px wide and as tall as each page: ``timeline.png``, ``case.png``, ``alerts.png``,
``alert.png`` (the acknowledged alert that links its known finding), ``findings.png``, ``target-poll-error.png``
(``transformers-nightly``'s page: the poll error, the queue, the last run's error) and ``error-alert.png`` (its
broken-commit alert).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import uvicorn  # noqa: E402
from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from sqlalchemy import create_engine, make_url, select, text  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from service.app import create_app  # noqa: E402
from service.auth import hash_token  # noqa: E402
from service.db import make_engine, session_scope  # noqa: E402
from service.ingest import NewCommit, RunOptions, queue_runs, record_commits  # noqa: E402
from service.models import Alert, AlertKind, AlertState, Commit, Run, RunStatus, Target  # noqa: E402
from service.alerts import set_alert_state  # noqa: E402
from service.releases import release_sha  # noqa: E402
from service.settings import Environment, Settings  # noqa: E402
from service.targets import add_target, make_spec  # noqa: E402
from workers.analysis.context import AnalysisConfig  # noqa: E402
from workers.analysis.run import analyse  # noqa: E402
from workers.runs import InstallRetry, RunOutcome, RunSpec, claim_run, record_install_failure, record_outcome  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from screenshots_ops import NIGHTLY, seed_operations  # noqa: E402

from specwatch.protocol import Acceptance, CaseResult, Failure, Verdict  # noqa: E402
from specwatch.targets.install import InstallError  # noqa: E402

MAIN, RELEASES = "transformers-main", "transformers"
VERSION = "5.26.0.dev0"
PROFILE = "quick"
T0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
ALPHA, TESTS = 1e-4, 41  # the run's Bonferroni budget: threshold m/α
THRESHOLD = TESTS / ALPHA
DEVICE = "cuda:NVIDIA H100 80GB HBM3"
WIDTH = 1400

# The cases of each run: (description, expected acceptance per trial, or None where the case has no exact K law).
CASES: dict[str, tuple[str, float | None]] = {
    "direct/far_apart/V8/g1": ("peaked, far-apart p and q (Dirichlet 0.3), one draft", 0.334),
    "direct/close/V64/g5": ("draft = target logits + N(0, 1): a realistic drafter, five drafts", 1.455),
    "direct/near_identical/V64/g5": ("draft = target logits + N(0, 0.1^2): acceptance near 1, five drafts", 4.62),
    "direct/temperature_target/V64/g3": ("draft = target + N(0, 1) noise; temperature 0.7 on the target only", 0.912),
    "direct/top_p_target/V64/g3": ("top-p 0.9 on the target only", 1.208),
    "direct/transformers_target_distribution/V10/g3": ("transformers' test_speculative_sampling_target_distribution fixture", 0.806),
    "edge/all_accept/V64/g3/u_max": ("p == q: every draft accepted; every uniform just below 1 (deterministic)", 3.0),
    "edge/q_zero_where_p/V64/g3/u_max": ("q = 0 where p > 0: the residual covers it; every uniform just below 1", None),
    "e2e/assistant_model/processed": ("assistant model with the same tokenizer (temperature 2, top-k 4, top-p 0.7)", None),
    "e2e/prompt_lookup/processed": ("prompt lookup decoding (temperature 2, top-k 4, top-p 0.7)", None),
    "e2e/greedy/assistant_model": ("do_sample=False: assisted output equals plain greedy output exactly (64 prompts)", None),
    "e2e/gemma4_assistant/processed": ("model-specific assistant: a tiny Gemma4AssistantForCausalLM drafts 2 tokens", None),
    "e2e/greedy/gemma4_assistant": ("do_sample=False with the Gemma 4 assistant", None),
}
CASE_PAGE = "direct/top_p_target/V64/g3"
GEMMA_FROM, TOP_P_BUG_FROM, QUEUED = 4, 9, 12
# (message, author) of main's commits, oldest first.
COMMITS = (
    ("Fix typo in the generation strategies docs", "Mira K."),
    ("[generation] Simplify the candidate generator registry", "Jonas P."),
    ("Bump the tokenizers minimum version", "Lea S."),
    ("Add the Gemma 4 assistant model for speculative decoding", "Tomas R."),
    ("Gemma 4 assistant: docs and examples", "Tomas R."),
    ("Faster attention mask creation in assisted generation", "Jonas P."),
    ("[tests] Mark slow generation tests", "Lea S."),
    ("Cache the processed target logits between rounds", "Mira K."),
    ("Apply top-p to the target probabilities in _speculative_sampling", "Jonas P."),
    ("Update the Llama conversion script", "Lea S."),
    ("Remove deprecated generation arguments", "Mira K."),
    ("Refactor the logits processor list", "Tomas R."),
)


def sha_of(label: str) -> str:
    return hashlib.sha1(label.encode(), usedforsecurity=False).hexdigest()


# --------------------------------------------------------------------------------------------- case results
@dataclass(frozen=True)
class Behaviour:
    """How one case behaves at a commit: skipped (not in this version), or failing with TV ``tv`` (0: lossless)."""

    skipped: bool = False
    tv: float = 0.0


def behaviour(order: int, case_id: str) -> Behaviour:
    if "gemma4" in case_id and order < GEMMA_FROM:
        return Behaviour(skipped=True)
    if case_id == "e2e/gemma4_assistant/processed":
        return Behaviour(tv=0.21)
    if order >= TOP_P_BUG_FROM and case_id in ("direct/top_p_target/V64/g3", "e2e/assistant_model/processed"):
        return Behaviour(tv=0.083 if case_id.startswith("direct") else 0.11)
    return Behaviour()


def case_result(sha: str, order: int, case_id: str, attempt: int) -> CaseResult:
    """A result shaped like the suite's (schema 2) for ``case_id`` at commit ``order``, drawn from a fixed seed."""
    description, expected = CASES[case_id]
    rng = random.Random(sha_of(f"{sha}/{case_id}/{attempt}"))  # noqa: S311 - figures for pictures, not secrets
    seed = int(sha_of(f"seed/{sha}/{case_id}/{attempt}")[:15], 16)
    how = behaviour(order, case_id)
    fingerprint = sha_of(f"{case_id}/{how}")[:16]
    common: dict[str, Any] = {
        "case_id": case_id,
        "family": case_id.split("/", maxsplit=1)[0],
        "description": description,
        "threshold": THRESHOLD,
        "counts_digest": sha_of(f"counts/{seed}")[:16],
        "fingerprint": fingerprint,
        "seed": seed,
        "attempt": attempt,
        "device": DEVICE,
    }
    deterministic = case_id.startswith(("edge/", "e2e/greedy/"))
    if how.skipped:
        return CaseResult(
            **common,
            verdict=Verdict.SKIPPED,
            reason="this transformers has no Gemma4AssistantForCausalLM",
            lossless=Verdict.SKIPPED,
            conformance=Verdict.SKIPPED,
            n_trials=0,
            trial_cap=0,
            powered=False,
            e_value=1.0,
            log_e_value=0.0,
            p_value=None,
            tv_estimate=None,
            tv_ci=None,
            acceptance=Acceptance(None, None),
            duration_s=0.0,
        )
    cap = 64 if deterministic else (9_067 if case_id.endswith("g1") else 24_000 + rng.randrange(2_000))
    if how.tv:
        # Rejected early: the e-process passed the threshold long before the cap (the running maximum keeps growing
        # with each trial past it; the chart clips it).
        trials = rng.randrange(2_500, 4_000)
        log_e = math.log(THRESHOLD) * rng.uniform(6, 25)
        tv, half = how.tv * rng.uniform(0.92, 1.08), rng.uniform(0.018, 0.03)
        observed: float | None = expected * rng.uniform(0.84, 0.9) if expected else 2.1 * rng.uniform(0.95, 1.05)
        return CaseResult(
            **common,
            verdict=Verdict.FAIL,
            reason=f"lossless check rejected after {trials} trials (E >= {THRESHOLD:g})",
            lossless=Verdict.FAIL,
            conformance=Verdict.FAIL,
            n_trials=trials,
            trial_cap=cap,
            powered=True,
            e_value=math.exp(min(log_e, 700.0)),
            log_e_value=log_e,
            p_value=None,
            tv_estimate=tv,
            tv_ci=(tv - half, tv + half),
            acceptance=Acceptance(observed, expected),
            duration_s=rng.uniform(4, 40),
            failure=Failure.LOSSLESS,
            headline="lossless/joint",
        )
    log_e = 0.0 if deterministic else max(0.0, rng.gauss(0.4, 0.9))
    passing_tv = None if deterministic else rng.uniform(0.004, 0.03)
    # End-to-end sampling cases count accepted drafts per generate call, with no exact expectation.
    e2e_observed = None if deterministic else 2.4 * (1 + rng.gauss(0, 0.01))
    observed = expected * (1 + rng.gauss(0, 0.006)) if expected is not None else e2e_observed
    return CaseResult(
        **common,
        verdict=Verdict.PASS,
        reason=f"no check reached the threshold in {cap} trials (designed to detect TV >= 0.1)",
        lossless=Verdict.PASS,
        conformance=Verdict.PASS,
        n_trials=cap,
        trial_cap=cap,
        powered=True,
        e_value=math.exp(log_e),
        log_e_value=log_e,
        p_value=None if deterministic else round(rng.uniform(0.05, 0.95), 3),
        tv_estimate=passing_tv,
        tv_ci=None if passing_tv is None else (0.0, passing_tv + rng.uniform(0.03, 0.06)),
        acceptance=Acceptance(observed, expected),
        duration_s=rng.uniform(0.5, 30),
        headline=None if deterministic else "lossless/joint",
    )


# ------------------------------------------------------------------------------------------- the history
class Worker:
    """Runs queued runs the way a worker does (claim, store the outcome, analyse), with made-up case results."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.config = AnalysisConfig()

    def run(self, run_id: int, now: datetime) -> None:
        claim = claim_run(self.session, run_id, worker="gpu-worker-1", now=now, lease_s=3600)
        assert isinstance(claim, RunSpec), claim
        order = self.session.get_one(Commit, self.session.get_one(Run, run_id).commit_id).branch_order or 0
        cases = tuple(case_result(claim.sha, order, case_id, claim.seed_attempt) for case_id in CASES)
        status = RunStatus.failed if any(c.verdict is Verdict.FAIL for c in cases) else RunStatus.passed
        outcome = RunOutcome(
            status, device=DEVICE, library_version=VERSION, torch_version="2.9.1+cu128", python_version="3.12.9", cases=cases
        )
        finished = now + timedelta(minutes=18)
        assert record_outcome(self.session, run_id, claim.attempt, outcome, now=finished)
        self.analyse(run_id, finished + timedelta(seconds=5))

    def analyse(self, run_id: int, now: datetime) -> None:
        report = analyse(self.session, run_id, config=self.config, now=now)
        for queued in report.queued:  # confirmation runs (fresh seeds), run at once
            self.run(queued, now + timedelta(minutes=1))


def seed(session: Session) -> tuple[int, int]:
    """The illustrative history (see the module docstring); the ids of the alert that links a known finding and of
    the broken-commit alert."""
    main = add_target(
        session,
        make_spec(
            name=MAIN,
            repo_url="https://github.com/huggingface/transformers.git",
            branches=["main"],
            adapter="transformers",
            poll="10m",
            commit_policy="every",
        ),
    )
    options = RunOptions(profile=PROFILE, queued_lease=timedelta(hours=6))
    described = [
        NewCommit(sha=sha_of(f"main/{order}"), author=author, committed_at=T0 + timedelta(hours=3 * order), message=message)
        for order, (message, author) in enumerate(COMMITS, start=1)
    ]
    commits, _ = record_commits(session, main, "main", described)
    worker = Worker(session)
    for order, new in enumerate(described, start=1):
        [run_id] = queue_runs(session, [commits[new.sha]], options)
        if order != QUEUED:
            assert new.committed_at is not None
            worker.run(run_id, new.committed_at + timedelta(minutes=7))
    gemma_alert = _alert_at(session, main, commits[described[GEMMA_FROM - 1].sha])
    set_alert_state(session, gemma_alert, AlertState.acknowledged, now=T0 + timedelta(hours=3 * GEMMA_FROM + 2))
    _uninstallable_release(session)
    broken_alert = seed_operations(session, worker.run, start=T0 + timedelta(days=1), now=datetime.now(UTC))
    return gemma_alert, broken_alert


def _alert_at(session: Session, target: Target, commit: Commit) -> int:
    """The violation alert whose first bad commit is ``commit``."""
    query = select(Alert.id).where(Alert.target_id == target.id, Alert.first_bad_commit_id == commit.id, Alert.kind == AlertKind.violation)
    return session.execute(query).scalar_one()


def _uninstallable_release(session: Session) -> None:
    """5.25.0 of the releases target: its install fails on every attempt, then the run ends uninstallable."""
    releases = add_target(
        session,
        make_spec(
            name=RELEASES,
            repo_url="https://github.com/huggingface/transformers.git",
            branches=["main"],
            adapter="transformers",
            install_mode="pip",
        ),
    )
    commits, _ = record_commits(session, releases, None, [NewCommit(sha=release_sha("5.25.0"), committed_at=T0 + timedelta(hours=20))])
    [run_id] = queue_runs(session, list(commits.values()), RunOptions(profile=PROFILE, queued_lease=timedelta(hours=6)))
    error = InstallError(
        "kernels<0.20,>=0.19.1", "missing", "no distribution on the package index satisfies it", wanted="transformers==5.25.0"
    )
    retry, now = InstallRetry(), T0 + timedelta(hours=20, minutes=5)
    while True:
        claim = claim_run(session, run_id, worker="gpu-worker-1", now=now, lease_s=3600)
        assert isinstance(claim, RunSpec), claim
        failure = record_install_failure(
            session, run_id, claim.attempt, RunOutcome(RunStatus.uninstallable, error=str(error)), now=now, retry=retry, grace_s=600
        )
        assert failure is not None
        if failure.retry_in_s is None:
            break
        now += timedelta(seconds=failure.retry_in_s + 30)
    analyse(session, run_id, config=AnalysisConfig(), now=now + timedelta(seconds=5))


# ----------------------------------------------------------------------------- database, server, browser
@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new database on ``server_url``'s server, migrated to head (``alembic upgrade head``); dropped at the end."""
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    name = f"specwatch_screens_{secrets.token_hex(6)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        config = Config(str(ROOT / "alembic.ini"))
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        config.attributes["configure_logging"] = False
        command.upgrade(config, "head")
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def served(database_url: str, token: str) -> Iterator[str]:
    """The real app (API and dashboard) on a free local port, in a thread; its base URL."""
    settings = Settings(
        env=Environment.test,
        database_url=database_url,
        redis_url="redis://127.0.0.1:1/0",  # nothing is enqueued
        webhook_secret=SecretStr(secrets.token_hex(16)),
        api_token_hashes=[hash_token(token)],
        session_secret=SecretStr(secrets.token_hex(16)),
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise SystemExit("the dashboard did not start (see uvicorn's output above)")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def browser(profile: Path) -> Iterator[Any]:
    """Headless Chromium driven by the system's chromedriver (never one Selenium Manager downloads)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit(
            "headless Chromium and chromedriver are needed: scripts/test-deps.sh --tools (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def sign_in(driver: Any, base: str, token: str) -> None:
    """Through the dashboard's login form, as a person would."""
    driver.get(f"{base}/ui/login?next=/ui/alerts")
    driver.find_element(By.ID, "token").send_keys(token)
    submit = driver.find_element(By.ID, "submit")
    submit.click()
    WebDriverWait(driver, 30).until(expected_conditions.staleness_of(submit))
    if not driver.find_elements(By.ID, "sign-out"):
        raise SystemExit(f"signing in failed: {driver.current_url}")


def capture(driver: Any, url: str, path: Path) -> None:
    """``url`` as a PNG :data:`WIDTH` px wide and as tall as the page."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": 600, "deviceScaleFactor": 1, "mobile": False})
    driver.get(url)
    height = int(driver.execute_script("return Math.ceil(document.documentElement.scrollHeight)"))
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}
    )
    path.write_bytes(driver.get_screenshot_as_png())
    print(f"{path} ({WIDTH}x{height})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="folder for the PNGs (default: docs/screenshots)")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("SPECWATCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        help="a PostgreSQL URL whose server may get a scratch database (default: $SPECWATCH_TEST_POSTGRES_URL or the local server)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(24)
    with scratch_database(args.postgres) as url:
        engine = make_engine(url)
        try:
            with session_scope(sessionmaker(bind=engine, expire_on_commit=False)) as session:
                known_alert, broken_alert = seed(session)
        finally:
            engine.dispose()
        with tempfile.TemporaryDirectory() as profile, served(url, token) as base, browser(Path(profile)) as driver:
            sign_in(driver, base, token)
            pages = {
                "timeline.png": f"/ui/targets/{MAIN}",
                "case.png": f"/ui/targets/{MAIN}/cases/{CASE_PAGE}",
                "alerts.png": "/ui/alerts",
                "alert.png": f"/ui/alerts/{known_alert}",
                "findings.png": f"/ui/targets/{MAIN}/findings",
                "target-poll-error.png": f"/ui/targets/{NIGHTLY}",
                "error-alert.png": f"/ui/alerts/{broken_alert}",
            }
            for name, page in pages.items():
                capture(driver, base + page, args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
