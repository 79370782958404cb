"""specwatch's public face: test a speculative sampler's losslessness from a library's own test suite.

::

    from specwatch import assert_lossless

    def test_speculative_sampling_is_lossless():
        assert_lossless(my_sampler, cases=["direct/*"], budget_s=300)

:func:`assert_lossless` runs the exact-law checks of ``specwatch check`` (the built-in case catalogue, the
anytime-valid e-processes, the family-wise false-alarm rate ``alpha``) against ``my_sampler`` in the test's
own process and raises :class:`LosslessnessError` (an ``AssertionError``) naming each failing case, its
check and its TV estimate. A sampler takes a :class:`SpecStep`, a number of trials and a
``torch.Generator`` and returns a :class:`SpecOutput` (docs/check.md, "Testing your own sampler"). The plain install
(``pip install specwatch``: torch, numpy, scipy and the command line's typer, rich and packaging) also registers the
pytest plugin (:mod:`specwatch.pytest_plugin`): an ``assert_lossless`` fixture and ``--specwatch-seed`` /
``--specwatch-quick`` options.

The names below load on first use: importing :mod:`specwatch` (as pytest does for its plugin) costs
nothing until a check runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Version of the statistics and runner; recorded with every run.
#: 0.6: the early pass's statistic is a mixture of likelihood ratios per set with numerators between the null and the
#: bug (p0(A) + eps/4, + eps/2), not the null's own: a clean check passes on 25-50 % fewer observations;
#: 0.5: ``--quick`` designs every case at TV 0.05 at least (0.1 before); with the early pass a case stops once every
#: designed check passed early or has its planned observations (it waited for every pass statistic); results record
#: why a case stopped (schema 7); checks over 1025-131,072 cells at TV >= 0.05 (the 50,257-token case) sized from
#: the power table;
#: 0.4: caps sized from the e-process's own power (eprocess_power.json), not 1.5 x the Pearson design;
#: 0.3: a case holds (no early pass) while any check holds evidence; 0.2: joint checks, stopped e-values, schema 2.
SUITE_VERSION = "0.6.0"
#: Version of the case catalogue (fixtures, designs); bump when any case changes.
CATALOGUE_VERSION = "2026.12.3.1"  # long-horizon e2e cases, processed fixtures that cut mass, V256/V1024

if TYPE_CHECKING:
    from specwatch.cases import CASES
    from specwatch.lossless import IrreproducibleSamplerWarning, LosslessnessError, UnderpoweredError, assert_lossless, check_lossless
    from specwatch.protocol import CaseResult, RunResult
    from specwatch.sampling import Processing, Sampler, SpecOutput, SpecStep, reference_sampler

__all__ = [
    "CASES",
    "CaseResult",
    "IrreproducibleSamplerWarning",
    "LosslessnessError",
    "Processing",
    "RunResult",
    "Sampler",
    "SpecOutput",
    "SpecStep",
    "UnderpoweredError",
    "assert_lossless",
    "check_lossless",
    "reference_sampler",
]

_HOMES = {
    "IrreproducibleSamplerWarning": "specwatch.lossless",
    "LosslessnessError": "specwatch.lossless",
    "UnderpoweredError": "specwatch.lossless",
    "assert_lossless": "specwatch.lossless",
    "check_lossless": "specwatch.lossless",
    "CASES": "specwatch.cases",
    "CaseResult": "specwatch.protocol",
    "RunResult": "specwatch.protocol",
    "Processing": "specwatch.sampling",
    "Sampler": "specwatch.sampling",
    "SpecOutput": "specwatch.sampling",
    "SpecStep": "specwatch.sampling",
    "reference_sampler": "specwatch.sampling",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'specwatch' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
