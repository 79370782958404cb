"""service.queue: publishing by task name, and a broker failure left to the sweeper instead of raised."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
from kombu.exceptions import OperationalError

from service.queue import RUN_SUITE_TASK, SUITE_QUEUE, CeleryProducer, enqueue_runs, make_producer
from service.settings import Settings


@dataclass
class FlakyProducer:
    fail_on: set[int] = field(default_factory=set)
    tried: list[int] = field(default_factory=list)

    def send_run(self, run_id: int) -> None:
        self.tried.append(run_id)
        if run_id in self.fail_on:
            raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def test_every_run_is_sent_in_order() -> None:
    producer = FlakyProducer()
    assert enqueue_runs(producer, [3, 1, 2]) == [3, 1, 2]
    assert producer.tried == [3, 1, 2]


def test_a_broker_failure_is_logged_and_the_rest_left_for_the_sweeper(caplog: pytest.LogCaptureFixture) -> None:
    producer = FlakyProducer(fail_on={2})
    with caplog.at_level(logging.WARNING, logger="service.queue"):
        assert enqueue_runs(producer, [1, 2, 3]) == [1]
    assert producer.tried == [1, 2]
    [record] = caplog.records
    assert "enqueue_failed run_id=2 left_for_sweeper=[2, 3]" in record.getMessage()
    assert "Connection refused" in record.getMessage()


def test_the_celery_producer_sends_by_name_to_the_gpu_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, object]]] = []
    producer = make_producer(Settings(env="test", redis_url="redis://redis.invalid:6379/3"))
    try:
        assert producer.celery.conf.broker_url == "redis://redis.invalid:6379/3"
        monkeypatch.setattr(producer.celery, "send_task", lambda name, **options: calls.append((name, options)))
        producer.send_run(7)
    finally:
        producer.close()
    [(name, options)] = calls
    assert (name, options["args"], options["queue"]) == (RUN_SUITE_TASK, [7], SUITE_QUEUE)


def test_an_unreachable_broker_raises_from_send_run_and_is_swallowed_by_enqueue_runs() -> None:
    producer = CeleryProducer("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(OperationalError):
            producer.send_run(1)
        assert enqueue_runs(producer, [1, 2]) == []
    finally:
        producer.close()
