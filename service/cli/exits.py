"""Exit statuses of every ``specwatch`` command, in one place.

``specwatch check`` passes the suite's own status through (:class:`workers.suite.exits.SuiteExit`, pinned
equal to these by a test: the control plane never imports the suite). The other commands use the same
numbers for the same kinds of ending.
"""

from __future__ import annotations

from typing import Final

#: Done; for ``check``: every case passed.
OK: Final = 0
#: ``check``: some case failed (a violation).
VIOLATION: Final = 1
#: The database is unreachable or not migrated (``targets``, ``history``, ``runs``, ``compare``, ``alerts``).
UNAVAILABLE: Final = 1
#: A usage error: bad input, nothing found, invalid settings, a target the suite cannot load.
USAGE: Final = 2
#: ``check``: the ``--pip`` release could not be installed (a missing dependency, conflicting dependencies, the
#: package index unreachable); nothing was tested.
INSTALL: Final = 3
