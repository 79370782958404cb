"""Configuration errors are the target's: one alert per target while its repository cannot be used.

A run whose checkout failed because of the repository itself (missing, refused by the policy, no access, or
unreachable after its retries: ``Run.configuration_error``) says nothing about its commit. Every commit of the
target fails the same way, so instead of one BROKEN alert per commit (and as many "Resolved:" messages) the
target gets one CONFIGURATION alert with the cause, opened by the first such run and kept while it lasts; the
first run that gets past the checkout resolves it.

Infrastructure errors (``Run.infrastructure_error``: the commit missing from the repository, a checkout or mirror
failure, a worker that crashed or was lost) say nothing about their commit either, and one alone pages nobody: it is
an error on its run. Only when the target's last :data:`PERSISTING_RUNS` finished primary runs all ended so does the
target get the same one alert (:func:`infrastructure_persists`), resolved by the first run that tests its commit.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from service.ingest import lock_targets
from service.models import FINISHED_STATUSES, Alert, AlertKind, AlertState, Commit, Run, RunPurpose
from service.models.entries import ConfigurationEntry
from workers.analysis.alerts import open_alert
from workers.analysis.context import Analysis
from workers.analysis.resolution import resolve

log = logging.getLogger(__name__)

#: Consecutive finished primary runs of a target with infrastructure errors that make a target-level alert.
PERSISTING_RUNS = 3


def configuration_entry(run: Run) -> ConfigurationEntry:
    """The cause, as the configuration alert lists it."""
    return ConfigurationEntry(case_id="(target)", reason="configuration", error=(run.error or "")[:500])


def open_configuration_alerts(ctx: Analysis, target_id: int) -> list[Alert]:
    """The target's configuration alerts not resolved (at most one, unless opened concurrently before this lock)."""
    query = select(Alert).where(Alert.target_id == target_id, Alert.kind == AlertKind.configuration, Alert.state != AlertState.resolved)
    return list(ctx.session.scalars(query.order_by(Alert.id).with_for_update()))


def target_misconfigured(ctx: Analysis, run: Run) -> None:
    """Open the target's configuration alert, unless one is open already (then this run only adds to its evidence)."""
    target = run.commit.target
    lock_targets(ctx.session, [target.id])  # one writer decides whether the target's alert exists
    standing = open_configuration_alerts(ctx, target.id)
    if standing:
        log.info("configuration_error_known target=%s alert_id=%s run_id=%s", target.name, standing[0].id, run.id)
        return
    open_alert(ctx, run, AlertKind.configuration, run.commit, [configuration_entry(run)])


def target_configured(ctx: Analysis, run: Run) -> None:
    """``run`` got past its checkout: the target's repository works again; resolve its configuration alerts."""
    for alert in open_configuration_alerts(ctx, run.commit.target_id):
        resolve(ctx, alert, run)


def infrastructure_persists(ctx: Analysis, run: Run) -> bool:
    """Whether ``run``'s infrastructure error persists: the target's last :data:`PERSISTING_RUNS` finished primary
    runs (``run`` among them) all ended with one."""
    newest = (
        select(Run.infrastructure_error)
        .join(Run.commit)
        .where(Commit.target_id == run.commit.target_id, Run.purpose == RunPurpose.primary, Run.status.in_(FINISHED_STATUSES))
        .order_by(Run.finished_at.desc(), Run.id.desc())
        .limit(PERSISTING_RUNS)
    )
    flags = list(ctx.session.scalars(newest))
    return len(flags) == PERSISTING_RUNS and all(flags)
