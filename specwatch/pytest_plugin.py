"""The pytest plugin (entry point ``pytest11``): an ``assert_lossless`` fixture and two command-line options.

::

    def test_speculative_sampling_is_lossless(assert_lossless):
        assert_lossless(my_sampler, cases=["direct/*"])

``--specwatch-seed N`` reruns every check with another seed (a failure message names the seed it used);
``--specwatch-quick`` designs every case for TV 0.05 at least (fewer trials: a smoke test for pull requests).
Options given to the call win over the command line. Loading the plugin imports no torch: the suite loads
when the fixture is first used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from specwatch.protocol import RunResult


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specwatch", "specwatch: losslessness checks of speculative samplers")
    group.addoption("--specwatch-seed", type=int, default=None, help="seed of every assert_lossless call (default 0)")
    group.addoption("--specwatch-quick", action="store_true", default=False, help="design every case for TV >= 0.05 (fewer trials)")


@pytest.fixture(name="assert_lossless")
def assert_lossless_fixture(request: pytest.FixtureRequest) -> Callable[..., RunResult]:
    """:func:`specwatch.assert_lossless` with the seed and ``quick`` of the command line as defaults."""
    from specwatch.lossless import assert_lossless  # noqa: PLC0415 - the suite (torch) loads on first use

    defaults: dict[str, Any] = {}
    seed = request.config.getoption("specwatch_seed")
    if seed is not None:
        defaults["seed"] = seed
    if request.config.getoption("specwatch_quick"):
        defaults["quick"] = True

    def bound(sampler: Any, **options: Any) -> RunResult:
        __tracebackhide__ = True
        return assert_lossless(sampler, **{**defaults, **options})

    return bound
