"""Same seed, same result: what the runner does so that a case's trials depend on its seed alone.

A sampler gets a private ``torch.Generator``, but user code also draws from the global generators (``np.random``,
``torch.multinomial`` without ``generator=``, ``random``). numpy's global one is seeded from the operating system in
each process, and torch's holds whatever the process drew before (the other tests of a pytest session, the cases a
``--jobs`` worker ran earlier): such a sampler gave different trials and verdicts under ``assert_lossless(seed=0)``
and ``specwatch check --seed 0`` (issue 42). The runner therefore seeds every global generator from the case's seed
before a case's trials (:func:`seeded_globals`, the caller's states restored after), runs torch with one thread on
either side (:func:`one_thread`), and runs the fingerprint probe twice with one seed: different outputs mean the
sampler draws randomness it cannot seed (``np.random.default_rng()`` without a seed, the clock, a nondeterministic
kernel), and the case says ``reproducible: false``.

It also bounds how many trials one sampler call gets (:func:`default_max_batch`, :func:`draw`): the runner's batches
grow to 65,536 trials, and a sampler that builds an (n, V) array at V = 50,257 would need gigabytes.
The probe itself is :func:`specwatch.provenance.probe`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.experiments import Experiment, Observation

#: Memory one sampler call may use by default, counted as a float64 array of (n, gamma + 1, V).
BATCH_MEMORY_BYTES = 1 << 30
#: The fewest trials a call gets by default, whatever the vocabulary (a call has a fixed cost of its own).
MIN_MAX_BATCH = 64
#: The most trials a call gets by default (the runner's largest batch).
MAX_MAX_BATCH = 1 << 16


def default_max_batch(vocab: int, gamma: int) -> int:
    """The most trials one call of a sampler gets by default for a step of ``vocab`` tokens and ``gamma`` drafts:
    the largest power of two n with n * (gamma + 1) * vocab * 8 bytes within :data:`BATCH_MEMORY_BYTES` (a float64
    array over every trial, position and token), between :data:`MIN_MAX_BATCH` and :data:`MAX_MAX_BATCH`. It
    depends on the step alone, never on the machine, so that a run reproduces everywhere."""
    fits = BATCH_MEMORY_BYTES // max(1, vocab * (gamma + 1) * 8)
    n = 1 << max(0, int(fits).bit_length() - 1) if fits >= 1 else 1
    return int(min(MAX_MAX_BATCH, max(MIN_MAX_BATCH, n)))


def experiment_max_batch(experiment: Experiment, given: int | None) -> int | None:
    """The call bound for ``experiment``: ``given``, else the default of its chain step (``step`` or ``chain.step``);
    None for experiments without one (end-to-end cases call ``generate()`` trial by trial)."""
    if given is not None:
        return given
    step = getattr(experiment, "step", None) or getattr(getattr(experiment, "chain", None), "step", None)
    if step is None:
        return None
    return default_max_batch(int(step.vocab_size), int(step.gamma))


def _merge(parts: list[Observation]) -> Observation:
    """One observation of consecutive calls: counts and accepted drafts summed, violations in order; a malformed
    part (violations and no counts) makes the whole malformed, as one call would have been."""
    if len(parts) == 1:
        return parts[0]
    violations = tuple(v for part in parts for v in part.violations)
    if any(part.violations and not part.counts for part in parts):
        return Observation({}, violations, 0, b"")
    counts: dict[str, NDArray[np.int64]] = {}
    for part in parts:
        for name, value in part.counts.items():
            counts[name] = counts[name] + value if name in counts else value.copy()
    coverage = None
    for part in parts:
        if part.coverage is not None:
            coverage = part.coverage if coverage is None else coverage.merge(part.coverage)
    expected = [p.expected_accepted for p in parts if p.expected_accepted is not None]
    return Observation(
        counts,
        violations,
        sum(p.accepted_total for p in parts),
        b"".join(p.sample for p in parts),
        coverage,
        sum(expected) if expected else None,
    )


def draw(experiment: Experiment, n: int, generator: torch.Generator, max_batch: int | None) -> Observation:
    """``n`` trials of ``experiment`` in calls of at most ``max_batch`` trials (None: one call), as one observation.

    The calls draw from ``generator`` in turn, so the trials depend on the seed and on ``max_batch``: a call of n
    trials draws its uniforms in an order of the sampler's own (the reference draws every trial's drafts, then every
    trial's acceptance uniforms), which no split can reproduce. The same seed and the same ``max_batch`` give the
    same trials; the default bound depends on the case alone.
    """
    if max_batch is None or n <= max_batch:
        return experiment.run(n, generator)
    parts: list[Observation] = []
    for start in range(0, n, max_batch):
        part = experiment.run(min(max_batch, n - start), generator)
        parts.append(part)
        if part.violations and not part.counts:  # malformed output: the case stops here
            break
    return _merge(parts)


def global_seed(seed: int, purpose: str) -> int:
    """A 32-bit seed for the global generators (numpy's legacy one takes 32 bits) from a case seed and a purpose."""
    digest = hashlib.blake2b(f"{seed}:{purpose}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


@contextmanager
def seeded_globals(seed: int, device: str = "cpu") -> Iterator[None]:
    """While open, Python's ``random``, numpy's global ``np.random`` and torch's global generators (CPU, and the
    CUDA device of ``device``) start from ``seed``; the caller's states come back on exit (a pytest session's other
    tests draw as if the suite had not run)."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch with one intra-op thread while open (as ``specwatch check``'s suite process and its ``--jobs``
    workers run), the caller's count restored on exit."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
