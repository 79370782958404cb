"""How an attempt at a run ends: one enum, whose finished members are exactly the run's finished statuses."""

from __future__ import annotations

import pytest

from service.models import FINISHED_STATUSES, RunStatus
from workers.execution import AttemptStatus


@pytest.mark.unit
def test_an_attempt_finishes_its_run_exactly_when_it_stores_a_finished_run_status() -> None:
    assert {s.value for s in AttemptStatus if s.finished} == {s.value for s in FINISHED_STATUSES}
    # An install failure leaves the run queued for its retry: not finished, not analysed.
    assert AttemptStatus.retrying.value == RunStatus.queued.value
    assert not AttemptStatus.retrying.finished
    assert not AttemptStatus.skipped.finished
    assert not AttemptStatus.lease_lost.finished
