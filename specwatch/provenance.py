"""What makes a result reproducible and comparable: each case's seed from the run's (:func:`derive_seed`), the output
fingerprint of a case (a fixed-seed probe: equal behaviour, equal fingerprint), and the device and environment a run
records."""

from __future__ import annotations

import hashlib
import platform

import numpy as np
import scipy
import torch

from specwatch.cases import Case
from specwatch.experiments import Experiment
from specwatch.reproducible import draw, global_seed, seeded_globals


def derive_seed(run_seed: int, case_id: str, attempt: int) -> int:
    """A 63-bit seed from (run seed, case, attempt): every result is reproducible from its record."""
    digest = hashlib.blake2b(f"{run_seed}:{case_id}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


FINGERPRINT_SEED = 0


#: Probe trials of an experiment that does not say how many it wants.
DEFAULT_PROBE_TRIALS = 64


def probe_trials(experiment: Experiment, first_batch: int) -> int:
    """Trials of the fingerprint probe: what the experiment asks for (``probe_trials``: many for cheap
    vectorised chain steps, few for ``generate()`` calls), at most one first batch. It depends on the case
    alone, never on the run's other cases, so equal behaviour gives equal fingerprints."""
    wanted = getattr(experiment, "probe_trials", DEFAULT_PROBE_TRIALS)
    return max(1, min(first_batch, int(wanted)))


def output_fingerprint(case: Case, experiment: Experiment, trials: int, device: str, max_batch: int | None = None) -> str:
    """A hash of the outputs of ``trials`` trials drawn with a seed fixed per case (not per run or commit), in calls of
    at most ``max_batch`` trials, the global generators seeded from the same seed
    (:func:`specwatch.reproducible.seeded_globals`).

    Two commits whose sampler behaves the same on the case get the same fingerprint, on the same device
    and library versions, so an unchanged fingerprint marks "behaviour unchanged" at no statistical cost.
    The probe's trials are not evidence: the test draws its own with the run's seed.
    """
    seed = derive_seed(FINGERPRINT_SEED, case.id, 0)
    generator = torch.Generator(device=device).manual_seed(seed)
    with seeded_globals(global_seed(seed, "probe"), device):
        obs = draw(experiment, trials, generator, max_batch)
    digest = hashlib.sha256(f"{trials}:".encode())
    digest.update(obs.sample)
    for name in sorted(obs.counts):
        digest.update(name.encode())
        digest.update(np.asarray(obs.counts[name], dtype=np.int64).tobytes())
    for violation in obs.violations:
        digest.update(f"{violation.layer.value}:{violation.message}".encode())
    return digest.hexdigest()[:16]


def probe(case: Case, experiment: Experiment, trials: int, device: str, max_batch: int | None) -> tuple[str, bool]:
    """The case's fingerprint (:func:`output_fingerprint`) and whether a second probe with the same seeds gave the
    same outputs: False when the sampler draws randomness that neither its generator nor the seeded global ones
    give it (an unseeded ``np.random.default_rng()``, the clock, a nondeterministic kernel), so that a run with the
    same seed need not give the same trials."""
    first = output_fingerprint(case, experiment, trials, device, max_batch)
    return first, output_fingerprint(case, experiment, trials, device, max_batch) == first


def device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return f"cpu:{platform.machine()}"


def environment() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "platform": platform.platform(),
    }
