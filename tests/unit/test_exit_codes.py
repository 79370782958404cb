"""Exit statuses: ``specwatch check`` passes the suite process's status through, so the two definitions (one on each
side of the import rule that keeps the control plane from importing the suite) must agree."""

from __future__ import annotations

from service.cli import exits
from workers.suite.exits import SuiteExit


def test_the_command_line_and_the_suite_process_use_the_same_exit_statuses() -> None:
    command_line = (exits.OK, exits.VIOLATION, exits.USAGE, exits.INSTALL)
    assert command_line == (SuiteExit.PASS, SuiteExit.VIOLATION, SuiteExit.USAGE, SuiteExit.INSTALL)
    assert len(set(SuiteExit)) == len(command_line)
