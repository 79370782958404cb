"""Exit status of ``python -m workers.suite``: part of the protocol the worker and ``specwatch check`` read.

The command line (:mod:`service.cli.exits`) passes these through unchanged; a test pins the two equal, since
the control plane cannot import the suite.
"""

from __future__ import annotations

from enum import IntEnum


class SuiteExit(IntEnum):
    """How a suite process ended."""

    #: Every case passed (``list`` and ``mutants`` also exit 0).
    PASS = 0
    #: Some case failed, including a target that raised on a valid input (that case fails as ``raised``).
    VIOLATION = 1
    #: A usage or target error: a target that cannot be loaded, a case that cannot be set up or errors.
    USAGE = 2
    #: The release (``--pip``) could not be installed: a dependency no distribution on the index satisfies,
    #: conflicting dependencies, or the index unreachable. Nothing was tested; the release is not broken.
    INSTALL = 3
