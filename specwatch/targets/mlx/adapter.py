"""MLX-LM as a target: what the installed release offers, found by looking.

``--pip mlx-lm==X`` installs the release with MLX's CPU backend (``mlx[cpu]``) on Linux
(its registry entry, :data:`specwatch.targets.mlx.TARGET`). MLX-LM exposes no rejection-sampling function to call on a fixture:
its draft model is verified by exact match inside ``speculative_generate_step``, so the target has end-to-end cases
only (:mod:`.e2e`); the direct sampler refuses with the reason.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from types import ModuleType

import torch

from specwatch.cases import Case
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import Sampler
from specwatch.targets.base import Adapter, AdapterError, distribution_version, refusing_sampler

DISTRIBUTION = "mlx-lm"


@dataclass
class MlxAdapter(Adapter):
    module: ModuleType
    version: str
    mlx_version: str
    device: str
    features: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def load(cls) -> MlxAdapter:
        try:
            mx = importlib.import_module("mlx.core")
            mlx_lm = importlib.import_module("mlx_lm")
            generate = importlib.import_module("mlx_lm.generate")
        except Exception as exc:
            raise AdapterError(
                f"cannot import mlx_lm and mlx.core: {type(exc).__name__}: {exc} (on Linux MLX needs its CPU backend: mlx[cpu])"
            ) from exc
        features = {
            "speculative_generate_step": hasattr(generate, "speculative_generate_step"),
            "stream_generate": hasattr(generate, "stream_generate"),
            "server": importlib.util.find_spec("mlx_lm.server") is not None,
        }
        version = str(getattr(mlx_lm, "__version__", None) or distribution_version(DISTRIBUTION))
        return cls(mlx_lm, version, str(getattr(mx, "__version__", "unknown")), str(mx.default_device()), features)

    def describe(self) -> LibraryIdentity:
        """The release's identity: the distribution, its version, MLX's version and the device it computes on."""
        return LibraryIdentity(
            name="mlx",
            distribution=DISTRIBUTION,
            version=self.version,
            path=str(getattr(self.module, "__file__", "") or ""),
            details={"mlx": self.mlx_version, "mlx_device": self.device, "torch": torch.__version__},
        )

    def sampler(self) -> Sampler:
        return refusing_sampler("mlx-lm has no rejection-sampling function to call on a fixture: its cases are end to end")

    def cases(self) -> tuple[Case, ...]:
        from specwatch.targets.mlx.e2e import e2e_cases  # noqa: PLC0415 - the tiny models need transformers

        return e2e_cases(self)
