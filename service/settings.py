"""The control plane's one settings object, read from ``SPECWATCH_*`` environment variables (or ``.env``).

Build it with :func:`get_settings` (cached, never at import time); tests build their own ``Settings(...)``.
Secrets have no default and are refused when empty outside ``dev``/``test``.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import lru_cache
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# The same list as service.targets.GIT_PROTOCOLS (settings import nothing of the service).
_GIT_PROTOCOLS = ("https", "ssh", "http", "git")


class Environment(StrEnum):
    dev = "dev"
    test = "test"
    prod = "prod"


class Settings(BaseSettings):
    """specwatch control-plane settings; every field is ``SPECWATCH_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="SPECWATCH_", env_file=".env", env_file_encoding="utf-8", extra="ignore")

    env: Environment = Environment.dev
    database_url: str = "sqlite:///./specwatch.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Verifies X-Hub-Signature-256 on GitHub webhooks. Empty unless set, and refused empty outside dev/test:
    # an empty secret would accept forged pushes.
    webhook_secret: SecretStr = SecretStr("")
    github_token: SecretStr | None = None
    # Check runs (targets with github_checks) are created only with a GitHub App's installation token ("Checks:
    # Read and write"); unset, they are sent with github_token. Commit statuses always use github_token.
    github_checks_token: SecretStr | None = None
    # The GitHub REST API that commit statuses are posted to (GitHub Enterprise: https://HOST/api/v3).
    github_api_url: str = "https://api.github.com"
    slack_webhook_url: SecretStr | None = None
    dashboard_url: str = "http://127.0.0.1:8000"
    # Larger webhook bodies are refused (413) before or while they are read. GitHub caps payloads at 25 MB, but a
    # push payload lists at most 2048 commits (each a message, an author and file lists: a few MB at the very
    # most), and specwatch reads only pushes and pings: 10 MiB leaves room for the largest push while halving
    # the disk and hashing an unauthenticated client can make a slot cost. A push refused here is caught up by
    # the branch poller (a target with `poll`).
    webhook_max_body_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    # A webhook body is hashed while it streams into a spool: in memory up to this size, on disk past it.
    webhook_spool_bytes: int = Field(default=256 * 1024, ge=0)
    # The bytes of webhook bodies read at once per process, charged as they arrive: a body that does not fit
    # gets 503 with Retry-After (what unauthenticated clients hold, memory and spool disk, is bounded by it; a
    # connection dripping a body holds only what it has sent). At least webhook_max_body_bytes, so that the
    # largest push fits on its own.
    webhook_body_budget_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # A body is read within this many seconds of its first byte being awaited, and no read waits longer than
    # webhook_body_read_timeout_s; past either the request gets 408 and its slot is free again. GitHub itself
    # gives a delivery 10 s in all, so a real push never needs more; a client dripping bytes with a false
    # signature holds a slot for seconds, not for as long as it likes (issue 28).
    webhook_body_deadline_s: float = Field(default=10.0, gt=0, le=300)
    webhook_body_read_timeout_s: float = Field(default=5.0, gt=0, le=300)
    # The suite profile of runs queued by webhooks and pollers.
    run_profile: str = Field(default="default", min_length=1, max_length=50)
    # A queued run that no worker has started by then is re-enqueued by the sweeper (workers.sweep_runs):
    # it repairs a lost message or an enqueue that failed after commit (broker down).
    queued_lease_s: int = Field(default=15 * 60, gt=0)
    # API bearer tokens, stored as the SHA-256 hex digests of the tokens (comma-separated), never the tokens:
    # `printf %s "$TOKEN" | sha256sum`. Write tokens may also read; read tokens only read (403 on writes).
    # Writes (targets, alerts) always need a write token: with none configured, every write is refused (401).
    api_token_hashes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    api_read_token_hashes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Whether reads (GET of the API and the dashboard) need a token too; off by default.
    api_auth_reads: bool = False
    # Whether /metrics answers without a token. Unset: it follows the reads (anonymous unless api_auth_reads is
    # on); false: a read or write token is needed (a Prometheus `authorization` credential); true: anonymous even
    # where reads need a token (what it shows: counts per target name, status and kind, queue ages).
    metrics_public: bool | None = None
    # Signs the dashboard's session cookies (signing in with an API token to acknowledge and resolve alerts):
    # a long random string, e.g. `python -c "import secrets; print(secrets.token_urlsafe(32))"`. Unset in
    # dev/test: a random key per process; unset elsewhere: the dashboard's sign-in is off (pages stay readable).
    session_secret: SecretStr = SecretStr("")
    # Which repositories targets may name, and what the worker's git may fetch (service.targets.RepoPolicy).
    # Protocols (comma-separated) among https, ssh, http, git; credentials never go in a URL (configure a git
    # credential helper for the worker instead).
    git_protocols: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["https"])
    # Local paths and file:// URLs; private, loopback and link-local hosts. Unset: allowed with SPECWATCH_ENV
    # dev or test (the embedded default on a laptop, whose demo registers a local repository), refused with
    # prod. Compose sets both to false.
    allow_local_repositories: bool | None = None
    allow_private_hosts: bool | None = None

    @field_validator("api_token_hashes", "api_read_token_hashes", "git_protocols", mode="before")
    @classmethod
    def _split_hashes(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("api_token_hashes", "api_read_token_hashes")
    @classmethod
    def _check_hashes(cls, value: list[str]) -> list[str]:
        bad = [item for item in value if not _SHA256_HEX.fullmatch(item.lower())]
        if bad:
            raise ValueError(f"{len(bad)} token hash(es) are not SHA-256 hex digests (64 hex digits): store sha256(token), not the token")
        return [item.lower() for item in value]

    @field_validator("git_protocols")
    @classmethod
    def _known_protocols(cls, value: list[str]) -> list[str]:
        protocols = [item.lower() for item in value]
        unknown = sorted(set(protocols) - set(_GIT_PROTOCOLS))
        if unknown:
            raise ValueError(
                f"unknown git protocol(s) {', '.join(unknown)}: use {', '.join(_GIT_PROTOCOLS)} "
                "(local repositories: SPECWATCH_ALLOW_LOCAL_REPOSITORIES)"
            )
        return protocols

    @property
    def local_repositories_allowed(self) -> bool:
        return self.allow_local_repositories if self.allow_local_repositories is not None else self.env is not Environment.prod

    @property
    def private_hosts_allowed(self) -> bool:
        return self.allow_private_hosts if self.allow_private_hosts is not None else self.env is not Environment.prod

    @property
    def metrics_anonymous(self) -> bool:
        return self.metrics_public if self.metrics_public is not None else not self.api_auth_reads

    @model_validator(mode="after")
    def _body_budget_holds_the_largest_body(self) -> Settings:
        if self.webhook_body_budget_bytes < self.webhook_max_body_bytes:
            raise ValueError(
                f"SPECWATCH_WEBHOOK_BODY_BUDGET_BYTES ({self.webhook_body_budget_bytes}) is below "
                f"SPECWATCH_WEBHOOK_MAX_BODY_BYTES ({self.webhook_max_body_bytes}): the largest push would never fit"
            )
        return self

    @model_validator(mode="after")
    def _secrets_required_outside_dev(self) -> Settings:
        if self.env not in (Environment.dev, Environment.test) and not self.webhook_secret.get_secret_value():
            raise ValueError(
                f"SPECWATCH_WEBHOOK_SECRET is empty but SPECWATCH_ENV={self.env.value}: "
                "set it to the secret configured on the GitHub webhook (required outside dev/test)"
            )
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, built on first use from the environment."""
    return Settings()
