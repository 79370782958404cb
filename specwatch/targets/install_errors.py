"""Why a release could not be installed: :class:`InstallError` and what pip's output says (:func:`install_failure`).

A release pip cannot install is not a broken release: nothing was tested (exit
:attr:`~specwatch.protocol.ExitStatus.INSTALL`). The installer (:mod:`specwatch.targets.install`) and the targets that
build their releases (:mod:`specwatch.targets.llamacpp.build`) raise it; this module imports neither.
"""

from __future__ import annotations

import re

from specwatch.targets import TargetError


class InstallError(TargetError):
    """pip could not install a release: ``requirement`` is what it could not satisfy, ``cause`` says why.

    ``cause`` is one of :data:`INSTALL_CAUSES`: ``missing`` (no distribution on the index satisfies it),
    ``conflict`` (the release's dependencies conflict), ``network`` (the index could not be reached or
    answered with an error), ``pip`` (another pip failure, e.g. a source distribution that does not build).
    """

    def __init__(self, requirement: str, cause: str, detail: str, *, wanted: str) -> None:
        self.requirement, self.cause, self.detail, self.wanted = requirement, cause, detail, wanted
        needed = "" if requirement == wanted else f", needed by {wanted}"
        super().__init__(f"could not install: {requirement} ({detail}{needed})")


INSTALL_CAUSES = ("missing", "conflict", "network", "pip")

_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
#: Lines of pip's output (its ``--log``, at debug level) about fetching from the index, and in them the causes
#: that say the index could not be reached. A 4xx (a project the index does not have) is not one of them.
_FETCH_LINE = re.compile(r"^.*(?:Could not fetch URL|Retrying \(Retry|HTTP error|ConnectionError|ReadTimeoutError).*$", re.M)
_NETWORK = re.compile(
    r"too many 5\d\d error responses|\b5\d\d Server Error|HTTP error 5\d\d|Connection refused|timed out|Network is unreachable|"
    r"Temporary failure in name resolution|Name or service not known|SSL[A-Za-z]*Error|Connection reset by peer|Connection aborted"
)
CONFLICT = re.compile(r"ResolutionImpossible|conflicting dependencies")
_DEPENDS = re.compile(r"^\s*(.+ depends on .+?)\s*$", re.M)


def install_failure(requirement: str, output: str) -> InstallError:
    """What pip's ``output`` (stdout, stderr and its debug log) says about why ``requirement`` could not be installed.

    Network trouble wins over a missing distribution: pip reports an index it could not reach as a
    requirement with no matching version.
    """
    missing = _NO_MATCH.findall(output)
    network = next((found for line in _FETCH_LINE.findall(output) if (found := _NETWORK.search(line))), None)
    if network is not None:
        why = f"the package index could not be reached: {network[0]}"
        return InstallError(missing[-1] if missing else requirement, "network", why, wanted=requirement)
    if missing:
        return InstallError(missing[-1], "missing", "no distribution on the package index satisfies it", wanted=requirement)
    if CONFLICT.search(output):
        causes = "; ".join(_DEPENDS.findall(output)[:4])
        return InstallError(requirement, "conflict", "its dependencies conflict" + (f": {causes}" if causes else ""), wanted=requirement)
    errors = [line.removeprefix("ERROR: ").strip() for line in output.splitlines() if line.startswith("ERROR:")]
    last = errors[-1] if errors else next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "no output")
    return InstallError(requirement, "pip", f"pip failed: {last[:300]}", wanted=requirement)
