"""The heartbeat of ``specwatch check`` outside a terminal: a line whenever the run has been silent for a while."""

from __future__ import annotations

import threading
import time

from rich.markup import escape

from specwatch.cli.output import console

#: Outside a terminal, the longest silence (seconds) before a line says the run is alive (:class:`_Heartbeat`).
HEARTBEAT_S = 30.0


class Heartbeat:
    """Outside a terminal (a log, CI) the bars are not drawn and a line appears only when a case ends: a long case
    would print nothing for minutes. This thread prints a line whenever :data:`HEARTBEAT_S` pass without one, with
    what the last progress event said (the case, its trials of its cap, its evidence) and the time so far."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.started = self.last = time.monotonic()
        self.state = "waiting for the suite to start"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._beat, name="specwatch-heartbeat", daemon=True)

    def printed(self, state: str) -> None:
        """A line was printed; the run is now at ``state``."""
        with self.lock:
            self.last = time.monotonic()
            self.state = state

    def doing(self, state: str) -> None:
        """The run is at ``state`` (nothing printed: the silence goes on)."""
        with self.lock:
            self.state = state

    def _beat(self) -> None:
        while True:
            with self.lock:
                due = self.last + self.interval_s
            if self.stop.wait(max(0.0, due - time.monotonic())):  # wakes when the silence would reach interval_s
                return
            with self.lock:
                now = time.monotonic()
                if now - self.last < self.interval_s:
                    continue
                self.last = now
                line = f"... still running ({now - self.started:.0f} s): {self.state}"
            console.print(escape(line), highlight=False, soft_wrap=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
