"""Exit statuses: ``specwatch check`` passes the suite process's status through, so the two definitions (one on each
side of the import rule that keeps the control plane from importing the suite) must agree."""

from __future__ import annotations

from service.cli import exits
from workers.suite.exits import SuiteExit


def test_the_command_line_and_the_suite_process_use_the_same_exit_statuses() -> None:
    assert (exits.OK, exits.VIOLATION, exits.USAGE) == (SuiteExit.PASS, SuiteExit.VIOLATION, SuiteExit.USAGE)
