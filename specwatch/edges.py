"""Edge checks: deterministic experiments at the extremes of the uniforms (u = 0 and the largest value below 1),
where precision effects and rare-event bugs live that no statistical test can reach (docs/statistics.md)."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from specwatch.experiments import ChainExperiment, CheckSpec, Observation, Violation


class Extreme(enum.StrEnum):
    """Where every uniform of an edge check sits: 0 (torch.rand's smallest value) or the largest value
    below 1 in the dtype asked for."""

    MIN = "u_min"
    MAX = "u_max"

    def uniform(self, dtype: torch.dtype) -> float:
        if self is Extreme.MIN:
            return 0.0
        one = torch.tensor(1.0, dtype=dtype)
        return float(torch.nextafter(one, torch.zeros_like(one)))


#: Calls of torch.rand / torch.rand_like answered with the extreme in one forced block; later calls get
#: real uniforms, so a sampler that loops until a draw differs (rejection sampling) still ends.
FORCED_DRAWS = 64


@contextmanager
def forced_uniforms(extreme: Extreme, draws: int = FORCED_DRAWS) -> Iterator[None]:
    """While open, the first ``draws`` calls of ``torch.rand`` and ``torch.rand_like`` return ``extreme``
    everywhere (whatever the generator); later calls draw as usual.

    Samplers that draw their uniforms from torch (the reference, the mutants, transformers'
    ``_speculative_sampling``) then take one fixed path. Other draws (``torch.multinomial``) are left alone.
    Process-wide: the suite runs one case at a time per process.
    """
    real_rand, real_rand_like = torch.rand, torch.rand_like
    left = [draws]

    def forced() -> bool:
        left[0] -= 1
        return left[0] >= 0

    def rand(*size: Any, dtype: torch.dtype | None = None, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if not forced():
            return real_rand(*size, dtype=dtype, device=device, **kwargs)
        if "size" in kwargs:
            size = (kwargs["size"],)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], tuple | list | torch.Size) else tuple(size)
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            return out.resize_(shape).fill_(extreme.uniform(out.dtype))
        dtype = dtype or torch.get_default_dtype()
        return torch.full(shape, extreme.uniform(dtype), dtype=dtype, device=device)

    def rand_like(like: torch.Tensor, *, dtype: torch.dtype | None = None, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if not forced():
            return real_rand_like(like, dtype=dtype, device=device, **kwargs)
        dtype = dtype or like.dtype
        return torch.full(like.shape, extreme.uniform(dtype), dtype=dtype, device=device if device is not None else like.device)

    for name, fake in (("rand", rand), ("rand_like", rand_like)):
        setattr(torch, name, fake)
    try:
        yield
    finally:
        for name, original in (("rand", real_rand), ("rand_like", real_rand_like)):
            setattr(torch, name, original)


#: Trials of an edge check: with every uniform fixed they repeat one path; a few show that it is stable.
EDGE_TRIALS = 4


class EdgeExperiment:
    """A chain step run with every uniform fixed at an extreme: a deterministic check.

    Whatever the uniforms, each output of a correct sampler lies in the support of the exact laws (an
    emitted token with p_t > 0, a K the fixture allows, ...). Fixing them at 0 or just below 1 reaches
    the boundary cases that random uniforms hit with probability 2^-24 or less (``u <= p/q`` accepting
    a draft with p = 0 when u == 0; a ratio of exactly 1 rounded below u). Outputs outside the support
    are certain violations; there is no statistical check, so nothing is added to the run's tests.
    """

    probe_trials = EDGE_TRIALS

    def __init__(self, chain: ChainExperiment, extreme: Extreme) -> None:
        self.chain = chain
        self.extreme = extreme

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return ()

    @property
    def expected_acceptance(self) -> None:
        return None

    @property
    def accepted_per_trial_max(self) -> None:
        """Every uniform is fixed: one path repeated, not a sample of the acceptance rate."""
        return None

    @property
    def fixed_trials(self) -> int:
        return EDGE_TRIALS

    def run(self, n: int, generator: torch.Generator) -> Observation:
        with forced_uniforms(self.extreme):
            obs = self.chain.run(n, generator)
        violations = list(obs.violations)
        for check in self.chain.checks:
            counts = obs.counts.get(check.name)
            if counts is None:
                continue
            impossible = np.flatnonzero((counts > 0) & (check.null <= 0))
            if impossible.size:
                message = f"{check.name}: cell {int(impossible[0])} has probability 0 (every uniform at {self.extreme.value})"
                violations.append(Violation(check.layer, message))
        return Observation({}, tuple(violations), obs.accepted_total, obs.sample)
