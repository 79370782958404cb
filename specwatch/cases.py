"""The case catalogue: the fixture battery of direct sampler cases.

Every fixture is deterministic (its own fixed numpy seed), so a case id names one exact experiment.
Change a fixture only together with ``CATALOGUE_VERSION``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.edges import EdgeExperiment, Extreme
from specwatch.experiments import ChainExperiment, Experiment
from specwatch.sampling import Processing, Sampler, SpecStep

NEG_INF = float("-inf")

#: TV distance the default profile designs a real library's direct cases at (issue 31), and at or above
#: ``LARGE_VOCAB`` tokens: a check over that many cells cannot pass early and needs about 4 times the trials at
#: half the distance (``direct/large_vocab/V50257/g1`` at the reference battery's threshold, sized from the power
#: table's 65,536- and 131,072-cell rows since suite 0.5: 135,482 trials at 0.1, 528,721 at 0.05).
LIBRARY_DIRECT_EPSILON = 0.05
LARGE_VOCAB_EPSILON = 0.1
LARGE_VOCAB = 10_000
_VOCAB_IN_ID = re.compile(r"/V(\d+)/")


@dataclass(frozen=True)
class Case:
    """One reproducible experiment: an id, a family, the TV distance it is designed to detect and
    either a chain-step fixture (direct cases, run through the target's sampler) or an experiment
    factory (end-to-end cases contributed by a library adapter). ``skip_reason`` marks a case the
    target cannot run (e.g. a code path its version lacks)."""

    id: str
    family: str
    description: str
    epsilon: float
    make_step: Callable[[], SpecStep] | None = None
    make_experiment: Callable[[torch.device], Experiment] | None = None
    skip_reason: str | None = None
    #: Part of the ``--quick`` profile.
    quick: bool = True
    #: An edge check: the fixture runs with every uniform fixed at this extreme (deterministic).
    extreme: Extreme | None = None

    def build(self, sampler: Sampler, device: torch.device) -> Experiment:
        if self.make_experiment is not None:
            return self.make_experiment(device)
        if self.make_step is None:
            raise ValueError(f"case {self.id} has neither a fixture nor an experiment")
        chain = ChainExperiment(self.make_step().to(device), sampler)
        return chain if self.extreme is None else EdgeExperiment(chain, self.extreme)

    def step(self) -> SpecStep:
        """The chain-step fixture of a direct case."""
        if self.make_step is None:
            raise ValueError(f"case {self.id} is not a direct case")
        return self.make_step()


def large_vocabulary(case: Case) -> bool:
    """Whether ``case`` runs over a vocabulary of ``LARGE_VOCAB`` tokens or more (``V`` in the case id)."""
    vocab = _VOCAB_IN_ID.search(case.id)
    return vocab is not None and int(vocab.group(1)) >= LARGE_VOCAB


def library_epsilon(case: Case, floor: float = LIBRARY_DIRECT_EPSILON) -> float:
    """The TV distance a library target designs direct case ``case`` at: ``floor`` (at least the case's own), and
    at least ``LARGE_VOCAB_EPSILON`` over a vocabulary of ``LARGE_VOCAB`` tokens or more (``V`` in the case id)."""
    return max(case.epsilon, floor, LARGE_VOCAB_EPSILON if large_vocabulary(case) else 0.0)


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big"))


def _tensor(x: NDArray[np.float64]) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))


def _dirichlet_logits(rng: np.random.Generator, rows: int, vocab: int, concentration: float) -> NDArray[np.float64]:
    probs = rng.dirichlet(np.full(vocab, concentration), size=rows)
    with np.errstate(divide="ignore"):
        return np.log(probs)


def _zipf_logits(rng: np.random.Generator, rows: int, vocab: int, exponent: float = 1.1) -> NDArray[np.float64]:
    """LLM-like rows: Zipf(exponent) over a random permutation of the vocabulary per row."""
    base = -exponent * np.log(np.arange(1, vocab + 1, dtype=np.float64))
    return np.stack([base[rng.permutation(vocab)] for _ in range(rows)])


def _mask_half(rng: np.random.Generator, logits: NDArray[np.float64], keep_from: NDArray[np.float64]) -> NDArray[np.float64]:
    """Set -inf on a random half of the tokens where ``keep_from`` is finite (at least one kept per row)."""
    out = logits.copy()
    for r in range(out.shape[0]):
        finite = np.flatnonzero(np.isfinite(keep_from[r]) & np.isfinite(out[r]))
        drop = rng.choice(finite, size=len(finite) // 2, replace=False)
        out[r, drop] = NEG_INF
    return out


def _step(
    target: NDArray[np.float64],
    draft: NDArray[np.float64],
    target_processing: Processing = Processing(),
    draft_processing: Processing = Processing(),
) -> SpecStep:
    return SpecStep(_tensor(target), _tensor(draft), target_processing, draft_processing)


def _far_apart(name: str, vocab: int, gamma: int) -> Callable[[], SpecStep]:
    def make() -> SpecStep:
        rng = _rng(name)
        return _step(_dirichlet_logits(rng, gamma + 1, vocab, 0.3), _dirichlet_logits(rng, gamma, vocab, 0.3))

    return make


def _noisy_draft(
    name: str,
    vocab: int,
    gamma: int,
    sigma: float,
    *,
    target: Processing = Processing(),
    draft: Processing = Processing(),
    zipf: bool = False,
) -> Callable[[], SpecStep]:
    """Draft = target logits + N(0, sigma^2) noise: close but not equal, like a real small model."""

    def make() -> SpecStep:
        rng = _rng(name)
        t = _zipf_logits(rng, gamma + 1, vocab) if zipf else _dirichlet_logits(rng, gamma + 1, vocab, 1.0)
        d = t[:gamma] + rng.normal(0.0, sigma, size=(gamma, vocab))
        return _step(t, d, target, draft)

    return make


def _disjoint(name: str, vocab: int, gamma: int) -> Callable[[], SpecStep]:
    def make() -> SpecStep:
        rng = _rng(name)
        t = _dirichlet_logits(rng, gamma + 1, vocab, 1.0)
        d = _dirichlet_logits(rng, gamma, vocab, 1.0)
        t[:gamma, 1::2] = NEG_INF
        d[:, 0::2] = NEG_INF
        return _step(t, d)

    return make


def _onehot_q(name: str, vocab: int, gamma: int) -> Callable[[], SpecStep]:
    def make() -> SpecStep:
        rng = _rng(name)
        t = _dirichlet_logits(rng, gamma + 1, vocab, 0.5)
        d = np.full((gamma, vocab), NEG_INF)
        d[np.arange(gamma), rng.integers(0, vocab, size=gamma)] = 0.0
        return _step(t, d)

    return make


def _zero_where(name: str, vocab: int, gamma: int, side: str) -> Callable[[], SpecStep]:
    def make() -> SpecStep:
        rng = _rng(name)
        t = _dirichlet_logits(rng, gamma + 1, vocab, 1.0)
        d = _dirichlet_logits(rng, gamma, vocab, 1.0)
        if side == "draft":
            d = _mask_half(rng, d, t[:gamma])
        else:
            t[:gamma] = _mask_half(rng, t[:gamma], d)
        return _step(t, d)

    return make


def _equal(name: str, vocab: int, gamma: int) -> Callable[[], SpecStep]:
    def make() -> SpecStep:
        t = _dirichlet_logits(_rng(name), gamma + 1, vocab, 0.5)
        return _step(t, t[:gamma].copy())

    return make


def _transformers_fixture() -> SpecStep:
    """transformers' test_speculative_sampling_target_distribution, judged against its exact law.

    Vocabulary 10; near one-hot drafts 1, 4, 5; the target accepts 1, then 4, rejects 5 (p = 0)
    and resamples over {1, 3, 7, 8} with logits 2.0, 1.0, -0.01, 2.0. The test's bonus row is all
    -inf (never reached there: draft 5 is always rejected); here it is uniform, reached with
    probability about 1e-8, so that the law is defined everywhere.
    """
    draft = np.full((3, 10), -10.0)
    draft[0, 1] = draft[1, 4] = draft[2, 5] = 10.0
    target = np.full((4, 10), NEG_INF)
    target[0, 1] = 10.0
    target[1, 4] = 10.0
    target[2, [1, 3, 7, 8]] = [2.0, 1.0, -0.01, 2.0]
    target[3] = 0.0
    return _step(target, draft)


_T, _K, _P = Processing(temperature=0.7), Processing(top_k=8), Processing(top_p=0.9)
_ALL = Processing(temperature=0.7, top_k=8, top_p=0.9)
_LLM = Processing(temperature=0.7, top_k=50)
_NONE = Processing()


def _direct(case_id: str, description: str, epsilon: float, make: Callable[[str], Callable[[], SpecStep]]) -> Case:
    return Case(id=f"direct/{case_id}", family="direct", description=description, epsilon=epsilon, make_step=make(case_id))


DIRECT_CASES: tuple[Case, ...] = (
    _direct("far_apart/V8/g1", "peaked, far-apart p and q (Dirichlet 0.3), one draft", 0.02, lambda n: _far_apart(n, 8, 1)),
    _direct("far_apart/V8/g3", "peaked, far-apart p and q (Dirichlet 0.3), three drafts", 0.05, lambda n: _far_apart(n, 8, 3)),
    _direct("far_apart/V64/g3", "peaked, far-apart p and q (Dirichlet 0.3), V = 64", 0.05, lambda n: _far_apart(n, 64, 3)),
    _direct(
        "near_identical/V64/g5",
        "draft = target logits + N(0, 0.1^2): acceptance near 1, five drafts",
        0.05,
        lambda n: _noisy_draft(n, 64, 5, 0.1),
    ),
    _direct(
        "close/V64/g5", "draft = target logits + N(0, 1): a realistic drafter, five drafts", 0.05, lambda n: _noisy_draft(n, 64, 5, 1.0)
    ),
    _direct("disjoint/V8/g3", "disjoint supports: every draft is rejected (beta = 0)", 0.05, lambda n: _disjoint(n, 8, 3)),
    _direct("onehot_q/V64/g3", "one-hot draft distributions (a greedy drafter reporting one-hot q)", 0.05, lambda n: _onehot_q(n, 64, 3)),
    _direct("q_zero_where_p/V64/g3", "q = 0 on half of the tokens where p > 0", 0.05, lambda n: _zero_where(n, 64, 3, "draft")),
    _direct("p_zero_where_q/V64/g3", "p = 0 on half of the tokens where q > 0", 0.05, lambda n: _zero_where(n, 64, 3, "target")),
    _direct("p_equals_q/V64/g3", "p == q: every draft must be accepted", 0.05, lambda n: _equal(n, 64, 3)),
    _direct(
        "temperature_target/V64/g3",
        "draft = target + N(0, 1) noise; temperature 0.7 on the target only",
        0.05,
        lambda n: _noisy_draft(n, 64, 3, 1.0, target=_T, draft=_NONE),
    ),
    _direct(
        "temperature_draft/V64/g3", "temperature 0.7 on the draft only", 0.05, lambda n: _noisy_draft(n, 64, 3, 1.0, target=_NONE, draft=_T)
    ),
    _direct("top_k_target/V64/g3", "top-k 8 on the target only", 0.05, lambda n: _noisy_draft(n, 64, 3, 1.0, target=_K, draft=_NONE)),
    _direct("top_k_draft/V64/g3", "top-k 8 on the draft only", 0.05, lambda n: _noisy_draft(n, 64, 3, 1.0, target=_NONE, draft=_K)),
    _direct("top_p_target/V64/g3", "top-p 0.9 on the target only", 0.05, lambda n: _noisy_draft(n, 64, 3, 1.0, target=_P, draft=_NONE)),
    _direct("top_p_draft/V64/g3", "top-p 0.9 on the draft only", 0.05, lambda n: _noisy_draft(n, 64, 3, 1.0, target=_NONE, draft=_P)),
    _direct(
        "processed_both/V64/g3",
        "temperature 0.7, top-k 8, top-p 0.9 on both sides",
        0.05,
        lambda n: _noisy_draft(n, 64, 3, 1.0, target=_ALL, draft=_ALL),
    ),
    _direct(
        "llm_like/V1024/g4",
        "Zipf target, draft = target + N(0, 0.7^2), T 0.7 and top-k 50 on both",
        0.05,
        lambda n: _noisy_draft(n, 1024, 4, 0.7, target=_LLM, draft=_LLM, zipf=True),
    ),
    _direct(
        "large_vocab/V50257/g1",
        "Zipf target over 50,257 tokens (not a multiple of 64), draft noise 0.7",
        0.05,
        lambda n: _noisy_draft(n, 50257, 1, 0.7, zipf=True),
    ),
    Case(
        id="direct/transformers_target_distribution/V10/g3",
        family="direct",
        description="transformers' test_speculative_sampling_target_distribution fixture, against its exact law",
        epsilon=0.05,
        make_step=_transformers_fixture,
    ),
)


def _p_zero_first_draft() -> SpecStep:
    """V = 4, one draft: q = (1/2, 1/2, 0, 0), p = (0, 1/2, 1/2, 0). With u = 0 the draft is token 0 (the first
    of q's support), which p forbids: it must be rejected and token 2 drawn from (p - q)+."""
    with np.errstate(divide="ignore"):
        draft = np.log(np.array([[0.5, 0.5, 0.0, 0.0]]))
        target = np.log(np.array([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]))
    return _step(target, draft)


def _edge(fixture: str, description: str, make: Callable[[], SpecStep], extreme: Extreme) -> Case:
    where = "0" if extreme is Extreme.MIN else "just below 1"
    return Case(
        id=f"edge/{fixture}/{extreme.value}",
        family="edge",
        description=f"{description}; every uniform {where} (deterministic)",
        epsilon=1.0,  # no statistical check: certain violations only
        make_step=make,
        extreme=extreme,
    )


#: Deterministic edge checks (docs/statistics.md §11: rare events such as u == 0 are out of statistical reach): each
#: fixture with every uniform at 0 and just below 1; any output outside the exact laws' support fails.
EDGE_CASES: tuple[Case, ...] = tuple(
    _edge(fixture, description, make, extreme)
    for fixture, description, make in (
        ("p_zero_draft/V4/g1", "a draft with q = 1/2 and p = 0 must be rejected", _p_zero_first_draft),
        ("all_reject/V8/g3", "disjoint supports: every draft rejected", _disjoint("disjoint/V8/g3", 8, 3)),
        ("all_accept/V64/g3", "p == q: every draft accepted", _equal("p_equals_q/V64/g3", 64, 3)),
        ("q_zero_where_p/V64/g3", "q = 0 where p > 0: the residual covers it", _zero_where("q_zero_where_p/V64/g3", 64, 3, "draft")),
        ("p_zero_where_q/V64/g3", "p = 0 where q > 0: never emitted", _zero_where("p_zero_where_q/V64/g3", 64, 3, "target")),
        ("transformers_fixture/V10/g3", "transformers' target-distribution fixture", _transformers_fixture),
    )
    for extreme in (Extreme.MIN, Extreme.MAX)
)

CASES: tuple[Case, ...] = DIRECT_CASES + EDGE_CASES


def select(patterns: Sequence[str] | None, cases: Sequence[Case] = CASES) -> tuple[Case, ...]:
    """Cases whose id matches any glob pattern (all cases when ``patterns`` is empty)."""
    if not patterns:
        return tuple(cases)
    return tuple(c for c in cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns))
